"""Every column value a reward function gets belongs to its prompt (issue 28): property tests over
random data through the real generator (group repetition, DAPO's dynamic sampling) on each of two
ranks of the real prompt sampler, with an engine that echoes the prompt, so no model runs."""

from __future__ import annotations

import random
from pathlib import Path

from grpo_lightning.data.sampler import PromptSampler
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.records import Completion
from grpo_lightning.rewards import RewardScorer, find_reward
from grpo_lightning.rollout import RolloutGenerator, Sampling
from grpo_lightning.rollout.dynamic_sampling import DynamicSampling
from grpo_lightning.rollout.engine import EngineBase

TRL_FILE = str(Path(__file__).resolve().parents[2] / "helpers" / "trl_style_rewards.py")
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


class EchoEngine(EngineBase):
    """The completion is the prompt's last digit and one digit drawn from the request's seed: which
    prompt a completion came from is readable in it, and a group's completions differ."""

    def __init__(self, tokenizer):
        self.digits = [tokenizer.convert_tokens_to_ids(d) for d in "0123456789"]

    def generate(self, requests, sampling):
        out = []
        for r in requests:
            last = [t for t in r.prompt_ids if t in self.digits][-1]
            out.append(Completion([last, random.Random(r.seed).choice(self.digits)], finished=True))
        return out

    def sequence_logprobs(self, prompt_ids, completion_ids):
        return [-1.0] * len(completion_ids)


def echo_checked(prompts, completions, question, solution, **kwargs):
    """Asserts the alignment; scores some prompts alike (tied groups: dynamic sampling redraws them)."""
    for p, c, q, s in zip(prompts, completions, question, solution, strict=True):
        text = p if isinstance(p, str) else p[-1]["content"]
        c = c if isinstance(c, str) else c[0]["content"]
        assert text == q and text[-2] == c[0], (p, q, c)
        a, b = text.rstrip("=").split("+")
        assert s == str(int(a) + int(b))
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [0.0 if int(s) % 3 == 0 else float(t[-1]) for t, s in zip(texts, solution, strict=True)]


def records(rng, size, conversational=False):
    pairs = rng.sample([(a, b) for a in range(1, 30) for b in range(1, 30)], size)
    rows = []
    for a, b in pairs:
        text = f"{a}+{b}="
        rows.append(
            {
                "prompt": [{"role": "user", "content": text}] if conversational else text,
                "question": text,
                "solution": str(a + b),
            }
        )
    return rows


TRL_NAMES = ["accuracy", "conversational_reward", "async_reward", "sometimes_none", "reward_len"]


def generator_for(tokenizer, group, seed, data, dynamic):
    functions = {"echo_checked": echo_checked, **{n: find_reward(n, [TRL_FILE]) for n in TRL_NAMES}}
    scorer = RewardScorer.from_names({n: 1.0 for n in functions}, functions=functions)
    gen = RolloutGenerator(
        EchoEngine(tokenizer),
        tokenizer,
        scorer,
        group,
        Sampling(max_new_tokens=2, temperature=1.0, top_p=1.0, top_k=0),
        seed=seed,
    )
    gen.max_steps, gen.num_train_prompts = 2, len(data)
    if dynamic:
        gen.dynamic = DynamicSampling(data, max_rounds=3)
    return gen


def test_columns_stay_with_their_prompts_over_groups_dynamic_sampling_and_two_ranks():
    rng = random.Random(0)
    plain, chat = build_char_tokenizer(), build_char_tokenizer()
    chat.chat_template = CHAT_TEMPLATE
    redrawn = 0  # dynamic-sampling steps that drew extra prompts (their records are re-assembled)
    for trial in range(24):
        size, group, per_step = rng.randint(6, 24), rng.randint(2, 4), rng.randint(1, 3)
        conversational, dynamic = trial % 2 == 1, trial % 4 >= 2
        data = records(rng, size, conversational)
        tokenizer = chat if conversational else plain
        seen: dict[int, list[set]] = {0: [], 1: []}
        for rank in (0, 1):
            sampler = PromptSampler(size, 2 * per_step, seed=trial, rank=rank, world_size=2, batch_size=per_step)
            order = list(sampler)
            gen = generator_for(tokenizer, group, trial, data, dynamic)
            for step in range(2):
                batch_records = [data[i] for i in order[step * per_step : (step + 1) * per_step]]
                batch = gen.rollout_for_step(batch_records, step, rank)  # the rewards assert inside
                assert batch.num_groups == per_step
                redrawn += batch.timing.get("rollout/sampling_rounds", 1) > 1
                groups = [batch.prompts[g * group : (g + 1) * group] for g in range(per_step)]
                assert all(len(set(g)) == 1 for g in groups)  # a group is one prompt, repeated
                assert len(batch.reward_extra["expected"]) == batch.num_sequences  # log_extra: one per row
                assert batch.reward_metrics == {"reward/accuracy_calls": 1.0}
                seen[rank].append({r["question"] for r in batch_records})
        for step in range(2):  # the two ranks' prompts of a step are different prompts
            assert not seen[0][step] & seen[1][step], (trial, size, per_step)
    assert redrawn >= 5
