"""Token ids of an episode from the chat template, without ever re-encoding what the model sampled.

The prompt is rendered once (:meth:`ChatRenderer.prompt_ids`). After each model turn, the
environment's messages become ids by comparing renders (:meth:`ChatRenderer.env_ids`): a
stand-in conversation ``[user, assistant(SENTINEL)]`` is rendered with and without the new
messages; what follows the sentinel is the template's turn close, the new messages and the
next assistant header. The sampled ids stay as they were sampled; only the boundary is
reconciled: when the model's last token is a stop token found in the template's turn close
(``<|im_end|>`` sampled, ``<|im_end|>\\n`` rendered), the close up to it is not appended again; the
rest of it (the ``\\n``) is. Text a template puts before the stop token (``\\n<|im_end|>``) is
skipped with it: the model stopped without sampling it, and a second stop token must not follow
(the ids then differ from a full render, which the start-up check names). A turn cut by a limit
(no stop token) gets the whole close. Why a stand-in rather than the real history: the sampled
text would have to be decoded and re-rendered, the re-tokenization drift this module exists to avoid.

A tokenizer without a chat template (the tiny character model) uses :data:`PLAIN_TEMPLATE`:
the messages' contents one after another, the prompt tokenized with the tokenizer's own special
tokens, as single-turn prompts are (``data/prompting.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from grpo_lightning.environments.base import Message

SENTINEL = "\u27e6Sampled\u27e7"  # the model's turn in the stand-in (mixed case: a rewrite shows)
STAND_IN_USER = "\u27e6USER\u27e7"
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


class TemplateError(ValueError):
    """The chat template cannot give environment ids by comparing renders (the message says why)."""


class ChatRenderer:
    """Renders an episode's prompt and environment messages to ids with one tokenizer's chat template.

    ``chat_template`` overrides the tokenizer's (a shipped, prefix-preserving template);
    ``stop_ids`` are the tokens that end a model turn (the tokenizer's EOS when not given).
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None, stop_ids: Iterable[int] | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None) or PLAIN_TEMPLATE
        self.plain = self.chat_template == PLAIN_TEMPLATE
        if stop_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            stop_ids = [] if eos is None else [eos]
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self._close: str | None = None  # the template's turn close after an assistant message, rendered once

    # ----------------------------------------------------------------------- rendering
    def render(self, messages: list[Message], tools: list[dict] | None = None, generation_prompt: bool = False) -> str:
        """The template's text of ``messages`` (tools declared when given)."""
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages,
            chat_template=self.chat_template,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            **kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Ids of template text (its special tokens are in the text: none are added)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """The episode's first observation, with the assistant header the model answers after."""
        text = self.render(messages, tools, generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=self.plain)["input_ids"])

    # ----------------------------------------------------------------------- environment turns
    def turn_suffix(self, messages: list[Message], tools: list[dict] | None = None, final: bool = False) -> str:
        """The text that follows a model turn: the template's turn close, ``messages`` and (unless
        ``final``) the next assistant header, found by comparing two renders of a stand-in."""
        stand_in: list[Message] = [
            {"role": "user", "content": STAND_IN_USER},
            {"role": "assistant", "content": SENTINEL},
        ]
        text = self.render(stand_in + list(messages), tools, generation_prompt=not final)
        at = text.find(SENTINEL)
        if at < 0:
            raise TemplateError(
                "the chat template does not render the assistant's content as given (it dropped or rewrote it), "
                "so environment ids cannot be found by comparing renders; set a chat_template override"
            )
        if text.count(SENTINEL) > 1:
            raise TemplateError("the chat template renders the assistant's content twice; set a chat_template override")
        return text[at + len(SENTINEL) :]

    def boundary(self, sampled_ids: list[int], suffix: str) -> str:
        """``suffix`` less the part of the turn close that the model's stop token ended: the close up to
        and including the stop token's text. A template may put text before it (``content\\n<|im_end|>``)
        that the model does not sample before stopping: it is skipped too, never a second stop token."""
        if not sampled_ids or sampled_ids[-1] not in self.stop_ids:
            return suffix
        stop_text = self.tokenizer.convert_ids_to_tokens(int(sampled_ids[-1]))
        if not stop_text:
            return suffix
        if self._close is None:
            self._close = self.turn_suffix([], None, final=True)
        at = self._close.find(stop_text)
        closed = self._close[: at + len(stop_text)] if at >= 0 else stop_text
        return suffix[len(closed) :] if suffix.startswith(closed) else suffix

    def env_text(self, sampled_ids: list[int], messages: list[Message], tools: list[dict] | None = None) -> str:
        """The text to append after the model's ``sampled_ids``: the rest of the turn close, the
        environment's ``messages`` and the next assistant header."""
        return self.boundary(sampled_ids, self.turn_suffix(messages, tools))

    def env_ids(self, sampled_ids: list[int], messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """The ids of :meth:`env_text`."""
        return self.encode(self.env_text(sampled_ids, messages, tools))

    def close_ids(self, sampled_ids: list[int]) -> list[int]:
        """The rest of the template's turn close after the last turn (what a full render would end with)."""
        return self.encode(self.boundary(sampled_ids, self.turn_suffix([], None, final=True)))
