"""The sync watchdog ends a collective that blocks: a gloo receive whose peer never sends, with
gloo's own timeout far beyond the sync's (as NCCL's effectively is), ends for the caller within
``timeout_s`` as a one-line :class:`ServerError`, and the abandoned sync cannot commit later."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from grpo_lightning.errors import ServerError
from grpo_lightning.rollout.sync_watchdog import SyncAttempt, SyncTimeout
from grpo_lightning.rollout.transports.wire import open_group


def _pair(collective_timeout_s: float):
    """Both members of a two-member gloo group, in this process (two threads rendezvous)."""
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timedelta(seconds=20), wait_for_workers=False)
    groups: dict[int, object] = {}

    def join(rank: int) -> None:
        groups[rank] = open_group(
            "gloo",
            "127.0.0.1",
            store.port,
            rank,
            collective_timeout_s,
            "watchdog-test",
            store=store if rank == 0 else None,
        )

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return groups[0], groups[1]


def test_a_receive_that_never_gets_its_peer_is_ended_within_the_timeout():
    sender, receiver = _pair(collective_timeout_s=600.0)  # gloo alone would wait ten minutes
    aborted = []
    attempt = SyncAttempt("the weight sync to version 7", timeout_s=1.0, abort=lambda: aborted.append(True))
    start = time.perf_counter()
    with pytest.raises(SyncTimeout) as caught:
        attempt.run(lambda _: receiver.recv([torch.zeros(4)], 0, 0).wait())
    elapsed = time.perf_counter() - start
    assert 0.9 < elapsed < 2.0, elapsed
    assert isinstance(caught.value, ServerError)  # the CLI prints it as one line, exit 2
    message = str(caught.value)
    assert "rollout.vllm.sync.timeout_s=1" in message and "previous weight version" in message and "\n" not in message
    assert aborted == [True] and attempt.cancelled.is_set()
    with pytest.raises(SyncTimeout, match="not committed"):
        attempt.check_not_cancelled()  # what the abandoned sync meets before its version bump
    sender.send([torch.ones(4)], 1, 0).wait()  # release the abandoned receive (no thread outlives the test)


def test_a_sync_within_its_deadline_returns_its_value_and_its_error_unchanged():
    assert SyncAttempt("x", 5.0).run(lambda attempt: 41 + (not attempt.cancelled.is_set())) == 42
    with pytest.raises(ValueError, match="half way"):
        SyncAttempt("x", 5.0).run(lambda _: (_ for _ in ()).throw(ValueError("half way")))


def test_a_failing_abort_still_raises_the_timeout():
    def boom():
        raise RuntimeError("communicator already gone")

    release = threading.Event()
    with pytest.raises(SyncTimeout, match="the abort itself failed: RuntimeError"):
        SyncAttempt("x", 0.2, abort=boom).run(lambda _: release.wait(10))
    release.set()
