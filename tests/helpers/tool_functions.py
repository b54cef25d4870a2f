"""Tool functions a spawned worker process can import by module and name (process-isolated tools)."""

from __future__ import annotations


def spin(n: int) -> int:
    """Loop forever: a CPU-bound tool that never returns.

    Args:
        n: ignored
    """
    while True:
        n += 1
