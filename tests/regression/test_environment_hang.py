"""An environment step that hangs (issue 46, silent failure 5 and the default limits): the step
times out by default, naming the environment, and the abandoned thread never keeps the process
from exiting (a ThreadPoolExecutor worker is joined at interpreter exit: it did, forever)."""

from __future__ import annotations

import concurrent.futures.thread as executor_threads
import sys
import threading
import time

from grpo_lightning.environments.base import Reset
from grpo_lightning.environments.episode import EpisodeRunner
from grpo_lightning.environments.limits import STEP_TIMEOUT, STEP_TIMEOUT_S, EpisodeLimits, EpisodeTaskConfig
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.rollout.engine import Sampling
from tests.helpers.episodes import FakeEngine, chatml_tokenizer

TOKENIZER = chatml_tokenizer()


def runner(make_env, env_name: str, step_timeout_s: float, max_turns: int = 2) -> EpisodeRunner:
    return EpisodeRunner(
        FakeEngine(len(TOKENIZER), TOKENIZER.eos_token_id),
        ChatRenderer(TOKENIZER),
        make_env,
        EpisodeLimits(max_turns=max_turns, max_turn_tokens=4, context=200, step_timeout_s=step_timeout_s),
        Sampling(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0),
        env_name=env_name,
    )


class Hangs:
    """Its step blocks until ``release`` is set (the test sets it at the end, so no thread leaks)."""

    release = threading.Event()

    def reset(self, seed, row):
        return Reset(messages=[{"role": "user", "content": "go"}])

    def step(self, turn):
        Hangs.release.wait()

    def close(self):
        pass


def threads_in(function_name: str) -> list[threading.Thread]:
    """The live threads whose stack is inside ``function_name`` right now."""
    frames = sys._current_frames()
    found = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident)
        while frame is not None and frame.f_code.co_name != function_name:
            frame = frame.f_back
        if frame is not None and frame.f_globals.get("__name__") == __name__:
            found.append(thread)
    return found


def test_an_abandoned_environment_step_never_keeps_the_process_from_exiting():
    """Interpreter exit joins every non-daemon thread and every ThreadPoolExecutor worker: an abandoned
    step in either kept a finished run, or one stopped by two SIGTERMs, alive forever."""
    registered = set(executor_threads._threads_queues)  # the workers concurrent.futures joins at exit
    try:
        episodes = runner(lambda row: Hangs(), "hangs", step_timeout_s=0.2).run([{"prompt": "p"}] * 2, [0, 0], [1, 2])
        assert [e.stop_reason for e in episodes] == [STEP_TIMEOUT] * 2
        hung = threads_in("step")
        assert len(hung) == 2, "the abandoned steps are still running (a thread cannot be stopped)"
        assert all(thread.daemon for thread in hung), [t.name for t in hung]
        assert not set(executor_threads._threads_queues) - registered
    finally:
        Hangs.release.set()


def test_an_environment_step_has_a_time_limit_by_default():
    assert EpisodeTaskConfig().step_timeout_s == STEP_TIMEOUT_S == EpisodeLimits().step_timeout_s
    assert 0 < STEP_TIMEOUT_S <= 300
    help_text = EpisodeTaskConfig.__dataclass_fields__["step_timeout_s"].metadata
    assert f"default {STEP_TIMEOUT_S:g}" in str(help_text)


def test_a_step_timeout_names_the_environment_and_the_limit():
    done = threading.Event()

    class Slow(Hangs):
        def reset(self, seed, row):
            done.wait(5)
            return super().reset(seed, row)

    start = time.monotonic()
    try:
        (episode,) = runner(lambda row: Slow(), "slowpoke", step_timeout_s=0.1).run([{"prompt": "p"}], [0], [1])
    finally:
        done.set()
    assert time.monotonic() - start < 3
    assert episode.stop_reason == STEP_TIMEOUT
    assert episode.error == (
        "environment 'slowpoke': reset() took over task.step_timeout_s=0.1 s (abandoned, still running)"
    )
