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
from lightning.pytorch.utilities import rank_zero_info
from transformers import PreTrainedTokenizerBase

from grpo_lightning.callbacks import CompletionsTable, HealthMonitor, TrainingSummary
from grpo_lightning.checkpointing import RunCheckpoints, fit_refusing_code, resume_path
from grpo_lightning.config import TrainConfig, checkpointing_mode, validate_config
from grpo_lightning.data import PromptDataModule
from grpo_lightning.data.files import max_prompt_tokens, prompt_check
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.models import load_policy
from grpo_lightning.models.allocator import apply_huge_pages, huge_pages_report, release_freed_memory
from grpo_lightning.models.compile import compile_training_models
from grpo_lightning.models.memory import check_memory
from grpo_lightning.module import GRPOModule
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rewards.sources import bind_sources
from grpo_lightning.rollout import (
    ENGINES,
    AsyncRolloutGenerator,
    RolloutEngine,
    RolloutGenerator,
    Sampling,
    WeightSync,
)
from grpo_lightning.rollout.dynamic_sampling import DynamicSampling
from grpo_lightning.runtime.resume_check import config_record
from grpo_lightning.runtime.run_lock import RunLock, lock_run_folder
from grpo_lightning.sharding import build_strategy
from grpo_lightning.tasks import task_records


@dataclass
class Run:
    """What ``Trainer.fit`` needs, plus the tokenizer for looking at completions.

    The module owns the rollout generator (``module.rollout``) and the evaluator; the
    callbacks only observe (health, completions table, summary).
    """

    module: GRPOModule
    datamodule: PromptDataModule
    callbacks: list[L.Callback]
    logger: Logger | bool
    tokenizer: PreTrainedTokenizerBase
    health: HealthMonitor | None = None
    checkpoints: RunCheckpoints | None = None  # periodic checkpoints, hf/ export, SIGINT/SIGTERM
    lock: RunLock | None = None  # the output folder's lock (global rank 0), released when fit ends

    @property
    def rollout(self) -> RolloutGenerator:
        return self.module.rollout

    def trainer(self, cfg: TrainConfig, **overrides) -> L.Trainer:
        t = cfg.trainer
        kwargs = dict(
            max_steps=t.max_steps,
            accelerator=t.accelerator,
            devices=t.devices,
            num_nodes=t.num_nodes,
            strategy=build_strategy(t.strategy, t.devices, t.num_nodes),
            precision=t.precision,
            logger=self.logger,
            callbacks=self.callbacks,
            log_every_n_steps=t.log_every_n_steps,
            default_root_dir=t.output_dir,
            enable_checkpointing=t.enable_checkpointing,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            max_epochs=1,  # one epoch of exactly the batches needed (build_datamodule)
            **validation_kwargs(cfg, self.datamodule),
        )
        kwargs.update(overrides)
        return L.Trainer(**kwargs)


