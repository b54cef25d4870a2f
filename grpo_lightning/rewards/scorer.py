"""Score completions with several weighted reward functions, loudly on any misbehaviour.

A reward function written for TRL's ``GRPOTrainer`` works unchanged, registered or not: it is
called by keyword (:mod:`.calling`) with ``prompts``, ``completions``, ``completion_ids``,
every other column of the dataset, ``trainer_state``, ``log_extra`` and ``log_metric``, but only
those its signature takes (all of them if it takes ``**kwargs``). It may return ``None`` for a
sample it does not apply to (the weighted sum skips it, as TRL's ``nansum`` does), and may be
``async def`` (the async functions of a batch run concurrently).

A sample that *every* function returns None for is an error naming it: it has no reward, so it
would only bias its group (TRL warns and gives it no advantage); it usually means a kind of row
that no reward covers.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpo_lightning.errors import RewardError, StoppedAtOnce
from grpo_lightning.rewards.calling import PROVIDED, RewardState, call_reward, run_concurrently, signature_of
from grpo_lightning.rewards.deadline import LimitedReward, RewardTimeLimitError
from grpo_lightning.rewards.isolation import IsolatedReward, RewardWorkerError
from grpo_lightning.rewards.lookup import find_reward, module_address
from grpo_lightning.rewards.registry import RewardFn
from grpo_lightning.rewards.reward_logs import RewardLogs
from grpo_lightning.rewards.values import reward_values

__all__ = ["RewardFunctionError", "RewardScorer", "RewardState", "WeightedReward", "as_reward_completions"]


def as_reward_completions(prompts: list, texts: list[str]) -> list:
    """Completions as reward functions receive them: strings, or a one-message list
    (``[{"role": "assistant", "content": text}]``) when the prompts were messages (TRL's format)."""
    if prompts and not isinstance(prompts[0], str):
        return [[{"role": "assistant", "content": text}] for text in texts]
    return texts


class RewardFunctionError(RewardError):
    """A reward function raised, or returned something other than one finite float (or None) per completion."""


@dataclass(frozen=True)
class WeightedReward:
    name: str
    fn: RewardFn
    weight: float = 1.0

    def accepted(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments ``fn`` takes (every one if it has ``**kwargs``)."""
        sig = signature_of(self.fn)
        if sig is None or sig.takes_any:
            return kwargs
        return {k: v for k, v in kwargs.items() if k in sig.names}


def _short(prompt: Any) -> str:
    text = prompt if isinstance(prompt, str) else repr(prompt)
    return repr(text[:80] + ("..." if len(text) > 80 else ""))


class RewardScorer:
    """Total reward = sum of weight x reward over the functions that apply to each sample;
    each component is kept for logging (NaN where a function returned None)."""

    def __init__(self, rewards: Sequence[WeightedReward], modules: Sequence[str] = ()):
        if not rewards:
            raise ValueError("at least one reward function is needed (task.rewards is empty)")
        for reward in rewards:  # a NaN weight would silently drop its reward, an inf one tie every group
            if not math.isfinite(reward.weight):
                raise RewardFunctionError(f"reward {reward.name!r} has weight {reward.weight}; a weight must be finite")
        self.rewards = list(rewards)
        self.modules = tuple(modules)  # where names were looked up (the evaluator looks up its reward there too)
        self.last_logs = RewardLogs(0)  # what the functions logged in the latest call (log_metric, log_extra)

    @classmethod
    def from_names(
        cls,
        weights: dict[str, float],
        timeout_s: float | None = None,
        modules: Sequence[str] = (),
        functions: dict[str, RewardFn] | None = None,
        process: bool = True,
    ) -> RewardScorer:
        """Each name's function: from ``functions`` (callables given in Python), else looked up
        (:func:`~grpo_lightning.rewards.lookup.find_reward`: registered, a top-level callable of
        ``modules``, or ``pkg.module:function``). ``timeout_s``: at most that long a call, each in a
        killable worker process (``process``), else in this one, interrupted at the limit
        (:mod:`.deadline`); a reward source that bounds itself (``bounds_itself``) is left as it is."""
        fns = {name: (functions or {}).get(name) or find_reward(name, modules) for name in weights}
        if timeout_s is not None and process:
            fns = {
                name: IsolatedReward(name, fn, timeout_s, module_address(name, fn, modules)) for name, fn in fns.items()
            }
        elif timeout_s is not None:
            fns = {
                name: fn
                if getattr(fn, "bounds_itself", False) or isinstance(fn, LimitedReward)
                else LimitedReward(name, fn, timeout_s)
                for name, fn in fns.items()
            }
        return cls([WeightedReward(name, fns[name], float(w)) for name, w in weights.items()], modules)

    def __call__(
        self, prompts: list, completions: list, sample_fields: dict[str, list], **extra: Any
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``extra``: ``completion_ids``, ``trainer_state`` (passed to the functions that take them);
        what the functions log with ``log_metric`` / ``log_extra`` is in :attr:`last_logs` afterwards."""
        clash = sorted(set(sample_fields) & (PROVIDED - {"max_new_tokens"}))
        if clash:
            raise RewardFunctionError(
                f"the data has a column named {clash[0]!r}, which reward functions receive as an argument of "
                f"their own (TRL's convention); rename the column"
            )
        self.last_logs = RewardLogs(len(prompts))
        kwargs = {**sample_fields, **extra, **self.last_logs.callbacks()}
        raw = self._call_all(prompts, completions, kwargs)
        components = {r.name: self._validated(r.name, raw[r.name], prompts) for r in self.rewards}
        weighted = torch.stack([r.weight * components[r.name] for r in self.rewards])
        applied = ~torch.isnan(weighted)
        none_apply = (~applied.any(dim=0)).nonzero().flatten().tolist()
        if none_apply:
            i = none_apply[0]
            raise RewardFunctionError(
                f"no reward function applies to sample {i} (prompt {_short(prompts[i])}): "
                f"{[r.name for r in self.rewards]} all returned None for it ({len(none_apply)} samples "
                f"like it); add a reward that scores it, or drop such rows from the data"
            )
        # Added function after function, elementwise, so every sample's terms are summed in the
        # same order: samples that every function scores alike get bit-equal totals (a tied
        # group stays tied). A reduction over dim 0 may order the additions per column.
        total = torch.zeros(weighted.shape[1], dtype=torch.float64)
        for row in torch.where(applied, weighted, 0.0).double():
            total = total + row
        total = total.float()
        self._check_total(total, prompts)
        return total, components

    def _check_total(self, total: torch.Tensor, prompts: list) -> None:
        """Finite components can still sum to inf (a huge weight, an overflow in float32): a
        non-finite total would make its group look tied (nothing learned), so it stops like a
        non-finite reward does."""
        bad = (~torch.isfinite(total)).nonzero().flatten().tolist()
        if bad:
            weights = {r.name: r.weight for r in self.rewards}
            raise RewardFunctionError(
                f"the weighted reward total is non-finite at completions {bad[:5]} ({len(bad)} of {len(total)}; "
                f"sample {bad[0]}: prompt {_short(prompts[bad[0]])}) with task.rewards weights {weights}: "
                f"lower the weights or the scale of the rewards"
            )

    def _call_all(self, prompts: list, completions: list, kwargs: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        pending = {}
        for reward in self.rewards:
            try:
                value = call_reward(reward.fn, prompts, completions, kwargs)
            except (RewardWorkerError, RewardTimeLimitError, StoppedAtOnce):  # named already / the run's own stop
                raise
            except (Exception, SystemExit) as err:  # sys.exit() in a reward must not end the run unsaved
                raise self._raised(reward.name, err, prompts) from err
            if inspect.isawaitable(value):
                pending[reward.name] = value
            else:
                out[reward.name] = value
        if pending:
            results = run_concurrently(list(pending.values()))
            for name, result in zip(pending, results, strict=True):
                if isinstance(result, (KeyboardInterrupt, asyncio.CancelledError, StoppedAtOnce, RewardTimeLimitError)):
                    raise result  # Ctrl-C, cancellation, the run's own second-signal stop, a limit (named)
                if isinstance(result, BaseException):
                    raise self._raised(name, result, prompts) from result
                out[name] = result
        return out

    @staticmethod
    def _raised(name: str, err: BaseException, prompts: list) -> RewardFunctionError:
        kind = getattr(err, "kind", type(err).__name__)  # RewardCallFailed: the worker's exception
        return RewardFunctionError(
            f"reward function {name!r} raised {kind}: {err} (scoring {len(prompts)} "
            f"completions, the first of prompt {_short(prompts[0]) if prompts else '-'})"
        )

    @staticmethod
    def _validated(name: str, values, prompts: list) -> torch.Tensor:
        checked = reward_values(name, values, len(prompts), RewardFunctionError)
        missing = [v is None for v in checked]
        values = [0.0 if v is None else v for v in checked]
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if bad:
            raise RewardFunctionError(
                f"reward function {name!r} returned non-finite values at completions {bad[:5]} (sample "
                f"{bad[0]}: prompt {_short(prompts[bad[0]])}): a non-finite reward would poison every "
                f"advantage of its group"
            )
        return torch.tensor([math.nan if m else v for v, m in zip(values, missing, strict=True)], dtype=torch.float32)
