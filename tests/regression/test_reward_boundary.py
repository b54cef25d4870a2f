"""The reward boundary: what a reward function returns, raises or exits with is checked there,
named, and never ends the run silently; weights and totals are finite; a slow reward is killed."""

from __future__ import annotations

import asyncio
import math
import random
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from grpo_lightning import train
from grpo_lightning.config import ConfigError, TaskConfig, TrainConfig, validate_config
from grpo_lightning.errors import RewardError
from grpo_lightning.registry import load_plugins
from grpo_lightning.rewards import RewardFunctionError, RewardScorer, WeightedReward, register_reward
from grpo_lightning.rewards.isolation import IsolatedReward, RewardWorkerError


def score(fn, n=2, weight=1.0):
    return RewardScorer([WeightedReward("bad", fn, weight)])(["a"] * n, ["1"] * n, {})


# ----------------------------------------------------------------------------- return values
@pytest.mark.parametrize(
    "returned, said",
    [
        ({"a": 1.0, "b": 2.0}, "got a dict"),
        ("12", "got a str"),
        (["1", "2"], "value 0 is a str"),
        ([1.0, {"score": 1}], "value 1 is a dict"),
        ([1.0, [1.0]], "value 1 is a list"),
        ([1.0, 1 + 2j], "value 1 is a complex"),
        (torch.ones(2, 1), "got a Tensor"),
        ([1.0, torch.ones(2)], "value 1 is a Tensor"),
    ],
)
def test_a_return_value_of_the_wrong_kind_is_named_with_its_index_and_type(returned, said):
    with pytest.raises(RewardFunctionError, match="'bad'") as err:
        score(lambda p, c, **_: returned)
    assert said in str(err.value)


def test_every_kind_of_number_is_taken_as_its_value():
    """Many random mixes of the accepted kinds (bool, int, float, numpy and torch scalars, None)."""
    rng = random.Random(0)
    kinds = [
        lambda x: float(x),
        lambda x: int(x),
        lambda x: bool(x > 0),
        lambda x: np.float32(x),
        lambda x: np.int64(x),
        lambda x: np.bool_(x > 0),
        lambda x: torch.tensor(x),
        lambda x: None,
    ]
    for _ in range(200):
        n = rng.randint(1, 8)
        raw = [rng.choice(kinds)(rng.uniform(-5, 5)) for _ in range(n)]
        container = rng.choice([list, tuple])
        returned = container(raw)
        rewards = [
            WeightedReward("bad", lambda p, c, returned=returned, **_: returned),
            WeightedReward("one", lambda p, c, **_: [1] * len(c)),
        ]
        _, parts = RewardScorer(rewards)(["a"] * n, ["1"] * n, {})
        for got, value in zip(parts["bad"].tolist(), raw, strict=True):
            assert (math.isnan(got) and value is None) or got == pytest.approx(float(value), rel=1e-6)


# ----------------------------------------------------------------------------- weights and totals
@pytest.mark.parametrize("weight", ["nan", "inf", "-inf"])
def test_a_non_finite_weight_is_refused_at_config_time_naming_the_reward(weight):
    cfg = TrainConfig(task=TaskConfig(rewards={"arithmetic_exact": 1.0, "arithmetic_close": float(weight)}))
    with pytest.raises(ConfigError, match=f"task.rewards.arithmetic_close={weight} must be a finite number"):
        validate_config(cfg)


@pytest.mark.parametrize("weight", [math.nan, math.inf])
def test_a_non_finite_weight_is_refused_by_the_scorer_too(weight):
    with pytest.raises(RewardFunctionError, match="reward 'bad' has weight"):
        score(lambda p, c, **_: [1.0, 1.0], weight=weight)


def test_a_total_that_overflows_is_a_named_reward_error_not_a_tied_group():
    big = [WeightedReward(name, lambda p, c, **_: [3e38, 1.0]) for name in ("r1", "r2")]
    with pytest.raises(RewardFunctionError, match=r"total is non-finite at completions \[0\] \(1 of 2"):
        RewardScorer(big)(["a", "b"], ["1", "2"], {})
    with pytest.raises(RewardFunctionError, match="'r1': 1e\\+38"):  # a finite weight times a finite reward
        RewardScorer([WeightedReward("r1", lambda p, c, **_: [10.0, 1.0], 1e38)])(["a", "b"], ["1", "2"], {})


# ----------------------------------------------------------------------------- raising and exiting
def exits(prompts, completions, **_):
    sys.exit(0)


async def exits_async(prompts, completions, **_):
    sys.exit(3)


