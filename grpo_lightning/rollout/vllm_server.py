"""Rollouts from a vLLM OpenAI-compatible server shared by every training rank.

Why a server: an in-process engine lives inside one training process, so with several
ranks each would need its own copy of the model and its own device. One server serves every
rank; each rank sends its own requests, one per sample with that sample's seed from
:mod:`grpo_lightning.rollout.seeding` (so F1 and F2 hold across ranks and engines: the
seeds differ per rank, step, prompt and sample, and a repeated run is identical).

``rollout.vllm.server.url`` connects to a running server; ``rollout.vllm.server.launch``
starts one as a subprocess on the policy's initial weights (:class:`VLLMServer`): it waits
until ``/health`` answers, with a progress message, and stops it (the whole process group)
at the end, on failure, or when the trainer process dies (``PR_SET_PDEATHSIG``); its
temporary folders go with it. A launched server answers only requests carrying a random
per-run token, and is checked to be the one launched before training
(:mod:`grpo_lightning.rollout.server_guard`, :mod:`grpo_lightning.rollout.server_auth`).

**Weight sync** (:meth:`VLLMServerEngine.load_weights`, called on every rank by the
generator's ``WeightSync`` after each ``sync_every`` optimizer steps): every rank first
finishes the generations it queued and meets the others at a barrier; rank 0 writes the
policy's weights as a safetensors folder and has the server reload them
(``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": ...}}``, then
``/reset_prefix_cache`` and ``/update_weight_version``); every other rank polls
``/weight_info`` until the server reports that version before its next request. The folder
must be readable by the server: the same host, or a shared file system
(``rollout.vllm.server.sync_dir``). The barrier makes async mode deterministic: no rank's
queued generation can land after the push. (vLLM's NCCL weight-transfer endpoints,
``/init_weight_transfer_engine`` and ``/update_weights``, avoid the file system on GPUs; they
are not used here.) The server must run with ``VLLM_SERVER_DEV_MODE=1`` for
``/collective_rpc``; a launched server does.

**Timeouts everywhere**: every HTTP call has ``timeout_s``; a refused connection, a timeout,
an error status or an exited server process becomes :class:`VLLMServerError` naming the
server (and, from the generator, the step and rank), never a hang.

Each completion carries the weight version that produced it: the version in force when the
engine's worker thread ran its generation (``rollout/weight_version_lag``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from grpo_lightning.models.lora import save_merged
from grpo_lightning.rollout import server_auth, server_guard
from grpo_lightning.rollout.engine import Completion, GenerationRequest, SamplingSettings
from grpo_lightning.rollout.server_guard import VLLMServerError

SERVED_NAME = "policy"  # --served-model-name of a launched server


@dataclass(frozen=True)
class ServerSettings:
    """Mirrors ``rollout.vllm.server`` (see its help text) plus the launch options of ``rollout.vllm``."""

    url: str | None = None
    launch: bool = False
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port chosen at launch
    allow_remote: bool = False
    api_key_env: str | None = None
    timeout_s: float = 300.0
    start_timeout_s: float = 300.0
    concurrency: int = 64
    sync_dir: str | None = None
    dtype: str = "float32"
    max_model_len: int | None = None
    kv_cache_gib: float = 1.0
    enforce_eager: bool = True
    seed: int = 0

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        return (self.url or f"http://{host}:{self.port}").rstrip("/")


def save_weights_folder(named_tensors, folder: str) -> str:
    """Write ``named_tensors`` as ``folder/model.safetensors`` for vLLM to reload.

    Tensors that share memory (tied input and output embeddings, as in SmolLM2) are written
    as copies: safetensors refuses shared tensors, and vLLM reads each name it needs.
    """
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors = {}
    for name, tensor in named_tensors:
        tensor = tensor.detach().cpu().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    Path(folder).mkdir(parents=True, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    return folder


def _rank() -> int:
    return (
        torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0
    )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGTERM when the trainer process dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class VLLMServer:
    """A ``vllm`` OpenAI-compatible server in a subprocess, on a saved copy of the policy, that
    answers only requests carrying :attr:`token` (given to it in the environment, never in argv)."""

    def __init__(self, policy, tokenizer, settings: ServerSettings):
        server_guard.check_bind_host(settings.host, settings.allow_remote)
        settings = replace(settings, port=server_guard.launch_port(settings.host, settings.port))
        self.settings = settings
        self.url = settings.base_url
        self.token = server_guard.new_token()
        self._model_dir = tempfile.TemporaryDirectory(prefix="grpo-vllm-server-model-")
        save_merged(policy, self._model_dir.name, tokenizer)  # a LoRA policy: its merged weights
        self.log_path = Path(self._model_dir.name) / "server.log"
        s = settings
        command = [
            sys.executable,
            "-P",  # the script's folder (this package's rollout/) stays off sys.path: it would shadow vllm
            server_auth.__file__,
            "--model",
            self._model_dir.name,
            "--served-model-name",
            SERVED_NAME,
            "--host",
            s.host,
            "--port",
            str(s.port),
            "--dtype",
            s.dtype,
            "--seed",
            str(s.seed),
            "--logprobs-mode",
            "processed_logprobs",
            "--kv-cache-memory-bytes",
            str(int(s.kv_cache_gib * 2**30)),
        ]
        if s.enforce_eager:
            command.append("--enforce-eager")
        if s.max_model_len is not None:
            command += ["--max-model-len", str(s.max_model_len)]
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", server_auth.TOKEN_ENV: self.token}
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        # Stopped at interpreter exit too, if nobody called stop().
        self._finalizer = weakref.finalize(self, VLLMServer._terminate, self.process, self._log, self._model_dir)

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_healthy(self, client) -> float:
        """Poll ``/health`` until it answers 200; returns the seconds it took (progress on stderr)."""
        start, deadline, last_note = time.perf_counter(), time.perf_counter() + self.settings.start_timeout_s, 0.0
        print(
            f"[grpo_lightning] starting the vLLM server at {self.url} (log: {self.log_path}) ...",
            file=sys.stderr,
            flush=True,
        )
        while time.perf_counter() < deadline:
            if self.process.poll() is not None:
                raise VLLMServerError(
                    f"the vLLM server launched at {self.url} exited with code {self.process.returncode} while "
                    f"starting; last lines of its log {self.log_path}:\n{self.log_tail()}"
                )
            if client.healthy():
                elapsed = time.perf_counter() - start
                print(f"[grpo_lightning] vLLM server healthy after {elapsed:.0f} s", file=sys.stderr, flush=True)
                return elapsed
            if time.perf_counter() - last_note > 15:
                last_note = time.perf_counter()
                print(
                    f"[grpo_lightning] waiting for the vLLM server ({last_note - start:.0f} s) ...",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(0.5)
        self.stop()
        raise VLLMServerError(
            f"the vLLM server launched at {self.url} was not healthy after rollout.vllm.server.start_timeout_s="
            f"{self.settings.start_timeout_s:g} s; last lines of its log:\n{self.log_tail()}"
        )

    def exited(self) -> str | None:
        """Why the server is gone, or None while it runs."""
        code = self.process.poll()
        return None if code is None else f"the launched server process exited with code {code}"

    def stop(self) -> None:
        self._finalizer()

    @staticmethod
    def _terminate(process: subprocess.Popen, log, model_dir: tempfile.TemporaryDirectory) -> None:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=30)
        log.close()
        model_dir.cleanup()


class ServerClient:
    """HTTP calls to the server, each bounded by ``timeout_s``, failures as :class:`VLLMServerError`."""

    def __init__(self, url: str, timeout_s: float, concurrency: int, why_gone=lambda: None, token: str | None = None):
        import httpx

        self.url = url
        self.timeout_s = timeout_s
        # Idle connections are dropped after 2 s, before the server's own keep-alive timeout
        # (uvicorn: 5 s) can close one under a request we are about to send on it.
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=2.0)
        headers = {"Authorization": f"Bearer {token}"} if token else None  # every request carries it
        self._http = httpx.Client(base_url=url, timeout=timeout_s, limits=limits, headers=headers)
        self._why_gone = why_gone  # a launched server's exit status, if it exited
        self.model = SERVED_NAME

    def healthy(self) -> bool:
        import httpx

        try:
            return self._http.get("/health", timeout=min(self.timeout_s, 5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    def call(self, method: str, path: str, what: str, hint: str = "", **kwargs):
        """One request; ``hint`` is added when the server answers with an error status."""
        import httpx

        try:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.RemoteProtocolError:
                # The server closed a pooled keep-alive connection as we reused it: the request
                # never ran. Once more on a fresh connection (requests are seeded: harmless).
                response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as err:
            raise VLLMServerError(
                f"the vLLM server {self.url} did not answer {what} within rollout.vllm.server.timeout_s="
                f"{self.timeout_s:g} s ({type(err).__name__}){self._gone()}"
            ) from err
        except httpx.HTTPError as err:
            raise VLLMServerError(
                f"the vLLM server {self.url} failed {what}: {type(err).__name__}: {err}{self._gone()}"
            ) from err
        if response.status_code != 200:
            raise VLLMServerError(
                f"the vLLM server {self.url} answered {what} with HTTP {response.status_code}: "
                f"{response.text[:500]}{hint}"
            )
        return response.json()

    def _gone(self) -> str:
        why = self._why_gone()
        return f"; {why}" if why else ""

    def served_model(self) -> str:
        models = self.call("GET", "/v1/models", "GET /v1/models")["data"]
        return models[0]["id"]

    def close(self) -> None:
        self._http.close()


def _launch_shared(policy, tokenizer, settings: ServerSettings):
    """Rank 0 launches; every rank gets the server's port and token from it (or its failure).

    Returns ``(server or None, settings with the port, token)``."""
    server, failure = None, None
    if _rank() == 0:
        try:
            server = VLLMServer(policy, tokenizer, settings)
        except Exception as err:  # noqa: BLE001 - the other ranks must hear of it, not wait in the broadcast
            failure = err
    shared = [{"port": server.settings.port, "token": server.token} if server else {"failure": str(failure)}]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(shared, src=0)
    if failure is not None:
        raise failure
    if "failure" in shared[0]:
        raise VLLMServerError(f"rank 0 could not launch the vLLM server: {shared[0]['failure']}")
    return server, replace(settings, port=shared[0]["port"]), shared[0]["token"]


class VLLMServerEngine:
    """A :class:`RolloutEngine` whose samples come from a vLLM server (see the module docstring)."""

    owns_weights = True  # the trainer pushes every update (load_weights)
    supports_async = True  # requests run on a thread pool

    def __init__(
        self,
        settings: ServerSettings,
        eos_token_id: int | None = None,
        server: VLLMServer | None = None,
        token: str | None = None,
    ):
        self.settings = settings
        self.server = server
        self.eos_token_id = eos_token_id
        self.client = ServerClient(
            settings.base_url,
            settings.timeout_s,
            settings.concurrency,
            why_gone=server.exited if server is not None else (lambda: None),
            token=token,
        )
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-server-engine")
        self._requests = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="vllm-server-request")
        self._sync_dir = None if settings.sync_dir else tempfile.TemporaryDirectory(prefix="grpo-vllm-sync-")
        self.weight_version: int | None = None  # what the server holds, as this rank knows it
        self.start_seconds = 0.0

    @classmethod
    def from_policy(cls, policy, tokenizer, settings: ServerSettings) -> VLLMServerEngine:
        """Connect to ``settings.url``, or (``launch``) start a server on ``policy``'s weights.

        With several ranks only rank 0 launches; the others get its address and token from it
        and wait until it is healthy. A launched server must prove it is ours before training.
        """
        server, token = None, server_guard.api_key_from_env(settings.api_key_env)
        if settings.launch:
            server, settings, token = _launch_shared(policy, tokenizer, settings)
        engine = cls(settings, tokenizer.eos_token_id, server, token=token)
        try:
            engine.start_seconds = engine._wait_until_up()
            if settings.launch:
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
        start = time.perf_counter()
        deadline = start + (self.settings.start_timeout_s if self.settings.launch else self.settings.timeout_s)
        while not self.client.healthy():
            if time.perf_counter() > deadline:
                raise VLLMServerError(
                    f"no healthy vLLM server at {self.client.url} (rank {_rank()}): start one "
                    f"(rollout.vllm.server.launch=true) or check rollout.vllm.server.url"
                )
            time.sleep(0.5)
        return time.perf_counter() - start

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[GenerationRequest], sampling: SamplingSettings) -> list[Completion]:
        return self.generate_async(requests, sampling).result()

    def generate_async(self, requests: list[GenerationRequest], sampling: SamplingSettings) -> Future:
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

    def _one(self, request: GenerationRequest, sampling: SamplingSettings) -> Completion:
        body = {
            "model": self.client.model,
            "prompt": list(request.prompt_ids),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else 0,
            "seed": request.seed,
            "logprobs": 0,
            "return_token_ids": True,
            "n": 1,
        }
        choice = self.client.call("POST", "/v1/completions", "a generation request", json=body)["choices"][0]
        tokens = list(choice["token_ids"])
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        return Completion(token_ids=tokens, finished=choice["finish_reason"] == "stop", logprobs=logprobs)

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
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> float:
        """Every rank: finish queued generations, meet at a barrier; rank 0 pushes ``version``,
        the others wait until the server reports it. Returns the seconds this rank spent."""
        start = time.perf_counter()
        version = (self.weight_version or 0) + 1 if version is None else version
        self._worker.submit(lambda: None).result()  # this rank's queued generations are done
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.barrier()  # ... and every other rank's
        if _rank() == 0:
            self._push(named_tensors, version)
        else:
            self._wait_for_version(version)
        self.weight_version = version
        return time.perf_counter() - start

    def _push(self, named_tensors, version: int) -> None:
        folder = save_weights_folder(named_tensors, self.settings.sync_dir or self._sync_dir.name)
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": folder}}
        self.client.call(
            "POST",
            "/collective_rpc",
            "the weight reload",
            json=rpc,
            hint=" (a server started by hand needs VLLM_SERVER_DEV_MODE=1 for /collective_rpc)",
        )
        self.client.call("POST", "/reset_prefix_cache", "the prefix-cache reset")
        self.client.call(
            "POST", "/update_weight_version", "the weight version update", json={"new_version": str(version)}
        )

    def _wait_for_version(self, version: int) -> None:
        deadline = time.perf_counter() + self.settings.timeout_s
        while True:
            held = self.client.call("GET", "/weight_info", "GET /weight_info")["weight_version"]
            if held == str(version):
                return
            if time.perf_counter() > deadline:
                raise VLLMServerError(
                    f"rank {_rank()} waited rollout.vllm.server.timeout_s={self.settings.timeout_s:g} s for the "
                    f"vLLM server {self.client.url} to hold weight version {version} (rank 0 pushes it); it holds {held!r}"
                )
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the worker threads, the client, and a server this engine launched (no orphans)."""
        self._worker.shutdown(wait=False, cancel_futures=True)
        self._requests.shutdown(wait=False, cancel_futures=True)
        self.client.close()
        if self.server is not None:
            self.server.stop()
        if self._sync_dir is not None:
            self._sync_dir.cleanup()
