"""The network transport to a vLLM server that cannot read the trainer's folders (run as root).

Starts a vLLM server as the user ``nobody`` (``setpriv``) on its own copy of the tiny policy, in
a folder of its own, with the network receiver and LoRA enabled. The trainer (root) keeps its
sync folder at mode 0700. Then, through the engine's own ``load_weights``:

1. the ``folder`` transport must fail: the server cannot read the trainer's folder (and the
   version it reports must not move);
2. the ``network`` transport must deliver merged weights: the canary matches;
3. the ``network`` transport must deliver a LoRA adapter (tensors shipped, saved by the server
   in a folder of its own, loaded): the canary matches.

    sudo python benchmarks/network_other_user.py

Not yet working here: the server started as nobody exits while vLLM inspects the model
("Model architectures ['LlamaForCausalLM'] failed to be inspected"), probably a path under
/root (mode 0700: the interpreter's prefix) that nobody cannot reach; an interpreter outside
/root is the next thing to try.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import torch

from grpo_lightning.config import AlgorithmConfig, LoraModelConfig, VLLMConfig, VLLMServerConfig, VLLMSyncConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.models.adapter_sync import base_state
from grpo_lightning.models.lora import apply_lora, save_merged
from grpo_lightning.module import GRPOModule
from grpo_lightning.rollout.lora_adapters import LoraServing
from grpo_lightning.rollout.transports import make_transport
from grpo_lightning.rollout.vllm_server import VLLMServerEngine, VLLMServerError
from grpo_lightning.rollout.weight_sync import WeightSync
from grpo_lightning.weight_push import policy_weights, probe_scores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    assert os.geteuid() == 0, "run as root: the server is started as the user nobody"
    tokenizer = build_char_tokenizer()
    policy = apply_lora(build_tiny_policy(tokenizer), LoraModelConfig(rank=8))
    server_home = tempfile.mkdtemp(prefix="grpo-server-host-")
    model_dir = os.path.join(server_home, "model")
    save_merged(policy, model_dir, tokenizer, state=base_state(policy))
    subprocess.run(["chown", "-R", "nobody", server_home], check=True)
    trainer_dir = tempfile.mkdtemp(prefix="grpo-trainer-only-")  # mode 0700, owned by root
    os.chmod(trainer_dir, 0o700)
    port = free_port()
    env = {
        **os.environ,
        "HOME": server_home,
        "XDG_CACHE_HOME": os.path.join(server_home, ".cache"),
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "PYTHONPATH": ROOT,
        "TMPDIR": server_home,
    }
    command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-P", "-m"]
    command += ["vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name", "policy"]
    command += ["--port", str(port), "--dtype", "float32", "--logprobs-mode", "processed_logprobs"]
    command += ["--kv-cache-memory-bytes", str(2**29), "--enforce-eager", "--max-model-len", "128", "--seed", "0"]
    command += ["--worker-extension-cls", "grpo_lightning.rollout.transports.network_receiver.NetworkWeightReceiver"]
    command += LoraServing(8, 2).server_args()
    log = open(os.path.join(server_home, "server.log"), "w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=server_home)
    config = VLLMConfig(
        server=VLLMServerConfig(url=f"http://127.0.0.1:{port}", timeout_s=180, sync_dir=trainer_dir),
        sync=VLLMSyncConfig(timeout_s=60, retries=0),
    )
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < 240:  # a server given by URL must already listen
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}")
            time.sleep(1)
        engine = VLLMServerEngine.from_policy(policy, tokenizer, config, 0, LoraServing(8, 2))
        print(f"server (user nobody) up in {time.perf_counter() - start:.1f} s", flush=True)
        who = subprocess.run(["ps", "-o", "user=", "-p", str(server.pid)], capture_output=True, text=True)
        print(f"server process user: {who.stdout.strip()}; trainer folder mode {oct(os.stat(trainer_dir).st_mode)}")
        module = GRPOModule(policy, AlgorithmConfig(beta=0.0))
        with torch.no_grad():
            for name, param in policy.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
        expected = probe_scores(module, tokenizer)
        sync = WeightSync(verify=True, tolerance=1e-3)
        try:
            sync.sync(policy_weights(policy, 1), engine, expected)
            print("FAIL: the folder transport worked, the server could read the trainer's folder")
        except VLLMServerError as err:
            version = engine.client.call("GET", "/weight_info", "check")["weight_version"]
            print(f"folder transport refused as expected (version still {version!r}): {str(err)[:160]}")
        engine.transport = make_transport("network", config.sync)
        metrics = sync.sync(policy_weights(policy, 2), engine, expected)
        print(f"network, merged: canary diff {metrics['rollout/sync_probe_diff']:.2e}, {metrics}")
        metrics = sync.sync(policy_weights(policy, 3, adapter=True), engine, expected)
        print(f"network, adapter: canary diff {metrics['rollout/sync_probe_diff']:.2e}, model {engine.client.model}")
        engine.close()
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        print("server log tail:", open(os.path.join(server_home, "server.log")).read()[-600:].replace("\n", " | "))
        shutil.rmtree(server_home, ignore_errors=True)
        shutil.rmtree(trainer_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
