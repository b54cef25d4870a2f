"""TRL-style reward functions, written as TRL's documentation writes them: plain functions, no
decorator, called by keyword. Used through ``task.reward_modules=[this file]`` (issue 28).

Each asserts, inside the reward, that every column value still belongs to its prompt: the data's
``question`` column is the prompt's text and ``solution`` its sum, whatever group repetition,
dynamic sampling or sharding did to the batch.
"""

import asyncio
import re

from grpo_lightning.rewards.overlong import overlong_penalty_value

CALLS: dict[str, int] = {}  # name -> calls, for the tests


def prompt_text(prompt):
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def completion_text(completion):
    return completion if isinstance(completion, str) else completion[0]["content"]


def check_columns(name, prompts, completions, kwargs):
    """Every column value belongs to its prompt; completions come as TRL gives them."""
    CALLS[name] = CALLS.get(name, 0) + 1
    question, solution = kwargs["question"], kwargs["solution"]
    assert len(prompts) == len(completions) == len(question) == len(solution) == len(kwargs["completion_ids"])
    for p, c, q, s in zip(prompts, completions, question, solution, strict=True):
        assert prompt_text(p) == q, (name, p, q)
        a, b = prompt_text(p).rstrip("=").split("+")
        assert s == str(int(a) + int(b)), (name, p, s)
        if isinstance(p, str):
            assert isinstance(c, str)
        else:
            assert isinstance(c, list) and c[0]["role"] == "assistant" and isinstance(c[0]["content"], str)
    state = kwargs["trainer_state"]
    assert state.global_step >= 0 and state.max_steps >= 0 and state.epoch >= 0


def reward_len(completions, **kwargs):
    """TRL's docs: prefer completions near 20 characters."""
    check_columns("reward_len", kwargs["prompts"], completions, kwargs)
    return [-abs(20 - len(completion_text(c))) for c in completions]


def format_reward(completions, **kwargs):
    """A format regex: digits only."""
    check_columns("format_reward", kwargs["prompts"], completions, kwargs)
    return [1.0 if re.fullmatch(r"\d+", completion_text(c).strip()) else 0.0 for c in completions]


def accuracy(completions, solution, **kwargs):
    """TRL's canonical accuracy reward: ``solution`` is a dataset column, passed by name."""
    check_columns("accuracy", kwargs["prompts"], completions, {**kwargs, "solution": solution})
    kwargs["log_metric"]("accuracy_calls", 1.0)
    kwargs["log_extra"]("expected", list(solution))
    return [float(completion_text(c).strip() == s) for c, s in zip(completions, solution, strict=True)]


def conversational_reward(prompts, completions, **kwargs):
    """TRL's conversational shape: completions are ``[{"role": "assistant", "content": ...}]`` for message prompts."""
    check_columns("conversational_reward", prompts, completions, kwargs)
    return [float(len(completion_text(c)) > 2) for c in completions]


async def async_reward(prompts, completions, **kwargs):
    """An async reward (a judge over HTTP would be one); runs concurrently with the other async ones."""
    await asyncio.sleep(0)
    check_columns("async_reward", prompts, completions, kwargs)
    return [len(completion_text(c)) % 3 / 2 for c in completions]


def sometimes_none(completions, solution, **kwargs):
    """Applies only to odd sums; None elsewhere (TRL's "not applicable")."""
    check_columns("sometimes_none", kwargs["prompts"], completions, {**kwargs, "solution": solution})
    return [
        None if int(s) % 2 == 0 else float("7" in completion_text(c))
        for c, s in zip(completions, solution, strict=True)
    ]


def get_soft_overlong_punishment(max_completion_len, soft_punish_cache):
    """A factory, as TRL's ``get_soft_overlong_punishment``: the reward is the closure it returns."""

    def soft_overlong_punishment(completion_ids, **kwargs):
        kwargs["log_metric"]("overlong_calls", 1.0)
        return [overlong_penalty_value(len(ids), max_completion_len, soft_punish_cache) for ids in completion_ids]

    return soft_overlong_punishment


overlong = get_soft_overlong_punishment(max_completion_len=4, soft_punish_cache=2)
helper_not_a_reward = re.compile  # imported helpers are never rewards unless task.rewards names them

ALL = ["reward_len", "format_reward", "accuracy", "conversational_reward", "async_reward", "sometimes_none", "overlong"]
