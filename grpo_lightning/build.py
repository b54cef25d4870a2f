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
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.loggers import Logger, WandbLogger
from lightning.pytorch.utilities import rank_zero_info
from transformers import PreTrainedTokenizerBase

from grpo_lightning.callbacks import CompletionsTable, HealthMonitor, RunProgress, RunReport, TrainingSummary
from grpo_lightning.config import TrainConfig, checkpointing_mode, validate_config
from grpo_lightning.config.effective import apply_model_defaults, differences
from grpo_lightning.data import PromptDataModule
from grpo_lightning.data.files import max_prompt_tokens, prompt_check
from grpo_lightning.data.images import image_refs
from grpo_lightning.data.mixture import head_per_source
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.data.vision_prompting import VisionPrompts
from grpo_lightning.environments.images import EpisodeImages, refuse_engine
from grpo_lightning.environments.limits import EpisodeTaskConfig
from grpo_lightning.environments.rollout import EpisodeRollout
from grpo_lightning.environments.startup_checks import check_environment
from grpo_lightning.evaluation.episodes import EpisodeEvaluator
from grpo_lightning.evaluation.held_out import group_values
from grpo_lightning.models import load_policy
from grpo_lightning.models.allocator import apply_huge_pages, huge_pages_report, release_freed_memory
from grpo_lightning.models.compile import compile_training_models
from grpo_lightning.models.loading import default_lora_targets
from grpo_lightning.models.lora import apply_lora, lora_enabled
from grpo_lightning.models.memory import check_memory
from grpo_lightning.models.sharding import build_strategy
from grpo_lightning.models.vision.families import is_vision_config
from grpo_lightning.models.vision.loading import vision_model_type
from grpo_lightning.models.vision.processor import as_tokenizer, processor_of
from grpo_lightning.rewards.sources import bind_sources, build_sources
from grpo_lightning.rewards.sources.sandbox import keep_private
from grpo_lightning.rollout import (
    ENGINES,
    AsyncRolloutGenerator,
    RolloutEngine,
    RolloutGenerator,
    Sampling,
    WeightSync,
)
from grpo_lightning.rollout.dynamic_sampling import DynamicSampling
from grpo_lightning.rollout.pipeline import PipelineRolloutGenerator, PromptStream
from grpo_lightning.rollout.vllm_vision import refuse_unsupported
from grpo_lightning.run_objects import take_objects
from grpo_lightning.runtime.checkpoints import RunCheckpoints, checkpoints_in, fit_refusing_code, resume_path
from grpo_lightning.runtime.csv_logger import ResumableCSVLogger, csv_version
from grpo_lightning.runtime.logging_setup import quiet_console
from grpo_lightning.runtime.resume_check import check_before_loading, config_record
from grpo_lightning.runtime.run_lock import RunLock, lock_run_folder
from grpo_lightning.runtime.step_estimate import episode_step_seconds, estimate_line, time_forward
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.teachers import build_teacher
from grpo_lightning.step.teachers.checks import check_teacher
from grpo_lightning.tasks import source_weights, task_records, task_scorer
from grpo_lightning.tasks.base import checked


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
    report: RunReport | None = None  # report.png, summary.json, completions.jsonl in the output folder
    resume_from: Path | None = None  # the checkpoint trainer.resume names (checked before the model loaded)

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
        callbacks = list(kwargs["callbacks"] or [])
        if kwargs.get("enable_progress_bar", True) and not any(isinstance(c, ProgressBar) for c in callbacks):
            kwargs["callbacks"] = [*callbacks, RunProgress()]  # the one bar: reward, KL, accuracy, time left
        return L.Trainer(**kwargs)


