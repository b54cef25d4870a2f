"""Environment ids from the chat template: the boundary with the sampled turn, the plain fallback, refusals."""

from __future__ import annotations

import pytest

from grpo_lightning.environments.render import ChatRenderer, TemplateError
from grpo_lightning.models import build_char_tokenizer
from tests.helpers.episodes import chatml_tokenizer

CHATML = chatml_tokenizer()
REPLY = [{"role": "user", "content": "ok"}]


def ids(text: str) -> list[int]:
    return CHATML(text, add_special_tokens=False)["input_ids"]


def test_a_sampled_stop_token_is_not_closed_twice_and_a_cut_turn_gets_the_whole_close():
    renderer = ChatRenderer(CHATML)
    eos = CHATML.eos_token_id
    after = "\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"
    assert renderer.env_ids(ids("hi") + [eos], REPLY) == ids(after)  # the boundary newline only
    assert renderer.env_ids(ids("hi"), REPLY) == ids("<|im_end|>" + after)  # cut: the template's close
    assert renderer.close_ids(ids("hi") + [eos]) == ids("\n") and renderer.close_ids(ids("hi")) == ids("<|im_end|>\n")


def test_a_tokenizer_without_a_template_renders_contents_in_a_row():
    tokenizer = build_char_tokenizer()
    renderer = ChatRenderer(tokenizer)
    assert renderer.prompt_ids([{"role": "user", "content": "1-8?"}]) == tokenizer("1-8?")["input_ids"]
    eos = tokenizer.eos_token_id
    sampled = tokenizer("5", add_special_tokens=False)["input_ids"] + [eos]
    assert renderer.env_ids(sampled, [{"role": "user", "content": "+"}]) == tokenizer.convert_tokens_to_ids(["+"])


def test_a_template_that_rewrites_the_assistant_content_is_refused():
    template = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(TemplateError, match="chat_template override"):
        ChatRenderer(CHATML, chat_template=template).env_ids([1], REPLY)
