"""Which limit cut an episode task's batch, and the option that changes it: the advice the
truncation, reward-signal and episode-limits checks give for episodes.

An episode's completion is every turn and reply: its length budget is not
``rollout.max_new_tokens`` (that is one turn's budget) but the episode horizon, and an episode is
"unfinished" because a runner limit ended it (``task.max_turns``, ``task.max_total_tokens``, the
model's context), or its turns were cut at their budget. Advice that quoted the horizon as
``rollout.max_new_tokens`` sent users to the wrong option; this names the limit that cut most,
with its value (``RolloutBatch.episode_limits``) and the option to change.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "rollout/episodes/"  # the episode metrics of grpo_lightning.environments.rollout
LIMITS = ("max_turns", "max_total_tokens", "context")  # the runner's stop reasons
TURNS_CUT = 0.5  # above this share of turns cut at their budget, the turn budget is a limit worth naming


@dataclass(frozen=True)
class Cut:
    """The limit that cut most (a stop reason, or ``turn_budget`` for turns cut at their token budget),
    what it did, and what to change."""

    limit: str
    what: str
    fix: str


def is_episode_batch(rollout) -> bool:
    return PREFIX + "count" in rollout.timing


def counts(rollout) -> dict[str, float]:
    """This rank's episodes, their turns, the turns cut at their budget, and the episodes each limit ended."""
    timing = rollout.timing
    n = float(timing.get(PREFIX + "count", 0.0))
    out = {
        "episodes": n,
        "turns": n * timing.get(PREFIX + "turns", 0.0),
        "cut_turns": n * timing.get(PREFIX + "cut_turns", 0.0),
    }
    out.update({limit: float(timing.get(f"{PREFIX}stop/{limit}", 0.0)) for limit in LIMITS})
    return out


def advice(limit: str, limits: dict) -> Cut:
    """What ``limit`` did and the option to change, with the run's values."""
    turn = limits.get("max_turn_tokens")
    if limit == "turn_budget":
        return Cut(
            limit,
            f"the model's turns were cut at their token budget, rollout.max_new_tokens={turn}",
            f"raise rollout.max_new_tokens (now {turn}, the budget of one turn)",
        )
    if limit == "max_turns":
        n = limits.get("max_turns")
        return Cut(
            limit,
            f"task.max_turns={n} ended the episodes before the environment did",
            f"raise task.max_turns (now {n}), or give the environment an on_truncated hook that scores an unfinished "
            "episode",
        )
    if limit == "max_total_tokens":
        n = limits.get("max_total_tokens")
        return Cut(
            limit,
            f"the episode token budget task.max_total_tokens={n} ran out before the environment ended them",
            f"raise task.max_total_tokens (now {n}), or make the environment's replies shorter",
        )
    context = limits.get("context")
    return Cut(
        "context",
        f"the model's context ({context} tokens: prompt, turns and replies) filled up before the environment "
        "ended them",
        f"lower rollout.max_new_tokens (now {turn}) or task.max_turns so that the turns fit, make the prompt and "
        "the environment's replies shorter, or use a model with a longer context",
    )


def worst_cut(totals: dict[str, float], limits: dict) -> Cut | None:
    """The limit that cut most of ``totals`` (sums of :func:`counts`): the runner limit that ended most
    episodes, or the turn budget when most turns were cut, a larger share than any limit's episodes."""
    if not totals.get("episodes"):
        return None
    ended = {limit: totals.get(limit, 0.0) for limit in LIMITS}
    limit = max(ended, key=ended.get)
    turn_share = totals.get("cut_turns", 0.0) / max(totals.get("turns", 0.0), 1.0)
    if turn_share > max(ended[limit] / totals["episodes"], TURNS_CUT):
        limit = "turn_budget"
    elif not ended[limit]:
        return None
    return advice(limit, limits)
