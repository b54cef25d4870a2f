"""Weight-sync seconds into the in-process vLLM engine: a LoRA policy (merged weights) vs full.

For SmolLM2-135M-Instruct (``model=smollm2_135m``), in a fresh process per variant: load the
policy (full, or with LoRA adapters of ``--rank`` on every projection, their B made non-zero
so that merging changes the weights), start vLLM on it in process, then time ``--syncs``
syncs through the generator's ``WeightSync`` with ``verify`` on. A LoRA sync computes
``W + scale * B @ A`` for every adapted layer out of place (the policy is never merged and
unmerged) and pushes the merged tensors; the time reported includes that merge.

    python benchmarks/lora_sync.py [--rank 16] [--syncs 5]

Results: benchmarks/results/lora_sync.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from grpo_lightning.config import AlgorithmConfig, LoraModelConfig, ModelConfig, VLLMConfig
from grpo_lightning.models import load_policy
from grpo_lightning.rollout import WeightSync
from grpo_lightning.rollout.vllm import VLLMEngine
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.weight_push import policy_weights, probe_scores


def lora_policy(model: str, rank: int):
    """``model`` (a ``model.name_or_path``) with LoRA adapters of ``rank`` on every projection (rank 0:
    none), their B made non-zero so that merging changes the weights; and its tokenizer."""
    policy, tokenizer = load_policy(
        ModelConfig(name_or_path=model, lora=LoraModelConfig(rank=rank, alpha=2.0 * max(rank, 1)))
    )
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01, generator=torch.Generator().manual_seed(0))
    return policy, tokenizer


def timed_syncs(policy, tokenizer, engine, rank: int, syncs: int) -> dict:
    """``syncs`` verified syncs of ``policy`` into ``engine``, each after a new update, as the module's
    weight push runs them: the merged weights (their merge timed with the push), then the canary."""
    module = GRPOModule(policy, AlgorithmConfig(beta=0.0))
    sync = WeightSync(verify=True, tolerance=1e-3)
    seconds, diffs = [], []
    for step in range(syncs):
        with torch.no_grad():  # a new update each time, as after an optimizer step
            for param in policy.parameters():
                if param.requires_grad or rank == 0:
                    param.add_(1e-4)
        sync.sync(policy_weights(policy, step), engine, probe_scores(module, tokenizer))
        seconds.append(sync.last_sync_seconds)
        diffs.append(sync.last_probe_diff)
    return {
        "rank": rank,
        "sync_seconds": seconds,
        "median_sync_s": statistics.median(seconds),
        "max_probe_diff": max(diffs),
        "trained_params": sum(p.numel() for p in policy.parameters() if p.requires_grad),
    }


def child(rank: int, syncs: int) -> dict:
    torch.set_num_threads(1)
    policy, tokenizer = lora_policy("smollm2_135m", rank)
    engine = VLLMEngine.from_policy(policy, tokenizer, VLLMConfig(max_model_len=256, kv_cache_gib=0.5), seed=0)
    try:
        return timed_syncs(policy, tokenizer, engine, rank, syncs)
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", default="benchmarks/results/lora_sync.json")
    args = parser.parse_args()
    if args.child is not None:
        print("RESULT " + json.dumps(child(args.child, args.syncs)))
        return
    results = {}
    for name, rank in (("full", 0), (f"lora{args.rank}", args.rank)):
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(rank), "--syncs", str(args.syncs)], capture_output=True, text=True
        )
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if done.returncode or not line:
            sys.exit(f"{name} failed:\n{done.stderr[-4000:]}")
        results[name] = json.loads(line[-1][len("RESULT ") :])
        r = results[name]
        print(
            f"{name:<8} median sync {r['median_sync_s']:.3f} s over {args.syncs} (max probe diff {r['max_probe_diff']:.2g})"
        )
    ratio = results[f"lora{args.rank}"]["median_sync_s"] / results["full"]["median_sync_s"]
    print(f"LoRA / full sync time: {ratio:.2f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps({"model": "smollm2_135m", "results": results, "lora_over_full": ratio}, indent=2)
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
