"""Peak memory per trained parameter on SmolLM2-135M: ours (full float32, bfloat16 weights,
LoRA rank 16 with and without the KL reference) vs TRL 1.16 (full, and LoRA through its
``peft_config``), each with and without gradient checkpointing.

Every measurement is a fresh process (peak RSS is ``getrusage``'s maximum resident set of
that process) that trains ``--steps`` GRPO steps on the same model files, prompts ("3+4="),
batch (4 prompts x 8 completions x 32 tokens), beta, loss aggregation and learning rate as
``trl_vs_ours.py``. Reported per run: peak RSS, the RSS after imports and before the model
loads (the interpreter, torch, transformers: the same for every run of one trainer), the
peak above that baseline, and that peak divided by the number of trained parameters, the
peak when training ended (ours then exports the model to ``hf/final``, which TRL's run with
``save_strategy="no"`` does not: the process peak includes that export, the training peak not), and
whether large CPU tensors were on huge pages (ours: on, as trainer.huge_pages asks by default; TRL:
off, its default, and on in the ``trl-*-thp`` runs).

    make .venv-bench/.installed          # TRL 1.16 + peft + this package in .venv-bench
    .venv-bench/bin/python benchmarks/memory.py --model-dir ~/.cache/grpo_lightning/SmolLM2-135M-Instruct
    .venv-bench/bin/python benchmarks/memory.py --only ours-lora16 --checkpointing on   # one row

Results: benchmarks/results/memory_smollm2.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from grpo_lightning.models.allocator import prefer_huge_pages, torch_uses_huge_pages
from grpo_lightning.tasks.arithmetic import arithmetic_close

sys.path.insert(0, str(Path(__file__).parent))
from trl_vs_ours import child_environment, load_model, our_config, prompt_records, trl_config

DIMS = dict(prompts=4, generations=8, max_tokens=32, steps=2)
LORA = dict(rank=16, alpha=32.0, dropout=0.0)
# name -> (trainer, weights dtype, LoRA, beta)
RUNS = {
    "ours-full-fp32": ("ours", "float32", False, 0.04),
    "ours-full-bf16": ("ours", "bfloat16", False, 0.04),
    "ours-lora16": ("ours", "float32", True, 0.04),
    "ours-lora16-nokl": ("ours", "float32", True, 0.0),
    "trl-full-fp32": ("trl", "float32", False, 0.04),
    "trl-full-bf16": ("trl", "bfloat16", False, 0.04),
    "trl-lora16": ("trl", "float32", True, 0.04),
    # TRL with the huge pages our package turns on by default (THP_MEM_ALLOC_ENABLE=1 from its start)
    "trl-full-fp32-thp": ("trl", "float32", False, 0.04),
    "trl-lora16-thp": ("trl", "float32", True, 0.04),
}
HUGE_PAGES_ENV = {"trl-full-fp32-thp", "trl-lora16-thp"}
# ours vs TRL on the same setting
PAIRS = [
    ("ours-full-fp32", "trl-full-fp32"),
    ("ours-full-bf16", "trl-full-bf16"),
    ("ours-lora16", "trl-lora16"),
    ("ours-full-fp32", "trl-full-fp32-thp"),
    ("ours-lora16", "trl-lora16-thp"),
]


def current_rss_mb(field: str = "VmRSS") -> float:
    """``/proc/self/status``'s ``field`` in MB: VmRSS now, VmHWM the peak so far."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def training_peak_callback():
    """Records the peak RSS when training ends, before our run's export of the model (hf/final)
    adds its merged copy of the weights: TRL's run (``save_strategy="no"``) writes nothing."""
    import lightning as L  # noqa: PLC0415  (after child() applies huge pages: importing lightning allocates)

    class TrainingPeak(L.Callback):
        peak_mb = float("nan")

        def on_train_end(self, trainer, pl_module) -> None:
            TrainingPeak.peak_mb = current_rss_mb("VmHWM")

    return TrainingPeak()


def run_ours(model_dir: str, dtype: str, lora: bool, beta: float, checkpointing: bool, steps: int) -> dict:
    from grpo_lightning.build import build_run  # noqa: PLC0415  (imports lightning: after the huge-pages choice)

    cfg = our_config("smollm2", model_dir, checkpointing, steps)
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations = DIMS["prompts"], DIMS["generations"]
    cfg.rollout.max_new_tokens = DIMS["max_tokens"]
    cfg.algorithm.micro_batch_size = DIMS["prompts"] * DIMS["generations"]
    cfg.algorithm.beta = beta
    cfg.model.dtype = dtype
    if lora:
        cfg.model.lora.rank, cfg.model.lora.alpha, cfg.model.lora.dropout = LORA["rank"], LORA["alpha"], LORA["dropout"]
    cfg.health.enabled = True
    peak = training_peak_callback()  # before the run's checkpoint callback, which exports at train end
    run = build_run(cfg, callbacks=[peak])
    policy = run.module.policy
    start = time.perf_counter()
    run.trainer(cfg, enable_progress_bar=False, limit_val_batches=0).fit(run.module, datamodule=run.datamodule)
    return {
        "seconds": time.perf_counter() - start,
        "training_peak_rss_mb": peak.peak_mb,
        "trained_params": sum(p.numel() for p in policy.parameters() if p.requires_grad),
        "reference": type(run.module.reference).__name__ if run.module.reference is not None else None,
    }