def build_datamodule(cfg: TrainConfig, records: tuple[list[dict], list[dict]] | None = None) -> PromptDataModule:
    # Every task's prompts are vetted with the tokenizer before the model loads: characters it
    # cannot encode, prompts that leave no room for the completion. The task calls the check
    # where it names the source best (task=dataset: the file's row; generated tasks: the task).
    # ``records``: (train, val) given as objects to build_run, already vetted.
    train, val = records if records is not None else task_records(cfg.task, prompt_check(cfg))
    episodes = isinstance(cfg.task.promoted(), EpisodeTaskConfig)  # held-out episodes: val/reward, val/success
    if cfg.task.correctness_reward is None and not episodes:  # nothing defines "correct": no held-out evaluation
        val = []
    group_values(val, cfg.task.group_column)  # a held-out row without the column stops here, before the model loads
    batches = -(-cfg.trainer.max_steps // cfg.algorithm.num_iterations)
    lookahead = cfg.rollout.max_staleness if cfg.rollout.mode == "async" else 0
    return PromptDataModule(
        train,
        head_per_source(val, cfg.eval.num_prompts),
        cfg.rollout.prompts_per_step,
        seed=cfg.trainer.seed,
        num_batches=batches,
        val_batch_size=cfg.eval.batch_size,
        lookahead=lookahead,
        source_weights=source_weights(cfg.task),
        needs_prompts=not episodes,
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
    try:
        has_val = bool(run.datamodule.val_records)
        ckpt_path = run.resume_from
        if has_val and cfg.eval.before_training and ckpt_path is None:
            trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
        fit_refusing_code(trainer, run.module, run.datamodule, ckpt_path)  # checkpoints load as data, never code
        if run.checkpoints is not None and run.checkpoints.interrupted is not None:
            return
        every, batches = cfg.eval.every_n_steps, run.datamodule.num_batches or 0
        if has_val and every > 0 and batches % min(every, batches or every):
            trainer.validate(run.module, datamodule=run.datamodule, verbose=False)
    finally:  # after the last write of the run (the final evaluation's report): the user's umask comes back
        if run.lock is not None:
            run.lock.release()


def build_logger(cfg: TrainConfig, logged_config: dict | None = None) -> Logger | bool:
    """``logged_config`` (the CLI passes Hydra's resolved composition) becomes the run's config."""
    kind, out = cfg.logger.kind, Path(cfg.trainer.output_dir)
    if kind == "none":
        return False
    if kind == "csv":
        resuming = cfg.trainer.resume is not None and bool(checkpoints_in(out))  # appends to the run's CSV
        return ResumableCSVLogger(save_dir=str(out), name="csv", version=csv_version(out / "csv", resuming))
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


def build_run(
    cfg: TrainConfig,
    *,
    engine: RolloutEngine | None = None,
    logged_config: dict | None = None,
    model=None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    train_dataset=None,
    eval_dataset=None,
    reward_funcs=None,
    peft_config=None,
    callbacks: list[L.Callback] = (),
) -> Run:
    """Validate first (before any model loads), then build module, data, callbacks, logger.

    ``engine`` reuses a running engine (e.g. one vLLM engine for a whole notebook or test
    session) instead of starting one; the weight sync pushes this run's policy into it first.
    ``logged_config`` is what the logger records as the run's config (the CLI passes the
    resolved Hydra config). The rest are objects in place of names, as TRL's GRPOTrainer takes
    them (run_objects.py): ``model`` (an id or a loaded model, with its ``tokenizer``), a
    ``train_dataset`` / ``eval_dataset`` (``datasets.Dataset`` or dicts with a ``prompt``),
    ``reward_funcs`` (callables), a PEFT ``LoraConfig``, and Lightning ``callbacks`` to add.
    """
    given = take_objects(
        cfg,
        model=model,
        tokenizer=as_tokenizer(tokenizer),  # TRL's processing_class may be a VLM's processor
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        reward_funcs=reward_funcs,
        peft_config=peft_config,
    )
    cfg.task = cfg.task.promoted()  # TaskConfig(name="gsm") from Python: gsm's own options, rewards included
    apply_model_defaults(cfg)  # the CLI's composition did it already; a config made in Python gets them here
    validate_config(cfg)
    if cfg.rollout.engine == "vllm" and given.policy is None:  # a VLM family vLLM cannot run here: said first
        refuse_unsupported(vision_model_type(cfg.model), cfg.rollout)
    if isinstance(cfg.task, EpisodeTaskConfig) and (cfg.rollout.engine != "hf" or cfg.rollout.mode == "pipeline"):
        config = getattr(given.policy, "config", None)
        given_type = config.model_type if is_vision_config(config) else None
        refuse_engine(vision_model_type(cfg.model) if given.policy is None else given_type, cfg.rollout)

    quiet_console(load_vllm=cfg.rollout.engine == "vllm")  # third-party notes nobody acts on (logging_setup.py)
    rank_zero_info("config (values that differ from the defaults): " + ", ".join(differences(cfg)))
    # A second run in this folder fails here, at once; what this one writes is private to its user.
    lock = lock_run_folder(cfg.trainer.output_dir, private=not cfg.trainer.share_outputs)
    apply_huge_pages(cfg.trainer.huge_pages)  # in time only if nothing allocated yet (allocator.py)
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    if cfg.trainer.malloc_mmap_threshold > 0:
        release_freed_memory(cfg.trainer.malloc_mmap_threshold)
    L.seed_everything(cfg.trainer.seed, workers=True, verbose=False)
    records = given.records
    if records is not None:
        loaded = None if given.tokenizer is None else (given.tokenizer, _context(given.policy))
        records = checked("train_dataset", *records, prompt_check(cfg, loaded))
    datamodule = build_datamodule(cfg, records)
    loaded = None if given.tokenizer is None else (given.tokenizer, _context(given.policy))
    check_teacher(cfg, datamodule.train_records, loaded)  # tokenizer, context: before any weights load
    # A batch that cannot fit: refused now, not minutes into the first step.
    check_memory(cfg, images_per_prompt=max((len(image_refs(r)) for r in datamodule.train_records[:1000]), default=0))
    resume_from = resume_path(cfg.trainer.resume, cfg.trainer.output_dir)
    record = config_record(cfg)
    # Another model shape, a refused change, a truncated file: one line now, not after the model loads.
    check_before_loading(resume_from, record, cfg.trainer.max_steps, cfg.trainer.resume_allow_changes)
    # After the data: a run that fails on its inputs says only what failed (cli_errors).
    if cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available():
        report = huge_pages_report(cfg.trainer.huge_pages)
        if report:
            rank_zero_info(report)
    if given.policy is not None:
        policy, tokenizer = given.policy, given.tokenizer
        if lora_enabled(cfg.model.lora):
            policy = apply_lora(policy, cfg.model.lora, default_targets=default_lora_targets(policy))
    else:
        policy, tokenizer = load_policy(cfg.model)
        tokenizer = given.tokenizer or tokenizer
    r = cfg.rollout
    generator_cls, extra = RolloutGenerator, {}
    if r.mode == "async":
        generator_cls = AsyncRolloutGenerator
        extra = {"max_staleness": r.max_staleness, "max_off_policy_steps": r.max_off_policy_steps}
        extra["off_policy_action"] = r.off_policy_action
    elif r.mode == "pipeline":
        generator_cls = PipelineRolloutGenerator
        extra = {"max_lag": r.pipeline.max_lag, "max_in_flight": r.pipeline.max_in_flight}
        extra.update(max_off_policy_steps=r.max_off_policy_steps, off_policy_action=r.off_policy_action)
        extra["max_sampling_rounds"] = r.max_sampling_rounds
    v = r.vllm
    bind_sources(cfg.rewards)  # rewards.<source>.* for the sources task.rewards names
    keep_private(cfg.trainer.output_dir)  # never shown to a sandboxed program, wherever it is
    scorer = task_scorer(cfg.task, cfg.plugin_entries())
    build_sources(r.fn for r in scorer.rewards)  # a bad judge URL or reward model folder fails here, not in step 1
    rollout = generator_cls(
        engine=engine if engine is not None else build_engine_factory(cfg, tokenizer),
        tokenizer=tokenizer,
        scorer=scorer,
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
    rollout.max_steps, rollout.num_train_prompts = cfg.trainer.max_steps, len(datamodule.train_records)
    if processor_of(tokenizer) is not None:  # a vision-language policy: prompts with their images
        rollout.vision = VisionPrompts(processor_of(tokenizer), cfg.task.system_prompt)
    if isinstance(task := cfg.task.promoted(), EpisodeTaskConfig):  # multi-turn: episodes in an environment
        context = r.vllm.max_model_len or getattr(policy.config, "max_position_embeddings", None)
        rollout.episodes = EpisodeRollout.from_task(
            task,
            tokenizer,
            r.max_new_tokens,
            context,
            datamodule.train_records[0],
            cfg.model.name_or_path,
            EpisodeImages(processor_of(tokenizer), r.vllm.images_per_prompt),  # the environments' pictures
        )
        prompt = check_environment(
            rollout.episodes, datamodule.train_records, datamodule.val_records, task.environment, context
        )
        if r.engine == "hf" and (cfg.trainer.accelerator == "cpu" or not torch.cuda.is_available()):
            say_step_estimate(policy, len(tokenizer), r.prompts_per_step * r.num_generations, prompt, task.max_turns, r)
    if isinstance(rollout, PipelineRolloutGenerator):
        pipeline_inputs(rollout, datamodule, cfg)
    elif r.dynamic_sampling:
        rollout.dynamic = DynamicSampling(datamodule.train_records, r.max_sampling_rounds)
    module = GRPOModule(
        policy,
        cfg.algorithm,
        teacher=build_teacher(cfg, tokenizer, policy),
        rollout=rollout,
        correctness_reward=cfg.task.correctness_reward,
        eval_max_new_tokens=cfg.eval.max_new_tokens,
        eval_pass_k=cfg.eval.pass_k,
        auto_checkpointing=checkpointing_mode(cfg.model.gradient_checkpointing) == "auto",
    )
    if module.evaluator is not None and cfg.task.group_column is not None:  # val/<value>/* per group
        module.evaluator.group_column = cfg.task.group_column
        module.evaluator.groups = group_values(datamodule.val_records, cfg.task.group_column)
    if rollout.episodes is not None:
        e = cfg.eval
        module.evaluator = EpisodeEvaluator(
            rollout, e.greedy, e.samples_per_row, e.max_new_tokens, task.success_info, task.success_reward
        )
    if cfg.model.compile:
        compile_training_models(module)
    callbacks: list[L.Callback] = [TrainingSummary(), *callbacks]
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
        config=record,
        allow_changes=t.resume_allow_changes,
    )
    lg = cfg.logger
    report = RunReport(t.output_dir, lg.table_every_n_steps, lg.table_rows, health, checkpoints, lg.report_png)
    callbacks += [report, checkpoints]  # the report first: a checkpoint's report includes its step
    if isinstance(rollout, PipelineRolloutGenerator):  # a stop signal: the producer admits only what the step needs
        rollout.stopping = lambda: checkpoints.signals.received is not None
    logger = build_logger(cfg, logged_config)
    if isinstance(logger, WandbLogger) and cfg.logger.table_every_n_steps > 0:
        callbacks.append(CompletionsTable(cfg.logger.table_every_n_steps, cfg.logger.table_rows))
    return Run(module, datamodule, callbacks, logger, tokenizer, health, checkpoints, lock, report, resume_from)


def pipeline_inputs(rollout: PipelineRolloutGenerator, datamodule: PromptDataModule, cfg: TrainConfig) -> None:
    """What the pipeline's producer draws from: each rank's prompts in the loader's order, no more
    batches than the run trains, dynamic sampling as a filter of finished groups."""
    records, per_step = datamodule.train_records, datamodule.prompts_per_step
    rollout.streams = lambda rank, world: PromptStream(records, lambda: datamodule.train_sampler(rank, world), per_step)
    rollout.budget_batches = datamodule.num_batches
    rollout.filter_tied = cfg.rollout.dynamic_sampling


def say_step_estimate(policy, vocab: int, episodes: int, prompt: int, turns: int, r) -> None:
    """The start-up line when an episode step would take minutes on this CPU (runtime/step_estimate.py)."""
    token_s, pass_s = time_forward(policy, vocab)
    seconds = episode_step_seconds(token_s, pass_s, episodes, prompt, turns, r.max_new_tokens)
    line = estimate_line(seconds, episodes, prompt, turns, r.max_new_tokens)
    if line is not None:
        rank_zero_info(line)


def _context(policy) -> int | None:
    """A given model's context length (None: unknown, or the model loads by name)."""
    return getattr(getattr(policy, "config", None), "max_position_embeddings", None)
