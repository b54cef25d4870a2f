"""Async generation with the real vLLM: F1 regression, reproducibility, staleness."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from helpers.vllm_helpers import RolloutRecorder, diversity_failures, run_training, small_config

import grpo_lightning.rollout.generator as rollout_module
from grpo_lightning.build import build_run
from grpo_lightning.data import PromptDataModule
from grpo_lightning.runtime.checkpoints import checkpoints_in

# The same two prompts at every step: F1 showed as one prompt getting the same completion
# at every step.
RECORDS = [{"prompt": "3+4=", "answer": "7"}, {"prompt": "5+2=", "answer": "7"}]


def completion_ids(batches) -> list[list[list[int]]]:
    return [b.completion_ids.tolist() for b in batches]


def test_async_batches_are_diverse_across_samples_and_steps(vllm_session):
    batches = run_training(small_config(steps=4, mode="async"), vllm_session.engine, RECORDS)
    assert len(batches) == 4
    assert diversity_failures(batches) == []
    # Seeds follow the step each batch is for: step t's batch differs from step t-1's.
    for before, now in pairwise(batches):
        assert not torch.equal(before.completion_ids, now.completion_ids)


def test_a_constant_seed_is_caught_by_the_diversity_check(vllm_session, monkeypatch):
    """Inject F1's cause (every request gets one fixed seed) into async mode: the check fails."""

    def constant_seeds(run_seed, rank, step, num_prompts, num_generations):
        return [1234] * (num_prompts * num_generations)

    monkeypatch.setattr(rollout_module, "group_seeds", constant_seeds)
    batches = run_training(small_config(steps=3, mode="async"), vllm_session.engine, RECORDS)
    failures = diversity_failures(batches)
    assert any("every sample" in f for f in failures), failures
    assert any("same completions again" in f for f in failures), failures


def test_sync_runs_with_the_same_seed_are_identical(vllm_session):
    first = run_training(small_config(steps=4), vllm_session.engine)
    second = run_training(small_config(steps=4), vllm_session.engine)
    assert completion_ids(first) == completion_ids(second)
    assert all(torch.equal(a.engine_logprobs, b.engine_logprobs) for a, b in zip(first, second, strict=True))


def test_async_runs_are_identical_given_the_same_staleness(vllm_session):
    one = run_training(small_config(steps=4, mode="async", staleness=1), vllm_session.engine)
    again = run_training(small_config(steps=4, mode="async", staleness=1), vllm_session.engine)
    assert completion_ids(one) == completion_ids(again)
    assert all(torch.equal(a.engine_logprobs, b.engine_logprobs) for a, b in zip(one, again, strict=True))
    # Staleness is real: the same prompts and seeds scored by older weights.
    sync = run_training(small_config(steps=4), vllm_session.engine)
    two = run_training(small_config(steps=4, mode="async", staleness=2), vllm_session.engine)
    assert torch.equal(sync[0].engine_logprobs, one[0].engine_logprobs)  # step 0: nothing to be stale on
    assert not torch.equal(sync[1].engine_logprobs, one[1].engine_logprobs)  # step 1 sampled with step-0 weights
    assert torch.equal(one[1].engine_logprobs, two[1].engine_logprobs)  # both sampled with the initial weights
    assert not torch.equal(one[2].engine_logprobs, two[2].engine_logprobs)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_async_training_with_importance_sampling_logs_the_mismatch(vllm_session, level):
    cfg = small_config(steps=3, mode="async", lr=1e-2)
    cfg.algorithm.is_level = level
    cfg.algorithm.is_cap = 2.0

    run = build_run(cfg, engine=vllm_session.engine)
    trainer = run.trainer(cfg, enable_progress_bar=False)
    trainer.fit(run.module, datamodule=run.datamodule)
    metrics = run.module.last_metrics
    assert float(metrics["rollout/staleness"]) == 1.0
    assert float(metrics["rollout/logp_diff_mean"]) > 1e-4  # one step off-policy at lr 1e-2
    assert 1.0 < float(metrics["rollout/is_ratio_max"])
    assert float(metrics["rollout/sync_seconds"]) > 0
    assert float(metrics["rollout/sync_probe_diff"]) < 1e-4  # after GRPO steps at lr 1e-2


def test_async_resume_trains_on_the_batches_that_were_in_flight(vllm_session, tmp_path):
    """Checkpoint at step 2 of 4 with one batch in flight, resume: the same batches and weights."""

    def run(name, resume=None):
        cfg = small_config(steps=4, mode="async", max_new_tokens=4)
        cfg.rollout.vllm.verify_sync = False
        cfg.trainer.output_dir, cfg.trainer.checkpoint_every_n_steps = str(tmp_path / name), 2
        cfg.trainer.resume = resume
        return cfg

    straight = run_training(run("a"), vllm_session.engine, RECORDS)
    first = checkpoints_in(tmp_path / "a")[0]
    assert first.name == "step_00000002.ckpt"
    [in_flight] = torch.load(first, weights_only=True)["grpo_rollout"]["pending"]  # plain data, no pickle
    assert in_flight["step"] == 2 and len(in_flight["completions"]) == len(in_flight["requests"])
    cfg = run("b", str(first))
    built = build_run(cfg, engine=vllm_session.engine)
    data = PromptDataModule(RECORDS, None, len(RECORDS), seed=0, num_batches=4, lookahead=1)
    recorder = RolloutRecorder()
    trainer = built.trainer(cfg, callbacks=built.callbacks + [recorder], enable_progress_bar=False)
    trainer.fit(built.module, datamodule=data, ckpt_path=str(first))
    assert [b.step for b in recorder.batches] == [2, 3]
    assert completion_ids(recorder.batches) == completion_ids(straight[2:])
    assert recorder.batches[0].timing["rollout/staleness"] == straight[2].timing["rollout/staleness"] == 1.0
