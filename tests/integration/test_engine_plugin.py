"""A rollout engine from a user's file: ``plugins=[my_engine.py] rollout.engine=my_engine`` on the
CLI selects it, and its completions are what the run scores and trains on; an unknown engine name
fails at config time naming the closest registered one."""

from __future__ import annotations

import csv
import sys
import textwrap

import pytest
from conftest import make_config

from grpo_lightning import train
from grpo_lightning.config import ConfigError, validate_config
from grpo_lightning.rollout import ENGINES

ENGINE_PLUGIN = textwrap.dedent(
    """
    from grpo_lightning.rewards import register_reward
    from grpo_lightning.rollout.engine import ENGINES, EngineBase
    from grpo_lightning.records import Completion

    FIXED = "7+7"
    CALLS = []  # (number of requests, max_new_tokens) of each generate call

    class FixedEngine(EngineBase):
        def __init__(self, tokenizer):
            ids = tokenizer(FIXED, add_special_tokens=False)["input_ids"]
            self.ids = [*ids, tokenizer.eos_token_id]

        def generate(self, requests, sampling):
            CALLS.append((len(requests), sampling.max_new_tokens))
            return [Completion(token_ids=list(self.ids), finished=True) for _ in requests]

    @ENGINES.register("fixed_text_engine")
    def fixed_text_engine(policy, tokenizer, cfg):
        return FixedEngine(tokenizer)

    @register_reward("is_fixed_text")
    def is_fixed_text(prompts, completions, **_):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [1.0 if text.strip() == FIXED else 0.0 for text in texts]
    """
)


def test_an_engine_from_a_plugin_file_is_selected_and_its_completions_are_trained_on(tmp_path, monkeypatch, capsys):
    plugin = tmp_path / "fixed_engine_plugin.py"
    plugin.write_text(ENGINE_PLUGIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "grpo-lightning",
            f"plugins=[{plugin}]",
            "rollout.engine=fixed_text_engine",
            "task.rewards={is_fixed_text: 1.0}",
            "trainer.max_steps=2",
            "rollout.prompts_per_step=2",
            "rollout.num_generations=2",
            "rollout.max_new_tokens=6",
            "eval.before_training=false",
            "eval.num_prompts=0",
            "logger=csv",
            f"hydra.run.dir={tmp_path}/run",
        ],
    )
    train.cli()
    files = list((tmp_path / "run").glob("csv/version_*/metrics.csv"))
    assert len(files) == 1, files
    with open(files[0]) as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("reward/mean")]
    assert len(rows) == 2
    # Every completion is the engine's fixed text (the tiny policy never writes it by itself).
    assert [float(r["reward/mean"]) for r in rows] == [1.0, 1.0]
    assert all(float(r["completions/mean_length"]) == 4.0 for r in rows)  # "7+7" and EOS
    calls = ENGINES["fixed_text_engine"].__globals__["CALLS"]
    assert calls and all(call == (4, 6) for call in calls)  # 2 prompts x 2 samples, rollout.max_new_tokens
    assert "final metrics" in capsys.readouterr().out


def test_an_unknown_engine_fails_at_config_time_naming_the_closest():
    cfg = make_config(1, **{"rollout.engine": "vlm"})
    with pytest.raises(
        ConfigError, match=r"rollout.engine='vlm' is not a registered rollout engine; did you mean 'vllm'"
    ):
        validate_config(cfg)
    assert {"hf", "vllm"} <= set(ENGINES)
