"""An environment that raises on every step (issue 46): the run said nothing of the exception and
its first alert, after three steps, blamed the reward format (constant_reward). Now the first
exception (type, message, environment, where) is logged within the first rollout batch and the
episode_failures check alerts at that first step; failed episodes are not the reward's doing."""

from __future__ import annotations

import logging
import warnings

import pytest

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.environments.base import ENVIRONMENTS, Reset
from grpo_lightning.tasks.guess_number import GuessNumberTaskConfig


class AlwaysRaises:
    def reset(self, seed, row):
        return Reset(messages=[{"role": "user", "content": "1-8?"}])

    def step(self, turn):
        raise RuntimeError("the scoreboard is unreachable")

    def close(self):
        pass


@pytest.fixture(scope="module", autouse=True)
def always_raises():
    if "always_raises" not in ENVIRONMENTS:
        ENVIRONMENTS.register("always_raises")(lambda options, row: AlwaysRaises())


def test_the_first_exception_is_shown_at_once_and_the_alert_names_the_environment(tmp_path, caplog):
    cfg = TrainConfig()
    cfg.task = GuessNumberTaskConfig(correctness_reward=None, environment="always_raises", max_turns=2)
    cfg.logger.kind, cfg.logger.report_png, cfg.trainer.output_dir, cfg.trainer.max_steps = (
        "none",
        False,
        str(tmp_path),
        3,
    )
    cfg.rollout.num_generations, cfg.rollout.prompts_per_step, cfg.rollout.max_new_tokens = 2, 2, 3
    run = build_run(cfg)
    trainer = run.trainer(cfg, enable_progress_bar=False)
    caplog.set_level(logging.WARNING, logger="grpo_lightning.environments.rollout")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(run.module, datamodule=run.datamodule)
    said = [r.getMessage() for r in caplog.records if r.name == "grpo_lightning.environments.rollout"]
    assert len(said) == 1, said  # once, not every step
    assert said[0].startswith("env_error in 4 of 4 episodes of step 0, the first: environment 'always_raises': step() ")
    assert "raised RuntimeError: the scoreboard is unreachable (" in said[0] and "in step)" in said[0]
    assert "test_environment_failures.py:" in said[0]  # where it was raised
    alerts = [(a.check, a.step) for a in run.health.alerts]
    assert alerts and alerts[0] == ("episode_failures", 0), alerts
    assert "constant_reward" not in [check for check, _ in alerts], alerts
