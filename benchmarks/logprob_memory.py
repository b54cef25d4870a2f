"""Peak memory and time of chosen-token log-probs: grpo_lightning's fused path vs two baselines.

Baselines (named): ``plain``, ``log_softmax(lm_head(hidden).float(), -1).gather(-1, targets)``,
the way most trainers compute it; ``checkpointed``, a chunk of rows through the head at a time
with each chunk's autograd graph recomputed in the backward (our previous path, still used
for the entropy bonus). Ours: ``lm_head_log_probs``, the head and log-softmax as one autograd
function that keeps one chunk of logits alive at a time (``algorithm/fused_head.py``). All
start from the same final hidden states (SmolLM2-135M's shape: hidden 576, vocabulary 49152)
at batch 32 x 256 tokens, forward and backward. Each variant runs in a fresh subprocess;
peak RSS above the inputs and the forward + backward seconds are reported.

    python benchmarks/logprob_memory.py [--batch 32 --time 256 --vocab 49152]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time as time_module

import torch
from torch.utils.checkpoint import checkpoint

from grpo_lightning.algorithm import lm_head_log_probs
from grpo_lightning.algorithm.logprobs import _chunk_log_probs

VARIANTS = ("plain", "checkpointed", "ours")


def measure(variant: str, batch: int, time: int, vocab: int, hidden_size: int) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the head's init draws from the global RNG: same head in both variants
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(batch, time, hidden_size, generator=gen).requires_grad_(True)
    targets = torch.randint(0, vocab, (batch, time), generator=gen)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time_module.perf_counter()
    if variant == "plain":
        logp = torch.log_softmax(head(hidden).float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    elif variant == "checkpointed":
        flat_h, flat_t = hidden.reshape(-1, hidden_size), targets.reshape(-1)
        logp = torch.cat(
            [
                checkpoint(
                    lambda h, t: _chunk_log_probs(head(h), t, 1.0, False)[0],
                    flat_h[i : i + 512],
                    flat_t[i : i + 512],
                    use_reentrant=False,
                )
                for i in range(0, flat_h.shape[0], 512)
            ]
        ).view(batch, time)
    else:
        logp = lm_head_log_probs(hidden, head, targets, chunk_size=512).logp
    logp.sum().backward()
    seconds = time_module.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "variant": variant,
        "peak_mb": (peak - before) / 1024,
        "seconds": seconds,
        "logp_head": logp.detach()[0, :4].tolist(),
        "logp_sum": float(logp.detach().double().sum()),
        "grad_sum": float(hidden.grad.double().abs().sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--time", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant, args.batch, args.time, args.vocab, args.hidden)))
        return
    results = {}
    for variant in VARIANTS:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--variant",
                variant,
                "--batch",
                str(args.batch),
                "--time",
                str(args.time),
                "--vocab",
                str(args.vocab),
                "--hidden",
                str(args.hidden),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    plain, ours = results["plain"], results["ours"]
    print(f"log-probs of {args.batch} x {args.time} tokens, vocabulary {args.vocab}, forward + backward, 1 thread")
    print(f"{'variant':<14} {'peak MB':>10} {'seconds':>9} {'peak / plain':>13}")
    for name, r in results.items():
        print(f"{name:<14} {r['peak_mb']:>10.0f} {r['seconds']:>9.2f} {r['peak_mb'] / plain['peak_mb']:>13.3f}")
    for name in ("checkpointed", "ours"):
        r = results[name]
        rel = abs(plain["logp_sum"] - r["logp_sum"]) / abs(plain["logp_sum"])
        print(
            f"{name}: relative difference of the log-prob sums vs plain {rel:.2e}; "
            f"|grad| sums {plain['grad_sum']:.6e} (plain) vs {r['grad_sum']:.6e}"
        )
    print(f"first values: {plain['logp_head']} (plain) vs {ours['logp_head']} (ours)")


if __name__ == "__main__":
    main()