def build_datamodule(cfg: TrainConfig) -> PromptDataModule:
    # Every task's prompts are vetted with the tokenizer before the model loads: characters it
    # cannot encode, prompts that leave no room for the completion. The task calls the check
    # where it names the source best (task=dataset: the file's row; generated tasks: the task).
    train, val = task_records(cfg.task, prompt_check(cfg))
    if cfg.task.correctness_reward is None:  # nothing defines "correct": no held-out evaluation
        val = []
    batches = -(-cfg.trainer.max_steps // cfg.algorithm.num_iterations)
    lookahead = cfg.rollout.max_staleness if cfg.rollout.mode == "async" else 0
    return PromptDataModule(
        train,
        val[: cfg.eval.num_prompts],
        cfg.rollout.prompts_per_step,
        seed=cfg.trainer.seed,
        num_batches=batches,
        val_batch_size=cfg.eval.batch_size,
        lookahead=lookahead,
    )


def validation_kwargs(cfg: TrainConfig, datamodule: PromptDataModule) -> dict:
    """Trainer arguments for the held-out evaluation: every ``eval.every_n_steps`` or at the end."""
    if not datamodule.val_records:
        return {"limit_val_batches": 0}
    every = cfg.eval.every_n_steps
    if every <= 0:
        return {"limit_val_batches": 1.0, "val_check_interval": 1.0}
    return {"limit_val_batches": 1.0, "val_check_interval": min(every, datamodule.num_batches or every)}


def fit(run: Run, trainer: L.Trainer, cfg: TrainConfig) -> None:
    """``Trainer.fit`` (from ``trainer.resume``'s checkpoint if any) with the baseline evaluation
    before a fresh run and a final one if the last step had none."""
    has_val = bool(run.datamodule.val_records)
    ckpt_path = resume_path(cfg.trainer.resume, cfg.trainer.output_dir)
    if has_val and cfg.eval.before_training and ckpt_path is None:
        trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
    try:
        fit_refusing_code(trainer, run.module, run.datamodule, ckpt_path)  # checkpoints load as data, never code
    finally:
        if run.lock is not None:
            run.lock.release()
    if run.checkpoints is not None and run.checkpoints.interrupted is not None:
        return
    every, batches = cfg.eval.every_n_steps, run.datamodule.num_batches or 0
    if has_val and every > 0 and batches % min(every, batches or every):
        trainer.validate(run.module, datamodule=run.datamodule, verbose=False)


def build_logger(cfg: TrainConfig, logged_config: dict | None = None) -> Logger | bool:
    """``logged_config`` (the CLI passes Hydra's resolved composition) becomes the run's config."""
    kind, out = cfg.logger.kind, Path(cfg.trainer.output_dir)
    if kind == "none":
        return False
    if kind == "csv":
        return CSVLogger(save_dir=str(out), name="csv")
    offline = cfg.logger.offline
    if offline is None:
        offline = not os.environ.get("WANDB_API_KEY")
    out.mkdir(parents=True, exist_ok=True)
    logger = WandbLogger(project=cfg.logger.project, name=cfg.logger.run_name, save_dir=str(out), offline=offline)
    logger.log_hyperparams(logged_config if logged_config is not None else asdict(cfg))
    return logger


def build_engine_factory(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase):
    """``policy -> engine`` for ``rollout.engine`` (a name in :data:`ENGINES`), called by the module's ``setup``."""
    make = ENGINES[cfg.rollout.engine]
    return lambda policy: make(policy, tokenizer, cfg)


def build_run(cfg: TrainConfig, *, engine: RolloutEngine | None = None, logged_config: dict | None = None) -> Run:
    """Validate first (before any model loads), then build module, data, callbacks, logger.

    ``engine`` reuses a running engine (e.g. one vLLM engine for a whole notebook or test
    session) instead of starting one; the weight sync pushes this run's policy into it first.
    ``logged_config`` is what the logger records as the run's config (the CLI passes the
    resolved Hydra config).
    """
    validate_config(cfg)
    lock = lock_run_folder(cfg.trainer.output_dir)  # a second run in this folder fails here, at once
    apply_huge_pages(cfg.trainer.huge_pages)  # in time only if nothing allocated yet (allocator.py)
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    if cfg.trainer.malloc_mmap_threshold > 0:
        release_freed_memory(cfg.trainer.malloc_mmap_threshold)
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    datamodule = build_datamodule(cfg)
    check_memory(cfg)  # a batch that cannot fit: refused now, not minutes into the first step
    # After the data: a run that fails on its inputs says only what failed (cli_errors).
    if cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available():
        report = huge_pages_report(cfg.trainer.huge_pages)
        if report:
            rank_zero_info(report)
    policy, tokenizer = load_policy(cfg.model)
    r = cfg.rollout
    generator_cls, extra = RolloutGenerator, {}
    if r.mode == "async":
        generator_cls, extra = AsyncRolloutGenerator, {"max_staleness": r.max_staleness}
    v = r.vllm
    bind_sources(cfg.rewards)  # rewards.<source>.* for the sources task.rewards names
    rollout = generator_cls(
        engine=engine if engine is not None else build_engine_factory(cfg, tokenizer),
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names(cfg.task.rewards, cfg.task.reward_timeout_s),
        num_generations=r.num_generations,
        sampling=Sampling.from_config(r),
        seed=cfg.trainer.seed,
        formatter=PromptFormatter(
            tokenizer,
            cfg.task.system_prompt,
            cfg.task.instruction,
            use_chat_template=cfg.task.chat_template,
            max_tokens=max_prompt_tokens(getattr(policy.config, "max_position_embeddings", None), cfg)
            if cfg.task.truncate_prompts
            else None,
        ),
        weight_sync=WeightSync(v.sync_every, v.verify_sync, v.verify_tolerance),
        **extra,
    )
    if r.dynamic_sampling:
        rollout.dynamic = DynamicSampling(datamodule.train_records, r.max_sampling_rounds)
    module = GRPOModule(
        policy,
        cfg.algorithm,
        rollout=rollout,
        correctness_reward=cfg.task.correctness_reward,
        eval_max_new_tokens=cfg.eval.max_new_tokens,
        eval_pass_k=cfg.eval.pass_k,
        auto_checkpointing=checkpointing_mode(cfg.model.gradient_checkpointing) == "auto",
    )
    if cfg.model.compile:
        compile_training_models(module)
    callbacks: list[L.Callback] = [TrainingSummary()]
    health = HealthMonitor(cfg.health) if cfg.health.enabled else None
    if health is not None:
        callbacks.append(health)
    t = cfg.trainer
    checkpoints = RunCheckpoints(
        t.output_dir,
        tokenizer,
        every_n_steps=t.checkpoint_every_n_steps,
        keep=t.keep_checkpoints,
        export_every_n_steps=t.export_every_n_steps,
        config=config_record(cfg),
        allow_changes=t.resume_allow_changes,
    )
    callbacks.append(checkpoints)
    logger = build_logger(cfg, logged_config)
    if isinstance(logger, WandbLogger) and cfg.logger.table_every_n_steps > 0:
        callbacks.append(CompletionsTable(cfg.logger.table_every_n_steps, cfg.logger.table_rows))
    return Run(module, datamodule, callbacks, logger, tokenizer, health, checkpoints, lock)
