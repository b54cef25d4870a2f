"""Side by side: TRL's GRPOTrainer vs grpo_lightning, two tables, in one run.

Both trainers get the same model files, prompts (as text: the raw "3+4=" for the arithmetic
settings; for reasoning-gym the chat-formatted question, so TRL sees the same string), the
same generation batch (prompts x num_generations), completion length, beta 0.04, loss
aggregation (TRL ``loss_type="grpo"`` = our ``seq_mean_token_mean``), learning rate, steps,
reward (``arithmetic_close``), one thread, no evaluation pass; our health monitor stays on.

Two tables (``--tables``):

- ``identical``: the same batch, tokens and precision (float32), gradient checkpointing on
  (TRL's default) for both; our step as it ships otherwise (padding-free packing is how our
  step works, not a setting). Two runs of ours against the same TRL runs: ``ours_default``
  decodes with our default HF decoder (``rollout.hf_decoder=fused``, which draws the very
  tokens ``generate`` draws: tests/unit/rollout/test_hf_decoder.py), ``ours`` with HF
  ``generate`` as TRL does (``rollout.hf_decoder=generate``): both decoders alike.
- ``fastest``: each trainer at the fastest configuration this machine supports for the same
  algorithm and batch. Ours: checkpointing ``auto`` (off here: the activations fit) and the
  faster rollout engine for the setting (``fastest_engine``: the in-process vLLM engine on
  SmolLM2; on the tiny model the policy's own KV-cache loop with the fused decode step,
  ``rollout.hf_decoder=fused``). TRL: checkpointing off; with ``--trl-vllm`` also its
  colocated vLLM mode (``use_vllm=True, vllm_mode="colocate"``), which the script tries and,
  when it cannot run, reports why and leaves out. Both in the same precision
  (``--fastest-precision``): bfloat16 autocast over float32 weights (TRL ``bf16=True``; ours
  ``trainer.precision=bf16-mixed`` and a bfloat16 vLLM engine) where this machine's one-thread
  bfloat16 matmul is at least ``BF16_MIN_SPEEDUP`` times its float32 one (measured at the
  start of the run: CPUs with AVX512-BF16 or AMX), else float32. The tiny model stays float32:
  its step is bound by per-op overhead, which autocast's casts only add to.

The trainers alternate ``--repeats`` times, each run in a fresh subprocess so that peak RSS
is its own. Reported per trainer: median step time (each step from its start to the next
one's, so that callbacks and logging count; first ``--warmup`` steps dropped), completion
tokens per second through the whole step, the share of the step spent generating, peak RSS;
then ours / TRL's. For our runs also: the padding share of the micro-batches padded vs
packed, and the training phase (step minus generation) in achieved GFLOP/s next to the
one-thread matmul rate of the table's precision, measured at the start of the run.

    make bench-trl                       # creates .venv-bench (TRL + this package), runs this
    .venv-bench/bin/python benchmarks/trl_vs_ours.py --setting tiny
    .venv-bench/bin/python benchmarks/trl_vs_ours.py --setting smollm2 --model-dir DIR --repeats 2
    .venv-bench/bin/python benchmarks/trl_vs_ours.py --setting smollm2_rg --model-dir DIR --repeats 1

Settings: ``tiny`` (the in-code model, 8 prompts x 8 generations x 32 tokens), ``smollm2``
(a local SmolLM2-135M-Instruct folder, 4 prompts x 8 x 64 tokens, arithmetic prompts) and
``smollm2_rg`` (SmolLM2 on reasoning-gym chain_sum questions in its chat template,
4 prompts x 8 x 128 tokens, lr 2e-5).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpo_lightning.algorithm.packing import pack_micro_batch
from grpo_lightning.config import ModelConfig, TrainConfig
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.models import load_policy
from grpo_lightning.models.allocator import prefer_huge_pages, torch_uses_huge_pages
from grpo_lightning.step.micro_batches import micro_batches
from grpo_lightning.tasks.arithmetic import arithmetic_close
from grpo_lightning.tasks.reasoning_gym import reasoning_gym_records

SETTINGS = {
    "tiny": dict(
        prompts=8,
        generations=8,
        max_tokens=32,
        steps=12,
        repeats=2,  # with 12 steps: keeps make bench-trl (both tables) short
        prompts_from="arithmetic",
        fastest_engine="hf",
        fastest_precision="fp32",
    ),
    "smollm2": dict(
        prompts=4,
        generations=8,
        max_tokens=64,
        steps=5,
        prompts_from="arithmetic",
        fastest_engine="vllm",
        fastest_precision="auto",
    ),
    # lr 2e-5 (the recipe's): at the other settings' 3e-4 SmolLM2 collapses within a step or two to
    # near-empty answers in one trainer and not the other, and the step times compare different lengths.
    "smollm2_rg": dict(
        prompts=4,
        generations=8,
        max_tokens=128,
        steps=4,
        prompts_from="reasoning_gym",
        fastest_engine="vllm",
        fastest_precision="auto",
        lr=2e-5,
    ),
}
# fastest_precision "auto": bfloat16 autocast for both trainers where a one-thread bfloat16 matmul
# is at least this many times as fast as a float32 one on this machine (measured per run).
BF16_MIN_SPEEDUP = 1.5
# fastest_engine: our faster rollout engine on this machine for the setting. On the tiny model
# vLLM's per-step overhead outweighs its decode speed (0.32 s vs 0.15 s per step measured).
COMMON = dict(beta=0.04, lr=3e-4, temperature=1.0)
TABLES = ("identical", "fastest")


def prompt_records(count: int, source: str = "arithmetic", tokenizer=None) -> list[dict]:
    """The prompts both trainers see, as text."""
    if source == "arithmetic":
        return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)][:count]
    train, _ = reasoning_gym_records("chain_sum", size=count, val_fraction=0.0)
    formatter = PromptFormatter(
        tokenizer, system_prompt="Reply with only the final answer inside <answer></answer> tags."
    )
    return [{"prompt": formatter.text(r["prompt"]), "answer": r["answer"]} for r in train]


def save_tiny_model() -> str:
    """The in-code tiny model saved as a folder: both trainers load the very same files
    (TRL also re-loads its reference model from the policy's path)."""
    folder = tempfile.mkdtemp(prefix="tiny-policy-")
    model, tokenizer = load_policy(ModelConfig(name_or_path="tiny"))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load_model(model_dir: str):
    return load_policy(ModelConfig(name_or_path=model_dir))


class GenerateTimer:
    """Wraps ``model.generate`` on the instance and sums its wall time."""

    def __init__(self, model):
        self.seconds, inner = 0.0, model.generate

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        model.generate = timed


def trl_config(s: dict, checkpointing: bool, **overrides):
    """TRL's GRPOConfig for a setting ``s`` (prompts, generations, max_tokens, steps): our values."""
    from trl import GRPOConfig  # noqa: PLC0415  (optional: TRL's venv)

    kwargs = dict(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=s["prompts"] * s["generations"],
        gradient_accumulation_steps=1,
        num_generations=s["generations"],
        max_completion_length=s["max_tokens"],
        beta=COMMON["beta"],
        loss_type="grpo",
        learning_rate=s.get("lr", COMMON["lr"]),
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=s["steps"],
        temperature=COMMON["temperature"],
        top_p=1.0,
        top_k=0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=0,
        dataloader_num_workers=0,
        max_grad_norm=1.0,
        num_iterations=1,
        scale_rewards="group",
        gradient_checkpointing=checkpointing,
    )
    kwargs.update(overrides)
    return GRPOConfig(**kwargs)


def run_trl(setting: str, model_dir: str | None, table: str, trl_vllm: bool = False, precision: str = "fp32") -> dict:
    from datasets import Dataset  # noqa: PLC0415  (optional: TRL's venv)
    from trl import GRPOTrainer  # noqa: PLC0415  (optional: TRL's venv)

    s = SETTINGS[setting]
    model, tokenizer = load_model(model_dir)
    timer = GenerateTimer(model)
    steps: list[dict] = []

    extra = {}
    if table == "fastest" and trl_vllm:
        extra = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3)
    config = trl_config(s, checkpointing=table == "identical", bf16=precision == "bf16", **extra)
    dataset = Dataset.from_list(prompt_records(max(64, s["prompts"] * s["steps"]), s["prompts_from"], tokenizer))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[arithmetic_close],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[trl_step_times(timer, steps, s["prompts"] * s["generations"])],
    )
    trainer.train()
    return {"steps": steps}


