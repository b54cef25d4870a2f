"""End to end: Trainer.fit on the default task raises the mean reward by a clear margin."""

from __future__ import annotations

import pytest
from conftest import DEFAULT_RUN_STEPS

pytestmark = pytest.mark.slow


def test_default_task_reward_rises(default_task_run):
    run, rewards = default_task_run
    first, last = rewards[:25], rewards[-50:]
    early, late = sum(first) / len(first), sum(last) / len(last)
    assert len(rewards) == DEFAULT_RUN_STEPS
    assert early < 0.2, early
    assert late - early > 0.2, (early, late)
    assert run.module.counters.skipped_steps == 0
