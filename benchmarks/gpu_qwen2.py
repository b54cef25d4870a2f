"""On a GPU: a Qwen2-0.5B-shaped policy (random weights, built from its config) through our step.

No model or data can be downloaded on the GPU machines this project is lent, and vLLM is not
installed there, so the policy is Qwen2-0.5B's architecture (24 layers, hidden 896, 14 query
and 2 key/value heads, MLP 4864, 151936-token vocabulary, tied embeddings) with random
weights: shape is what decides memory and speed. Its tokenizer is built in code: one token
per character over 151936 characters, so every id the policy samples decodes.

Each configuration (``--configs``) trains ``--steps`` steps in a fresh process with HF
``generate`` rollouts (``*_graph``: ``rollout.hf_decoder=graph``, the fused decoder's step
replayed as a CUDA graph) and reports, over the steps after ``--warmup``:

- the step time and its breakdown: generation, ``prepare`` (advantages and the reference
  forward), ``accumulate_gradients`` (policy forward and backward), the optimizer step and
  the rest (logging, the health monitor), each bracketed by ``torch.cuda.synchronize``;
- peak GPU memory (``max_memory_allocated``, whole run and per step) and reserved memory;
- the training phase's model FLOP/s and MFU: matmul FLOPs the step must do (reference
  forward when beta > 0; policy forward; backward x2 of the forward for full training,
  x1 for LoRA, whose frozen base needs no weight gradients; recomputation by checkpointing
  not counted, as MFU conventionally does not), over the training phase's time, against
  both the GPU's dense bf16 peak (``--peak-tflops``) and a bf16 8192^3 matmul measured at the
  start of the same run, on the same GPU;
- HF generate's completion tokens per second;
- with ``--profile``: the top CUDA kernels of the last step's training phase (and their GPU
  time by kind: matmuls, attention, compiled Triton kernels, reductions, elementwise and
  copies, the optimizer; and the GPU time of the fused output head's forward and backward)
  and the top CPU operators of the generation of the step before, each with the time the GPU
  was busy against the wall time (those two steps are left out of the timings above).

The reward (``benchmark_hash``) is a hash of the completion text: random weights solve no
task, and a constant reward would leave every group without signal, which is not the step
a real run takes.

    python benchmarks/gpu_qwen2.py --out results.json                       # on the GPU machine
    python benchmarks/gpu_qwen2.py --shape small --device cpu --steps 2     # a CPU smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import lightning as L
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_lightning.algorithm import fused_head
from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.models.tiny import DEFAULT_ALPHABET, build_char_tokenizer
from grpo_lightning.rewards import register_reward

SHAPES = {
    # Qwen/Qwen2-0.5B's config.json (max_position_embeddings cut to what the run needs).
    "qwen2-0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    ),
    # A CPU-sized stand-in for trying the script anywhere.
    "small": dict(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    ),
}

# name -> (model.dtype, trainer.precision, LoRA rank, strategy, hf_decoder, model.compile)
CONFIGS = {
    "lora_bf16": ("bfloat16", "32-true", 16, "auto", "generate", False),
    "full_bf16": ("bfloat16", "32-true", 0, "auto", "generate", False),
    "full_bf16_compile": ("bfloat16", "32-true", 0, "auto", "generate", True),
    "lora_bf16_compile": ("bfloat16", "32-true", 16, "auto", "generate", True),
    "full_bf16_mixed": ("float32", "bf16-mixed", 0, "auto", "generate", False),
    "full_bf16_fsdp": ("bfloat16", "32-true", 0, "fsdp", "generate", False),
    "lora_bf16_loop": ("bfloat16", "32-true", 16, "auto", "loop", False),
    "full_bf16_graph": ("bfloat16", "32-true", 0, "auto", "graph", False),
    "full_bf16_graph_compile": ("bfloat16", "32-true", 0, "auto", "graph", True),
}
H100_BF16_DENSE_TFLOPS = 989.4  # H100 SXM's dense bf16 peak (NVIDIA's datasheet)


def build_model_folder(shape: str, folder: str) -> str:
    """Random-weight Qwen2 of ``shape`` and a character tokenizer covering its vocabulary, saved."""
    spec = SHAPES[shape]
    extra, code = [], 0x100
    while len(DEFAULT_ALPHABET) + len(extra) + 3 < spec["vocab_size"]:
        if not 0xD800 <= code <= 0xDFFF:  # surrogates are not characters
            extra.append(chr(code))
        code += 1
    tokenizer = build_char_tokenizer(DEFAULT_ALPHABET + "".join(extra))
    assert len(tokenizer) == spec["vocab_size"], (len(tokenizer), spec["vocab_size"])
    config = Qwen2Config(
        **spec,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def register_benchmark_reward() -> None:
    @register_reward("benchmark_hash")
    def benchmark_hash(prompts: list[str], completions: list[str], **_) -> list[float]:
        """A value in [0, 1) from the completion's text: varies within every group."""
        return [int(hashlib.sha1(c.encode()).hexdigest()[:8], 16) / 2**32 for c in completions]


