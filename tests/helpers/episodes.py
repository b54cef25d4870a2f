"""Shared pieces of the episode tests: a ChatML character tokenizer, a fake engine, a scripted environment."""

from __future__ import annotations

import random
import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grpo_lightning.environments.base import Reset, Step, Turn
from grpo_lightning.rollout.engine import Completion, EngineBase, GenerationRequest, Sampling

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>"]
ALPHABET = string.ascii_lowercase + string.digits + " \n\t.,:!?+-=<>/_"


def chatml_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, ChatML's markers as special tokens; EOS is ``<|im_end|>``."""
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for char in ALPHABET:
        vocab.setdefault(char, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="<|im_end|>", unk_token="<pad>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHATML
    return tokenizer


class FakeEngine(EngineBase):
    """Random ids (special and whitespace tokens included) from each request's seed, with made-up log-probs;
    ``eos_rate`` is the chance of ending a turn at each token. Records every request."""

    def __init__(self, vocab_size: int, eos_id: int, eos_rate: float = 0.15, ids: list[int] | None = None):
        self.vocab_size, self.eos_id, self.eos_rate, self.ids = vocab_size, eos_id, eos_rate, ids
        self.requests: list[tuple[list[int], int, int]] = []  # (prompt ids, seed, max_new_tokens)
        self.outputs: dict[tuple, Completion] = {}  # (request ids, seed) -> what was returned

    def generate(self, requests: list[GenerationRequest], sampling: Sampling) -> list[Completion]:
        out = []
        for request in requests:
            rng = random.Random(request.seed)
            tokens: list[int] = []
            while len(tokens) < sampling.max_new_tokens:
                if rng.random() < self.eos_rate:
                    tokens.append(self.eos_id)
                    break
                tokens.append(rng.choice(self.ids) if self.ids else rng.randrange(self.vocab_size))
                if tokens[-1] == self.eos_id:  # a real engine stops at its stop token
                    break
            completion = Completion(
                token_ids=tokens,
                finished=bool(tokens) and tokens[-1] == self.eos_id,
                logprobs=[-rng.random() * 5 for _ in tokens],
            )
            self.requests.append((list(request.prompt_ids), request.seed, sampling.max_new_tokens))
            self.outputs[(tuple(request.prompt_ids), request.seed)] = completion
            out.append(completion)
        return out


class ScriptedEnv:
    """Replies with seeded random text (whitespace and punctuation included); done after ``turns`` turns.

    ``fail_at`` makes step number ``fail_at`` raise; ``reward`` is given per step."""

    def __init__(self, turns: int = 3, fail_at: int | None = None, reply_len: int = 6, use_async: bool = False):
        self.turns, self.fail_at, self.reply_len = turns, fail_at, reply_len
        self.count = 0
        self.rng = random.Random(0)
        self.closed = False
        self.seen: list[Turn] = []
        if use_async:
            self.step = self._async_step  # type: ignore[method-assign]

    def reset(self, seed: int, row: dict) -> Reset:
        self.rng = random.Random(seed)
        return Reset(messages=[{"role": "user", "content": f"{row['prompt']} {self._text()}"}], info={"seed": seed})

    def _text(self) -> str:
        return "".join(self.rng.choice(ALPHABET) for _ in range(self.rng.randint(1, self.reply_len)))

    def step(self, turn: Turn) -> Step:
        self.seen.append(turn)
        self.count += 1
        if self.fail_at is not None and self.count == self.fail_at:
            raise RuntimeError("scripted failure")
        return Step(messages=[{"role": "user", "content": self._text()}], reward=1.0, done=self.count >= self.turns)

    async def _async_step(self, turn: Turn) -> Step:
        return ScriptedEnv.step(self, turn)

    def close(self) -> None:
        self.closed = True
