"""The suite's time budget by area: what ``make test`` prints at its end.

The whole suite must finish in 15 minutes on a fresh 2-core machine (two pytest-xdist
workers: 1800 seconds of test time at most). Each area of the suite gets a share of that;
:func:`budget_table` says how much of its share each area used in this run, so a change that
makes one area grow shows up where it happened, on whichever machine runs the suite. Timings
are printed, never asserted (a machine's speed is not a test result). Standard library only:
pytest-xdist's controller, which prints the table, imports no torch.
"""

from __future__ import annotations

import re
from collections import defaultdict

SUITE_LIMIT_S = 15 * 60  # the suite's wall-time limit on a fresh 2-core machine
WORKERS = 2  # make test's -n logical on 2 cores

# (area, share of the budget, the test files it holds: a regex on the path, first match wins).
# The shares are the areas' parts of the measured suite (benchmarks/results/LOG.md, "The demo and
# the test suite"), rounded: on the AMD EPYC (Zen 4) machine the suite uses about 62% of the budget,
# each area about as much of its share.
# The benchmarks' smoke tier came later: its share is its own run's time on two workers with room to
# spare, taken from the unit, regression and DDP areas (59%, 52% and 52% of theirs used in that suite).
AREAS: tuple[tuple[str, float, str], ...] = (
    ("unit tier", 0.13, r"^tests/unit/"),
    ("regression tier", 0.08, r"^tests/regression/"),
    ("benchmarks smoke tier", 0.03, r"^tests/integration/test_benchmarks"),
    ("vLLM engines and servers", 0.30, r"^tests/integration/test_(vllm|server)"),
    ("DDP and scale-out", 0.05, r"^tests/integration/test_(ddp|two_nodes)"),
    ("docs, notebook, examples, wheel", 0.12, r"^tests/integration/test_(readme|docs_|notebook|extending|wheel)"),
    ("faults and bad input", 0.08, r"^tests/integration/test_(fault|bad_inputs|cli_errors)"),
    ("environments and episodes", 0.05, r"^tests/integration/test_(openenv|verifiers|.*episodes|guess|key_lookup)"),
    ("whole runs, CLI, outputs", 0.16, r"^tests/integration/"),
)


def area_of(nodeid: str) -> str:
    """The area a test belongs to, from its node id (``tests/...py::name``)."""
    path = nodeid.split("::", 1)[0]
    for name, _, pattern in AREAS:
        if re.match(pattern, path):
            return name
    return "other"


def budget_table(durations: dict[str, float], tests: dict[str, int]) -> str:
    """One line per area that ran: its tests, its seconds of test time (setup, call and teardown,
    summed over workers), and that as a part of its budget; then the total."""
    budget = SUITE_LIMIT_S * WORKERS
    shares = {name: share for name, share, _ in AREAS}
    lines = [f"{'area':34} {'tests':>6} {'seconds':>8} {'budget':>7} {'used':>6}"]
    for name in [a for a, _, _ in AREAS] + ["other"]:
        if name not in durations:
            continue
        allowed = budget * shares.get(name, 0.0)
        used = f"{durations[name] / allowed:6.0%}" if allowed else "     -"
        lines.append(f"{name:34} {tests[name]:6d} {durations[name]:8.0f} {allowed:7.0f} {used}")
    total = sum(durations.values())
    lines.append(f"{'all':34} {sum(tests.values()):6d} {total:8.0f} {budget:7.0f} {total / budget:6.0%}")
    return "\n".join(lines)


class SuiteClock:
    """Sums each test's reported durations by area (a pytest plugin object, see conftest.py)."""

    def __init__(self) -> None:
        self.durations: dict[str, float] = defaultdict(float)
        self.tests: dict[str, int] = defaultdict(int)

    def pytest_runtest_logreport(self, report) -> None:
        area = area_of(report.nodeid)
        self.durations[area] += report.duration
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.tests[area] += 1

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.durations:
            terminalreporter.write_sep("=", "test time by area, against its share of the 15-minute budget")
            terminalreporter.write_line(budget_table(self.durations, self.tests))
