"""Held-out evaluation: exact accuracy and pass@k on a scripted engine, and val/* logged during fit."""

from __future__ import annotations

import csv
import random

import pytest
import torch

from grpo_lightning.build import build_run, fit
from grpo_lightning.config import RolloutConfig, TrainConfig
from grpo_lightning.errors import ConfigError
from grpo_lightning.evaluation import Evaluator
from grpo_lightning.evaluation.held_out import group_values
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import Completion, EngineBase, RolloutGenerator, Sampling

RECORDS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (2, 2), (5, 0)]]


class ScriptedEngine(EngineBase):
    """Answers a prompt right or wrong by a rule on (prompt, call, sample index within the prompt)."""

    def __init__(self, tokenizer, rule):
        self.tokenizer, self.rule, self.calls, self.sampling = tokenizer, rule, [], []

    def generate(self, requests, sampling):
        self.sampling.append(sampling)
        answers = {tuple(self.tokenizer(r["prompt"])["input_ids"]): r["answer"] for r in RECORDS}
        out, seen = [], {}
        for request in requests:
            key = tuple(request.prompt_ids)
            index = seen[key] = seen.get(key, -1) + 1
            right = answers[key]
            text = right if self.rule(right, len(self.calls), index) else "9" + right
            out.append(Completion(self.tokenizer(text, add_special_tokens=False)["input_ids"], True))
        self.calls.append(len(requests))
        return out


def make_evaluator(rule, pass_k=0, **groups):
    tokenizer = build_char_tokenizer()
    engine = ScriptedEngine(tokenizer, rule)
    rollout = RolloutGenerator(
        engine,
        tokenizer,
        RewardScorer.from_names({"arithmetic_exact": 1.0}),
        4,
        Sampling.from_config(RolloutConfig(max_new_tokens=4, temperature=0.7)),
    )
    return Evaluator(rollout, "arithmetic_exact", max_new_tokens=4, pass_k=pass_k, **groups), engine


def test_greedy_accuracy_counts_exactly_the_correct_answers():
    evaluator, engine = make_evaluator(lambda answer, call, index: answer in ("3", "7", "4"))
    metrics = evaluator.evaluate(RECORDS)
    assert metrics["val/accuracy"] == pytest.approx(0.75)
    assert engine.sampling[0].top_k == 1  # greedy: only the most likely token survives
    assert [s["correct"] for s in evaluator.last_samples] == [True, True, True, False]
    assert "val/pass@4" not in metrics


def test_pass_at_k_counts_a_prompt_once_any_sample_is_right():
    # greedy (call 0) is always wrong; among the k sampled ones only sample 2 of prompts "3" and "7" is right
    rule = lambda answer, call, index: call == 1 and index == 2 and answer in ("3", "7")  # noqa: E731
    evaluator, engine = make_evaluator(rule, pass_k=3)
    metrics = evaluator.evaluate(RECORDS)
    assert metrics["val/accuracy"] == 0.0
    assert metrics["val/pass@3"] == pytest.approx(0.5)
    assert engine.calls == [4, 12]
    assert engine.sampling[1].temperature == 0.7 and engine.sampling[1].top_k == 0


@pytest.mark.slow
def test_fit_logs_validation_accuracy_before_during_and_after(tmp_path):
    cfg = TrainConfig()
    cfg.trainer.max_steps = 5
    cfg.trainer.output_dir = str(tmp_path)
    cfg.rollout.prompts_per_step = 4
    cfg.algorithm.micro_batch_size = 16
    cfg.logger.kind = "csv"
    cfg.eval.every_n_steps = 2
    cfg.eval.num_prompts = 10
    cfg.eval.pass_k = 2
    run = build_run(cfg)
    fit(run, run.trainer(cfg, enable_progress_bar=False), cfg)
    (metrics,) = tmp_path.glob("csv/version_*/metrics.csv")
    rows = [r for r in csv.DictReader(open(metrics)) if r.get("val/accuracy")]
    # before training (step 0), after steps 2 and 4 (in the row of the step whose weights they
    # evaluated, beside its training metrics), and a final one after step 5
    assert [int(r["step"]) for r in rows] == [0, 2, 4, 5]
    for row in rows:
        assert 0.0 <= float(row["val/accuracy"]) <= 1.0
        assert 0.0 <= float(row["val/pass@2"]) <= 1.0
    assert len(run.module.evaluator.last_samples) == 10


def test_each_value_of_the_group_column_gets_its_own_metrics():
    """task.group_column: val/<value>/accuracy over that value's rows only (task=shapes: per question type)."""
    records = [{**r, "kind": kind} for r, kind in zip(RECORDS, ["odd", "even", "even", "odd"], strict=True)]
    right = lambda answer, call, index: answer in ("3", "7", "4")  # noqa: E731  (the last one wrong)
    evaluator, _ = make_evaluator(right, group_column="kind", groups=["odd", "even", "never"])
    metrics = evaluator.evaluate(records)
    assert metrics["val/odd/accuracy"] == pytest.approx(0.5)
    assert metrics["val/even/accuracy"] == 1.0
    assert metrics["val/accuracy"] == pytest.approx(0.75)
    # Every group's keys in every batch, each weighing its own rows (0 where the batch has none).
    assert evaluator.last_weights["val/odd/accuracy"] == 2 and evaluator.last_weights["val/never/accuracy"] == 0


def test_group_metrics_are_exact_means_over_batches_of_mixed_groups():
    """A group's mean over batches weighs each batch by the group's rows in it, not by the batch's size."""
    from grpo_lightning.step.reductions import ValidationMeans  # noqa: PLC0415

    rng = random.Random(0)
    evaluator, _ = make_evaluator(
        lambda answer, call, index: answer in ("3", "7"), group_column="kind", groups=["a", "b"]
    )
    for _case in range(20):
        records = [{**rng.choice(RECORDS), "kind": rng.choice("ab")} for _ in range(rng.randint(4, 12))]
        means = ValidationMeans()
        for start in range(0, len(records), 3):
            batch = records[start : start + 3]
            means.update(evaluator.evaluate(batch), len(batch), torch.device("cpu"), evaluator.last_weights)
        got = means.compute()
        for kind in "ab":
            rows = [r["answer"] in ("3", "7") for r in records if r["kind"] == kind]
            if rows:
                assert got[f"val/{kind}/accuracy"] == pytest.approx(sum(rows) / len(rows), abs=1e-6)


def test_a_held_out_row_without_the_group_column_is_named():
    with pytest.raises(ConfigError, match=r"task.group_column='kind': held-out row 1 has no column 'kind'"):
        group_values([{"prompt": "1+2=", "kind": "a"}, {"prompt": "3+4="}], "kind")
    assert group_values([{"kind": 2}, {"kind": 1}, {"kind": 2}], "kind") == ["2", "1"]
