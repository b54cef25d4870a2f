"""task.reward_timeout_s in the trainer's thread: sleeps, busy loops that swallow exceptions and
async functions stop at the limit; a function that uses signals itself still works; off the main
thread the call is abandoned in a daemon thread; the process mode and the config rule stay."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from grpo_lightning.config import TrainConfig
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rewards.deadline import LimitedReward, RewardTimeLimitError
from grpo_lightning.rewards.isolation import IsolatedReward


def sleeps(prompts, completions, **_):
    time.sleep(60)


def swallows(prompts, completions, **_):
    while True:
        try:
            time.sleep(0.01)
        except Exception:  # noqa: BLE001  (what a careless reward does)
            pass


async def awaits(prompts, completions, **_):
    await asyncio.sleep(60)


def uses_sigalrm(prompts, completions, **_):
    """As math-verify's own timeout does: only possible in the main thread."""
    previous = signal.signal(signal.SIGALRM, lambda *a: None)
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
    return [float(len(c)) for c in completions]


def scorer(fn, seconds=0.3):
    return RewardScorer.from_names({fn.__name__: 1.0}, seconds, functions={fn.__name__: fn}, process=False)


@pytest.mark.parametrize("fn", [sleeps, swallows, awaits], ids=lambda f: f.__name__)
def test_a_call_past_the_limit_stops_naming_the_function(fn):
    start = time.monotonic()
    with pytest.raises(RewardTimeLimitError, match=rf"'{fn.__name__}' ran past task.reward_timeout_s=0.3 s"):
        scorer(fn)(["p"], ["abc"], {})
    assert time.monotonic() - start < 3


def test_a_reward_that_uses_signals_still_runs_in_the_main_thread():
    assert scorer(uses_sigalrm)(["p", "q"], ["ab", "abc"], {})[0].tolist() == [2.0, 3.0]


def test_off_the_main_thread_the_call_is_abandoned_at_the_limit():
    raised = []
    worker = threading.Thread(
        target=lambda: raised.append(pytest.raises(RewardTimeLimitError, scorer(sleeps), ["p"], ["x"], {}))
    )
    start = time.monotonic()
    worker.start()
    worker.join(10)
    assert raised and time.monotonic() - start < 3


def test_a_signal_after_the_call_ended_is_harmless():
    """The handler stays installed: a late signal must not meet the default action (end of process)."""
    scorer(uses_sigalrm)(["p"], ["x"], {})
    signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR2)
    time.sleep(0.05)


def test_a_handler_restored_by_another_library_is_set_again():
    """Lightning's fit puts back every signal's handler of before it when it ends: ours too."""
    scorer(uses_sigalrm)(["p"], ["x"], {})
    previous = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        with pytest.raises(RewardTimeLimitError):
            scorer(sleeps)(["p"], ["x"], {})
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_process_mode_and_no_limit_are_still_there():
    fns = RewardScorer.from_names({"arithmetic_exact": 1.0}, 5, process=True).rewards
    assert isinstance(fns[0].fn, IsolatedReward)
    fns[0].fn.close()
    assert not isinstance(RewardScorer.from_names({"arithmetic_exact": 1.0}).rewards[0].fn, LimitedReward)
    cfg = TrainConfig()
    cfg.task.reward_timeout_s, cfg.task.reward_process = None, True
    assert any("task.reward_process=true needs task.reward_timeout_s" in p for p in cfg.validate())
