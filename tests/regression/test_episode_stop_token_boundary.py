"""A chat template that puts text before the stop token in its turn close (``content\\n<|im_end|>``):
the model samples ``content<|im_end|>`` and stops, so the runner must not append the template's
``\\n<|im_end|>`` after the sampled stop token (the stop token would be trained on twice)."""

from __future__ import annotations

import random

from helpers.chat_templates import tokenizer_for

from grpo_lightning.environments.episode import EpisodeRunner
from grpo_lightning.environments.limits import EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.rollout.engine import Sampling
from tests.helpers.episodes import FakeEngine, ScriptedEnv

TOKENIZER = tokenizer_for("boundary_newline")
STOP = TOKENIZER.eos_token_id
START = TOKENIZER.convert_tokens_to_ids("<|im_start|>")
TEXT = TOKENIZER("abc xyz.", add_special_tokens=False)["input_ids"]


def test_a_turn_close_with_text_before_the_stop_token_keeps_one_stop_token_per_turn():
    for case in range(20):
        rng = random.Random(case)
        engine = FakeEngine(len(TOKENIZER), STOP, eos_rate=rng.choice([0.1, 0.3]), ids=TEXT)
        limits = EpisodeLimits(max_turns=rng.randint(2, 5), max_turn_tokens=rng.randint(2, 10), context=400)
        runner = EpisodeRunner(
            engine,
            ChatRenderer(TOKENIZER),
            lambda row, r=rng: ScriptedEnv(turns=r.randint(1, 5)),
            limits,
            Sampling(max_new_tokens=limits.max_turn_tokens, temperature=1.0, top_p=1.0, top_k=0),
            batch_window_s=0.001,
        )
        (episode,) = runner.run([{"prompt": "p"}], [case], [case])
        outputs = [engine.outputs[(tuple(prompt), seed)].token_ids for prompt, seed, _ in engine.requests]
        sampled = [t for t, m in zip(episode.ids, episode.loss_mask, strict=True) if m]
        assert sampled == [t for out in outputs for t in out], "the mask-1 tokens are not the engine's outputs"
        ids = episode.prompt_ids + episode.ids
        for at in [i for i, t in enumerate(ids) if t == STOP]:
            following = ids[at + 1 : ids.index(START, at) if START in ids[at:] else len(ids)]
            assert STOP not in following, f"case {case}: a stop token twice in {TOKENIZER.decode(ids)!r}"
