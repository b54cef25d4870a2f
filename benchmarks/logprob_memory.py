"""Peak memory of chosen-token log-probs: grpo_lightning's chunked path vs the plain one.

Baseline (named): ``log_softmax(lm_head(hidden).float(), -1).gather(-1, targets)``, the
way most trainers compute it. Ours: ``lm_head_log_probs`` (a chunk of rows through the head
at a time, checkpointed for the backward). Both start from the same final hidden states
(SmolLM2-135M's shape: hidden 576, vocabulary 49152) at batch 32 x 256 tokens, forward and
backward. Each variant runs in a fresh subprocess; peak RSS above the inputs is reported.

    python benchmarks/logprob_memory.py [--batch 32 --time 256 --vocab 49152]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def measure(variant: str, batch: int, time: int, vocab: int, hidden_size: int) -> dict:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)  # the head's init draws from the global RNG: same head in both variants
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    hidden = torch.randn(batch, time, hidden_size, generator=gen).requires_grad_(True)
    targets = torch.randint(0, vocab, (batch, time), generator=gen)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if variant == "plain":
        logp = torch.log_softmax(head(hidden).float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    else:
        from grpo_lightning.algorithm import lm_head_log_probs

        logp = lm_head_log_probs(hidden, head, targets, chunk_size=512).logp
    logp.sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "variant": variant,
        "peak_mb": (peak - before) / 1024,
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
    parser.add_argument("--variant", choices=["plain", "ours"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args.variant, args.batch, args.time, args.vocab, args.hidden)))
        return
    results = {}
    for variant in ("plain", "ours"):
        out = subprocess.run(
            [sys.executable, __file__, "--variant", variant, "--batch", str(args.batch), "--time",
             str(args.time), "--vocab", str(args.vocab), "--hidden", str(args.hidden)],
            capture_output=True, text=True, check=True,
        )
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    plain, ours = results["plain"], results["ours"]
    rel = abs(plain["logp_sum"] - ours["logp_sum"]) / abs(plain["logp_sum"])
    print(f"log-probs of {args.batch} x {args.time} tokens, vocabulary {args.vocab}, forward + backward, 1 thread")
    print(f"{'variant':<8} {'peak MB':>10}")
    print(f"{'plain':<8} {plain['peak_mb']:>10.0f}")
    print(f"{'ours':<8} {ours['peak_mb']:>10.0f}")
    print(f"ratio ours / plain: {ours['peak_mb'] / plain['peak_mb']:.3f}")
    print(f"values: relative difference of the sums {rel:.2e}; first values {plain['logp_head']} vs {ours['logp_head']}")
    print(f"gradients: |grad| sums {plain['grad_sum']:.6e} vs {ours['grad_sum']:.6e}")


if __name__ == "__main__":
    main()
