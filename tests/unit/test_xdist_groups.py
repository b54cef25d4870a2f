"""The suite's own scheduling rule (tests/conftest.py): tests that share an expensive fixture stay
on one pytest-xdist worker, so the fixture runs once; a module marked spread_over_workers does not."""

from __future__ import annotations

import pytest
from conftest import pytest_collection_modifyitems

pytest_plugins = ["pytester"]

SHARED = """
import pytest

@pytest.fixture(scope="module")
def built():
    return 1

def test_a(built):
    assert built

def test_b(built):
    assert built

def test_c():
    pass
"""


def groups(pytester: pytest.Pytester, source: str) -> dict[str, str | None]:
    path = pytester.makepyfile(test_mod=source)
    items, _ = pytester.inline_genitems(path)
    pytest_collection_modifyitems(items)
    marks = {item.name: item.get_closest_marker("xdist_group") for item in items}
    return {name: (mark.args[0] if mark else None) for name, mark in marks.items()}


def test_tests_of_a_module_fixture_share_one_group_and_the_others_none(pytester):
    found = groups(pytester, SHARED)
    assert found["test_a"] == found["test_b"] == "test_mod.py"
    assert found["test_c"] is None


def test_a_module_marked_spread_over_workers_keeps_no_group(pytester):
    pytester.makeini("[pytest]\nmarkers =\n    spread_over_workers: x\n")
    found = groups(pytester, "import pytest\npytestmark = pytest.mark.spread_over_workers\n" + SHARED)
    assert set(found.values()) == {None}


def test_the_session_vllm_fixtures_get_their_own_groups(pytester):
    source = """
import pytest

@pytest.fixture(scope="session")
def vllm_server():
    return 1

@pytest.fixture(scope="session")
def vllm_session():
    return 1

def test_server(vllm_server):
    pass

def test_engine(vllm_session):
    pass
"""
    found = groups(pytester, source)
    assert found == {"test_server": "vllm_server", "test_engine": "vllm_engine"}