def open_step() -> dict:
    """A step's record as it starts: both clocks read (see :func:`close_step`)."""
    return {"start": time.perf_counter(), "cpu_start": time.process_time()}


def close_step(steps: list[dict], less: float = 0.0) -> None:
    """Closes the open step of ``steps``, if any: its wall seconds and its process's CPU seconds (every
    thread's), each less ``less`` of bookkeeping. The CPU seconds are what a loaded machine leaves
    comparable: the wall seconds count the time other processes held the cores."""
    if steps and "start" in steps[-1]:
        steps[-1]["seconds"] = time.perf_counter() - steps[-1].pop("start") - less
        steps[-1]["cpu_seconds"] = time.process_time() - steps[-1].pop("cpu_start") - less


def trl_step_times(timer: GenerateTimer, steps: list[dict], sequences: int):
    """A TRL callback appending each step to ``steps``: its seconds from its start to the next one's
    (its logging included, as for ours), the seconds ``timer`` counted generating, its completion tokens."""
    from transformers import TrainerCallback  # noqa: PLC0415  (TRL's side; allocates: not before ours' huge pages)

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            close_step(steps)
            steps.append(open_step())
            self.gen = timer.seconds

        def on_step_end(self, args, state, control, **kwargs):
            steps[-1]["generate"] = timer.seconds - self.gen

        def on_train_end(self, args, state, control, **kwargs):
            close_step(steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs and steps:
                steps[-1]["tokens"] = logs["completions/mean_length"] * sequences

    return StepTimes()


def our_config(
    setting: str,
    model: str | None,
    checkpointing: bool | str = True,
    steps: int | None = None,
    engine: str = "hf",
    hf_decoder: str = "generate",
    precision: str = "fp32",
):
    """Our TrainConfig for a setting: the same values TRL's GRPOConfig gets in run_trl."""
    s = SETTINGS[setting]
    cfg = TrainConfig()
    cfg.model.name_or_path = model
    cfg.model.gradient_checkpointing = str(checkpointing).lower()
    cfg.rollout.engine, cfg.rollout.hf_decoder = engine, hf_decoder
    cfg.task.rewards = {"arithmetic_close": 1.0}
    cfg.task.chat_template = False  # TRL sees the raw prompt text: so do we
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations = s["prompts"], s["generations"]
    cfg.rollout.max_new_tokens, cfg.rollout.temperature = s["max_tokens"], COMMON["temperature"]
    cfg.algorithm.beta, cfg.algorithm.lr = COMMON["beta"], s.get("lr", COMMON["lr"])
    cfg.algorithm.loss_agg, cfg.algorithm.micro_batch_size = "seq_mean_token_mean", s["prompts"] * s["generations"]
    cfg.trainer.max_steps, cfg.trainer.num_threads = steps or s["steps"], 1
    cfg.trainer.output_dir, cfg.logger.kind = tempfile.mkdtemp(), "none"
    if precision == "bf16":  # as TRL's bf16=True: bfloat16 autocast over float32 weights
        cfg.trainer.precision, cfg.rollout.vllm.dtype = "bf16-mixed", "bfloat16"
    return cfg


def padding_shares(module, rollout) -> tuple[float, float]:
    """Share of the positions the decoder computes that hold no token: padded vs packed micro-batches."""
    real = padded = packed = 0
    for mb in micro_batches(rollout, module.cfg.micro_batch(rollout.num_sequences)):
        real += int(mb.attention_mask.sum())
        padded += mb.input_ids.numel()
        packed += pack_micro_batch(mb.input_ids, mb.attention_mask, mb.prompt_width).input_ids.numel()
    return 1 - real / padded, 1 - real / packed


def training_flops(model, rollout, checkpointing: bool, beta: float) -> float:
    """Matmul FLOPs of the training phase: reference forward (beta > 0), policy forward and backward
    (x2 of the forward), a recomputed forward with checkpointing; decoder weights on every real
    token, the output head on completion tokens only. Attention scores are left out (short rows)."""
    tokens = float(rollout.prompt_mask.sum() + rollout.completion_mask.sum())
    completion = float(rollout.completion_mask.sum())
    head = model.get_output_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    if model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        body -= head
    forward = 2 * (body * tokens + head * completion)
    passes = 3 + (1 if beta > 0 else 0) + (1 if checkpointing else 0)
    return passes * forward


def run_ours(
    setting: str, model_dir: str | None, table: str, precision: str = "fp32", hf_decoder: str | None = None
) -> dict:
    import lightning as L  # noqa: PLC0415  (after child() applies huge pages: importing lightning allocates)

    from grpo_lightning.build import build_run  # noqa: PLC0415  (imports lightning: after the huge-pages choice)

    fastest = table == "fastest"
    s = SETTINGS[setting]
    cfg = our_config(
        setting,
        model_dir,
        "auto" if fastest else True,
        engine=s["fastest_engine"] if fastest else "hf",
        hf_decoder=hf_decoder or ("fused" if fastest else "generate"),
        precision=precision,
    )
    run = build_run(cfg)
    if s["prompts_from"] == "reasoning_gym":  # the very prompt strings TRL gets
        run.datamodule.train_records = prompt_records(
            max(64, s["prompts"] * s["steps"]), "reasoning_gym", run.tokenizer
        )
    steps: list[dict] = []

    class StepTimes(L.Callback):
        """Each step from its start to the next one's (callbacks, weight sync and logging included),
        less this callback's own bookkeeping."""

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            close_step(steps, steps[-1].pop("bookkeeping") if steps and "start" in steps[-1] else 0.0)
            steps.append({**open_step(), "bookkeeping": 0.0})

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            start = time.perf_counter()
            rollout = module.last_step.rollout
            padded, packed = padding_shares(module, rollout)
            checkpointing = bool(module.policy.is_gradient_checkpointing)
            steps[-1].update(
                {
                    "generate": rollout.timing["rollout/seconds"],
                    "tokens": float(rollout.completion_mask.sum()),
                    "padding_share_padded": padded,
                    "padding_share_packed": packed,
                    "checkpointing": checkpointing,
                    "train_flops": training_flops(module.policy, rollout, checkpointing, module.cfg.beta),
                }
            )
            steps[-1]["bookkeeping"] += time.perf_counter() - start

        def on_train_end(self, trainer, module):
            close_step(steps, steps[-1].pop("bookkeeping") if steps and "start" in steps[-1] else 0.0)

    run.callbacks.insert(0, StepTimes())  # its clock starts before training_step generates
    run.trainer(cfg, enable_progress_bar=False, limit_val_batches=0).fit(run.module, datamodule=run.datamodule)
    return {"steps": steps}


def child(
    trainer: str, setting: str, model_dir: str | None, table: str, trl_vllm: bool, precision: str, hf_decoder=None
) -> None:
    if trainer == "ours":  # first, as the CLI applies trainer.huge_pages: before torch's first allocation
        prefer_huge_pages()
    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if trainer == "trl":
        result = run_trl(setting, model_dir, table, trl_vllm, precision)
    else:
        result = run_ours(setting, model_dir, table, precision, hf_decoder)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["huge_pages"] = torch_uses_huge_pages()
    print("RESULT " + json.dumps(result))


def matmul_gflops(seconds: float = 1.5, dtype: str = "fp32") -> float:
    """Matmul rate of one thread on decoder-shaped operands ([2048 x 576] @ [576 x 1536]), in
    float32 or bfloat16 (``dtype``)."""
    torch.set_num_threads(1)
    kind = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    a, b = torch.randn(2048, 576, dtype=kind), torch.randn(576, 1536, dtype=kind)
    a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * 2048 * 576 * 1536 * count / (time.perf_counter() - start) / 1e9


def summarize(runs: list[dict], warmup: int) -> dict:
    steps = [step for run in runs for step in run["steps"][warmup:]]
    seconds = [s["seconds"] for s in steps]
    out = {
        "median_step_s": statistics.median(seconds),
        "median_step_cpu_s": statistics.median(s["cpu_seconds"] for s in steps),
        "tokens_per_s": sum(s.get("tokens", 0.0) for s in steps) / sum(seconds),
        "generation_share": sum(s["generate"] for s in steps) / sum(seconds),
        "peak_rss_mb": max(run["peak_rss_mb"] for run in runs),
        "steps_measured": len(steps),
    }
    if steps and "train_flops" in steps[0]:
        train_seconds = sum(s["seconds"] - s["generate"] for s in steps)
        out["train_gflops"] = sum(s["train_flops"] for s in steps) / train_seconds / 1e9
        out["padding_share_padded"] = statistics.mean(s["padding_share_padded"] for s in steps)
        out["padding_share_packed"] = statistics.mean(s["padding_share_packed"] for s in steps)
        out["checkpointing"] = sorted({s["checkpointing"] for s in steps})
    return out


# The project's own venv (`make test` / `make demo` build it): same torch and transformers as .venv-bench, plus vLLM.
OURS_PYTHON = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python"


# As the user started this script, before anything of ours could set it to 1 (the "ours" child
# asks for huge pages, as trainer.huge_pages does by default).
USER_HUGE_PAGES = os.environ.get("THP_MEM_ALLOC_ENABLE")


def child_environment(trainer: str) -> dict:
    """Each trainer with its own default for large CPU tensors: ours on huge pages (the child
    asks for them, as trainer.huge_pages does), TRL without (torch's default), unless the user set the switch."""
    env = dict(os.environ)
    if trainer == "trl":
        env["THP_MEM_ALLOC_ENABLE"] = USER_HUGE_PAGES if USER_HUGE_PAGES is not None else "0"
    return env


# Each table's runs, in the order they alternate: name -> (trainer, our rollout.hf_decoder; None: the table's).
RUNS = {
    "identical": {"ours_default": ("ours", "fused"), "ours": ("ours", None), "trl": ("trl", None)},
    "fastest": {"ours": ("ours", None), "trl": ("trl", None)},
}
# How the tables print each run of ours.
LABELS = {
    "identical": {"ours_default": "ours, default HF decoder (fused)", "ours": "ours, HF generate"},
    "fastest": {"ours": "ours at its fastest"},
}


def run_child(trainer: str, args, model_dir: str, table: str, precision: str, hf_decoder=None) -> dict | str:
    """One fresh-process run; its parsed result, or the tail of its error output."""
    python = sys.executable
    if trainer == "ours" and table == "fastest" and SETTINGS[args.setting].get("fastest_engine") == "vllm":
        python = args.ours_python or python  # our vLLM rollouts need a venv with vLLM
    command = (
        [
            python,
            __file__,
            "--child",
            trainer,
            "--setting",
            args.setting,
            "--model-dir",
            model_dir,
            "--tables",
            table,
            "--precision",
            precision,
        ]
        + (["--trl-vllm"] if args.trl_vllm else [])
        + (["--steps", str(args.steps)] if args.steps else [])
        + (["--hf-decoder", hf_decoder] if hf_decoder else [])
    )
    done = subprocess.run(command, capture_output=True, text=True, env=child_environment(trainer))
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not line:
        return done.stderr[-3000:]
    return json.loads(line[-1][len("RESULT ") :])


def table_precision(table: str, setting: str, choice: str, rates: dict[str, float]) -> str:
    """The precision both trainers run ``table`` in: float32 for identical settings; for the
    fastest, ``choice`` (``setting``: the setting's own rule, where ``auto`` takes bfloat16 when
    this machine's one-thread bfloat16 matmul is ``BF16_MIN_SPEEDUP`` times the float32 one)."""
    if table == "identical":
        return "fp32"
    rule = SETTINGS[setting]["fastest_precision"] if choice == "setting" else choice
    if rule == "auto":
        return "bf16" if rates["bf16"] >= BF16_MIN_SPEEDUP * rates["fp32"] else "fp32"
    return rule


def print_table(table: str, summary: dict, precision: str, rates: dict[str, float]) -> None:
    rows = [
        ("median step (s)", "median_step_s", "{:.3f}"),
        ("completion tokens/s", "tokens_per_s", "{:.1f}"),
        ("generation share", "generation_share", "{:.2f}"),
        ("peak RSS (MB)", "peak_rss_mb", "{:.0f}"),
    ]
    for name in (n for n in summary if n != "trl"):
        what = "same batch, tokens, precision, checkpointing" if table == "identical" else "each at its fastest"
        print(f"\n{table} settings ({what}): {LABELS[table].get(name, name)} vs TRL")
        print(f"{'metric':<22}{'ours':>10}{'TRL':>10}{'ours/TRL':>10}")
        for label, key, fmt in rows:
            ours, trl = summary[name][key], summary["trl"][key]
            print(f"{label:<22}{fmt.format(ours):>10}{fmt.format(trl):>10}{ours / trl:>10.2f}")
        ours = summary[name]
        print(
            f"both in {precision}; ours: padding share {ours['padding_share_padded']:.2f} padded -> "
            f"{ours['padding_share_packed']:.2f} packed; checkpointing {ours['checkpointing']}; training phase "
            f"{ours['train_gflops']:.1f} GFLOP/s ({ours['train_gflops'] / rates[precision]:.0%} of a one-thread "
            f"{precision} matmul)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="tiny")
    parser.add_argument("--model-dir", help="local SmolLM2-135M-Instruct folder (settings smollm2, smollm2_rg)")
    parser.add_argument("--repeats", type=int, help="alternations of the two trainers (default: the setting's, else 3)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps of each run left out")
    parser.add_argument("--steps", type=int, help="steps per run (default: the setting's)")
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="which tables to measure")
    parser.add_argument("--trl-vllm", action="store_true", help="fastest table: try TRL's colocated vLLM mode")
    parser.add_argument(
        "--fastest-precision",
        choices=["setting", "auto", "fp32", "bf16"],
        default="setting",
        help="precision of both trainers in the fastest table: setting (the setting's rule: auto for SmolLM2, "
        "fp32 for the tiny model), auto (bf16 where its matmul is BF16_MIN_SPEEDUP x faster here), fp32, bf16",
    )
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--hf-decoder", help=argparse.SUPPRESS)
    parser.add_argument(
        "--ours-python",
        default=str(OURS_PYTHON) if OURS_PYTHON.exists() else None,
        help="interpreter for our runs that roll out with vLLM (the SmolLM2 fastest tables): default the "
        "project's .venv from make, which has the CPU build of vLLM that .venv-bench lacks. Every other run "
        "uses this interpreter, so both trainers import the same packages (peak RSS compares like with like)",
    )
    parser.add_argument("--json", help="results file (default benchmarks/results/trl_vs_ours_<setting>.json)")
    parser.add_argument("--child", choices=["trl", "ours"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.setting != "tiny" and not args.model_dir:
        parser.error(f"--setting {args.setting} needs --model-dir (a local SmolLM2-135M-Instruct folder)")
    args.repeats = args.repeats or SETTINGS[args.setting].get("repeats", 3)
    if args.steps:
        SETTINGS[args.setting]["steps"] = args.steps  # both trainers, in every child (run_child passes it on)
    if args.child:
        child(args.child, args.setting, args.model_dir, args.tables[0], args.trl_vllm, args.precision, args.hf_decoder)
        return
    model_dir = args.model_dir or save_tiny_model()
    s = SETTINGS[args.setting]
    # Measured first, on an idle machine: they decide the fastest table's precision.
    rates = {dtype: matmul_gflops(dtype=dtype) for dtype in ("fp32", "bf16")}
    print(f"one-thread matmul: fp32 {rates['fp32']:.1f} GFLOP/s, bf16 {rates['bf16']:.1f} GFLOP/s", file=sys.stderr)
    results: dict = {
        "setting": args.setting,
        "config": s,
        "common": COMMON,
        "threads": 1,
        "tables": {},
        "matmul_gflops_one_thread": rates["fp32"],
        "matmul_gflops_one_thread_bf16": rates["bf16"],
    }
    for table in args.tables:
        precision = table_precision(table, args.setting, args.fastest_precision, rates)
        runs: dict[str, list] = {name: [] for name in RUNS[table]}
        failures: dict[str, str] = {}
        for repeat in range(args.repeats):
            for name, (trainer, hf_decoder) in RUNS[table].items():
                print(f"[{table} {repeat + 1}/{args.repeats}] {name} ...", file=sys.stderr, flush=True)
                out = run_child(trainer, args, model_dir, table, precision, hf_decoder)
                if isinstance(out, str) and trainer == "trl" and table == "fastest" and args.trl_vllm:
                    errors = [x for x in out.splitlines() if "Error" in x or "Exception" in x]
                    failures["trl_vllm"] = (errors or out.strip().splitlines())[-1].strip()
                    print(
                        f"TRL's colocated vLLM mode failed ({failures['trl_vllm']}); TRL runs with HF generate",
                        file=sys.stderr,
                    )
                    args.trl_vllm = False
                    out = run_child(trainer, args, model_dir, table, precision)
                if isinstance(out, str):
                    sys.exit(f"{trainer} ({table}) failed:\n{out}")
                runs[name].append(out)
        summary = {name: summarize(r, args.warmup) for name, r in runs.items()}
        results["tables"][table] = {"results": summary, "runs": runs, "failures": failures, "precision": precision}
        print_table(table, summary, precision, rates)
        for name, why in failures.items():
            print(f"left out: {name}: {why}")
    print(f"\none-thread matmul: fp32 {rates['fp32']:.1f} GFLOP/s, bf16 {rates['bf16']:.1f} GFLOP/s")
    print(
        f"setting {args.setting}: {s['prompts']} prompts x {s['generations']} generations x {s['max_tokens']} tokens, "
        f"{s['steps']} steps x {args.repeats} runs each (first {args.warmup} dropped), 1 thread"
    )
    import trl  # noqa: PLC0415  (optional: TRL's venv)

    results["trl_version"] = trl.__version__
    args.json = args.json or f"benchmarks/results/trl_vs_ours_{args.setting}.json"
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