def run_trl(model_dir: str, dtype: str, lora: bool, beta: float, checkpointing: bool, steps: int) -> dict:
    from datasets import Dataset  # noqa: PLC0415  (optional: TRL's venv)
    from trl import GRPOTrainer  # noqa: PLC0415  (optional: TRL's venv)

    model, tokenizer = load_model(model_dir)
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    peft_config = None
    if lora:
        from peft import LoraConfig  # noqa: PLC0415  (optional: the lora extra)

        peft_config = LoraConfig(
            r=LORA["rank"],
            lora_alpha=LORA["alpha"],
            lora_dropout=LORA["dropout"],
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
    config = trl_config(dict(DIMS, steps=steps), checkpointing, beta=beta)
    dataset = Dataset.from_list(prompt_records(64))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[arithmetic_close],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    reference = getattr(trainer, "ref_model", None)
    start = time.perf_counter()
    trainer.train()
    return {
        "seconds": time.perf_counter() - start,
        "training_peak_rss_mb": current_rss_mb("VmHWM"),  # nothing is saved (save_strategy="no")
        "trained_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "reference": type(reference).__name__ if reference is not None else None,
        "reference_dtype": str(next(reference.parameters()).dtype) if reference is not None else None,
    }


def child(name: str, model_dir: str, checkpointing: bool, steps: int) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer, dtype, lora, beta = RUNS[name]
    if trainer == "ours":
        # first, as the CLI applies trainer.huge_pages: huge pages for large CPU tensors, which
        # torch decides at its first allocation (importing lightning allocates)
        prefer_huge_pages()
    import lightning  # noqa: F401, PLC0415  (before the baseline, after the huge-pages choice)
    import transformers  # noqa: F401, PLC0415  (before the baseline)

    if trainer == "trl":
        import trl  # noqa: F401, PLC0415  (optional: TRL's venv)
    baseline = current_rss_mb()
    result = (run_trl if trainer == "trl" else run_ours)(model_dir, dtype, lora, beta, checkpointing, steps)
    result.update(
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        baseline_rss_mb=baseline,
        huge_pages=torch_uses_huge_pages(),
    )
    print("RESULT " + json.dumps(result))


def measure(name: str, model_dir: str, checkpointing: bool, steps: int) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        name,
        "--model-dir",
        model_dir,
        "--checkpointing",
        "on" if checkpointing else "off",
        "--steps",
        str(steps),
    ]
    env = child_environment(RUNS[name][0])
    if name in HUGE_PAGES_ENV:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not line:
        sys.exit(f"{name} failed:\n{done.stderr[-4000:]}")
    result = json.loads(line[-1][len("RESULT ") :])
    result["above_baseline_mb"] = result["peak_rss_mb"] - result["baseline_rss_mb"]
    result["bytes_per_trained_param"] = result["above_baseline_mb"] * 2**20 / result["trained_params"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True, help="local SmolLM2-135M-Instruct folder")
    parser.add_argument("--steps", type=int, default=DIMS["steps"])
    parser.add_argument("--checkpointing", choices=["on", "off", "both"], default="both")
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="measure only these runs")
    parser.add_argument("--json", default="benchmarks/results/memory_smollm2.json")
    parser.add_argument("--child", choices=sorted(RUNS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    model_dir = str(Path(args.model_dir).expanduser())
    if args.child:
        child(args.child, model_dir, args.checkpointing == "on", args.steps)
        return
    path = Path(args.json)
    results = json.loads(path.read_text())["results"] if path.exists() else {}
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.checkpointing]
    for checkpointing in modes:
        for name in args.only or RUNS:
            key = f"{name} ckpt={'on' if checkpointing else 'off'}"
            print(f"{key} ...", file=sys.stderr, flush=True)
            results[key] = measure(name, model_dir, checkpointing, args.steps)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"dims": DIMS, "lora": LORA, "results": results}, indent=2))
    print(f"{'run':<32}{'peak RSS MB':>12}{'training':>10}{'above base':>12}{'trained':>12}{'B/param':>10}  reference")
    for key, r in results.items():
        print(
            f"{key:<32}{r['peak_rss_mb']:>12.0f}{r.get('training_peak_rss_mb', float('nan')):>10.0f}"
            f"{r['above_baseline_mb']:>12.0f}{r['trained_params']:>12,}"
            f"{r['bytes_per_trained_param']:>10.1f}  {r['reference']}"
        )
    for ours, trl in PAIRS:
        for ckpt in ("on", "off"):
            a, b = results.get(f"{ours} ckpt={ckpt}"), results.get(f"{trl} ckpt={ckpt}")
            if a and b:
                training = a.get("training_peak_rss_mb", float("nan")) / b.get("training_peak_rss_mb", float("nan"))
                print(
                    f"{ours} / {trl} (ckpt {ckpt}): peak RSS {a['peak_rss_mb'] / b['peak_rss_mb']:.2f}, "
                    f"above baseline {a['above_baseline_mb'] / b['above_baseline_mb']:.2f}, "
                    f"training peak {training:.2f}"
                )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
