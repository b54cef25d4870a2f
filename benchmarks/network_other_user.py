"""A vLLM server run as another OS user that cannot read the trainer's folders (run as root).

The stand-in for a server on another host without a shared file system. Creates the user
``grpo-vllm`` if absent (``useradd --system``), starts a vLLM server as that user (``setpriv``)
on its own copy of the tiny policy, in a folder of its own, with the network receiver and LoRA
enabled; the trainer (root) keeps its folders at mode 0700. Then:

1. the ``network`` transport must deliver a LoRA adapter (tensors shipped, saved by the server in
   a folder of its own, loaded; the canary matches);
2. the ``network`` transport must deliver merged weights (the canary matches);
3. a training run given the server's URL, ``rollout.vllm.sync.transport=network`` and
   ``verify_sync=true``, trains ``--steps`` steps with its output in a 0700 folder;
4. the ``folder`` transport must fail (the server cannot read the trainer's folder) and the
   version the server reports must not move.

    sudo python benchmarks/network_other_user.py [--steps 3]

Why the interpreter is copied: where the trainer's Python lives under a folder the other user
cannot enter (here ``/root``, 0700), vLLM fails while inspecting the model (it starts
``sys.executable`` in a subprocess). The script then copies the interpreter and its standard
library and headers (not its site-packages) to ``/opt/grpo-server-python`` and runs the server from a venv
there whose site-packages is a link to this venv's (which must be readable by all).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time

import httpx
import lightning as L
import torch

from grpo_lightning.build import build_run
from grpo_lightning.config import (
    AlgorithmConfig,
    LoraModelConfig,
    TrainConfig,
    VLLMConfig,
    VLLMServerConfig,
    VLLMSyncConfig,
)
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.models.adapter_sync import base_state
from grpo_lightning.models.lora import apply_lora, save_merged
from grpo_lightning.rollout.lora_adapters import LoraServing
from grpo_lightning.rollout.transports import make_transport
from grpo_lightning.rollout.transports.network import RECEIVER
from grpo_lightning.rollout.vllm_server import VLLMServerEngine, VLLMServerError
from grpo_lightning.rollout.weight_sync import WeightSync
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.weight_push import policy_weights, probe_scores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER = "grpo-vllm"
PYTHON_COPY = "/opt/grpo-server-python"


def ensure_user() -> pwd.struct_passwd:
    """The server's user, created (a system user, no home, no login) when absent."""
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "-s", "/usr/sbin/nologin", USER])
        return pwd.getpwnam(USER)


def others_can_enter(path: str) -> bool:
    """Whether every folder above ``path`` lets other users through (o+x)."""
    path = os.path.realpath(path)
    while path != "/":
        path = os.path.dirname(path)
        if not os.stat(path).st_mode & 0o001:
            return False
    return True


