"""Start-up checks of an environment against the model, before any step: what would otherwise fail
silently, turns or steps later.

- **Text the tokenizer cannot encode.** The first messages of the first rows are rendered with
  the chat template; a character the tokenizer turns into its unknown token (the tiny model's
  alphabet is digits and ``+-*=? ``) stops the run naming the row, the role and the characters,
  as a prompt of a data file is refused. A prompt that leaves no room for a turn in the
  model's context is refused too.
- **A runner limit that ends episodes before the environment would.** An environment may
  declare the turns it plays at most (an attribute ``max_turns``); when ``task.max_turns`` is
  lower, or when that many turns of ``rollout.max_new_tokens`` cannot fit the context or
  ``task.max_total_tokens``, a warning names the limit, what it costs (the environment's final
  reward, unless it has ``on_truncated``, see :mod:`.truncation`) and the option to change.
"""

from __future__ import annotations

import asyncio
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from grpo_lightning.data.files import unencodable
from grpo_lightning.data.image_checks import text_parts
from grpo_lightning.environments.base import call_maybe_async
from grpo_lightning.environments.calls import first_reset, made
from grpo_lightning.environments.daemon import in_daemon_thread
from grpo_lightning.environments.images import template_messages
from grpo_lightning.environments.limits import EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.truncation import HOOK
from grpo_lightning.errors import DataError

ROWS = 4  # rows of each split whose first messages are checked (each costs one reset)


def check_first_messages(
    renderer: ChatRenderer,
    make_env: Any,
    rows: list[tuple[str, dict]],
    name: str,
    context: int | None = None,
    timeout_s: float | None = None,
) -> int:
    """Reset one environment per ``(source, row)`` (``calls.first_reset``: under the step limit, its return
    checked); a DataError for text the tokenizer cannot encode or a prompt with no room for a turn.
    Returns the last prompt's length in tokens."""
    tokenizer = renderer.tokenizer
    cache: dict[str, bool] = {}
    length = 0
    for source, row in rows:
        reset = first_reset(make_env, row, name, timeout_s)
        for message in reset.messages:
            bad = unencodable(tokenizer, text_parts([message]), cache)  # a string content, or its text parts
            if bad:
                raise DataError(
                    f"task.environment={name}: the first messages of {source} hold characters {bad} (in a "
                    f"{message.get('role')!r} message) that the tokenizer cannot encode (they would become "
                    f"{tokenizer.unk_token!r}); keep the environment's text to the tokenizer's alphabet (the tiny "
                    "model's is model.tiny.alphabet) or use a model whose tokenizer has them (model=smollm2_135m)"
                )
        length = len(renderer.prompt_ids(template_messages(reset.messages), reset.tools or None))  # images unexpanded
        if context is not None and length >= context:
            raise DataError(
                f"task.environment={name}: the first messages of {source} are {length} tokens, the model's whole "
                f"context ({context}): no room for a turn; shorten them or use a model with a longer context"
            )
    return length


def declared(make_env: Any, row: dict, name: str) -> Any:
    """One environment made on ``row`` (not reset) to read what it declares (``max_turns``, ``on_truncated``),
    then closed in a daemon thread (a close that fails or hangs is not this check's business)."""
    env = made(make_env, row, name)

    async def close() -> None:
        await call_maybe_async(env.close)

    try:
        in_daemon_thread(asyncio.run, close(), name="env-declared").result(timeout=10)
    except Exception:  # noqa: BLE001  (reading attributes is the point; see the runner for close errors)
        pass
    return env


def limit_warnings(env: Any, prompt_tokens: int, limits: EpisodeLimits) -> list[str]:
    """Where a runner limit ends episodes before the environment would, with what to change."""
    declared = getattr(env, "max_turns", None)
    hook = hasattr(env, HOOK)
    lost = "" if hook else f"; it has no {HOOK} hook, so such an episode gets no final reward"
    found = []
    if isinstance(declared, int) and declared > limits.max_turns:
        found.append(
            f"the environment plays up to {declared} turns but task.max_turns={limits.max_turns} ends its episodes "
            f"first (stop reason max_turns){lost}: raise task.max_turns to {declared}"
        )
    turns = min(declared, limits.max_turns) if isinstance(declared, int) else limits.max_turns
    need = prompt_tokens + turns * limits.max_turn_tokens
    for bound, value, fix in (
        ("the model's context", limits.context, "use a model with a longer context or fewer turns"),
        ("task.max_total_tokens", limits.max_total_tokens, "raise task.max_total_tokens"),
    ):
        if value is not None and need > value:
            found.append(
                f"{turns} turns of rollout.max_new_tokens={limits.max_turn_tokens} after a {prompt_tokens}-token "
                f"prompt need {need} tokens (the environment's replies not counted), more than {bound} "
                f"({value}): episodes that go on that long end by that limit, not by the environment{lost}; "
                f"{fix}, or lower rollout.max_new_tokens"
            )
            break
    return found


def check_environment(rollout: Any, train: list[dict], val: list[dict], name: str, context: int | None) -> int:
    """Both checks for an episode rollout over the first rows of each split (warns about the limits);
    returns the last checked row's prompt length in tokens."""
    rows = [(f"training row {i}", row) for i, row in enumerate(train[:ROWS])]
    rows += [(f"held-out row {i}", row) for i, row in enumerate(val[:ROWS])]
    if not rows:
        return 0
    timeout = rollout.limits.step_timeout_s
    length = check_first_messages(rollout.renderer, rollout.make_env, rows, name, context, timeout)
    found = limit_warnings(declared(rollout.make_env, rows[0][1], name), length, rollout.limits)
    for line in found:
        rank_zero_warn(line)
    return length