def our_config(args, name: str, model_dir: str):
    dtype, precision, rank, strategy, decoder, compiled = CONFIGS[name]
    cfg = TrainConfig()
    cfg.model.name_or_path, cfg.model.dtype = model_dir, dtype
    cfg.model.gradient_checkpointing = args.checkpointing
    cfg.model.lora.rank, cfg.model.compile = rank, compiled
    cfg.rollout.engine, cfg.rollout.hf_decoder = "hf", decoder
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations = args.prompts, args.generations
    cfg.rollout.max_new_tokens, cfg.rollout.temperature = args.max_tokens, 1.0
    cfg.task.rewards = {"benchmark_hash": 1.0}
    cfg.task.chat_template = False
    cfg.algorithm.beta, cfg.algorithm.lr = 0.04, 1e-5
    cfg.algorithm.micro_batch_size = args.micro_batch or args.prompts * args.generations
    if args.logprob_chunk_mb:
        cfg.algorithm.logprob_chunk_mb = args.logprob_chunk_mb
    cfg.trainer.accelerator, cfg.trainer.precision, cfg.trainer.strategy = args.accelerator, precision, strategy
    cfg.trainer.max_steps, cfg.trainer.num_threads = args.steps, 1 if args.device == "cpu" else 0
    cfg.trainer.output_dir, cfg.logger.kind = tempfile.mkdtemp(), "none"
    cfg.trainer.enable_checkpointing = False
    return cfg


def train_flops(model, rollout, lora: bool, beta: float) -> float:
    """Model matmul FLOPs of the training phase (see the module docstring); attention included."""
    config = model.config
    tokens = float(rollout.prompt_mask.sum() + rollout.completion_mask.sum())
    completion = float(rollout.completion_mask.sum())
    lengths = (rollout.prompt_mask.sum(1) + rollout.completion_mask.sum(1)).double()
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    base = getattr(model, "get_base_model", lambda: model)()
    body = sum(p.numel() for name, p in base.named_parameters() if "lora_" not in name) - embed.numel()
    if head is not embed and head.data_ptr() != embed.data_ptr():
        body -= head.numel()
    # Causal attention per layer: QK^T and AV over half the square, 2 FLOPs per multiply-add.
    attention = (
        2
        * 2
        * float((lengths**2).sum())
        / 2
        * config.num_attention_heads
        * (config.hidden_size // config.num_attention_heads)
        * config.num_hidden_layers
    )
    forward = 2 * (body * tokens + head.numel() * completion) + attention
    backward = 1.0 if lora else 2.0
    return (1.0 + backward + (1.0 if beta > 0 else 0.0)) * forward


def measured_matmul_tflops(device: str) -> float | None:
    if device != "cuda":
        return None
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, count = time.perf_counter(), 20
    for _ in range(count):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * count / (time.perf_counter() - start) / 1e12


def tf32_head_check(device: str) -> dict | None:
    """The fused head's bf16 weight gradient with TF32 and with IEEE float32 accumulation, each
    against a float64 reference: both errors should be bf16's rounding (~2^-9 relative)."""
    if device != "cuda":
        return None
    torch.manual_seed(0)
    rows, hidden_size, vocab = 4096, 896, 151936
    hidden = (torch.randn(rows, hidden_size, device="cuda") * 0.5).to(torch.bfloat16)
    head = torch.nn.Linear(hidden_size, vocab, bias=False, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), device="cuda")
    grad = torch.randn(rows, device="cuda")

    def weight_grad(dtype=None):
        weight = head.weight.detach().to(dtype or head.weight.dtype).requires_grad_(True)
        h = hidden.to(dtype or hidden.dtype)
        # the eager path's TF32 choice (the Triton kernels' path takes 16-bit operands: gpu_head.py)
        logp, _, _ = fused_head.FusedHeadLogProbs.apply(h, weight, None, targets, 1.0, 1024, False, False)
        (logp * grad.to(logp.dtype)).sum().backward()
        return weight.grad.double()

    reference = weight_grad(torch.float64)
    out = {}
    real = fused_head.tf32_is_lossless
    for label, lossless in (("tf32", real), ("ieee", lambda *a, **k: False)):
        fused_head.tf32_is_lossless = lossless
        try:
            weight_grad()  # warm-up
            torch.cuda.synchronize()
            start = time.perf_counter()
            got = weight_grad()
            torch.cuda.synchronize()
            out[f"{label}_backward_s"] = time.perf_counter() - start
        finally:
            fused_head.tf32_is_lossless = real
        out[f"{label}_rel_err"] = float((got - reference).norm() / reference.norm())
    return out


