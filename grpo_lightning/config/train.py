"""``TrainConfig``: every group together, the rules that span groups, and :func:`validate_config`.

Rules about names that live above the schema (reward functions, tasks) are added by the code
that owns them through :func:`register_config_check`, so this layer imports nothing above it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from grpo_lightning.config.algorithm import AlgorithmConfig
from grpo_lightning.config.base import Schema, check, option
from grpo_lightning.config.eval import EvalConfig
from grpo_lightning.config.health import HealthConfig
from grpo_lightning.config.logger import LoggerConfig
from grpo_lightning.config.model import ModelConfig
from grpo_lightning.config.reward_sources import RewardSourcesConfig
from grpo_lightning.config.rollout import RolloutConfig
from grpo_lightning.config.task import TaskConfig, task_options
from grpo_lightning.config.teacher import teacher_problems
from grpo_lightning.config.trainer import TrainerConfig
from grpo_lightning.errors import ConfigError, PluginError
from grpo_lightning.registry import load_plugins

# Lightning precisions that cast the weights themselves (``*-true``) and the weights dtype they imply.
_TRUE_PRECISIONS = {
    "bf16-true": "bfloat16",
    "16-true": "float16",
    "32-true": "float32",
    "32": "float32",
    "64-true": "float64",
}
_PRECISION_CHOICES = (
    "the usual choices: model.dtype=float32 trainer.precision=bf16-mixed (float32 weights and AdamW "
    "state, bfloat16 compute: the most robust, the most memory), or model.dtype=bfloat16 "
    "trainer.precision=32-true (bfloat16 weights, gradients and AdamW state: half the memory; LoRA "
    "adapters stay float32; full training with a small lr can lose updates below bfloat16's resolution)"
)


@dataclass
class TrainConfig(Schema):
    plugins: list[str] = option(
        [], "Python files (path/to/x.py) or modules imported first; what they register can be named."
    )
    model: ModelConfig = option(ModelConfig(), "The policy.")
    task: TaskConfig = dataclasses.field(
        default_factory=lambda: TaskConfig().promoted(),  # the arithmetic task's own options, once it is registered
        metadata={"help": "The task: its prompts, rewards and options (task=<name> picks its options class)."},
    )
    rollout: RolloutConfig = option(RolloutConfig(), "Generation of completions.")
    algorithm: AlgorithmConfig = option(AlgorithmConfig(), "The GRPO objective and optimizer.")
    trainer: TrainerConfig = option(TrainerConfig(), "The Lightning Trainer.")
    logger: LoggerConfig = option(LoggerConfig(), "Metrics logging.")
    health: HealthConfig = option(HealthConfig(), "The health monitor: one check per failure (docs/failure_modes.md).")
    eval: EvalConfig = option(EvalConfig(), "Held-out evaluation: val/accuracy (greedy) and val/pass@k.")
    rewards: RewardSourcesConfig = option(
        RewardSourcesConfig(), "Options of reward sources named in task.rewards: reward_model, judge, code_tests."
    )

    def check_fields(self, p: str) -> list[str]:
        """The rules that span groups."""
        problems: list[str] = []
        r, a, t, m = self.rollout, self.algorithm, self.trainer, self.model
        batch = r.prompts_per_step * r.num_generations
        if (problem := a.micro_batch_problem(batch)) is not None:
            problems.append(problem)
        check(
            problems,
            0 <= self.task.overlong_buffer_tokens <= r.max_new_tokens,
            f"task.overlong_buffer_tokens={self.task.overlong_buffer_tokens} must be in [0, rollout.max_new_tokens="
            f"{r.max_new_tokens}] (0 = a fifth of the budget)",
        )
        check(
            problems,
            r.engine != "vllm" or t.devices == 1 or r.uses_server,
            f"rollout.engine=vllm with trainer.devices={t.devices} needs one vLLM server shared by the ranks: set "
            f"rollout.vllm.server.launch=true (or rollout.vllm.server.url=http://host:port for a running one); an "
            f"in-process engine lives inside one training process. Or use rollout.engine=hf.",
        )
        check(
            problems,
            t.strategy != "fsdp" or (t.checkpoint_every_n_steps == 0 and t.resume is None),
            f"trainer.strategy=fsdp does not write or resume checkpoints yet (trainer.checkpoint_every_n_steps="
            f"{t.checkpoint_every_n_steps}, trainer.resume={t.resume!r}): Lightning saves sharded models as a folder "
            f"of shards; set trainer.checkpoint_every_n_steps=0 and trainer.resume=null (the hf/ export works), or "
            f"use trainer.strategy=ddp",
        )
        check(
            problems,
            t.strategy != "fsdp" or r.engine == "hf",
            f"trainer.strategy=fsdp needs rollout.engine=hf (got {r.engine}): the weight sync into vLLM pushes whole "
            f"tensors, and under fsdp each rank holds a shard of each; use trainer.strategy=ddp with vLLM",
        )
        check(
            problems,
            not (m.compile and t.strategy == "fsdp"),
            "model.compile=true with trainer.strategy=fsdp is not supported: FSDP2 gathers each layer's weights in "
            "hooks around the layer that the compiled layer would have to trace; set model.compile=false, or use "
            "trainer.strategy=ddp",
        )
        check(
            problems,
            a.truncated_sampling != "refuse" or (r.top_p >= 1.0 and r.top_k == 0),
            f"rollout.top_p={r.top_p} / rollout.top_k={r.top_k} truncate the engine's distribution while "
            "algorithm.truncated_sampling=refuse: a trainer scoring the full softmax would see every token off by "
            "log(kept mass), biasing the ratio and every correction; set algorithm.truncated_sampling=replay, or "
            "rollout.top_p=1.0 rollout.top_k=0",
        )
        problems += teacher_problems(self)
        p_ = str(t.precision)
        if m.dtype in ("bfloat16", "float16") and p_.endswith("-mixed"):
            problems.append(
                f"model.dtype={m.dtype} with trainer.precision={p_}: mixed precision autocasts float32 weights "
                f"(and 16-mixed unscales float32 gradients); with {m.dtype} weights it has nothing to do. Pick one of "
                + _PRECISION_CHOICES
            )
        implied = _TRUE_PRECISIONS.get(p_)
        if implied is not None and implied != "float32" and m.dtype != implied:
            problems.append(
                f"trainer.precision={p_} casts the weights to {implied} itself while model.dtype={m.dtype}: set "
                f"model.dtype={implied} (it loads in that dtype directly, without a float32 copy first), or pick "
                "one of " + _PRECISION_CHOICES
            )
        return problems

    def __setattr__(self, name: str, value) -> None:
        # Switching the task after construction resets the fields that depend on it (rewards,
        # correctness_reward, prompts): cfg.task = "gsm", or a TaskConfig(name=...) with changes.
        if name == "task" and "task" in self.__dict__:
            value = task_options(value) if isinstance(value, str) else value.promoted()
        super().__setattr__(name, value)

    def plugin_entries(self) -> list[str]:
        """``plugins`` plus ``task.reward_modules``, each once, in order."""
        return list(dict.fromkeys([*self.plugins, *self.task.reward_modules]))


ConfigCheck = Callable[[TrainConfig], list[str]]
_CHECKS: list[ConfigCheck] = []


def register_config_check(check_fn: ConfigCheck) -> ConfigCheck:
    """Add a rule that needs names registered above the schema (e.g. reward functions).

    The owner (``grpo_lightning.rewards``) registers it on import; :func:`validate_config` runs it.
    """
    if check_fn not in _CHECKS:
        _CHECKS.append(check_fn)
    return check_fn


def validate_config(cfg: TrainConfig) -> None:
    """Raise :class:`ConfigError` listing every invalid field, before anything heavy runs.

    Imports ``plugins`` (and ``task.reward_modules``) first, so what they register
    can be named."""
    problems: list[str] = []
    for entries, field in ((cfg.plugins, "plugins"), (cfg.task.reward_modules, "task.reward_modules")):
        try:
            load_plugins(entries, field=field)
        except PluginError as err:
            problems += str(err).splitlines()
    problems += cfg.validate()
    for check_fn in _CHECKS:
        problems += check_fn(cfg)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
