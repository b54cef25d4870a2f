"""The cost of a distillation step against a GRPO step on the same generation batch.

One batch is generated once; then each variant's training part of the step (``GRPOModule.prepare``:
the reference and teacher passes, the advantages; ``accumulate_gradients``: forward and backward of
every micro-batch) runs on it, the variants alternating, ``--repeats`` times, one torch thread.
Generation is left out: it is the same for every variant (the student samples either way).

- ``grpo``: the default objective, ``algorithm.beta=0.04`` (a reference pass);
- ``distill``: the sampled-token reverse KL with ``beta=0``: the teacher pass **replaces** the reference pass;
- ``distill_kl``: the same with ``beta=0.04``: the teacher pass **joins** the reference pass;
- ``jsd``: the full-distribution JSD (beta 0.5), ``beta=0``: the teacher keeps its hidden states and each
  micro-batch adds the chunked divergence and its backward.

Settings: ``tiny`` (the in-code model, the demo's 16 x 8 x 4 tokens, a tiny teacher folder of its own
architecture) and ``smollm2`` (SmolLM2-135M-Instruct with ``+preset=smollm2_reasoning_gym``, 4 x 8 x 16
tokens; the teacher is SmolLM2 itself from its folder: a third model of the same size). Reported per
variant: the median wall and CPU seconds, and each against ``grpo``'s.

    python benchmarks/distill_cost.py --setting tiny --repeats 20
    python benchmarks/distill_cost.py --setting smollm2 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from grpo_lightning.build import build_datamodule
from grpo_lightning.config.compose import compose
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy, load_policy
from grpo_lightning.models.smollm2 import ensure_smollm2
from grpo_lightning.rewards.sources import bind_sources
from grpo_lightning.rollout import HFEngine, RolloutGenerator, Sampling
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.teachers import build_teacher
from grpo_lightning.tasks import task_scorer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from distill_tiny import cpu_name

SETTINGS = {
    "tiny": {"overrides": ["rollout.prompts_per_step=16"]},
    "smollm2": {
        "overrides": ["+preset=smollm2_reasoning_gym", "task.dataset=products", "+task.dataset_options.max_digits=1"]
    },
}
VARIANTS = {
    "grpo": [],
    "distill": ["algorithm.teacher.path={teacher}", "algorithm.beta=0"],
    "distill_kl": ["algorithm.teacher.path={teacher}"],
    "jsd": ["algorithm.teacher.path={teacher}", "algorithm.beta=0", "algorithm.teacher.objective=jsd"],
}


def teacher_folder(setting: str) -> str:
    """The teacher's folder: SmolLM2's own, or a tiny model of the student's architecture saved once."""
    if setting == "smollm2":
        return str(ensure_smollm2())
    folder = Path(tempfile.mkdtemp()) / "tiny_teacher"
    tokenizer = build_char_tokenizer()
    build_tiny_policy(tokenizer, seed=5).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def config(setting: str, variant: str, teacher: str, size: int | None = None):
    overrides = SETTINGS[setting]["overrides"] + [o.format(teacher=teacher) for o in VARIANTS[variant]]
    if size is not None:
        overrides.append(f"rollout.prompts_per_step={size}")
    return compose([*overrides, "logger=none", "trainer.output_dir=" + tempfile.mkdtemp()])[0]


def one_batch(cfg):
    """One generation batch of the setting, generated once by the policy."""
    policy, tokenizer = load_policy(cfg.model)
    bind_sources(cfg.rewards)
    generator = RolloutGenerator(
        engine=HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id),
        tokenizer=tokenizer,
        scorer=task_scorer(cfg.task, cfg.plugin_entries()),
        num_generations=cfg.rollout.num_generations,
        sampling=Sampling.from_config(cfg.rollout),
        seed=0,
        formatter=PromptFormatter(tokenizer, cfg.task.system_prompt, cfg.task.instruction, cfg.task.chat_template),
    )
    records = build_datamodule(cfg).train_records[: cfg.rollout.prompts_per_step]
    with torch.no_grad():
        return generator.generate(records, step=0, rank=0)


def module_for(cfg) -> GRPOModule:
    policy, tokenizer = load_policy(cfg.model)
    return GRPOModule(policy, cfg.algorithm, teacher=build_teacher(cfg, tokenizer, policy))


def timed(module: GRPOModule, rollout) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    module.accumulate_gradients(rollout, module.prepare(rollout))
    module.policy.zero_grad(set_to_none=True)
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(setting: str, repeats: int, variants: list[str]) -> dict:
    teacher = teacher_folder(setting)
    rollout = one_batch(config(setting, "grpo", teacher))
    modules = {v: module_for(config(setting, v, teacher)) for v in variants}
    for module in modules.values():
        timed(module, rollout)  # warm-up: the packing probe, first allocations
    seconds = {v: {"wall": [], "cpu": []} for v in variants}
    for _ in range(repeats):
        for variant, module in modules.items():
            wall, cpu = timed(module, rollout)
            seconds[variant]["wall"].append(wall)
            seconds[variant]["cpu"].append(cpu)
    medians = {v: {k: statistics.median(s[k]) for k in ("wall", "cpu")} for v, s in seconds.items()}
    base = medians.get("grpo")
    return {
        "setting": setting,
        "sequences": rollout.num_sequences,
        "completion_tokens": int(rollout.completion_mask.sum()),
        "median_seconds": medians,
        "over_grpo": {v: {k: m[k] / base[k] for k in m} for v, m in medians.items()} if base else None,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="tiny")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--out", help="the results' JSON (default: printed only)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    before = os.getloadavg()
    result = measure(args.setting, args.repeats, args.variants)
    result.update(cpu=cpu_name(), load_average=[before, os.getloadavg()], date=time.strftime("%Y-%m-%d %H:%M"))
    for variant, m in result["median_seconds"].items():
        ratio = result["over_grpo"][variant] if result["over_grpo"] else {"wall": float("nan"), "cpu": float("nan")}
        print(
            f"{variant:12} {m['wall']:.4f} s wall ({ratio['wall']:.2f}x grpo)  {m['cpu']:.4f} s CPU ({ratio['cpu']:.2f}x)"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