def test_sys_exit_in_a_reward_is_a_reward_error_naming_it():
    with pytest.raises(RewardFunctionError, match="reward function 'bad' raised SystemExit"):
        score(exits)
    with pytest.raises(RewardFunctionError, match="reward function 'bad' raised SystemExit: 3"):
        score(exits_async)


def test_ctrl_c_and_cancellation_keep_their_own_paths():
    def interrupted(prompts, completions, **_):
        raise KeyboardInterrupt

    async def cancelled(prompts, completions, **_):
        raise asyncio.CancelledError

    with pytest.raises(KeyboardInterrupt):
        score(interrupted)
    with pytest.raises(asyncio.CancelledError):
        score(cancelled)


# ----------------------------------------------------------------------------- timeouts
def spins(prompts, completions, **_):
    """CPU-bound and never returns: a thread could not stop it."""
    while True:
        pass


def lengths(prompts, completions, answer=None, **_):
    return [float(len(c)) + (answer is not None) for c in completions]


def raises_value_error(prompts, completions, **_):
    raise ValueError("no answer column")


def test_a_reward_past_its_timeout_is_killed_and_named_with_the_limit():
    reward = IsolatedReward("spins", spins, timeout_s=1.0)
    scorer = RewardScorer([WeightedReward("spins", reward)])
    reward._start()  # the worker's start-up (imports) does not count against the limit
    process = reward._process
    start = time.monotonic()
    with pytest.raises(RewardWorkerError, match=r"'spins' ran past task.reward_timeout_s=1 s"):
        scorer(["a"], ["x"], {})
    assert time.monotonic() - start < 10
    process.join(5)
    assert not process.is_alive()


def test_an_isolated_reward_scores_takes_its_columns_and_names_what_it_raised():
    ok = IsolatedReward("lengths", lengths, timeout_s=60)
    total, _ = RewardScorer([WeightedReward("lengths", ok)])(["p", "q"], ["ab", "abc"], {"answer": ["1", "2"]})
    assert total.tolist() == [3.0, 4.0]
    bad = RewardScorer([WeightedReward("raises", IsolatedReward("raises", raises_value_error, timeout_s=60))])
    with pytest.raises(RewardFunctionError, match="'raises' raised ValueError: no answer column"):
        bad(["p"], ["x"], {})
    ok.close()


def test_a_reward_a_worker_cannot_import_is_refused_when_built():
    with pytest.raises(RewardError, match="'inline' cannot run under task.reward_process=true"):
        IsolatedReward("inline", lambda p, c, **_: [1.0], timeout_s=1)


def test_a_reward_from_a_plugin_file_runs_in_the_worker(tmp_path):
    path = tmp_path / "slow_plugin.py"
    path.write_text(
        textwrap.dedent(
            """
            from grpo_lightning.rewards import register_reward

            @register_reward("plugin_twice_length")
            def twice(prompts, completions, **_):
                return [2.0 * len(c) for c in completions]
            """
        )
    )
    load_plugins([str(path)])
    scorer = RewardScorer.from_names({"plugin_twice_length": 1.0}, timeout_s=60)
    total, _ = scorer(["p"], ["abc"], {})
    assert total.tolist() == [6.0]
    scorer.rewards[0].fn.close()


# ----------------------------------------------------------------------------- the CLI
@register_reward("exits_at_step_2")
def exits_at_step_2(prompts, completions, trainer_state=None, **_):
    if trainer_state.global_step >= 2:
        sys.exit(0)
    return [float(len(c) % 3) for c in completions]


def test_sys_exit_in_a_reward_ends_the_cli_in_one_line_exit_2_with_the_steps_saved(
    monkeypatch, tmp_path, capsys, caplog
):
    """Also: saving on the stop path logs no "`weights_only` was not set" line (Lightning's, at info)."""
    monkeypatch.chdir(tmp_path)
    caplog.set_level("INFO")
    args = [
        "task.rewards={exits_at_step_2: 1.0}",
        "logger=none",
        "trainer.max_steps=4",
        "trainer.checkpoint_every_n_steps=10",
        f"trainer.output_dir={tmp_path}/out",
        "rollout.prompts_per_step=2",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=4",
        "eval.before_training=false",
        "eval.every_n_steps=0",
        f"hydra.run.dir={tmp_path}/run",
    ]
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop:
        train.cli()
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "reward function 'exits_at_step_2' raised SystemExit" in err
    assert "steps up to 2 are saved in" in err
    assert (tmp_path / "out" / "checkpoints" / "step_00000002.ckpt").is_file()
    assert "weights_only" not in caplog.text
