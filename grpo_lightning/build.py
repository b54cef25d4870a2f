"""Build every piece of a run from a ``TrainConfig``: the one place config meets objects.

``train.py`` (the Hydra CLI) and notebooks both call :func:`build_run`, so the two paths
cannot drift apart.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from transformers import PreTrainedTokenizerBase

from grpo_lightning.callbacks import (
    AsyncRolloutCallback,
    HealthMonitor,
    RolloutCallback,
    TrainingSummary,
    WeightSyncCallback,
)
from grpo_lightning.config import TrainConfig, validate_config
from grpo_lightning.data import PromptDataModule, arithmetic_records
from grpo_lightning.models import load_policy
from grpo_lightning.module import GRPOModule
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import HFEngine, RolloutEngine, SamplingSettings


@dataclass
class Run:
    """What ``Trainer.fit`` needs, plus the tokenizer for looking at completions."""

    module: GRPOModule
    datamodule: PromptDataModule
    callbacks: list[L.Callback]
    logger: Logger | bool
    tokenizer: PreTrainedTokenizerBase
    rollout: RolloutCallback
    health: HealthMonitor | None = None

    def trainer(self, cfg: TrainConfig, **overrides) -> L.Trainer:
        t = cfg.trainer
        kwargs = dict(
            max_steps=t.max_steps,
            accelerator=t.accelerator,
            devices=t.devices,
            precision=t.precision,
            logger=self.logger,
            callbacks=self.callbacks,
            log_every_n_steps=t.log_every_n_steps,
            default_root_dir=t.output_dir,
            enable_checkpointing=t.enable_checkpointing,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            max_epochs=1,  # one epoch of exactly the batches needed (build_datamodule)
        )
        kwargs.update(overrides)
        return L.Trainer(**kwargs)


def build_datamodule(cfg: TrainConfig) -> PromptDataModule:
    train, val = arithmetic_records(
        cfg.task.max_operand, cfg.task.operators, cfg.task.val_fraction, cfg.task.seed
    )
    batches = -(-cfg.trainer.max_steps // cfg.algorithm.num_iterations)
    lookahead = cfg.rollout.max_staleness if cfg.rollout.mode == "async" else 0
    return PromptDataModule(
        train, val, cfg.rollout.prompts_per_step, seed=cfg.trainer.seed, num_batches=batches, lookahead=lookahead
    )


def build_logger(cfg: TrainConfig) -> Logger | bool:
    kind, out = cfg.logger.kind, Path(cfg.trainer.output_dir)
    if kind == "none":
        return False
    if kind == "csv":
        return CSVLogger(save_dir=str(out), name="csv")
    offline = cfg.logger.offline
    if offline is None:
        offline = not os.environ.get("WANDB_API_KEY")
    out.mkdir(parents=True, exist_ok=True)
    logger = WandbLogger(
        project=cfg.logger.project, name=cfg.logger.run_name, save_dir=str(out), offline=offline
    )
    logger.log_hyperparams(asdict(cfg))
    return logger


def build_engine_factory(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase):
    """The engine for ``rollout.engine``, built at ``setup`` from the module's policy."""
    r = cfg.rollout
    if r.engine == "vllm":
        from grpo_lightning.rollout.vllm import VLLMEngine, VLLMSettings

        v = r.vllm
        settings = VLLMSettings(
            in_process=v.in_process, kv_cache_gib=v.kv_cache_gib, gpu_memory_utilization=v.gpu_memory_utilization,
            max_model_len=v.max_model_len, dtype=v.dtype, enforce_eager=v.enforce_eager, seed=cfg.trainer.seed,
        )
        return lambda pl_module: VLLMEngine.from_policy(pl_module.policy, tokenizer, settings)
    return lambda pl_module: HFEngine(
        pl_module.policy, tokenizer.pad_token_id, tokenizer.eos_token_id, r.generation_batch_size
    )


def build_run(cfg: TrainConfig, engine: RolloutEngine | None = None) -> Run:
    """Validate first (before any model loads), then build module, data, callbacks, logger.

    ``engine`` reuses a running engine (e.g. one vLLM engine for a whole notebook or test
    session) instead of starting one; the weight sync pushes this run's policy into it first.
    """
    validate_config(cfg)
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    datamodule = build_datamodule(cfg)
    policy, tokenizer = load_policy(cfg.model)
    module = GRPOModule(policy, cfg.algorithm)
    r = cfg.rollout
    sampling = SamplingSettings(r.max_new_tokens, r.temperature, r.top_p, r.top_k)
    rollout_cls, extra = RolloutCallback, {}
    if r.mode == "async":
        rollout_cls, extra = AsyncRolloutCallback, {"max_staleness": r.max_staleness}
    rollout = rollout_cls(
        engine=engine if engine is not None else build_engine_factory(cfg, tokenizer),
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names(cfg.task.rewards),
        num_generations=r.num_generations,
        sampling=sampling,
        seed=cfg.trainer.seed,
        **extra,
    )
    callbacks: list[L.Callback] = [rollout, TrainingSummary()]
    if r.engine == "vllm":
        v = r.vllm
        callbacks.append(WeightSyncCallback(rollout, v.sync_every, v.verify_sync, v.verify_tolerance))
    health = HealthMonitor(cfg.health) if cfg.health.enabled else None
    if health is not None:
        callbacks.append(health)
    return Run(module, datamodule, callbacks, build_logger(cfg), tokenizer, rollout, health)
