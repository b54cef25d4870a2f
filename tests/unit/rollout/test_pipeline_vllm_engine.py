"""The pipeline's vLLM engine against stand-in servers: each token's version read from vLLM's spans, a
group's callback once its last request returns (or one failure), and the weight sync's order on every
server (pause with requests kept, push, clear the prefix cache, set the version, resume), the resume
coming even when the push fails."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace

import pytest

from grpo_lightning.rollout.engine import GenerationRequest, Sampling
from grpo_lightning.rollout.pipeline.vllm_engine import VLLMPipelineEngine
from grpo_lightning.rollout.server_guard import VLLMServerError
from grpo_lightning.rollout.vllm_generate_route import parse_choice, token_versions


@pytest.mark.parametrize("seed", range(20))
def test_each_tokens_version_is_its_span_label(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 30)
    cuts = sorted(rng.sample(range(1, n), min(rng.randint(0, 3), max(n - 1, 0)))) if n > 1 else []
    bounds = [0, *cuts, n]
    labels = sorted(rng.sample(range(0, 50), len(bounds) - 1))
    spans = [{"version": str(v), "start": a, "end": b} for v, a, b in zip(labels, bounds, bounds[1:], strict=False)]
    expected = [v for v, a, b in zip(labels, bounds, bounds[1:], strict=False) for _ in range(a, b)]
    assert token_versions(spans, n) == expected
    assert token_versions([{"version": "default", "start": 0, "end": n}], n) == [-1] * n  # never synced
    assert token_versions(None, n) == [-1] * n


def test_a_choice_becomes_a_completion_with_its_log_probs_and_versions():
    choice = {
        "token_ids": [5, 6, 2],
        "finish_reason": "stop",
        "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}, {"logprob": -0.5}]},
        "weight_versions": [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 3}],
    }
    completion = parse_choice(choice)
    assert completion.token_ids == [5, 6, 2] and completion.finished
    assert completion.logprobs == [-1.0, -2.0, -0.5] and completion.token_weight_versions == [3, 3, 4]
    assert completion.weight_version == 3  # the oldest
    choice["weight_versions"] = [{"version": "default", "start": 0, "end": 3}]  # a server never synced
    assert parse_choice(choice).versions() is None
    choice["logprobs"]["content"].pop()
    with pytest.raises(VLLMServerError, match="3 tokens with 2 log-probs"):
        parse_choice(choice)


class StandIn:
    """A VLLMServerEngine's surface: its client's calls and its push steps, recorded in one shared log."""

    def __init__(self, name: str, log: list, fail_push: bool = False, fail_request: bool = False):
        self.name, self.log, self.fail_push, self.fail_request = name, log, fail_push, fail_request
        self.config = SimpleNamespace(server=SimpleNamespace(concurrency=2))
        self.client = SimpleNamespace(call=self.call, model="policy", url=f"http://{name}")
        self.weight_version = None
        self.takes_adapters = False
        self._lock = threading.Lock()

    def call(self, method, path, what, hint="", json=None):
        if path == "/inference/v1/generate":
            if self.fail_request:
                raise VLLMServerError(f"{self.name} refused")
            seed = json["sampling_params"]["seed"]
            return {"choices": [{"token_ids": [seed], "finish_reason": "length", "logprobs": {"content": [{"logprob": -1.0}]}, "weight_versions": [{"version": "0", "start": 0, "end": 1}]}]}  # fmt: skip
        with self._lock:
            self.log.append((self.name, path))
        return {"success": True}

    def _push_with_retries(self, weights, check, commit=True):
        assert check is None and commit is False
        if self.fail_push:
            raise VLLMServerError(f"{self.name} push failed")
        self.log.append((self.name, "push"))

    def commit(self, version):
        self.log.append((self.name, f"version {version}"))

    def close(self):
        self.log.append((self.name, "close"))


def test_a_group_is_done_once_its_last_request_returns_in_request_order():
    server = StandIn("a", [])
    engine = VLLMPipelineEngine(server)
    done, failed = threading.Event(), []
    got = {}
    requests = [GenerationRequest([1, 2], seed) for seed in (11, 12, 13)]
    engine.submit(requests, Sampling(4, 1.0, 1.0, 0), lambda c: (got.update(c=c), done.set()), failed.append)
    assert done.wait(10) and not failed
    assert [c.token_ids for c in got["c"]] == [[11], [12], [13]]
    bad = VLLMPipelineEngine(StandIn("b", [], fail_request=True))
    errors, ended = [], threading.Event()
    bad.submit(
        requests,
        Sampling(4, 1.0, 1.0, 0),
        lambda c: pytest.fail("done after a failure"),
        lambda e: (errors.append(e), ended.set()),
    )
    assert ended.wait(10)
    bad._requests.shutdown(wait=True)
    assert len(errors) == 1 and "b refused" in str(errors[0])  # one failure per group, whatever fails after


def test_the_sync_pauses_pushes_clears_sets_and_resumes_every_server_in_that_order():
    log: list = []
    servers = [StandIn("a", log), StandIn("b", log)]
    engine = VLLMPipelineEngine(
        SimpleNamespace(members=servers, balance=None, weight_version=None, takes_adapters=False)
    )
    engine.load_weights([], version=3)
    for name in ("a", "b"):
        steps = [step for who, step in log if who == name]
        assert steps == [
            "/pause?mode=keep",
            "push",
            "/reset_prefix_cache?reset_running_requests=true",
            "version 3",
            "/resume",
        ]
    first_push = min(i for i, (_, step) in enumerate(log) if step == "push")
    assert all(i < first_push for i, (_, step) in enumerate(log) if step == "/pause?mode=keep")  # all paused first
    assert engine.weight_version == 3 and all(s.weight_version == 3 for s in servers)
    assert engine.clock().sync > 0

    log.clear()
    servers[1].fail_push = True
    with pytest.raises(VLLMServerError, match="b push failed"):
        engine.load_weights([], version=4)
    assert ("a", "version 4") not in log and ("b", "version 4") not in log  # no server reports it
    assert {who for who, step in log if step == "/resume"} == {"a", "b"}  # both resumed nonetheless
    assert engine.weight_version == 3
