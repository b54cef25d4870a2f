"""The built-in task: sums of small numbers, e.g. prompt "3+4=" with answer "7".

Generated in code (no download), split deterministically into train and validation.
"""

from __future__ import annotations

import random


def arithmetic_records(
    max_operand: int = 9, operators: str = "+", val_fraction: float = 0.2, seed: int = 0
) -> tuple[list[dict], list[dict]]:
    """Every ``a <op> b`` with ``0 <= a, b <= max_operand``, shuffled, split train / val."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    unknown = set(operators) - set(ops)
    if unknown:
        raise ValueError(f"task.operators may contain {sorted(ops)} only, got {sorted(unknown)}")
    records = [
        {"prompt": f"{a}{op}{b}=", "answer": str(ops[op](a, b))}
        for op in operators
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]
    random.Random(seed).shuffle(records)
    num_val = int(len(records) * val_fraction)
    return records[num_val:], records[:num_val]
