"""The seeded sampler's draw on a GPU: the Triton inverse-CDF kernel against the eager CDFs.

One draw of :func:`grpo_lightning.rollout.sampler.draw_tokens` for 64 rows of a 151936-token
vocabulary (Qwen2's), timed with CUDA events (median of ``--repeats``), through the Triton kernel
(:mod:`grpo_lightning.rollout.cdf_kernel`, the sampler now on a GPU) and through the eager
block-wise inverse CDF (before), with the parts: the filter and log-softmax, the float64 masses,
the eager inverse CDF taken either as one cumulative sum along the whole row or block by block
(:func:`inverse_cdf`), and the kernel alone. It also counts the draws where the whole-row CDF or
the kernel picks another token than the block-wise CDF (float64 rounding at a boundary;
expected 0).

    python benchmarks/gpu_sampler.py --out sampler.json      # on the GPU machine
    python benchmarks/gpu_sampler.py --device cpu --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from grpo_lightning.rollout import cdf_kernel
from grpo_lightning.rollout.engine import Sampling
from grpo_lightning.rollout.sampler import draw_tokens, filter_logits, inverse_cdf


def whole_row_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The sampler's inverse CDF before the block-wise one: one cumulative sum per row."""
    cdf = probs.cumsum(dim=-1)
    return torch.searchsorted(cdf, uniforms[:, None] * cdf[:, -1:]).clamp(max=probs.shape[-1] - 1)


def timed_ms(fn, repeats: int, device: str) -> float:
    """Median milliseconds of ``fn()`` (CUDA events on a GPU, the wall clock on a CPU)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = args.device
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(args.rows, args.vocab, generator=g, device=device) * 3).to(torch.bfloat16)
    uniforms = torch.rand(args.rows, generator=g, device=device, dtype=torch.float64)
    sampling = Sampling(max_new_tokens=1, temperature=1.0, top_p=1.0, top_k=0)
    log_probs = torch.log_softmax(filter_logits(logits, sampling), dim=-1)
    probs = log_probs.double().exp()
    kernel = cdf_kernel.usable(log_probs)
    draw = lambda: draw_tokens(logits, sampling, uniforms)  # noqa: E731
    ms = {"draw (the sampler now)": timed_ms(draw, args.repeats, device)}  # its first call checks the kernel
    verdict = cdf_kernel.checked(log_probs.device)
    if kernel and verdict:  # the eager inverse CDF, as a draw takes it where the kernel does not apply
        cdf_kernel._AGREED[log_probs.device] = False
        ms["draw, eager block-wise CDF (before)"] = timed_ms(draw, args.repeats, device)
        cdf_kernel._AGREED[log_probs.device] = True
    ms["filter + log-softmax"] = timed_ms(
        lambda: torch.log_softmax(filter_logits(logits, sampling), dim=-1), args.repeats, device
    )
    ms["float64 masses"] = timed_ms(lambda: log_probs.double().exp(), args.repeats, device)
    ms["inverse CDF, whole-row cumulative sum"] = timed_ms(
        lambda: whole_row_inverse_cdf(probs, uniforms), args.repeats, device
    )
    ms["inverse CDF, block-wise (eager)"] = timed_ms(lambda: inverse_cdf(probs, uniforms), args.repeats, device)
    if kernel:
        ms["inverse CDF kernel, from the log-probs"] = timed_ms(
            lambda: cdf_kernel.inverse_cdf_from_log_probs(log_probs, uniforms), args.repeats, device
        )
    results = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": args.rows,
        "vocab": args.vocab,
        "kernel_check": verdict,
        "ms": ms,
    }
    whole_row = through_kernel = 0
    for seed in range(100):
        u = torch.rand(args.rows, generator=g.manual_seed(seed + 1), device=device, dtype=torch.float64)
        eager = inverse_cdf(probs, u)
        whole_row += int((eager != whole_row_inverse_cdf(probs, u)).sum())
        if kernel:
            through_kernel += int((eager != cdf_kernel.inverse_cdf_from_log_probs(log_probs, u)).sum())
    results["tokens_differing_of"] = {
        "whole-row CDF": [whole_row, 100 * args.rows],
        "kernel": [through_kernel, 100 * args.rows] if kernel else None,
    }
    print(json.dumps(results, indent=1))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
