"""Rollouts from a vLLM OpenAI-compatible server shared by every training rank.

Why a server: an in-process engine lives inside one training process, so with several
ranks each would need its own copy of the model and its own device. One server serves every
rank; each rank sends its own requests, one per sample with that sample's seed from
:mod:`grpo_lightning.rollout.seeding` (so F1 and F2 hold across ranks and engines: the
seeds differ per rank, step, prompt and sample, and a repeated run is identical).

``rollout.vllm.server.url`` connects to a running server; ``rollout.vllm.server.launch``
starts one as a subprocess on the policy's initial weights
(:mod:`grpo_lightning.rollout.vllm_server_process`). A launched server answers only requests
carrying a random per-run token, and is checked to be the one launched before training
(:mod:`grpo_lightning.rollout.server_guard`, :mod:`grpo_lightning.rollout.server_auth`).
Several servers behind one run (``urls``, ``replicas``): one of these engines per server, under
:class:`~grpo_lightning.rollout.vllm_server_pool.VLLMServerPool`.

**Weight sync** (:meth:`VLLMServerEngine.load_weights`, called on every rank by the
generator's ``WeightSync`` after each ``sync_every`` optimizer steps): every rank first
finishes the generations it queued and meets the others at a barrier; rank 0 pushes the
policy's weights with its transport (by default ``folder``,
:mod:`grpo_lightning.rollout.transports.folder`: a safetensors folder the server reloads with
``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": ...}}``), then
calls ``/reset_prefix_cache`` and ``/update_weight_version``; every other rank polls
``/weight_info`` until the server reports that version before its next request. The folder
must be readable by the server: the same host, or a shared file system
(``rollout.vllm.server.sync_dir``). The barrier makes async mode deterministic: no rank's
queued generation can land after the push. ``rollout.vllm.sync.transport=network`` needs no
shared disk (:mod:`grpo_lightning.rollout.transports.network`); a push runs under a watchdog,
is retried, and bumps the version only after the canary (:meth:`load_weights`); a LoRA policy
ships its adapter (:mod:`grpo_lightning.rollout.lora_adapters`). The server must run with ``VLLM_SERVER_DEV_MODE=1`` for
``/collective_rpc``; a launched server does.

**Timeouts everywhere**: every HTTP call has ``timeout_s``; a refused connection, a timeout,
an error status or an exited server process becomes :class:`VLLMServerError` naming the
server (:mod:`grpo_lightning.rollout.vllm_server_client`) (and, from the generator, the step and rank), never a hang.

Each completion carries the weight version that produced it: the version in force when the
engine's worker thread ran its generation (``rollout/weight_version_lag``).

**Images** (a vision-language policy): a prompt with images goes token in, token out to
``/inference/v1/generate`` with its images as content parts, and the server's expansion of them
must give the trainer's prompt ids (:mod:`grpo_lightning.rollout.vllm_vision`); text prompts go to
``/v1/completions`` as above. A launched server gets the policy's weights under vLLM's names and its
processor; every sync also resets the server's encoder cache.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

import grpo_lightning.rollout.server_guard as server_guard
from grpo_lightning.config import VLLMConfig
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.engine import Completion, EngineError, GenerationRequest, Sampling
from grpo_lightning.rollout.lora_adapters import LoraServing, ServedAdapters, adapter_name
from grpo_lightning.rollout.server_guard import VLLMServerError
from grpo_lightning.rollout.sync_watchdog import SyncAttempt
from grpo_lightning.rollout.temp_folders import owned_temp_dir
from grpo_lightning.rollout.transports import make_transport
from grpo_lightning.rollout.vllm_generate_route import GENERATE, SCALE_OUT_HINT, parse_choice
from grpo_lightning.rollout.vllm_server_client import ServerClient
from grpo_lightning.rollout.vllm_server_process import SERVED_NAME, VLLMServer, base_url, launch_shared, rank
from grpo_lightning.rollout.vllm_vision import EngineVision, checked_prompt
from grpo_lightning.rollout.weight_sync import WeightSyncError

_RPC_HINT = " (a server started by hand needs VLLM_SERVER_DEV_MODE=1 for /collective_rpc)"

__all__ = ["QueuedGeneration", "ServerClient", "VLLMServer", "VLLMServerEngine", "VLLMServerError"]


def sampling_params(sampling: Sampling, seed: int) -> dict:
    """A request's sampling settings as vLLM's HTTP routes take them: its seed, the sampled log-probs, one sample."""
    return {
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else 0,
        "seed": seed,
        "logprobs": 0,
        "n": 1,
    }


class QueuedGeneration:
    """What engines on servers share: calls queue on ``_worker`` (one thread: a weight sync waits
    behind the generations queued before it), their requests run on ``_requests`` through ``_one``,
    each completion carries the ``weight_version`` in force when it ran; a sync (``_synced``) starts
    once every rank's queued generations are done."""

    verifies_before_commit = True  # load_weights(check=...) runs the canary before the version bump

    def generate(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        return self.generate_async(requests, sampling).result()

    def generate_async(self, requests: list[GenerationRequest], sampling: Sampling) -> Future:
        """Queue a generation behind every call submitted before it (sync included)."""
        timing: dict[str, float] = {}
        future = self._worker.submit(self._timed_generate, list(requests), sampling, timing)
        future.timing = timing
        return future

    def _timed_generate(self, requests, sampling, timing: dict[str, float]) -> list[Completion]:
        start, version = time.perf_counter(), self.weight_version
        futures = [self._requests.submit(self._one, request, sampling) for request in requests]
        completions = [f.result() for f in futures]
        for completion in completions:
            completion.weight_version = version
        timing["seconds"] = time.perf_counter() - start
        return completions

    def load_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        version: int | None = None,
        check=None,
        adapter_config: dict | None = None,
    ) -> float:
        """Every rank: finish queued generations, meet at a barrier, then :meth:`_synced`; returns the
        seconds this rank spent."""
        start = time.perf_counter()
        version = (self.weight_version or 0) + 1 if version is None else version
        self._worker.submit(lambda: None).result()  # this rank's queued generations are done
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # ... and every other rank's
        self._synced(PolicyWeights(list(named_tensors), version, adapter_config=adapter_config), check)
        self.weight_version = version
        return time.perf_counter() - start


