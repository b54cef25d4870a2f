"""The hostile-completion corpus against the code_tests reward (tests/helpers/hostile_code.py):
every program that tries to game the tests scores 0, every honest one scores 1, and what the
hostile ones tried is counted by name (``reward/code_tests/hacks``). All of a kind are scored in
one batch, as a training step scores them."""

from __future__ import annotations

import json
import os

import pytest

from grpo_lightning.rewards.sources.code_sandbox import CodeTestsOptions, CodeTestsReward
from grpo_lightning.rewards.sources.sandbox import isolation_available
from tests.helpers.hostile_code import ADD_IO, ADD_TESTS, ASSERT_HACKS, HONEST, OTHER_HACKS, STDIO_HACKS

OPTIONS = {"cpu_s": 1, "wall_s": 1.5, "memory_mb": 256, "workers": 2}

pytestmark = [
    pytest.mark.slow,  # about 50 sandboxes, a few past their wall clock: the fast tier has the regression test
    pytest.mark.skipif(not isolation_available(), reason="no namespaces here: the unisolated sandbox is weaker"),
    pytest.mark.xdist_group("sandbox"),
]


def fenced(code: str) -> str:
    return f"Sure:\n```python\n{code}```\n"


def score_all(cases: dict[str, tuple[str, object]], **options) -> tuple[dict[str, float], list[tuple]]:
    """Each case's reward in one call, and what the reward logged."""
    logged = []
    reward = CodeTestsReward(CodeTestsOptions(**{**OPTIONS, **options}))
    names = list(cases)
    rewards = reward(
        prompts=["p"] * len(names),
        completions=[fenced(cases[n][0]) for n in names],
        tests=[cases[n][1] for n in names],
        log_metric=lambda name, value: logged.append((name, value)),
    )
    return dict(zip(names, rewards, strict=True)), logged


@pytest.fixture(scope="module")
def assert_scores():
    cases = {name: (code, ADD_TESTS) for name, code in ASSERT_HACKS.items()}
    cases |= {f"other:{name}": case for name, case in OTHER_HACKS.items()}
    cases |= {f"honest:{name}": case for name, case in HONEST.items()}
    return score_all(cases, partial_credit=True)


@pytest.fixture(scope="module")
def stdio_scores(tmp_path_factory):
    data = tmp_path_factory.mktemp("data") / "train.jsonl"
    data.write_text(json.dumps({"prompt": "add", "tests": ADD_IO}) + "\n")
    os.chmod(data, 0o644)
    os.chmod(data.parent, 0o755)
    cases = {name: (code.replace("DATA", repr(str(data))), ADD_IO) for name, code in STDIO_HACKS.items()}
    cases["honest"] = ("a, b = map(int, input().split())\nprint(a + b)\n", ADD_IO)
    return score_all(cases, partial_credit=True)


def test_the_corpus_is_large_enough():
    assert len(ASSERT_HACKS) + len(OTHER_HACKS) + len(STDIO_HACKS) >= 20


@pytest.mark.parametrize("name", [*ASSERT_HACKS, *(f"other:{n}" for n in OTHER_HACKS)])
def test_a_hostile_assert_program_scores_nothing(assert_scores, name):
    assert assert_scores[0][name] == 0.0


@pytest.mark.parametrize("name", list(STDIO_HACKS))
def test_a_hostile_stdio_program_scores_nothing(stdio_scores, name):
    assert stdio_scores[0][name] == 0.0


@pytest.mark.parametrize("name", list(HONEST))
def test_an_honest_program_passes_as_in_plain_python(assert_scores, name):
    assert assert_scores[0][f"honest:{name}"] == 1.0


def test_what_the_hostile_programs_tried_is_counted_by_name(assert_scores, stdio_scores):
    logged = dict(assert_scores[1])
    counted = {name.removeprefix("code_tests/hacks/") for name in logged if name.startswith("code_tests/hacks/")}
    # an object whose == lies, exits, and patches of the runtime are seen wherever they happen
    assert {"not_plain_value", "exits", "patched_builtins", "patched_exit", "atexit_handler"} <= counted, logged
    assert {"trace_hook", "patched_test_modules", "forged_answer", "odd_plain_type"} <= counted, logged
    assert 10 <= logged["code_tests/hacks"] < len(ASSERT_HACKS) + len(OTHER_HACKS), logged
    assert dict(stdio_scores[1])["code_tests/hacks"] == 0.0  # stdout is compared here: nothing to try
