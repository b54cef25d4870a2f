"""Issue 46, silent failure 1: a program that read the pass marker from its own file (or argv),
printed it and exited 0 scored 1.0 on tests it fails; so did one whose result's ``==`` always says
True, one that read the expected value from the caller's frame and one that skipped the asserts
with a trace function. Each now scores 0, and what it tried is counted."""

from __future__ import annotations

import pytest

from grpo_lightning.rewards.sources.code_sandbox import CodeTestsOptions, CodeTestsReward
from grpo_lightning.rewards.sources.sandbox import isolation_available
from tests.helpers.hostile_code import ADD_TESTS, ASSERT_HACKS

CASES = ["read_own_file_marker", "read_argv_marker", "always_equal_object", "walk_frames_to_the_test"]
CASES += ["trace_skips_the_asserts", "excepthook_prints_the_marker"]

pytestmark = pytest.mark.xdist_group("sandbox")


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "unisolated"])
def test_programs_that_forge_the_verdict_score_nothing(isolate):
    if isolate and not isolation_available():
        pytest.skip("no namespaces on this machine")
    logged = {}
    reward = CodeTestsReward(CodeTestsOptions(workers=2, wall_s=3.0, isolate=isolate))
    rewards = reward(
        prompts=["p"] * (len(CASES) + 1),
        completions=[f"```python\n{ASSERT_HACKS[name]}```" for name in CASES]
        + ["```python\ndef add(a, b):\n    return a + b\n```"],
        tests=[ADD_TESTS] * (len(CASES) + 1),
        log_metric=lambda name, value: logged.update({name: value}),
    )
    assert dict(zip(CASES, rewards, strict=False)) == dict.fromkeys(CASES, 0.0)
    assert rewards[-1] == 1.0  # the honest one still passes
    assert logged["code_tests/hacks"] >= 3 and logged["code_tests/hacks/not_plain_value"] == 1
