"""An episode's limits, each one a named stop reason, and the options of a task played in an environment.

Per-turn and total budgets are kept apart (the anchors' users hit prompt + max_tokens beyond the
context on later turns): a turn may sample at most ``min(rollout.max_new_tokens, context left,
total budget left)`` tokens. Timeouts come in two kinds: the step timeout bounds one
``reset``/``step`` call, the episode timeout the whole episode. Both stop waiting at once; a
synchronous environment running in a thread can only be abandoned there, not stopped (a
thread cannot be killed): put CPU-bound or untrusted work in a subprocess of your own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpo_lightning.config import TrainConfig, register_config_check
from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TaskConfig
from grpo_lightning.environments import aggregators, rewards  # noqa: F401  (register the aggregators, the environment reward)
from grpo_lightning.environments.base import ENVIRONMENTS, REWARD_AGGREGATORS, TOOL_PARSERS
from grpo_lightning.environments.parsers import AUTO

# Why an episode ended. "done": the environment said so; the others are limits or failures.
DONE = "done"
MAX_TURNS = "max_turns"
MAX_TOTAL_TOKENS = "max_total_tokens"  # the episode's token budget (prompt + every turn) is spent
CONTEXT = "context"  # no room left in the model's context for another turn
EPISODE_TIMEOUT = "episode_timeout"
STEP_TIMEOUT = "step_timeout"
ENV_ERROR = "env_error"
STOP_REASONS = (DONE, MAX_TURNS, MAX_TOTAL_TOKENS, CONTEXT, EPISODE_TIMEOUT, STEP_TIMEOUT, ENV_ERROR)
FAILURES = frozenset({EPISODE_TIMEOUT, STEP_TIMEOUT, ENV_ERROR})  # masked out of the loss, never dropped
# A hung reset/step must end: a minute covers a tool turn (4 calls of ToolLimits' 10 s) and a remote
# environment's reply; a step that needs longer says so with task.step_timeout_s.
STEP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EpisodeLimits:
    """The limits one episode runs under (from :class:`EpisodeTaskConfig` and ``rollout.max_new_tokens``)."""

    max_turns: int = 8
    max_turn_tokens: int = 64  # new tokens per model turn, before the context and total budgets cut it
    max_total_tokens: int | None = None  # prompt + every turn; None: the context only
    context: int | None = None  # the model's context (max_position_embeddings); None: unbounded
    episode_timeout_s: float | None = None
    step_timeout_s: float | None = STEP_TIMEOUT_S

    def turn_budget(self, used: int) -> int:
        """New tokens the next turn may sample after ``used`` tokens: never past the context or the total."""
        budget = self.max_turn_tokens
        for bound in (self.context, self.max_total_tokens):
            if bound is not None:
                budget = min(budget, bound - used)
        return max(budget, 0)

    def out_of_room(self, used: int) -> str | None:
        """The stop reason when no further turn fits after ``used`` tokens, else None."""
        if self.max_total_tokens is not None and used >= self.max_total_tokens:
            return MAX_TOTAL_TOKENS
        if self.turn_budget(used) <= 0:
            return CONTEXT if self.context is not None and used >= self.context else MAX_TOTAL_TOKENS
        return None

    def horizon(self) -> int:
        """The most tokens an episode can sample: the horizon of seq_mean_token_sum_norm (constant per run,
        whatever the environment's messages cost)."""
        total = self.max_turns * self.max_turn_tokens
        return total if self.max_total_tokens is None else min(total, self.max_total_tokens)


@dataclass
class EpisodeTaskConfig(TaskConfig):
    """The options every task played in an environment shares (its limits and rewards)."""

    environment: str = option("", "The environment: a name registered in grpo_lightning.environments.ENVIRONMENTS.")
    max_turns: int = option(8, "Model turns per episode at most (stop reason max_turns).")
    max_total_tokens: Optional[int] = option(
        None, "Prompt + every turn's tokens at most (stop reason max_total_tokens); null: the model's context."
    )
    episode_timeout_s: Optional[float] = option(
        None, "Seconds an episode may take; then it fails (masked out, counted). null: no limit."
    )
    step_timeout_s: Optional[float] = option(
        STEP_TIMEOUT_S,
        f"Seconds one environment reset/step/close may take (default {STEP_TIMEOUT_S:g}); then the episode fails, "
        "naming it. null: no limit (a hung step waits forever).",
    )
    images_per_episode: int = option(
        0,
        "A vision-language policy: the most pictures the environment returns in one episode (reset and steps), "
        "counted by the up-front memory estimate (capped at rollout.vllm.images_per_prompt); 0: none or unknown.",
    )
    failed_reward: float = option(0.0, "Reward of a failed episode (env error, timeout) in its group's statistics.")
    reward_aggregator: str = option("sum", "How per-step environment rewards become one: a REWARD_AGGREGATORS name.")
    chat_template_override: Optional[str] = option(
        None,
        "Chat template for episodes: a shipped one's name (chatml_tools) or Jinja text; null: the tokenizer's (or plain).",
    )
    tool_parser: str = option(
        AUTO,
        "How the model writes tool calls: a TOOL_PARSERS name; auto: chosen from the template/model, printed at start.",
    )
    # Hydra's structured configs take Optional, not "str | None".
    correctness_reward: Optional[str] = option(  # noqa: UP045
        None, "Episode tasks: null (held-out episodes report val/success: task.success_info or task.success_reward)."
    )
    success_info: str = option(
        "success", "The key of the environment's info whose true value means the episode succeeded (val/success)."
    )
    success_reward: Optional[str] = option(  # noqa: UP045
        None, "A reward of task.rewards whose score >= 1 means success (val/success) in place of the info; null: info."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(
            problems,
            self.group_column is None,
            f"{p}group_column={self.group_column!r}: episode tasks report val/reward and val/success over all "
            "their rows; set it to null",
        )
        for registry, name in ((ENVIRONMENTS, self.environment), (REWARD_AGGREGATORS, self.reward_aggregator)):
            if (problem := registry.problem(name)) is not None:
                problems.append(problem)
        if self.tool_parser != AUTO and (problem := TOOL_PARSERS.problem(self.tool_parser, f"{p}tool_parser")):
            problems.append(problem)
        check(problems, self.max_turns >= 1, f"{p}max_turns={self.max_turns} must be >= 1")
        check(problems, self.images_per_episode >= 0, f"{p}images_per_episode={self.images_per_episode} must be >= 0")
        total = self.max_total_tokens
        check(problems, total is None or total >= 2, f"{p}max_total_tokens={total} must be >= 2 (null = the context)")
        for name in ("episode_timeout_s", "step_timeout_s"):
            value = getattr(self, name)
            check(problems, value is None or value > 0, f"{p}{name}={value} must be > 0 (null = no limit)")
        return problems


@register_config_check
def episode_problems(cfg: TrainConfig) -> list[str]:
    """What episodes do not run with (yet): dynamic sampling, single-turn evaluation. (rollout.mode=async plays
    the next steps' episodes in the background: docs/environments.md.)"""
    task = cfg.task.promoted()
    problems: list[str] = []
    if not isinstance(task, EpisodeTaskConfig):
        single = f"task={task.name} is single-turn: its held-out prompts are decoded greedily (and eval.pass_k)"
        check(problems, cfg.eval.greedy, f"eval.greedy=false: {single}; set eval.pass_k to sample")
        check(problems, cfg.eval.samples_per_row == 1, f"eval.samples_per_row={cfg.eval.samples_per_row}: {single}")
        return problems
    why = f"task={task.name} plays episodes in an environment"
    k = cfg.eval.pass_k
    check(
        problems,
        k == 0,
        f"eval.pass_k={k}: {why}; sample k held-out episodes per row with eval.greedy=false eval.samples_per_row={k} "
        f"(val/pass@{k})",
    )
    check(
        problems,
        task.success_reward is None or task.success_reward in task.rewards,
        f"task.success_reward={task.success_reward!r} is not in task.rewards {sorted(task.rewards)}; name one of them "
        "(or null: the environment's info says success)",
    )
    check(problems, not cfg.rollout.dynamic_sampling, f"rollout.dynamic_sampling=true: {why}; set it false")
    most = cfg.rollout.vllm.images_per_prompt
    check(
        problems,
        task.images_per_episode <= most,
        f"task.images_per_episode={task.images_per_episode} is more than rollout.vllm.images_per_prompt={most}, the "
        f"most pictures an episode may hold; raise rollout.vllm.images_per_prompt to {task.images_per_episode}",
    )
    check(
        problems,
        task.correctness_reward is None,
        f"task.correctness_reward={task.correctness_reward!r}: {why}, whose held-out evaluation is not single-turn; "
        "set it null",
    )
    return problems
