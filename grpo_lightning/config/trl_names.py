"""TRL's ``GRPOConfig`` names, as a user coming from TRL types them, mapped to ours.

One table (:data:`TRL_NAMES`) is the single source of truth for three things: the overrides
accepted as aliases (``learning_rate=1e-6`` is ``algorithm.lr=1e-6``), the errors that name our
key where the meaning differs (``per_device_train_batch_size`` counts completions, ours counts
prompts), and the migration table in docs/trl_migration.md (:func:`migration_table`; a test
checks the page holds it). Torch-free: the CLI reads it before any heavy import.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrlName:
    """How one TRL field maps: ``alias`` (same meaning and unit: the override is renamed to
    ``ours``), else a hint: ``fix(value)`` says what to write instead (None: we lack it)."""

    ours: str | None
    note: str
    alias: bool = False
    fix: Callable[[Any], str] | None = None


def _mapped(key: str, table: dict[Any, str], fallback: str) -> Callable[[Any], str]:
    def fix(value: Any) -> str:
        chosen = table.get(str(value).lower())
        return f"{key}={chosen}" if chosen is not None else fallback

    return fix


def _prompts_per_step(value: Any) -> str:
    try:
        prompts = max(1, int(value) // 8)
    except (TypeError, ValueError):
        return "rollout.prompts_per_step=<completions / rollout.num_generations>"
    return f"rollout.prompts_per_step={prompts} (with rollout.num_generations=8; prompts, not completions)"


def _both_clips(value: Any) -> str:
    return f"algorithm.clip_low={value} algorithm.clip_high={value}"


def _alias(ours: str, note: str = "Same meaning.") -> TrlName:
    return TrlName(ours, note, alias=True)


TRL_NAMES: dict[str, TrlName] = {
    "learning_rate": _alias("algorithm.lr", "AdamW learning rate. Our default comes with the model (model=...)."),
    "num_generations": _alias("rollout.num_generations", "Completions per prompt (the group size G)."),
    "max_completion_length": _alias("rollout.max_new_tokens", "Completion budget in tokens."),
    "beta": _alias("algorithm.beta", "KL coefficient; 0 loads no reference model. TRL's default is 0.0, ours 0.04."),
    "use_bias_correction_kl": _alias(
        "algorithm.kl_bias_correction", "The KL term's gradient is the reverse KL's. Both default to true."
    ),
    "epsilon_high": _alias("algorithm.clip_high", "Upper clip of the ratio (DAPO's clip-higher)."),
    "num_iterations": _alias("algorithm.num_iterations", "Optimizer passes over each generation batch (mu)."),
    "temperature": _alias("rollout.temperature", "Sampling temperature; the trainer's log-probs use it too."),
    "top_p": _alias("rollout.top_p"),
    "top_k": _alias("rollout.top_k", "0 turns it off (TRL: None or 0)."),
    "max_steps": _alias("trainer.max_steps", "Optimizer steps."),
    "seed": _alias("trainer.seed"),
    "weight_decay": _alias("algorithm.weight_decay"),
    "max_grad_norm": _alias("algorithm.max_grad_norm"),
    "warmup_steps": _alias("algorithm.warmup_steps"),
    "output_dir": _alias("trainer.output_dir", "The CLI's default is Hydra's run folder."),
    "logging_steps": _alias("trainer.log_every_n_steps"),
    "save_steps": _alias("trainer.checkpoint_every_n_steps", "Resumable checkpoints; TRL saves every 500, we: off."),
    "save_total_limit": _alias("trainer.keep_checkpoints"),
    "eval_steps": _alias("eval.every_n_steps"),
    "run_name": _alias("logger.run_name"),
    "mask_truncated_completions": _alias("algorithm.mask_truncated", "DAPO's overlong filtering."),
    "gradient_checkpointing": _alias("model.gradient_checkpointing", "Ours also takes auto (the default)."),
    "vllm_gpu_memory_utilization": _alias("rollout.vllm.gpu_memory_utilization"),
    "vllm_importance_sampling_cap": _alias("algorithm.is_cap", "Cap of the truncated importance weight."),
    "per_device_train_batch_size": TrlName(
        "rollout.prompts_per_step",
        "Trap: TRL counts completions per device; rollout.prompts_per_step counts prompts (each gets "
        "rollout.num_generations completions) over all devices.",
        fix=_prompts_per_step,
    ),
    "gradient_accumulation_steps": TrlName(
        "rollout.prompts_per_step",
        "One optimizer step per generation batch, accumulated over micro-batches of algorithm.micro_batch_size: "
        "raise rollout.prompts_per_step for a larger batch.",
        fix=lambda v: (
            "rollout.prompts_per_step=<prompts per optimizer step> (algorithm.micro_batch_size bounds memory)"
        ),
    ),
    "generation_batch_size": TrlName(
        "rollout.prompts_per_step",
        "Trap: TRL's counts completions per generation; ours (rollout.generation_batch_size) is the sequences "
        "per generate() call, a memory bound. The batch is rollout.prompts_per_step x rollout.num_generations.",
        fix=_prompts_per_step,
    ),
    "epsilon": TrlName(
        "algorithm.clip_low",
        "TRL's epsilon sets both clips unless epsilon_high is given; ours are two keys.",
        fix=_both_clips,
    ),
    "loss_type": TrlName(
        "algorithm.loss_agg",
        "grpo: seq_mean_token_mean; dr_grpo: seq_mean_token_sum_norm (or algorithm=dr_grpo); dapo and bnpo: "
        "token_mean (or algorithm=dapo).",
        fix=_mapped(
            "algorithm.loss_agg",
            {
                "grpo": "seq_mean_token_mean",
                "dr_grpo": "seq_mean_token_sum_norm",
                "dapo": "token_mean",
                "bnpo": "token_mean",
            },
            "algorithm.loss_agg=<seq_mean_token_mean | token_mean | seq_mean_token_sum_norm>",
        ),
    ),
    "scale_rewards": TrlName(
        "algorithm.advantage_scale",
        "true / group: group; batch: batch; false / none: none (Dr. GRPO).",
        fix=_mapped(
            "algorithm.advantage_scale",
            {"true": "group", "group": "group", "batch": "batch", "false": "none", "none": "none"},
            "algorithm.advantage_scale=<group | batch | none>",
        ),
    ),
    "use_vllm": TrlName(
        "rollout.engine",
        "true: rollout.engine=vllm (or rollout=vllm); false: rollout.engine=hf.",
        fix=_mapped("rollout.engine", {"true": "vllm", "false": "hf"}, "rollout.engine=<hf | vllm>"),
    ),
    "vllm_mode": TrlName(
        "rollout.vllm.server.launch",
        "colocate: rollout.engine=vllm (in-process, the default); server: rollout.vllm.server.launch=true, or "
        "rollout.vllm.server.url=http://host:port for a running one.",
        fix=_mapped(
            "rollout.engine=vllm",
            {"colocate": "", "server": " rollout.vllm.server.launch=true"},
            "rollout.engine=vllm rollout.vllm.server.launch=true",
        ),
    ),
    "vllm_server_host": TrlName(
        "rollout.vllm.server.url", "One URL: rollout.vllm.server.url=http://host:port.", fix=lambda v: ""
    ),
    "vllm_server_port": TrlName(
        "rollout.vllm.server.url", "One URL: rollout.vllm.server.url=http://host:port.", fix=lambda v: ""
    ),
    "vllm_importance_sampling_correction": TrlName(
        "algorithm.is_level",
        "TRL's default true is token-level truncated importance sampling: algorithm.is_level=token.",
        fix=_mapped("algorithm.is_level", {"true": "token", "false": "none"}, "algorithm.is_level=<none | token>"),
    ),
    "importance_sampling_level": TrlName(
        "algorithm.policy_loss",
        "Trap: TRL's sequence level is GSPO: algorithm.policy_loss=gspo. Our algorithm.is_level is a different "
        "thing (engine vs trainer log-probs).",
        fix=_mapped("algorithm.policy_loss", {"token": "grpo", "sequence": "gspo"}, "algorithm.policy_loss=gspo"),
    ),
    "lr_scheduler_type": TrlName(
        "algorithm.lr_schedule",
        "constant, linear or cosine (TRL's default linear; ours constant).",
        fix=lambda v: f"algorithm.lr_schedule={v}",
    ),
    "bf16": TrlName(
        "trainer.precision",
        "bf16=true: trainer.precision=bf16-mixed (float32 weights, bfloat16 compute).",
        fix=_mapped("trainer.precision", {"true": "bf16-mixed", "false": "32-true"}, "trainer.precision=bf16-mixed"),
    ),
    "fp16": TrlName(
        "trainer.precision",
        "fp16=true: trainer.precision=16-mixed.",
        fix=_mapped("trainer.precision", {"true": "16-mixed", "false": "32-true"}, "trainer.precision=16-mixed"),
    ),
    "report_to": TrlName(
        "logger.kind",
        "wandb, csv or none (logger=wandb / logger=csv / logger=none); no tensorboard.",
        fix=_mapped("logger.kind", {"wandb": "wandb", "none": "none", "csv": "csv"}, "logger.kind=<wandb|csv|none>"),
    ),
    "reward_weights": TrlName(
        "task.rewards",
        "Weights sit beside the names: 'task.rewards={accuracy: 1.0, format: 0.2}'.",
        fix=lambda v: "'task.rewards={<name>: <weight>, ...}'",
    ),
    "resume_from_checkpoint": TrlName(
        "trainer.resume",
        "trainer.resume=auto (the newest checkpoint) or a checkpoint path.",
        fix=lambda v: f"trainer.resume={'auto' if str(v).lower() == 'true' else v}",
    ),
    "log_completions": TrlName(
        "logger.table_every_n_steps", "A completions table every n steps (wandb).", fix=lambda v: ""
    ),
    "max_prompt_length": TrlName(
        "task.truncate_prompts",
        "We never cut prompts silently: a prompt longer than the context is an error naming its row; "
        "task.truncate_prompts=true keeps its last tokens.",
        fix=lambda v: "",
    ),
    "max_tool_calling_iterations": TrlName(
        "task.max_turns",
        "TRL counts the tool-call rounds after the first turn; ours counts the model's turns (episode tasks: each "
        "turn may call tools), so N rounds are task.max_turns=N+1 (docs/trl_migration.md#multi-turn-and-tools).",
        fix=lambda v: f"task.max_turns={int(v) + 1}" if str(v).isdigit() else "task.max_turns=<rounds + 1>",
    ),
    "warmup_ratio": TrlName("algorithm.warmup_steps", "Warm-up is in steps only.", fix=lambda v: ""),
    "num_train_epochs": TrlName("trainer.max_steps", "Runs are counted in optimizer steps.", fix=lambda v: ""),
    "per_device_eval_batch_size": TrlName("eval.batch_size", "Held-out prompts per batch.", fix=lambda v: ""),
    "model_init_kwargs": TrlName("model.dtype", "model.dtype for torch_dtype; the rest is not exposed.", fix=None),
    "delta": TrlName(
        None, "Two-sided clipping (INTELLECT-2) is not implemented; algorithm.dual_clip is dual-clip PPO."
    ),
    "steps_per_generation": TrlName(None, "One generation batch per optimizer step (times algorithm.num_iterations)."),
    "top_entropy_quantile": TrlName(None, "Not implemented."),
    "min_p": TrlName(None, "Not implemented; rollout.top_p and rollout.top_k are."),
    "repetition_penalty": TrlName(None, "Not implemented."),
    "sync_ref_model": TrlName(None, "The reference model stays the initial policy."),
    "disable_dropout": TrlName(None, "Not exposed."),
    "use_liger_loss": TrlName(
        None, "Built in: the head is chunked (algorithm.logprob_chunk_mb), its softmax Triton kernels on GPUs."
    ),
    "cast_lm_head_to_fp32": TrlName(None, "Always: log-probs are computed in float32."),
    "num_completions_to_print": TrlName(None, "See logger.table_rows for the wandb table."),
}


def trl_problem(key: str, value: Any) -> str | None:
    """The message for a TRL name that is not an alias of ours, or None when ``key`` is no TRL name we know."""
    entry = TRL_NAMES.get(key.lstrip("+"))
    if entry is None or entry.alias:
        return None
    name = key.lstrip("+")
    if entry.ours is None:
        return f"{name} is TRL's GRPOConfig field; we lack it: {entry.note}"
    fix = entry.fix(value) if entry.fix is not None else ""
    write = f" Write {fix}." if fix else ""
    return f"{name} is TRL's GRPOConfig field; did you mean {entry.ours}?{write} {entry.note}"


def trl_hint(key: str) -> tuple[str, str] | None:
    """For a key that is no field of ours: (our key, the TRL name ``key`` is or is a typo of)."""
    found = difflib.get_close_matches(key.lstrip("+"), list(TRL_NAMES), n=1, cutoff=0.8)
    entry = TRL_NAMES[found[0]] if found else None
    return None if entry is None or entry.ours is None else (entry.ours, found[0])


def trl_alias(key: str) -> str | None:
    """Our key when ``key`` is a TRL name with the same meaning (``learning_rate`` -> ``algorithm.lr``)."""
    entry = TRL_NAMES.get(key.lstrip("+"))
    return entry.ours if entry is not None and entry.alias else None


def migration_table() -> str:
    """The markdown table of docs/trl_migration.md, made from :data:`TRL_NAMES`."""
    rows = ["| TRL `GRPOConfig` | grpo_lightning | how |", "|---|---|---|"]
    for name, entry in sorted(TRL_NAMES.items()):
        ours = f"`{entry.ours}`" if entry.ours else "(we lack it)"
        how = "alias: accepted as is" if entry.alias else ("error naming ours" if entry.ours else "error")
        rows.append(f"| `{name}` | {ours} | {how}. {entry.note} |")
    return "\n".join(rows) + "\n"
