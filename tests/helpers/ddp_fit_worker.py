"""Worker for the DDP tests: real Lightning DDP fits on CPU (gloo, 2 processes), one after another.

``python tests/helpers/ddp_fit_worker.py OUT_DIR SCENARIO:STEPS [SCENARIO:STEPS ...]``; Lightning's
``ddp`` strategy re-runs this script for rank 1 at the first fit, so both ranks play every scenario
in order, with its patches, in one process group (interpreter and process-group start-up are most of
a short fit, so the suite pays them once). Each rank writes ``OUT_DIR/<scenario>/rank_<r>.json``:
the seeds and prompts it used per step, its step count, the health alerts.

Scenarios:
- ``healthy``: the default run (each rank its own prompts, rank-derived seeds);
- ``pipeline``: ``healthy`` with ``rollout.mode=pipeline`` (each rank's producer, max_lag 1): over its
  steps it must train each group ``healthy`` trains in as many steps on that rank (prompt, seeds), once;
- ``f2_fault``: every rank gets the same prompts AND seeds ignore the rank (the F2 bug);
- ``f2_twin``: every rank gets the same prompts, seeds as designed (no fault);
- ``nan_one_rank``: on rank 1 only, the advantages of the second step are NaN (a non-finite
  loss on one rank: every rank must skip that step together, and none may hang);
- ``fsdp``: the healthy run with ``trainer.strategy=fsdp`` (FSDP2 through Lightning's
  ModelParallelStrategy): the same prompts and seeds, so it must end with the weights of ``healthy``;
- ``fsdp_lora``: ``fsdp`` with LoRA adapters (rank 8) and the KL term on;
- ``vision_ddp``: the in-code tiny VLM with its vision tower frozen (``model.freeze_vision=true``) on
  task=shapes: the frozen tower gets no gradient on any rank (DDP must not wait for one) and stays as it was;
- ``vision_fsdp``: ``vision_ddp`` sharded with FSDP2: the same prompts and seeds, so the same weights at the end;
- ``trl_rewards``: task=dataset on the sums of ``trl_sums.write_sums`` scored by the TRL-style rewards of
  trl_style_rewards.py (each asserts that every column value belongs to its prompt), with
  dynamic sampling: a misaligned column fails the run.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from transformers import AutoModelForCausalLM
from trl_sums import write_sums  # beside this script (run as a file: its folder is on sys.path)

import grpo_lightning.rollout.generator as rollout_module
import grpo_lightning.step.module as module_module
from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig, task_options
from grpo_lightning.data import PromptDataModule
from grpo_lightning.data.sampler import PromptSampler
from grpo_lightning.models.lora import full_state_dict, merged_state_dict
from grpo_lightning.registry import plugin_module
from grpo_lightning.rollout.seeding import group_seeds
from grpo_lightning.tasks.dataset import DatasetTaskConfig

TRL_FILE = str(Path(__file__).resolve().parent / "trl_style_rewards.py")

SEEDS_USED: list[list[int]] = []


def recording_seeds(run_seed, rank, step, num_prompts, num_generations):
    seeds = group_seeds(run_seed, rank, step, num_prompts, num_generations)
    SEEDS_USED.append(seeds[:4])
    return seeds


def rankless_seeds(run_seed, rank, step, num_prompts, num_generations):
    return recording_seeds(run_seed, 0, step, num_prompts, num_generations)


def nan_on_rank_one_second_step(group_advantages):
    calls = []

    def advantages(rewards, *args, **kwargs):
        calls.append(1)
        values = group_advantages(rewards, *args, **kwargs)
        if torch.distributed.get_rank() == 1 and len(calls) == 2:
            values = torch.full_like(values, float("nan"))
        return values

    return advantages


class SharedPromptsDataModule(PromptDataModule):
    """Every rank iterates the same prompts (a sampler that ignores the rank)."""

    def train_dataloader(self):
        loader = super().train_dataloader()
        sampler = PromptSampler(len(self.train_records), len(loader.sampler), seed=self.seed)
        return torch.utils.data.DataLoader(
            self.train_records,
            batch_size=self.prompts_per_step,
            sampler=sampler,
            drop_last=True,
            collate_fn=loader.collate_fn,
        )


def record_groups(generator) -> None:
    """Have ``generator.assemble`` keep the groups of the batch it last made: [prompt, each sample's seed]."""
    assemble = generator.assemble

    def recording(records, requests, *args, **kwargs):
        n = generator.num_generations
        seeds = [r.seed for r in requests]
        generator.assembled_groups = [[r["prompt"], *seeds[i * n : (i + 1) * n]] for i, r in enumerate(records)]
        return assemble(records, requests, *args, **kwargs)

    generator.assemble = recording


class Recorder(L.Callback):
    def __init__(self):
        self.prompts: list[list[str]] = []
        self.groups: list[list[list]] = []  # per step, each group trained: [prompt, its samples' seeds]
        self.lag_max: list[float] = []  # per step, rollout.mode=pipeline's pipeline/lag_max

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rollout = pl_module.last_step.rollout
        self.prompts.append(rollout.prompts[:: rollout.group_size])
        self.groups.append(getattr(pl_module.rollout, "assembled_groups", []))
        self.lag_max.append(rollout.timing.get("pipeline/lag_max", 0.0))


def full(param: torch.Tensor) -> torch.Tensor:
    """The whole tensor (an FSDP2 shard gathered from every rank)."""
    return param.detach().full_tensor() if hasattr(param, "full_tensor") else param.detach()


def local(param: torch.Tensor) -> torch.Tensor:
    """What this rank holds."""
    return param.detach().to_local() if hasattr(param, "to_local") else param.detach()


def main(out_dir: str, scenarios: list[str]) -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    originals = rollout_module.group_seeds, module_module.compute_advantages
    for spec in scenarios:
        scenario, steps = spec.split(":")
        folder = Path(out_dir, scenario)
        folder.mkdir(parents=True, exist_ok=True)
        SEEDS_USED.clear()
        try:
            fit_scenario(scenario, str(folder), int(steps))
        finally:
            rollout_module.group_seeds, module_module.compute_advantages = originals


def fit_scenario(scenario: str, out_dir: str, steps: int) -> None:
    rollout_module.group_seeds = rankless_seeds if scenario == "f2_fault" else recording_seeds
    if scenario == "nan_one_rank":
        module_module.compute_advantages = nan_on_rank_one_second_step(module_module.compute_advantages)
    cfg = TrainConfig()
    cfg.trainer.max_steps = steps
    cfg.trainer.devices = 2
    cfg.logger.kind = "none"
    cfg.trainer.output_dir = out_dir  # the exported hf/final goes there
    if "fsdp" in scenario:
        cfg.trainer.strategy = "fsdp"
        cfg.algorithm.logprob_chunk_mb = 0.01  # several output-head chunks per micro-batch
    if scenario == "fsdp_lora":
        cfg.model.lora.rank = 8
    if scenario == "pipeline":
        cfg.rollout.mode, cfg.eval.before_training = "pipeline", False
    if scenario.startswith("vision"):
        cfg.model.name_or_path, cfg.model.freeze_vision = "tiny_vlm", "true"
        cfg.task = task_options("shapes", size=64)
        cfg.rollout.prompts_per_step, cfg.rollout.num_generations = 2, 4
        cfg.eval.before_training = False
    if scenario == "trl_rewards":
        names = plugin_module(TRL_FILE, "task.reward_modules").ALL
        path = str(write_sums(Path(out_dir)))
        cfg.task = DatasetTaskConfig(path=path, reward_modules=[TRL_FILE], rewards=dict.fromkeys(names, 1.0))
        cfg.task.correctness_reward, cfg.task.val_fraction = "accuracy", 0.0
        cfg.rollout.prompts_per_step, cfg.rollout.num_generations, cfg.rollout.max_new_tokens = 2, 4, 4
        cfg.rollout.dynamic_sampling = True
        cfg.eval.before_training = False
    run = build_run(cfg)
    if scenario in ("f2_fault", "f2_twin"):
        dm = run.datamodule
        run.datamodule = SharedPromptsDataModule(
            dm.train_records, dm.val_records, dm.prompts_per_step, dm.seed, dm.num_batches
        )
    if scenario in ("healthy", "pipeline"):
        record_groups(run.module.rollout)
    recorder = Recorder()
    frozen_at_start = float(sum(p.double().sum() for p in run.module.policy.parameters() if not p.requires_grad))
    overrides = {} if "fsdp" in scenario else {"strategy": "ddp"}
    trainer = run.trainer(cfg, callbacks=[*run.callbacks, recorder], enable_progress_bar=False, **overrides)
    trainer.fit(run.module, datamodule=run.datamodule)
    export = {}
    if scenario.startswith("fsdp"):
        merged = merged_state_dict(run.module.policy, full_state_dict(run.module.policy))  # every rank
        if trainer.global_rank == 0:
            final = Path(out_dir, "hf", "final")
            loaded = AutoModelForCausalLM.from_pretrained(final)
            export = {
                "architectures": loaded.config.architectures,
                "max_abs_diff": max(float((t - merged[n]).abs().max()) for n, t in loaded.state_dict().items()),
                "same_names": sorted(loaded.state_dict()) == sorted(merged),
                "adapter_folder": (final / "adapter" / "adapter_config.json").is_file(),
            }
    report = {
        "export": export,
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "steps": run.health.steps,
        "global_step": trainer.global_step,
        "seeds": list(SEEDS_USED),
        "prompts": recorder.prompts,
        "groups": recorder.groups,
        "lag_max": recorder.lag_max,
        "alerts": [
            {"check": a.check, "failure": a.failure, "step": a.step, "text": a.text, "values": a.values}
            for a in run.health.alerts
        ],
        "metrics": run.health.last_metrics,
        "skipped_steps_total": run.module.counters.skipped_steps,
        "weights_checksum": float(sum(full(p).double().sum() for p in run.module.policy.parameters())),
        "weights_abs_sum": float(sum(full(p).double().abs().sum() for p in run.module.policy.parameters())),
        "local_fraction": sum(local(p).numel() for p in run.module.policy.parameters())
        / sum(p.numel() for p in run.module.policy.parameters()),
        "adapters_abs_sum": float(
            sum(full(p).abs().sum() for n, p in run.module.policy.named_parameters() if "lora_B" in n)
        ),
        "strategy": type(trainer.strategy).__name__,
        "frozen_checksum": float(
            sum(full(p).double().sum() for p in run.module.policy.parameters() if not p.requires_grad)
        ),
        "frozen_at_start": frozen_at_start,
        "reward_calls": dict(plugin_module(TRL_FILE, "task.reward_modules").CALLS) if scenario == "trl_rewards" else {},
    }
    Path(out_dir, f"rank_{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
