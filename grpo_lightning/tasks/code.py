"""``task=code``: write a short Python function that the record's assert tests check in a sandbox.

Generated in code from a few families of one-line functions ("returns x plus 3", "returns how
many times 'a' appears in s", ...), each with a parameter, so there are a few hundred distinct
prompts; the tests (column ``tests``: assert statements) come from a reference implementation.
Rewarded by ``code_tests`` (grpo_lightning/rewards/sources/code_sandbox.py). Small enough for a
small instruction-tuned model to make progress on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, TaskConfig, task_name
from grpo_lightning.tasks.base import Check, checked, split

# name, arguments, what it returns (with {k}), reference(k) -> function, test inputs(k)
FAMILIES: list[tuple[str, str, str, Callable[[int], Callable], Callable[[int], list[tuple]]]] = [
    ("add_k", "x", "x plus {k}", lambda k: lambda x: x + k, lambda k: [(0,), (5,), (-3,)]),
    ("times_k", "x", "x multiplied by {k}", lambda k: lambda x: x * k, lambda k: [(1,), (4,), (-2,)]),
    (
        "divisible_by_k",
        "n",
        "True if n is divisible by {k}, else False",
        lambda k: lambda n: n % k == 0,
        lambda k: [(0,), (k,), (k + 1,), (3 * k,), (7 * k + 1,)],
    ),
    (
        "count_k",
        "s",
        "how many times the digit '{k}' appears in the string s",
        lambda k: lambda s: s.count(str(k)),
        lambda k: [("",), (f"1{k}2{k}",), (f"{k}{k}{k}",), (f"{k + 1}{k - 1}",)],
    ),
    (
        "first_k",
        "xs",
        "a list of the first {k} elements of the list xs",
        lambda k: lambda xs: xs[:k],
        lambda k: [(list(range(1, 12)),), ([],), ([7, 8],)],
    ),
    ("square_plus_k", "x", "x squared plus {k}", lambda k: lambda x: x * x + k, lambda k: [(0,), (3,), (-4,)]),
    (
        "sum_above_k",
        "xs",
        "the sum of the numbers in the list xs that are greater than {k}",
        lambda k: lambda xs: sum(x for x in xs if x > k),
        lambda k: [([],), ([k, k + 1, 20],), ([-1, 0, k, 100],)],
    ),
    ("repeat_k", "s", "the string s repeated {k} times", lambda k: lambda s: s * k, lambda k: [("ab",), ("",), ("x",)]),
]


@dataclass
class CodeTaskConfig(TaskConfig):
    """Short Python functions checked by assert tests in a sandbox."""

    name: str = task_name("code")
    max_k: int = option(9, "Each family's parameter k runs from 1 to this value (prompts: families x max_k).")
    rewards: dict[str, float] = option({"code_tests": 1.0}, "Reward function name -> weight.")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.max_k >= 2, f"{p}max_k={self.max_k} must be >= 2 (too few prompts)")
        return problems


def code_records(max_k: int = 9, val_fraction: float = 0.2, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Every family with k in 1..max_k: a prompt and its assert tests, shuffled, split train / val."""
    records = []
    for name, args, returns, reference, inputs in FAMILIES:
        for k in range(1, max_k + 1):
            fn = reference(k)
            cases = inputs(k)
            tests = [f"assert {name}({', '.join(map(repr, c))}) == {fn(*c)!r}" for c in cases]
            prompt = f"Write a Python function `{name}({args})` that returns {returns.format(k=k)}."
            records.append({"prompt": prompt, "tests": tests, "function": name, "k": k})
    random.Random(seed).shuffle(records)
    return split(records, val_fraction)


@TASKS.register("code", options=CodeTaskConfig)
def code(options: CodeTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    train, val = code_records(options.max_k, options.val_fraction, options.seed)
    return checked(options.name, train, val, check)
