"""Where a decoded token's time goes with ``rollout.hf_decoder=graph`` on a GPU (Qwen2-0.5B shape).

Builds the random-weight Qwen2-0.5B of ``benchmarks/gpu_qwen2.py`` on the GPU in bf16 and times,
for 64 rows (8 prompts x 8 completions, as that benchmark's step):

- the decode step three ways: the fixed-shape step run eagerly (``StaticDecoder``), replayed as
  a CUDA graph (``GraphDecoder``), and replayed as a CUDA graph of the step compiled by
  ``torch.compile`` (inductor fuses the elementwise work between the matmuls);
- the GPU's busy time per replayed step (the sum of its kernels' times, from the profiler) and
  its largest kernels;
- one draw of the seeded sampler over the 151936-token vocabulary;
- the whole engine loop (``HFEngine.generate``) per token.

    python benchmarks/gpu_decode_step.py --out benchmarks/results/gpu_decode_step.json   # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_qwen2 import SHAPES  # noqa: E402

from grpo_lightning.config import RolloutConfig  # noqa: E402
from grpo_lightning.rollout import GenerationRequest, HFEngine, Sampling  # noqa: E402
from grpo_lightning.rollout.fused_decode import FusedWeights  # noqa: E402
from grpo_lightning.rollout.graph_decode import GraphDecoder, StaticDecoder  # noqa: E402
from grpo_lightning.rollout.sampler import SeededSampler  # noqa: E402


def timed(fn, count: int) -> float:
    """Seconds per call of ``fn`` over ``count`` calls, the GPU synchronized at both ends."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(count):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / count


def decoder_step_time(model, weights, ids, mask, kind: str, steps: int) -> dict:
    if kind == "eager":
        decoder = StaticDecoder(model, mask, steps + 3, weights)
    else:  # graph_compiled: the step compiled before it is recorded, as model.compile asks of the engine
        decoder = GraphDecoder(model, mask, steps + 3, weights, compiled=kind == "graph_compiled")
    tokens = torch.randint(0, model.config.vocab_size, (ids.shape[0],), device="cuda")
    with torch.no_grad():
        decoder.prefill(ids)
        start = time.perf_counter()
        decoder.step(tokens)  # the first step records the graph (and compiles)
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        decoder.step(tokens), decoder.step(tokens)
        out = {"first_step_s": first, "step_s": timed(lambda: decoder.step(tokens), steps)}
    return out


def busy_time(model, weights, ids, mask, steps: int) -> dict:
    """Kernel time per replayed graph step, and the largest kernels."""
    decoder = GraphDecoder(model, mask, steps + 1, weights)
    tokens = torch.randint(0, model.config.vocab_size, (ids.shape[0],), device="cuda")
    with torch.no_grad():
        decoder.prefill(ids)
        decoder.step(tokens)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                decoder.step(tokens)
            torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(e.self_device_time_total for e in events) / 1e6
    top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:12]
    return {
        "kernel_s_per_step": total / steps,
        "kernels_per_step": sum(e.count for e in events if e.self_device_time_total > 0) / steps,
        "top": [{"name": e.key[:90], "s_per_step": e.self_device_time_total / 1e6 / steps} for e in top],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/gpu_decode_step.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPES["qwen2-0.5b"])).to(torch.bfloat16).eval()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.rows, 4), device="cuda")
    mask = torch.ones_like(ids)
    weights = FusedWeights(model)
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": args.rows}
    kinds = ["eager", "graph"] + ([] if args.skip_compile else ["graph_compiled"])
    for kind in kinds:
        try:
            result[kind] = decoder_step_time(model, weights, ids, mask, kind, args.steps)
        except Exception as error:  # report and go on: the other timings still count
            result[kind] = {"error": f"{type(error).__name__}: {error}"[:2000]}
        print(kind, result[kind], flush=True)
    result["graph_busy"] = busy_time(model, weights, ids, mask, 20)
    print("busy", json.dumps(result["graph_busy"], indent=1), flush=True)
    logits = torch.randn(args.rows, vocab, device="cuda", dtype=torch.bfloat16)
    sampler = SeededSampler(list(range(args.rows)), Sampling(args.steps + 10, 1.0, 1.0, 0))

    def draw():
        _, logp = sampler.draw(logits)
        logp.cpu()  # the engine loop's per-token copy

    draw()
    result["sampler_draw_s"] = timed(draw, args.steps)
    engine = HFEngine(model, 0, 1, batch_size=256, decoder="graph")
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=256))
    eos_free = [
        GenerationRequest([int(t) % (vocab - 2) + 2 for t in row], seed) for seed, row in enumerate(ids.tolist())
    ]
    for _ in range(2):  # the first call checks the decoder against the forward
        torch.cuda.synchronize()
        start = time.perf_counter()
        completions = engine.generate(eos_free, sampling)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    longest = max(len(c.token_ids) for c in completions)
    result["engine"] = {"seconds": seconds, "tokens": longest, "s_per_token": seconds / longest}
    result["engine"]["checked"] = engine.fused_checked
    print(json.dumps({k: v for k, v in result.items() if k != "graph_busy"}, indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