def server_python() -> tuple[str, dict[str, str]]:
    """An interpreter the other user can run with this venv's packages, and the environment it needs."""
    if others_can_enter(os.path.realpath(sys.executable)):
        return sys.executable, {}
    site_packages = sysconfig.get_paths()["purelib"]
    if not others_can_enter(os.path.join(site_packages, "x")):
        raise SystemExit(f"{site_packages} is not readable by other users: install the venv outside a 0700 folder")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = sys.base_prefix
    venv = os.path.join(PYTHON_COPY, "venv")
    if not os.path.exists(os.path.join(PYTHON_COPY, "include")):
        print(f"copying the interpreter {base} (without its site-packages) to {PYTHON_COPY} ...", flush=True)
        shutil.rmtree(PYTHON_COPY, ignore_errors=True)  # an older, incomplete copy
        os.makedirs(os.path.join(PYTHON_COPY, "bin"), exist_ok=True)
        shutil.copy2(os.path.join(base, "bin", version), os.path.join(PYTHON_COPY, "bin", version))
        shutil.copytree(
            os.path.join(base, "lib"),
            os.path.join(PYTHON_COPY, "lib"),
            ignore=shutil.ignore_patterns("site-packages", "test", "__pycache__", "pkgconfig"),
            symlinks=True,
            dirs_exist_ok=True,
        )
        # The headers too: torch's inductor compiles C++ against Python.h inside the server.
        shutil.copytree(os.path.join(base, "include"), os.path.join(PYTHON_COPY, "include"), dirs_exist_ok=True)
        os.makedirs(os.path.join(venv, "bin"), exist_ok=True)
        os.makedirs(os.path.join(venv, "lib", version), exist_ok=True)
        for link in (os.path.join(venv, "bin", "python"), os.path.join(venv, "lib", version, "site-packages")):
            if os.path.islink(link):
                os.remove(link)
        os.symlink(os.path.join(PYTHON_COPY, "bin", version), os.path.join(venv, "bin", "python"))
        os.symlink(site_packages, os.path.join(venv, "lib", version, "site-packages"))
        with open(os.path.join(venv, "pyvenv.cfg"), "w") as f:
            f.write(f"home = {PYTHON_COPY}/bin\ninclude-system-site-packages = false\n")
        subprocess.run(["chmod", "-R", "a+rX", PYTHON_COPY], check=True)
    # The copied binary's RUNPATH still names the original lib folder: LD_LIBRARY_PATH comes first.
    return os.path.join(venv, "bin", "python"), {"LD_LIBRARY_PATH": os.path.join(PYTHON_COPY, "lib")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_user(user: pwd.struct_passwd) -> list[str]:
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


def start_server(user, python: str, extra_env: dict, server_home: str, model_dir: str, port: int):
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": server_home,
        "XDG_CACHE_HOME": os.path.join(server_home, ".cache"),
        "VLLM_CACHE_ROOT": os.path.join(server_home, ".cache", "vllm"),
        "TMPDIR": server_home,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "PYTHONPATH": ROOT,  # grpo_lightning, for the network receiver (a remote host installs it)
        "OMP_NUM_THREADS": "1",
        **extra_env,
    }
    command = [*as_user(user), python, "-P", "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    command += ["--served-model-name", "policy", "--port", str(port), "--dtype", "float32"]
    command += ["--logprobs-mode", "processed_logprobs", "--kv-cache-memory-bytes", str(2**29)]
    command += ["--enforce-eager", "--max-model-len", "128", "--seed", "0", "--worker-extension-cls", RECEIVER]
    command += LoraServing(8, 2).server_args()
    log = open(os.path.join(server_home, "server.log"), "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=server_home)
    return process, log


def wait_healthy(process, port: int, timeout_s: float = 300.0) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:  # a server given by URL must already listen
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return time.perf_counter() - start
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was up")
        time.sleep(1)
    raise RuntimeError(f"the server was not up after {timeout_s:g} s")


def sync_checks(url: str, trainer_dir: str) -> None:
    """Steps 1 and 2 through the engine's own ``load_weights``."""
    tokenizer = build_char_tokenizer()
    policy = apply_lora(build_tiny_policy(tokenizer), LoraModelConfig(rank=8))
    config = VLLMConfig(
        server=VLLMServerConfig(url=url, timeout_s=180, sync_dir=os.path.join(trainer_dir, "sync")),
        sync=VLLMSyncConfig(timeout_s=60, retries=0),
    )
    engine = VLLMServerEngine.from_policy(policy, tokenizer, config, 0, LoraServing(8, 2))
    try:
        module = GRPOModule(policy, AlgorithmConfig(beta=0.0))
        with torch.no_grad():
            for name, param in policy.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
        expected = probe_scores(module, tokenizer)
        sync = WeightSync(verify=True, tolerance=1e-3)
        engine.transport = make_transport("network", config.sync)
        # The adapter first: the server still holds the base weights it applies to (after a merged
        # push the adapter would count twice).
        metrics = sync.sync(policy_weights(policy, 1, adapter=True), engine, expected)
        print(
            f"1. network, adapter: canary diff {metrics['rollout/sync_probe_diff']:.2e}, model {engine.client.model}, "
            f"{metrics}"
        )
        engine.client.model = "policy"  # merged weights are served under the base name (one engine, two modes)
        metrics = sync.sync(policy_weights(policy, 2), engine, expected)
        print(f"2. network, merged: canary diff {metrics['rollout/sync_probe_diff']:.2e}, {metrics}")
    finally:
        engine.close()


def train(url: str, trainer_dir: str, steps: int) -> None:
    """Step 3: a whole run, weights over the network, its outputs in the 0700 folder."""
    cfg = TrainConfig()
    cfg.trainer.max_steps, cfg.trainer.output_dir, cfg.logger.kind = steps, os.path.join(trainer_dir, "run"), "none"
    cfg.rollout.engine, cfg.rollout.prompts_per_step, cfg.rollout.num_generations = "vllm", 4, 8
    cfg.rollout.max_new_tokens = 8
    cfg.rollout.vllm.server.url = url
    cfg.rollout.vllm.sync.transport = "network"
    cfg.rollout.vllm.verify_sync, cfg.rollout.vllm.verify_tolerance = True, 1e-4
    cfg.health.enabled = False
    seen: list[dict[str, float]] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            keep = ("rollout/sync_probe_diff", "rollout/sync_bytes", "rollout/sync_seconds", "reward/mean")
            metrics = {**trainer.callback_metrics, **trainer.logged_metrics}
            seen.append({k: round(float(v), 7) for k, v in metrics.items() if k in keep})

    run = build_run(cfg)
    start = time.perf_counter()
    trainer = run.trainer(cfg, callbacks=[*run.callbacks, Record()], enable_progress_bar=False, limit_val_batches=0)
    trainer.fit(run.module, datamodule=run.datamodule)
    print(f"3. trained {trainer.global_step} steps in {time.perf_counter() - start:.1f} s over the network:")
    for step, metrics in enumerate(seen, 1):
        print(f"   step {step}: {metrics}")


def folder_check(url: str, trainer_dir: str, process) -> None:
    """Step 4 (last: what the server does with a folder it cannot read may end it): the folder
    transport must fail and the version the server reports must not move."""
    tokenizer = build_char_tokenizer()
    policy = build_tiny_policy(tokenizer)
    config = VLLMConfig(
        server=VLLMServerConfig(url=url, timeout_s=180, sync_dir=os.path.join(trainer_dir, "sync")),
        sync=VLLMSyncConfig(timeout_s=60, retries=0),
    )
    engine = VLLMServerEngine.from_policy(policy, tokenizer, config, 0)
    before = engine.client.call("GET", "/weight_info", "GET /weight_info")["weight_version"]
    try:
        engine.load_weights(policy_weights(policy, 99).tensors, version=99)
        print("4. FAIL: the folder transport worked, the server could read the trainer's folder")
    except VLLMServerError as err:
        print(f"4. folder transport refused as expected: {str(err)[:300]}")
    time.sleep(2.0)
    if process.poll() is not None:
        print(f"   the server exited (code {process.returncode}) after the failed reload; it held version {before!r}")
    else:
        after = engine.client.call("GET", "/weight_info", "GET /weight_info")["weight_version"]
        print(f"   the server still runs; its version {before!r} -> {after!r}")
    engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds the server may take to start")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the script creates the user grpo-vllm and starts the server as that user")
    user = ensure_user()
    python, extra_env = server_python()
    server_home = tempfile.mkdtemp(prefix="grpo-server-host-")
    trainer_dir = tempfile.mkdtemp(prefix="grpo-trainer-only-")  # mode 0700, owned by root
    os.chmod(trainer_dir, 0o700)
    tokenizer = build_char_tokenizer()
    model_dir = os.path.join(server_home, "model")
    policy = apply_lora(build_tiny_policy(tokenizer), LoraModelConfig(rank=8))
    save_merged(policy, model_dir, tokenizer, state=base_state(policy))
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", server_home], check=True)
    os.chmod(server_home, 0o700)
    denied = subprocess.run([*as_user(user), "ls", trainer_dir], capture_output=True, text=True)
    print(f"server user {USER} (uid {user.pw_uid}) lists the trainer's folder: {denied.stderr.strip() or 'ALLOWED'}")
    port = free_port()
    process, log = start_server(user, python, extra_env, server_home, model_dir, port)
    url = f"http://127.0.0.1:{port}"
    try:
        print(f"server up in {wait_healthy(process, port, args.start_timeout):.1f} s", flush=True)
        who = subprocess.run(["ps", "-o", "user=", "-p", str(process.pid)], capture_output=True, text=True)
        print(f"server process user: {who.stdout.strip()}; trainer folder mode {oct(os.stat(trainer_dir).st_mode)}")
        sync_checks(url, trainer_dir)
        train(url, trainer_dir, args.steps)
        folder_check(url, trainer_dir, process)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        shutil.copy(os.path.join(server_home, "server.log"), os.path.join(tempfile.gettempdir(), "grpo-other-user.log"))
        print(f"server log kept in {os.path.join(tempfile.gettempdir(), 'grpo-other-user.log')}")
        shutil.rmtree(server_home, ignore_errors=True)
        shutil.rmtree(trainer_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
