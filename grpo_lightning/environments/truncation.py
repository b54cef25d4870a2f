"""The reward of an episode that a runner limit ended before the environment did.

A game that scores only when it is over (hangman's partial credit, a puzzle's progress) gives
nothing to an episode cut by ``task.max_turns``, the token budget or the context: its reward is
lost, silently. An environment may define ``on_truncated(reason)`` (sync or async), called once
when a limit ends its episode, returning the reward of the episode as it stands (or None).
The reward joins the step rewards and is the final reward the ``final`` aggregator takes; a hook
that raises or runs past ``task.step_timeout_s`` fails the episode, as a step would.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from grpo_lightning.environments.limits import CONTEXT, MAX_TOTAL_TOKENS, MAX_TURNS
from grpo_lightning.environments.returns import EnvironmentReturnError
from grpo_lightning.rewards.values import as_reward

HOOK = "on_truncated"
LIMITS = frozenset({MAX_TURNS, MAX_TOTAL_TOKENS, CONTEXT})  # the runner's limits (failures are not asked)
INFO = "truncated_reward"  # where the hook's reward is recorded in the episode's info


async def reward_at_limit(env: Any, episode: Any, call: Callable[..., Awaitable[Any]], name: str = "") -> None:
    """Ask ``env`` for the reward of ``episode`` if a limit ended it and the environment has the hook;
    ``call(env, fn, *args)`` is the runner's environment call (timeouts and failures as for a step). A
    reward that is not a finite number or None is the environment's bug: one line naming it, as for a
    step's reward (``returns.py``)."""
    hook = getattr(env, HOOK, None)
    if hook is None or episode.stop_reason not in LIMITS:
        return
    value = await call(env, hook, episode.stop_reason)
    try:
        reward = as_reward(value)
    except TypeError:
        reward = math.nan
    if reward is not None and not math.isfinite(reward):
        raise EnvironmentReturnError(
            f"environment {name or type(env).__name__!r}: {HOOK}() must return a finite number or None (as a step's "
            f"reward), got a {type(value).__name__}: {value!r:.80}; fix what its {HOOK}() returns"
        )
    if reward is not None:
        episode.step_rewards.append(reward)
        episode.info[INFO] = reward
