"""A launched vLLM server: the subprocess on a saved copy of the policy, and its hand-over to every rank.

:class:`VLLMServer` starts ``vllm serve`` through :mod:`grpo_lightning.rollout.server_auth` (a
stdlib-only launcher run with ``python -P``, so this folder never shadows ``vllm``), waits until
``/health`` answers, and stops it (the whole process group) at the end, on failure, or when the
trainer process dies (``PR_SET_PDEATHSIG``); its temporary folders go with it. The server answers
only requests carrying a random per-run token, given to it in the environment, never in argv.
:func:`launch_shared` has rank 0 launch and gives every rank the port and token (or the failure).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import torch

import grpo_lightning.rollout.server_auth as server_auth
import grpo_lightning.rollout.server_guard as server_guard
from grpo_lightning.config import VLLMConfig, VLLMServerConfig
from grpo_lightning.models.adapter_sync import base_state
from grpo_lightning.models.lora import save_merged
from grpo_lightning.rollout.server_guard import VLLMServerError
from grpo_lightning.rollout.temp_folders import holds_socket_names, owned_temp_dir
from grpo_lightning.rollout.vllm_cpu_steps import cpu_step_tokens
from grpo_lightning.rollout.vllm_vision import is_vision_policy, server_plugin_env, write_engine_weights

SERVED_NAME = "policy"  # --served-model-name of a launched server


def base_url(server: VLLMServerConfig, port: int | None = None) -> str:
    """``server.url``, or the address a launched server listens on (``port``: the one it got)."""
    host = f"[{server.host}]" if ":" in server.host else server.host  # an IPv6 address
    return (server.url or f"http://{host}:{server.port if port is None else port}").rstrip("/")


def rank() -> int:
    return (
        torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0
    )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the server gets SIGTERM when the trainer process dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _command(
    model_dir: str, config: VLLMConfig, port: int, seed: int, lora=None, vision: bool = False, cpu: bool = False
) -> list[str]:
    """The server's command line; ``cpu``: it will run on this machine's CPU (no CUDA device here)."""
    s = config.server
    command = [
        sys.executable,
        "-P",  # the script's folder (this package's rollout/) stays off sys.path: it would shadow vllm
        server_auth.__file__,
        "--model",
        model_dir,
        "--served-model-name",
        SERVED_NAME,
        "--host",
        s.host,
        "--port",
        str(port),
        "--dtype",
        config.dtype,
        "--seed",
        str(seed),
        "--logprobs-mode",
        "processed_logprobs",
        "--kv-cache-memory-bytes",
        str(int(config.kv_cache_gib * 2**30)),
        "--worker-extension-cls",  # the receiving end of the network weight transport
        "grpo_lightning.rollout.transports.network_receiver.NetworkWeightReceiver",
        "--enable-scale-out",  # /inference/v1/generate: tokens in and out with each token's weight version
    ]
    if config.enforce_eager:
        command.append("--enforce-eager")
    if config.max_model_len is not None:
        command += ["--max-model-len", str(config.max_model_len)]
    if cpu:  # never a prefill split across steps: vllm_cpu_steps.py says why
        steps = cpu_step_tokens(model_dir, config.max_model_len, config.max_num_batched_tokens)
        command += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(steps)]
    elif config.max_num_batched_tokens is not None:
        command += ["--max-num-batched-tokens", str(config.max_num_batched_tokens)]
    if lora is not None:  # adapter-only sync (rollout/lora_adapters.py)
        command += lora.server_args()
    if vision:  # a vision-language policy: images per prompt, as in process
        command += ["--limit-mm-per-prompt", json.dumps({"image": config.images_per_prompt})]
    return command


def _server_temp_env(owned: Path) -> dict[str, str]:
    """TMPDIR for the server: a folder inside its owned temporary folder, so the IPC sockets and
    files vLLM leaves in the temp folder when it is killed go with that folder; none where the
    path would make a socket name too long (the system's temp folder then)."""
    folder = owned / "tmp"
    if not holds_socket_names(folder):
        return {}
    folder.mkdir()
    return {"TMPDIR": str(folder)}


class VLLMServer:
    """A ``vllm`` OpenAI-compatible server in a subprocess, on a saved copy of the policy, that
    answers only requests carrying :attr:`token`. ``config`` is ``rollout.vllm`` (its ``server``
    group says where to listen); ``seed`` is the run's."""

    def __init__(self, policy, tokenizer, config: VLLMConfig, seed: int, lora=None):
        s = config.server
        server_guard.check_bind_host(s.host, s.allow_remote)
        self.config = config
        self.port = server_guard.launch_port(s.host, s.port)
        self.url = base_url(s, self.port)
        self.token = server_guard.new_token()
        self._model_dir = owned_temp_dir("vllm-server-model")
        # A LoRA policy: its merged weights, or its base weights when the server takes its adapters.
        save_merged(policy, self._model_dir.name, tokenizer, state=base_state(policy) if lora is not None else None)
        vision = is_vision_policy(policy)
        if vision:  # its weights under the names vLLM's loader takes; its processor is saved beside them
            write_engine_weights(policy, self._model_dir.name)
        self.log_path = Path(self._model_dir.name) / "server.log"
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", server_auth.TOKEN_ENV: self.token}
        env.update(_server_temp_env(Path(self._model_dir.name)))
        if lora is not None:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if vision:  # each of its processes prepares vLLM for the family without torchvision (vllm_vision.py)
            plugin = Path(self._model_dir.name) / "plugin"
            plugin.mkdir()
            env.update(server_plugin_env(plugin))
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            _command(self._model_dir.name, config, self.port, seed, lora, vision, cpu=not torch.cuda.is_available()),
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
        timeout = self.config.server.start_timeout_s
        start, deadline, last_note = time.perf_counter(), time.perf_counter() + timeout, 0.0
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
            f"{timeout:g} s; last lines of its log:\n{self.log_tail()}"
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


def launch_shared(policy, tokenizer, config: VLLMConfig, seed: int, lora=None):
    """Rank 0 launches; every rank gets the server's port and token from it (or its failure).

    Returns ``(server or None, port, token)``."""
    server, failure = None, None
    if rank() == 0:
        try:
            server = VLLMServer(policy, tokenizer, config, seed, lora)
        except Exception as err:  # noqa: BLE001 - the other ranks must hear of it, not wait in the broadcast
            failure = err
    shared = [{"port": server.port, "token": server.token} if server else {"failure": str(failure)}]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(shared, src=0)
    if failure is not None:
        raise failure
    if "failure" in shared[0]:
        raise VLLMServerError(f"rank 0 could not launch the vLLM server: {shared[0]['failure']}")
    return server, shared[0]["port"], shared[0]["token"]
