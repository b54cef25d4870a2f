"""The fused output head on a GPU: the Triton kernels against the eager float32 path.

One process, a Qwen2-0.5B-shaped head (896 -> 151936, bf16) over a step's completion tokens
(64 x 256 rows): the reference pass (forward without a graph) and the policy pass (forward and
backward), at two logit budgets (``algorithm.logprob_chunk_mb``). CUDA events, medians of five
after two warm-ups. Then the precision of each path's weight and hidden-state gradients against
a float64 reference (4096 rows), and how far the kernels' log-probs and entropies are from the
eager path's.

    python benchmarks/gpu_head.py --out benchmarks/results/gpu_head.json     # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from grpo_lightning.algorithm.fused_head import FusedHeadLogProbs


def timed(fn, repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def head_pass(hidden, weight, targets, chunk_rows, kernels, backward, with_entropy=True):
    def run():
        h = hidden.detach().requires_grad_(backward)
        w = weight.detach().requires_grad_(backward)
        with torch.set_grad_enabled(backward):
            logp, _, _ = FusedHeadLogProbs.apply(h, w, None, targets, 1.0, chunk_rows, with_entropy, kernels)
            if backward:
                logp.sum().backward()

    return run


def precision(rows: int, hidden_size: int, vocab: int) -> dict:
    torch.manual_seed(0)
    hidden = (torch.randn(rows, hidden_size, device="cuda") * 0.5).to(torch.bfloat16)
    weight = (torch.randn(vocab, hidden_size, device="cuda") * 0.02).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), device="cuda")
    upstream = torch.randn(rows, device="cuda")

    def grads(dtype, kernels):
        h = hidden.to(dtype).clone().requires_grad_(True)  # fresh leaves: no .grad carried between calls
        w = weight.to(dtype).clone().requires_grad_(True)
        logp, _, entropy = FusedHeadLogProbs.apply(h, w, None, targets, 1.0, 1024, True, kernels)
        (logp * upstream.to(logp.dtype)).sum().backward()
        return logp.detach().double(), entropy.double(), h.grad.double(), w.grad.double()

    ref = grads(torch.float64, False)
    out = {}
    for label, kernels in (("eager", False), ("kernels", True)):
        logp, entropy, dh, dw = grads(torch.bfloat16, kernels)
        out[label] = {
            "weight_grad_rel_err": float((dw - ref[3]).norm() / ref[3].norm()),
            "hidden_grad_rel_err": float((dh - ref[2]).norm() / ref[2].norm()),
            "logp_max_abs_err": float((logp - ref[0]).abs().max()),
            "entropy_max_abs_err": float((entropy - ref[1]).abs().max()),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64 * 256)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--budgets-mb", type=float, nargs="+", default=[96, 1024])
    parser.add_argument("--out", default="benchmarks/results/gpu_head.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    hidden = (torch.randn(args.rows, args.hidden, device="cuda") * 0.5).to(torch.bfloat16)
    weight = (torch.randn(args.vocab, args.hidden, device="cuda") * 0.02).to(torch.bfloat16)
    targets = torch.randint(0, args.vocab, (args.rows,), device="cuda")
    flops = 2 * args.rows * args.hidden * args.vocab
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "settings": vars(args)}
    rows_out = []
    for budget in args.budgets_mb:
        chunk_rows = max(1, int(budget * 2**20) // (4 * args.vocab))
        for kernels in (False, True):
            forward = timed(head_pass(hidden, weight, targets, chunk_rows, kernels, backward=False))
            both = timed(head_pass(hidden, weight, targets, chunk_rows, kernels, backward=True))
            row = {
                "path": "kernels" if kernels else "eager",
                "chunk_mb": budget,
                "chunk_rows": chunk_rows,
                "forward_s": forward,
                "forward_backward_s": both,
                "forward_backward_tflops": 4 * flops / both / 1e12,  # forward, recomputed logits, dh, dW
            }
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    result["timings"] = rows_out
    result["precision"] = precision(4096, args.hidden, args.vocab)
    print(json.dumps(result["precision"], indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