# Kernel names -> what they do, first match wins (cuBLAS / nvjet / CUTLASS matmuls, SDPA's
# attention kernels, inductor's fused Triton kernels, the optimizer's multi-tensor kernels).
KERNEL_KINDS = (
    ("matmul", ("gemm", "nvjet", "xmma", "cutlass", "wgmma", "splitk")),
    ("attention", ("flash", "fmha", "attention", "efficient")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("compiled (triton)", ("triton",)),
    ("reductions", ("reduce", "softmax", "norm", "scan")),
    (
        "elementwise and copies",
        ("elementwise", "copy", "memcpy", "memset", "fill", "index", "scatter", "gather", "cat"),
    ),
)
# record_function ranges of the step whose GPU time the profile reports on its own.
PROFILED_RANGES = ("fused_head.forward", "fused_head.backward", "Optimizer.step#AdamW.step")


def kernel_kinds(events) -> dict[str, float]:
    """Seconds of GPU time per kind of kernel (:data:`KERNEL_KINDS`) in a profile's averages."""
    seconds: dict[str, float] = {}
    for event in events:
        if event.self_cpu_time_total > 0 or event.self_device_time_total <= 0 or event.key in PROFILED_RANGES:
            continue  # an operator or a range (their kernels are listed on their own), or no GPU time
        name = event.key.lower()
        kind = next((k for k, words in KERNEL_KINDS if any(w in name for w in words)), "other")
        seconds[kind] = seconds.get(kind, 0.0) + event.self_device_time_total / 1e6
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def run_config(args, name: str, model_dir: str) -> dict:
    register_benchmark_reward()
    cuda = args.device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])

    cfg = our_config(args, name, model_dir)
    run = build_run(cfg)
    module = run.module
    phases: dict[str, float] = {}
    phase_peaks: dict[str, float] = {}  # GiB allocated at most during each phase of the step

    def timed(method_name: str, phase: str):
        inner = getattr(module, method_name)

        def wrapper(*a, **k):
            sync()
            if cuda:
                phase_peaks["before"] = max(phase_peaks.get("before", 0.0), torch.cuda.max_memory_allocated() / 2**30)
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                sync()
                phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - start
                if cuda:
                    peak = torch.cuda.max_memory_allocated() / 2**30
                    phase_peaks[phase] = max(phase_peaks.get(phase, 0.0), peak)
                    torch.cuda.reset_peak_memory_stats()

        setattr(module, method_name, wrapper)

    timed("generate_rollout", "generate")
    timed("prepare", "prepare_and_reference")
    timed("accumulate_gradients", "policy_forward_backward")
    timed("_guarded_step", "optimizer")
    steps: list[dict] = []
    profile: dict = {}

    class StepTimes(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            phases.clear()
            phase_peaks.clear()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            sync()
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            sync()
            seconds = time.perf_counter() - self.start
            rollout = pl_module.last_step.rollout
            lora = cfg.model.lora.rank > 0
            step = {
                "seconds": seconds,
                **phases,
                "other": seconds - sum(phases.values()),
                "completion_tokens": float(rollout.completion_mask.sum()),
                "tokens": float(rollout.prompt_mask.sum() + rollout.completion_mask.sum()),
                "train_flops": train_flops(pl_module.policy, rollout, lora, cfg.algorithm.beta),
                "checkpointing": bool(getattr(pl_module.policy, "is_gradient_checkpointing", False)),
                "peak_allocated_gib": max([torch.cuda.max_memory_allocated() / 2**30, *phase_peaks.values()])
                if cuda
                else None,
                "phase_peak_gib": dict(phase_peaks),
                "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
                "skipped": list(pl_module.last_step.skipped),
                "profiled": bool(args.profile and batch_idx >= args.steps - 2),  # left out of the summary
            }
            steps.append(step)
            print(
                f"[{name}] step {batch_idx}: {json.dumps({k: v for k, v in step.items() if k != 'skipped'})}",
                file=sys.stderr,
                flush=True,
            )

    class TrainingPhaseProfile(L.Callback):
        """Profiles the last step from after generation to its end."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if not (args.profile and batch_idx == args.steps - 1):
                return
            inner = pl_module.prepare

            def prepare(*a, **k):
                sync()
                self.wall_start = time.perf_counter()
                self.prof = torch.profiler.profile(activities=activities)
                self.prof.__enter__()
                return inner(*a, **k)

            pl_module.prepare = prepare

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if not hasattr(self, "prof"):
                return
            sync()
            wall = time.perf_counter() - self.wall_start
            self.prof.__exit__(None, None, None)
            events = self.prof.key_averages()
            attr = "device_time_total" if cuda else "cpu_time_total"
            top = sorted(events, key=lambda e: getattr(e, "self_" + attr, 0), reverse=True)[:25]
            kernel_us = sum(getattr(e, "self_device_time_total", 0) for e in events) if cuda else None
            profile.update(
                {
                    "wall_s": wall,
                    "device_busy_s": kernel_us / 1e6 if cuda else None,
                    "by_kind": kernel_kinds(events) if cuda else None,
                    "ranges_s": {
                        e.key: e.device_time_total / 1e6 if cuda else e.cpu_time_total / 1e6
                        for e in events
                        if e.key in PROFILED_RANGES
                    },
                    "table": events.table(sort_by="self_" + attr, row_limit=25),
                    "top": [{"name": e.key, "self_s": getattr(e, "self_" + attr) / 1e6, "count": e.count} for e in top],
                    # where the host's time goes: a GPU idle between kernels waits on these
                    "top_cpu": [
                        {"name": e.key, "self_cpu_s": e.self_cpu_time_total / 1e6, "count": e.count}
                        for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
                    ],
                }
            )
            del self.prof

    class GenerationProfile(L.Callback):
        """Profiles the generation of the step before the last: how busy the GPU is while decoding."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if not (args.profile and batch_idx == max(0, args.steps - 2)):
                return
            inner = pl_module.generate_rollout

            def generate_rollout(*a, **k):
                sync()
                start = time.perf_counter()
                with torch.profiler.profile(activities=activities) as prof:
                    out = inner(*a, **k)
                    sync()
                wall = time.perf_counter() - start
                events = prof.key_averages()
                by_cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
                profile["generation"] = {
                    "wall_s": wall,
                    "device_busy_s": sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
                    if cuda
                    else None,
                    "top_cpu": [
                        {"name": e.key, "self_cpu_s": e.self_cpu_time_total / 1e6, "count": e.count} for e in by_cpu
                    ],
                }
                pl_module.generate_rollout = inner
                return out

            pl_module.generate_rollout = generate_rollout

    run.callbacks[:0] = [StepTimes(), TrainingPhaseProfile(), GenerationProfile()]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run.trainer(cfg, enable_progress_bar=False, limit_val_batches=0).fit(module, datamodule=run.datamodule)
    wall = time.perf_counter() - start
    policy = module.policy
    trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return {
        "config": name,
        "settings": CONFIGS[name],
        "steps": steps,
        "fit_seconds": wall,
        "run_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "trained_parameters": trained,
        "total_parameters": sum(p.numel() for p in policy.parameters()),
        "checkpointing_report": module.checkpointing_choice.report() if module.checkpointing_choice else None,
        # hf_decoder=fused/graph: whether the fused decoder passed its check against the forward (None: not used).
        "fused_checked": getattr(getattr(module.rollout, "engine", None), "fused_checked", None),
        "profile": profile,
    }


def summarize(result: dict, warmup: int, peak_tflops: float, matmul_tflops: float | None) -> dict:
    measured = result["steps"][warmup:]
    steps = [s for s in measured if not s["profiled"]] or measured or result["steps"][-1:]
    total = sum(s["seconds"] for s in steps)
    # Rates are medians over the steps, like the step time: one slow step (a recompilation
    # under model.compile, an allocator flush) must not set the figure.
    train = statistics.median(s["train_flops"] / (s["seconds"] - s["generate"]) for s in steps) / 1e12
    compute = (
        statistics.median(s["train_flops"] / (s["prepare_and_reference"] + s["policy_forward_backward"]) for s in steps)
        / 1e12
    )
    out = {
        "median_step_s": statistics.median(s["seconds"] for s in steps),
        "breakdown_share": {
            phase: sum(s[phase] for s in steps) / total
            for phase in ("generate", "prepare_and_reference", "policy_forward_backward", "optimizer", "other")
        },
        "step_tokens_per_s": statistics.median(s["tokens"] / s["seconds"] for s in steps),
        "generate_tokens_per_s": statistics.median(s["completion_tokens"] / s["generate"] for s in steps),
        "train_s": statistics.median(s["seconds"] - s["generate"] for s in steps),
        "train_tflops": train,
        "forward_backward_tflops": compute,
        "mfu_vs_peak": train / peak_tflops,
        "mfu_vs_measured_matmul": train / matmul_tflops if matmul_tflops else None,
        "peak_allocated_gib": max((s["peak_allocated_gib"] or 0) for s in result["steps"]),
        "peak_reserved_gib": max((s["peak_reserved_gib"] or 0) for s in result["steps"]),
        "tokens_per_step": statistics.mean(s["tokens"] for s in steps),
        "checkpointing": sorted({s["checkpointing"] for s in steps}),
        "trained_parameters": result["trained_parameters"],
    }
    return out


def child(args) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run_config(args, args.child, args.model_dir)
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-0.5b")
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["lora_bf16", "full_bf16"])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--max-tokens", type=int, default=256, help="new tokens per completion")
    parser.add_argument("--micro-batch", type=int, default=0, help="sequences per micro-batch (0: the whole batch)")
    parser.add_argument("--checkpointing", default="auto", help="model.gradient_checkpointing: auto, true, false")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the summary")
    parser.add_argument("--profile", action="store_true", help="profile the last step's training phase")
    parser.add_argument("--logprob-chunk-mb", type=float, default=0, help="algorithm.logprob_chunk_mb (0: the default)")
    parser.add_argument("--peak-tflops", type=float, default=H100_BF16_DENSE_TFLOPS, help="the GPU's dense bf16 peak")
    parser.add_argument("--out", default="benchmarks/results/gpu_qwen2.json")
    parser.add_argument("--model-dir", help="a folder an earlier run built (build_model_folder): skips building it")
    parser.add_argument("--child", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.accelerator = "gpu" if args.device == "cuda" else "cpu"
    if args.child:
        child(args)
        return
    model_dir = args.model_dir or build_model_folder(args.shape, tempfile.mkdtemp(prefix=f"{args.shape}-"))
    matmul = measured_matmul_tflops(args.device)
    tf32 = tf32_head_check(args.device)
    print(f"TF32 head check: {tf32}", file=sys.stderr, flush=True)
    results: dict = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "settings": vars(args),
        "matmul_bf16_tflops": matmul,
        "tf32_head_check": tf32,
        "configs": {},
    }
    for name in args.configs:
        command = [
            sys.executable,
            __file__,
            "--child",
            name,
            "--model-dir",
            model_dir,
            "--device",
            args.device,
            "--prompts",
            str(args.prompts),
            "--generations",
            str(args.generations),
            "--max-tokens",
            str(args.max_tokens),
            "--micro-batch",
            str(args.micro_batch),
            "--checkpointing",
            args.checkpointing,
            "--steps",
            str(args.steps),
            "--logprob-chunk-mb",
            str(args.logprob_chunk_mb),
        ] + (["--profile"] if args.profile else [])
        print(f"== {name}", file=sys.stderr, flush=True)
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if done.returncode or not line:
            results["configs"][name] = {"error": done.stdout[-3000:] or f"exit {done.returncode}"}
            print(f"{name} failed (exit {done.returncode})", file=sys.stderr)
            continue
        result = json.loads(line[-1][len("RESULT ") :])
        result["summary"] = summarize(result, args.warmup, args.peak_tflops, matmul)
        results["configs"][name] = result
        print(json.dumps(result["summary"], indent=1), flush=True)
        if result["profile"].get("table"):
            print(result["profile"]["table"], flush=True)
            kinds = {key: result["profile"].get(key) for key in ("wall_s", "device_busy_s", "by_kind", "ranges_s")}
            print(json.dumps(kinds, indent=1), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
