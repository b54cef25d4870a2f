"""Code execution reward: the completion's Python runs against the record's tests in a sandbox
(``task.rewards={code_tests: 1.0}``, options ``rewards.code_tests.*``; the sandbox: :mod:`.sandbox`).

The tests are a column of the dataset (``tests_column``) in the formats of the common code-RL
datasets: stdin/stdout pairs (``{"inputs": [...], "outputs": [...]}`` as APPS / TACO,
``{"input": [...], "output": [...]}`` as CodeContests, or a list of ``{"input", "output"}``), or
assert statements (a list of strings, or one string of them, as MBPP's ``test_list`` and
HumanEval's checks), with an optional setup column run first (``setup_column``). The program is
the completion's last fenced code block (or all of it when it has none). Each test is its own
sandboxed run; the reward is 1 when every test passes, else 0, or the fraction passed
(``partial_credit``). Outputs are compared line by line, trailing whitespace ignored.
"""

from __future__ import annotations

import json
import re
import secrets
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from grpo_lightning.config.base import Schema, check, option
from grpo_lightning.errors import DataError
from grpo_lightning.rewards.sources.base import register_source
from grpo_lightning.rewards.sources.sandbox import Limits, isolation_available, run_python
from grpo_lightning.rewards.sources.text import message_text

FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass
class CodeTestsOptions(Schema):
    """Run the completion's Python against the record's tests in a sandbox."""

    tests_column: str = option("tests", "Column with the tests: stdin/stdout pairs or assert statements.")
    setup_column: str = option("", "Column with code run before assert tests (imports, helpers); empty: none.")
    partial_credit: bool = option(False, "Reward the fraction of tests passed instead of 1 only when all pass.")
    cpu_s: int = option(2, "CPU seconds per test run (RLIMIT_CPU).")
    wall_s: float = option(5.0, "Wall-clock seconds per test run; then its whole process group is killed.")
    memory_mb: int = option(512, "Address space per test run in MiB (RLIMIT_AS).")
    output_kb: int = option(64, "stdout + stderr per test run in KiB; more ends the run as failed.")
    file_mb: int = option(16, "Largest file a run may write, in MiB (RLIMIT_FSIZE).")
    processes: int = option(16, "Processes a run may have at once (RLIMIT_NPROC; as root each run has its own uid).")
    workers: int = option(4, "Sandboxed runs at once.")
    isolate: bool = option(True, "No network, private /tmp (namespaces); false runs without them (trusted code only).")
    python: str = option("python3", "Interpreter of the programs: a name on /usr/local/bin:/usr/bin:/bin, or a path.")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        for name in ("cpu_s", "memory_mb", "output_kb", "file_mb", "processes", "workers"):
            check(problems, getattr(self, name) >= 1, f"{p}{name}={getattr(self, name)} must be >= 1")
        check(problems, self.wall_s > 0, f"{p}wall_s={self.wall_s} must be > 0")
        check(problems, bool(self.tests_column), f"{p}tests_column is empty; name the column holding the tests")
        return problems

    def limits(self) -> Limits:
        return Limits(
            self.cpu_s,
            self.wall_s,
            self.memory_mb,
            self.output_kb,
            self.file_mb,
            self.processes,
            self.isolate,
            self.python,
        )


@dataclass(frozen=True)
class CodeTest:
    """One run: ``stdin`` and the ``expected`` stdout, or an ``assertion`` appended to the program."""

    stdin: str = ""
    expected: str | None = None
    assertion: str | None = None


def program_of(completion: Any) -> str:
    """The last fenced code block of the completion, or the whole text when there is none."""
    text = message_text(completion)
    blocks = FENCE.findall(text)
    return blocks[-1] if blocks else text


def parse_tests(tests: Any, row: int, column: str) -> list[CodeTest]:
    """The record's tests in any of the formats in the module docstring."""
    if isinstance(tests, str):
        stripped = tests.strip()
        if stripped[:1] in "[{":
            try:
                return parse_tests(json.loads(stripped), row, column)
            except json.JSONDecodeError:
                pass
        return [CodeTest(assertion=line) for line in stripped.splitlines() if line.strip().startswith("assert")]
    if isinstance(tests, dict):
        inputs = tests.get("inputs", tests.get("input"))
        outputs = tests.get("outputs", tests.get("output"))
        if isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs):
            return [CodeTest(stdin=_text(i), expected=_text(o)) for i, o in zip(inputs, outputs, strict=True)]
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        return [CodeTest(assertion=t) for t in tests]
    if isinstance(tests, list) and all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
        return [CodeTest(stdin=_text(t["input"]), expected=_text(t["output"])) for t in tests]
    raise DataError(
        f"row {row}: column {column!r} holds {type(tests).__name__} {str(tests)[:80]!r}, not tests: give "
        '{"inputs": [...], "outputs": [...]}, a list of {"input", "output"}, or a list of assert statements'
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def same_output(got: str, expected: str) -> bool:
    """Equal line by line, trailing whitespace and trailing blank lines ignored."""
    return [line.rstrip() for line in got.rstrip().splitlines()] == [
        line.rstrip() for line in expected.rstrip().splitlines()
    ]


@register_source("code_tests", options=CodeTestsOptions)
class CodeTestsReward:
    """A TRL reward function: the fraction (or all-or-nothing) of the record's tests the code passes."""

    def __init__(self, options: CodeTestsOptions):
        if options.isolate and not isolation_available():
            warnings.warn(
                "code_tests: this machine does not allow network / mount namespaces (not root, no unprivileged "
                "user namespaces): programs run with network access and the shared /tmp; see docs/rewards.md",
                stacklevel=2,
            )
            options = type(options)(**{**options.__dict__, "isolate": False})
        self.options = options
        self.limits = options.limits()

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float]:
        o = self.options
        if o.tests_column not in columns:
            raise DataError(
                f"code_tests needs a {o.tests_column!r} column (rewards.code_tests.tests_column); "
                f"the records have {sorted(columns)}"
            )
        setups = columns.get(o.setup_column) if o.setup_column else None
        runs = []  # (sample, program, test)
        counts = []
        for i, completion in enumerate(completions):
            cases = parse_tests(columns[o.tests_column][i], i, o.tests_column)
            program = program_of(completion)
            if setups is not None and setups[i]:
                program = f"{setups[i]}\n{program}"
            runs += [(i, program, case) for case in cases]
            counts.append(len(cases))
        with ThreadPoolExecutor(max_workers=o.workers) as pool:
            passed = list(pool.map(lambda run: self._passes(run[1], run[2]), runs))
        totals = [0] * len(completions)
        for (i, _, _), ok in zip(runs, passed, strict=True):
            totals[i] += ok
        return [self._score(t, n) for t, n in zip(totals, counts, strict=True)]

    def _score(self, passed: int, total: int) -> float:
        if total == 0:
            return 0.0
        return passed / total if self.options.partial_credit else float(passed == total)

    def _passes(self, program: str, case: CodeTest) -> bool:
        if case.assertion is not None:  # a secret line printed after the assert: os._exit(0) earlier fails
            marker = secrets.token_hex(8)
            result = run_python(f"{program}\n\n{case.assertion}\nprint({marker!r})\n", "", self.limits)
            return result.ok and marker in result.stdout
        result = run_python(program, case.stdin, self.limits)
        return result.ok and same_output(result.stdout, case.expected or "")
