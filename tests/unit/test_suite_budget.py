"""The suite budget's table (tests/helpers/suite_budget.py): every test file has an area, the
shares make the whole budget, and the printed seconds and parts are the reported durations."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

from helpers.suite_budget import AREAS, SUITE_LIMIT_S, WORKERS, SuiteClock, area_of, budget_table

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_an_area_and_the_shares_make_the_budget():
    files = sorted(p.relative_to(TESTS.parent).as_posix() for p in TESTS.rglob("test_*.py"))
    assert len(files) > 100
    assert [f for f in files if area_of(f"{f}::test_x") == "other"] == []
    assert abs(sum(share for _, share, _ in AREAS) - 1.0) < 1e-9
    assert area_of("tests/integration/test_vllm_server.py::t") == "vLLM engines and servers"
    assert area_of("tests/integration/test_benchmarks_smoke.py::t") == "benchmarks smoke tier"
    assert area_of("tests/integration/test_cli.py::t") == "whole runs, CLI, outputs"  # the catch-all comes last
    # a page's examples run as written belong to the docs, whatever the page is about
    assert area_of("tests/integration/test_docs_episodes.py::t") == "docs, notebook, examples, wheel"


def test_the_table_sums_the_reported_durations_per_area_and_counts_each_test_once():
    rng = random.Random(0)
    files = sorted(p.relative_to(TESTS.parent).as_posix() for p in TESTS.rglob("test_*.py"))
    for _ in range(30):
        clock, want, count = SuiteClock(), {}, {}
        for i in range(rng.randint(1, 40)):
            nodeid = f"{rng.choice(files)}::test_{i}"
            area = area_of(nodeid)
            for when in ("setup", "call", "teardown"):
                seconds = rng.uniform(0, 30)
                clock.pytest_runtest_logreport(
                    SimpleNamespace(nodeid=nodeid, when=when, duration=seconds, skipped=False)
                )
                want[area] = want.get(area, 0.0) + seconds
            count[area] = count.get(area, 0) + 1
        assert dict(clock.durations) == want and dict(clock.tests) == count
        rows = {
            line[:34].strip(): line[34:].split() for line in budget_table(clock.durations, clock.tests).splitlines()[1:]
        }
        shares = {name: share for name, share, _ in AREAS}
        for area, seconds in want.items():
            tests, printed, allowed, used = rows[area]
            assert int(tests) == count[area] and abs(float(printed) - seconds) <= 0.5
            assert abs(float(allowed) - SUITE_LIMIT_S * WORKERS * shares[area]) <= 0.5
            assert abs(float(used.rstrip("%")) - 100 * seconds / (SUITE_LIMIT_S * WORKERS * shares[area])) <= 0.5
        assert abs(float(rows["all"][1]) - sum(want.values())) <= 0.5 and int(rows["all"][0]) == sum(count.values())
