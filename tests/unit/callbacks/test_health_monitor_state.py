"""The health monitor's state across a resume: a window whose length changed takes the config's new
length (it kept the checkpoint's, silently ignoring the change) and keeps the newest entries."""

from __future__ import annotations

from grpo_lightning.callbacks.health import HealthMonitor
from grpo_lightning.config import HealthConfig


def monitor(window: int) -> HealthMonitor:
    cfg = HealthConfig()
    cfg.episode_failures.window = window
    return HealthMonitor(cfg)


def check(m: HealthMonitor, name: str = "episode_failures"):
    return next(c for c in m.checks if c.name == name)


def test_a_changed_window_takes_its_new_length_on_resume_keeping_the_newest_entries():
    before = monitor(window=4)
    check(before)._window.extend([1, 2, 3, 4])
    for window, kept in ((2, [3, 4]), (6, [1, 2, 3, 4])):
        after = monitor(window=window)
        after.load_state_dict(before.state_dict())
        assert check(after)._window.maxlen == window and list(check(after)._window) == kept
