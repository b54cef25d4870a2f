"""The reward_hacks check: the share of completions that tried to game a reward, over a window."""

from __future__ import annotations

import random
from types import SimpleNamespace

from grpo_lightning.health.reward_hacks import RewardHacksCheck, RewardHacksConfig, hack_counts
from grpo_lightning.records.plain_state import from_plain, to_plain


def view(completions: int, **tried: int):
    metrics = {"reward/code_tests/mean": 0.5, "reward/code_tests/hacks": float(sum(tried.values()))}
    metrics |= {f"reward/code_tests/hacks/{name}": float(n) for name, n in tried.items()}
    return SimpleNamespace(rollout=SimpleNamespace(reward_metrics=metrics, rewards=[0.0] * completions))


def run(check, views):
    return [check.evaluate(check.measure(v), v) for v in views]


def test_alerts_above_the_share_naming_what_was_tried():
    check = RewardHacksCheck(RewardHacksConfig(window=2, max_frac=0.1))
    (quiet, none), (metrics, finding) = run(check, [view(16, exits=1), view(16, not_plain_value=3, exits=1)])
    assert none is None and quiet["tried_frac"] == 1 / 16
    assert finding is not None and metrics["tried_frac_window"] == 5 / 32
    assert "code_tests: not_plain_value (3)" in finding.evidence and "code_tests: exits (2)" in finding.evidence
    assert "isolate" in check.diagnosis(None)[1]


def test_silent_without_attempts_or_without_sources_that_count_them():
    check = RewardHacksCheck(RewardHacksConfig(window=2))
    plain = SimpleNamespace(rollout=SimpleNamespace(reward_metrics={"reward/len/mean": 1.0}, rewards=[0.0] * 8))
    assert all(finding is None for _, finding in run(check, [plain, view(8), plain]))


def test_the_window_share_is_the_share_of_its_steps():
    """Property: over random steps, the window's share is the attempts over the completions of its last steps."""
    rng = random.Random(0)
    for _ in range(100):
        window = rng.randint(1, 6)
        check = RewardHacksCheck(RewardHacksConfig(window=window, max_frac=0.5))
        steps = [(rng.randint(1, 64), rng.randint(0, 3)) for _ in range(rng.randint(1, 12))]
        metrics, finding = run(check, [view(n, exits=k) for n, k in steps])[-1]
        last = steps[-window:]
        share = sum(k for _, k in last) / sum(n for n, _ in last)
        assert abs(metrics["tried_frac_window"] - share) < 1e-12
        assert (finding is not None) == (share > 0.5)


def test_counts_read_only_the_hacks_metrics():
    total, named = hack_counts(
        {"reward/judge/hacks": 2.0, "reward/judge/hacks/score_in_completion": 2.0, "reward/hacks_like": 9.0}
    )
    assert total == 2.0 and named == {"judge: score_in_completion": 2}


def test_its_state_is_plain_data_a_checkpoint_can_hold():
    check = RewardHacksCheck(RewardHacksConfig(window=3))
    run(check, [view(8, exits=1), view(8, not_plain_value=2)])
    saved = {k: v for k, v in vars(check).items() if k != "cfg"}  # what the monitor saves (not the options)
    state = from_plain(to_plain(saved, "health.reward_hacks"))
    assert state["_named"][1] == {"code_tests: not_plain_value": 2} and state["_window"][0] == (1.0, 8.0)