class VLLMServerEngine(QueuedGeneration):
    """A :class:`RolloutEngine` whose samples come from a vLLM server (see the module docstring)."""

    owns_weights = True  # the trainer pushes every update (load_weights)
    supports_async = True  # requests run on a thread pool

    def __init__(
        self,
        config: VLLMConfig,
        url: str,
        eos_token_id: int | None = None,
        server: VLLMServer | None = None,
        token: str | None = None,
        transport: str | None = None,
        lora: LoraServing | None = None,
        vision: EngineVision | None = None,
    ):
        """``vision``: a vision-language policy's (its prompts' images go with them, vllm_vision.py)."""
        self.config = config  # rollout.vllm; its server group says how to reach and wait for the server
        self.vision = vision
        s = config.server
        self.server = server
        self.eos_token_id = eos_token_id
        self.transport = make_transport(transport or config.sync.transport, config.sync)
        self.client = ServerClient(
            url,
            s.timeout_s,
            s.concurrency,
            why_gone=server.exited if server is not None else (lambda: None),
            token=token,
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-server-engine")
        self._requests = ThreadPoolExecutor(max_workers=s.concurrency, thread_name_prefix="vllm-server-request")
        self._sync_dir = None if s.sync_dir else owned_temp_dir("vllm-sync")
        self.weight_version: int | None = None  # what the server holds, as this rank knows it
        self.takes_adapters = lora is not None  # adapter-only sync (lora_adapters.py)
        self._adapters = ServedAdapters(lora.slots) if lora is not None else None
        self.start_seconds = 0.0

    @classmethod
    def from_policy(
        cls, policy, tokenizer, config: VLLMConfig, seed: int, lora: LoraServing | None = None
    ) -> VLLMServerEngine:
        """Connect to ``config.server.url``, or (``launch``) start a server on ``policy``'s weights.

        With several ranks only rank 0 launches; the others get its address and token from it
        and wait until it is healthy. A launched server must prove it is ours before training.
        ``lora``: sync LoRA adapters only (a launched server starts with ``--enable-lora``).
        """
        s = config.server
        server, port, token = None, None, server_guard.api_key_from_env(s.api_key_env)
        if s.launch:
            server, port, token = launch_shared(policy, tokenizer, config, seed, lora)
        vision = EngineVision.of(policy)
        return cls.connect(config, base_url(s, port), tokenizer.eos_token_id, server, token, lora, vision)

    @classmethod
    def connect(
        cls, config: VLLMConfig, url: str, eos_token_id, server=None, token=None, lora=None, vision=None
    ) -> VLLMServerEngine:
        """An engine on the server at ``url`` once it is up (a launched one must prove it is ours);
        ``server``: the one this rank launched there, stopped with the engine."""
        engine = cls(config, url, eos_token_id, server, token=token, lora=lora, vision=vision)
        try:
            engine.start_seconds = engine._wait_until_up()
            if config.server.launch:
                pid = server.process.pid if server is not None else None
                server_guard.verify_identity(engine.client, token, SERVED_NAME, pid)
            engine.client.model = engine.client.served_model()
        except BaseException:
            engine.close()
            raise
        return engine

    def _wait_until_up(self) -> float:
        if self.server is not None:
            return self.server.wait_healthy(self.client)
        if self.config.server.launch:  # rank 0 launched it a moment ago: it may not listen yet
            return self.client.wait_up(rank(), starting_s=self.config.server.start_timeout_s)
        return self.client.wait_up(rank())

    # ------------------------------------------------------------------ generation
    def _one(self, request: GenerationRequest, sampling: Sampling) -> Completion:
        if request.vision is not None and request.vision.num_images:
            return self._one_with_images(request, sampling)
        body = {"model": self.client.model, "prompt": list(request.prompt_ids), "return_token_ids": True}
        body.update(sampling_params(sampling, request.seed))
        choice = self.client.call("POST", "/v1/completions", "a generation request", json=body)["choices"][0]
        tokens = list(choice["token_ids"])
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        return Completion(token_ids=tokens, finished=choice["finish_reason"] == "stop", logprobs=logprobs)

    def _one_with_images(self, request: GenerationRequest, sampling: Sampling) -> Completion:
        """A prompt with images: token in, token out on ``/inference/v1/generate``, the images as content
        parts; the prompt ids the server expanded must be the trainer's (vllm_vision.py)."""
        if self.vision is None:
            raise EngineError("a prompt with images reached the vLLM server engine of a text policy")
        body = {
            "model": self.client.model,
            **self.vision.server_prompt(request),
            "sampling_params": sampling_params(sampling, request.seed),
            "return_token_ids": True,  # the prompt ids after the server's expansion of the images
        }
        answer = self.client.call("POST", GENERATE, "a generation request with images", hint=SCALE_OUT_HINT, json=body)
        completion = parse_choice(answer["choices"][0])
        completion.token_weight_versions = None  # one version per generation here, as for text prompts
        return checked_prompt(request, answer.get("prompt_token_ids") or [], completion)

    # ------------------------------------------------------------------ scoring
    def sequence_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """The server's log-probs (temperature 1) of ``completion_ids`` after ``prompt_ids``."""
        sequence = list(prompt_ids) + list(completion_ids)
        body = {
            "model": self.client.model,
            "prompt": sequence,
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
            "seed": 0,
            "n": 1,
        }
        choice = self.client.call("POST", "/v1/completions", "a probe scoring request", json=body)["choices"][0]
        scored = choice["prompt_logprobs"]
        return [float(scored[i][str(sequence[i])]["logprob"]) for i in range(len(prompt_ids), len(sequence))]

    # ------------------------------------------------------------------ weights
    def _synced(self, weights: PolicyWeights, check) -> None:
        """Rank 0 pushes (under the sync watchdog, retried on failure); the others wait until the
        server reports the version. ``check`` (the canary) runs after the push and before the
        server's version is bumped, so a failed, partial or wrong sync never shows as the new
        version. With ``adapter_config`` the tensors are a LoRA adapter, loaded under a name of its
        own that generations then use."""
        self.after_barrier(weights, check)

    def after_barrier(self, weights: PolicyWeights, check, commit: bool = True) -> None:
        """Rank 0 pushes ``weights`` (``commit=False``: all but the version bump, :meth:`commit`);
        every other rank waits until the server holds that version (and checks the canary)."""
        if rank() == 0:
            self._push_with_retries(weights, check, commit)
            return
        self._wait_for_version(weights.version)
        if weights.adapter_config is not None:
            self.client.model = adapter_name(weights.version)
        # Rank 0 checked this very state before the bump. With adapters the other ranks do not
        # repeat it: vLLM (0.32, CPU) fails a prompt_logprobs request batched with other LoRA
        # requests (an einsum shape error that kills its engine core).
        elif check is not None:
            check(self)

    def _push_with_retries(self, weights: PolicyWeights, check, commit: bool = True) -> None:
        s, version = self.config.sync, weights.version
        for attempt in range(1, s.retries + 2):
            what = f"the weight sync to version {version} (attempt {attempt} of {s.retries + 1})"
            try:
                SyncAttempt(what, s.timeout_s, getattr(self.transport, "abort", None)).run(
                    lambda sync: self._push(weights, check, sync, commit)
                )
                return
            except WeightSyncError:
                raise  # the canary disagrees: pushing the same weights again cannot fix that
            except Exception as err:
                if attempt > s.retries:
                    if isinstance(err, VLLMServerError):
                        raise
                    raise VLLMServerError(f"{what} to {self.client.url} failed: {type(err).__name__}: {err}") from err
                warnings.warn(f"{what} failed ({type(err).__name__}: {err}); retrying", stacklevel=2)

    def _push(self, weights: PolicyWeights, check, sync: SyncAttempt, commit: bool = True) -> None:
        previous = self.client.model
        if weights.adapter_config is None:
            self.transport.push(weights, self)
        else:
            self.client.model = self._adapters.load(self.client, self.transport, weights, self)
        try:
            self.client.call("POST", "/reset_prefix_cache", "the prefix-cache reset")
            if self.vision is not None:  # image embeddings are cached by image: made by the old tower
                self.client.call("POST", "/reset_encoder_cache", "the encoder-cache reset", hint=_RPC_HINT)
            if check is not None:
                check(self)
            sync.check_not_cancelled()  # a push that outlived its deadline commits nothing
            if commit:
                self.commit(weights.version)
        except BaseException:
            self.client.model = previous  # generations stay on the adapter the version names
            raise

    def commit(self, version: int) -> None:
        """The last step of a push: the server reports ``version`` (old adapters unloaded first)."""
        if self._adapters is not None:  # before the bump: no other rank's request overlaps an unload
            self._adapters.evict(self.client, self.transport, self)
        self.client.call(
            "POST", "/update_weight_version", "the weight version update", json={"new_version": str(version)}
        )

    def worker_call(self, method: str, what: str, spec: dict) -> list:
        """``method`` of every vLLM worker (a worker extension's) with ``spec`` as one JSON string."""
        body = {"method": method, "args": [json.dumps(spec)], "timeout": self.config.sync.timeout_s}
        return self.client.call("POST", "/collective_rpc", what, json=body, hint=_RPC_HINT)["results"]

    def reload_weights(self, **source) -> None:
        """The server's ``reload_weights`` (what a transport calls): from a folder it can read."""
        if "weights_iterator" in source:
            raise EngineError("a vLLM server cannot take tensors in memory: use a folder (or network) transport")
        self.client.call(
            "POST",
            "/collective_rpc",
            "the weight reload",
            json={"method": "reload_weights", "kwargs": source},
            hint=_RPC_HINT,
        )

    def sync_folder(self) -> str:
        """``rollout.vllm.server.sync_dir``, or a temporary folder (a server on this host)."""
        return self.config.server.sync_dir or self._sync_dir.name

    def _wait_for_version(self, version: int) -> None:
        s = self.config.sync  # rank 0's every attempt, and a little more
        timeout = min(self.config.server.timeout_s, (s.retries + 1) * s.timeout_s + 2.0)
        deadline = time.perf_counter() + timeout
        while True:
            held = self.client.call("GET", "/weight_info", "GET /weight_info")["weight_version"]
            if held == str(version):
                return
            if time.perf_counter() > deadline:
                raise VLLMServerError(
                    f"rank {rank()} waited {timeout:g} s (rollout.vllm.sync.timeout_s x attempts) for the vLLM "
                    f"server {self.client.url} to hold weight version {version} (rank 0 pushes it); it holds {held!r}: "
                    f"rank 0's sync failed or hangs (see its error)"
                )
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the worker threads, the client, and a server this engine launched (no orphans)."""
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._requests.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        if hasattr(self.transport, "close"):
            self.transport.close()
        if self.server is not None:
            self.server.stop()
        if self._sync_dir is not None:
            self._sync_dir.cleanup()
