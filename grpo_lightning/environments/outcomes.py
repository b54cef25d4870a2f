"""What the tools and the environments of a batch did, as ``rollout/episodes/*`` metrics.

Tool calls end in an outcome kind (``ToolEnvironment`` and the adapters report the kinds of the
errors in each step's ``info["tool_error_kinds"]`` and the calls that ran in ``info["tool_calls"]``);
an environment's own failures are the failed stop reasons, plus a ``close`` that raised (recorded,
never raised) and tool threads abandoned at their time limit (still running). Each is logged per
step, so a tool that starts failing after a change shows as a curve, not only in each episode's
info.
"""

from __future__ import annotations

from collections import Counter

from grpo_lightning.environments.episode import Episode

PREFIX = "rollout/episodes/"
# The kinds docs/environments.md lists: always logged (a CSV column from the first step), others as met.
TOOL_KINDS = ("parse", "unknown_tool", "bad_arguments", "exception", "timeout", "too_many_calls", "output_too_long")


def tool_outcomes(episode: Episode) -> Counter:
    """``calls`` (tool calls that ran) and the count of each error kind over the episode's steps."""
    totals: Counter = Counter()
    for info in episode.step_infos:
        totals["calls"] += int(info.get("tool_calls", 0) or 0)
        for kind, n in (info.get("tool_error_kinds") or {}).items():
            totals[str(kind)] += int(n)
    return totals


def outcome_metrics(episodes: list[Episode]) -> dict[str, float]:
    """``tool/<kind>``: error calls of each kind and ``tool/ran``, the calls that ran, per episode (means);
    ``close_errors`` and
    ``abandoned_threads``: counts over the batch."""
    n = max(len(episodes), 1)
    totals: Counter = Counter()
    for episode in episodes:
        totals.update(tool_outcomes(episode))
    kinds = (*TOOL_KINDS, *sorted(k for k in totals if k != "calls"))
    metrics = {f"{PREFIX}tool/{kind}": totals[kind] / n for kind in kinds}
    metrics[f"{PREFIX}tool/ran"] = totals["calls"] / n  # (tool_calls counts the calls parsed, run or not)
    metrics[f"{PREFIX}close_errors"] = float(sum("close_error" in e.info for e in episodes))
    threads = sum(int(info.get("abandoned_threads", 0) or 0) for e in episodes for info in e.step_infos)
    metrics[f"{PREFIX}abandoned_threads"] = float(threads)
    return metrics
