"""The engine processes' watchdog (rollout/child_watchdog.py): the pipe's end without a word (the
trainer died) stops the watched processes; a release leaves them alone."""

from __future__ import annotations

import subprocess
import sys

import psutil

from grpo_lightning.rollout.child_watchdog import descendants, watch

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
# Says "ready" once SIGTERM is ignored: signalled before that, it would die of SIGTERM (a loaded machine).
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)",
]


def test_the_pipe_closing_unreleased_stops_each_process_even_one_that_ignores_sigterm():
    before = descendants()
    children = [subprocess.Popen(SLEEPER), subprocess.Popen(STUBBORN, stdout=subprocess.PIPE, text=True)]
    assert children[1].stdout.readline() == "ready\n"
    pids = descendants() - before
    assert pids == {c.pid for c in children}
    dog = watch(pids, grace_s=0.5)
    dog.process.stdin.close()  # what the kernel does when the trainer dies, however it dies
    assert dog.process.wait(30) == 0
    for child in children:
        assert child.wait(5) is not None  # gone: the second only by the SIGKILL after the grace
    assert children[1].returncode == -9 and children[0].returncode == -15
    children[1].stdout.close()


def test_a_released_watchdog_exits_and_signals_nothing():
    child = subprocess.Popen(SLEEPER)
    dog = watch({child.pid}, grace_s=0.5)
    dog.release()
    assert dog.process.returncode == 0 and psutil.Process(child.pid).is_running() and child.poll() is None
    child.kill()
    child.wait()
    assert watch(set()) is None  # nothing to watch: no process started
