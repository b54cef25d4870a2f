"""Code execution reward: the completion's Python runs against the record's tests in a sandbox
(``task.rewards={code_tests: 1.0}``, options ``rewards.code_tests.*``; the sandbox: :mod:`.sandbox`).

The tests are a column of the dataset (``tests_column``) in the formats of the common code-RL
datasets: stdin/stdout pairs (``{"inputs": [...], "outputs": [...]}`` as APPS / TACO,
``{"input": [...], "output": [...]}`` as CodeContests, or a list of ``{"input", "output"}``), or
assert statements (a list of strings, or one string of them, as MBPP's ``test_list`` and
HumanEval's checks), with an optional setup column run first (``setup_column``). The program is
the completion's last fenced code block (or all of it when it has none). Each test is its own
process of the program, in one sandbox per completion; the reward is 1 when every test passes,
else 0, or the fraction passed (``partial_credit``). Outputs are compared here, line by line,
trailing whitespace ignored; assert tests are evaluated by the sandbox's checker, outside the
program's process (:mod:`.sandbox`). What a program tried against the tests (a value whose
``==`` lies, exiting, patching the runtime) scores nothing and is counted by name in
``reward/code_tests/hacks`` (completions of the batch) and ``reward/code_tests/hacks/<name>``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from grpo_lightning.config.base import Schema, check, option
from grpo_lightning.errors import ConfigError, DataError
from grpo_lightning.rewards.sources.base import register_source
from grpo_lightning.rewards.sources.sandbox import (
    Limits,
    SandboxError,
    interpreter,
    isolation_problem,
    prefixes,
    private_paths,
    run_tests,
)
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
    isolate: bool = option(
        True, "Namespaces: no network, a read-only root of system folders, nothing persists; false: trusted code only."
    )
    python: str = option("python3", "Interpreter of the programs: a name on /usr/local/bin:/usr/bin:/bin, or a path.")
    scratch_mb: int = option(64, "Memory-backed space a run may write (its folder, /tmp, /dev/shm), in MiB (isolated).")
    visible: list[str] = option([], "Host folders the programs may read (read-only) besides /usr, /etc, /lib*, /bin.")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        for name in ("cpu_s", "memory_mb", "output_kb", "file_mb", "processes", "workers", "scratch_mb"):
            check(problems, getattr(self, name) >= 1, f"{p}{name}={getattr(self, name)} must be >= 1")
        check(problems, self.wall_s > 0, f"{p}wall_s={self.wall_s} must be > 0")
        check(problems, bool(self.tests_column), f"{p}tests_column is empty; name the column holding the tests")
        check(
            problems,
            os.sep not in self.python or os.access(self.python, os.X_OK),
            f"{p}python={self.python!r} is not an executable file; give a path to a Python interpreter or a name "
            "on /usr/local/bin:/usr/bin:/bin",
        )
        for folder in self.visible:
            check(problems, os.path.isdir(folder), f"{p}visible names {folder!r}, which is not a folder here")
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
            self.scratch_mb,
            tuple(self.visible),
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
        return [
            checked_assertion(line, row, column) for line in stripped.splitlines() if line.strip().startswith("assert")
        ]
    if isinstance(tests, dict):
        inputs = tests.get("inputs", tests.get("input"))
        outputs = tests.get("outputs", tests.get("output"))
        if isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs):
            return [CodeTest(stdin=_text(i), expected=_text(o)) for i, o in zip(inputs, outputs, strict=True)]
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        return [checked_assertion(t, row, column) for t in tests]
    if isinstance(tests, list) and all(isinstance(t, dict) and "input" in t and "output" in t for t in tests):
        return [CodeTest(stdin=_text(t["input"]), expected=_text(t["output"])) for t in tests]
    raise DataError(
        f"row {row}: column {column!r} holds {type(tests).__name__} {str(tests)[:80]!r}, not tests: give "
        '{"inputs": [...], "outputs": [...]}, a list of {"input", "output"}, or a list of assert statements'
    )


def checked_assertion(text: str, row: int, column: str) -> CodeTest:
    """One ``assert <expr>`` statement: the checker evaluates exactly that, outside the program."""
    text = text.strip()
    try:
        body = ast.parse(text).body
    except SyntaxError as err:
        body, why = [], f"a syntax error ({err.msg})"
    else:
        why = "not a single assert statement"
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        raise DataError(
            f"row {row}: column {column!r} holds the test {text[:80]!r}, {why}: give one 'assert ...' per test"
        )
    return CodeTest(assertion=text)


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

    bounds_itself = True  # by its options, or by compute alone: task.reward_timeout_s leaves it alone

    def __init__(self, options: CodeTestsOptions):
        try:
            prefixes(interpreter(options.python))
        except SandboxError:
            raise ConfigError(
                f"rewards.code_tests.python={options.python!r} ({interpreter(options.python)}) does not run: give a "
                "Python interpreter the sandbox can start"
            ) from None
        if options.isolate and (problem := isolation_problem(options.python)) is not None:
            warnings.warn(
                f"code_tests: the isolated sandbox cannot be built here ({problem}), so programs run WITHOUT it: "
                "they have the network, can write the world-writable folders (/tmp, /var/tmp, /dev/shm, ...) and, "
                "unless the trainer is root, read and write your files. Run as root or allow unprivileged user "
                "namespaces, or set rewards.code_tests.isolate=false to say you trust the code (docs/security.md)",
                stacklevel=2,
            )
            options = type(options)(**{**options.__dict__, "isolate": False})
        self.options = options
        self.limits = options.limits()
        self.hacks: Counter[str] = Counter()  # completions of the run by what they tried, for a Python caller

    def __call__(self, prompts: list, completions: list, **columns: Any) -> list[float]:
        o = self.options
        if o.tests_column not in columns:
            raise DataError(
                f"code_tests needs a {o.tests_column!r} column (rewards.code_tests.tests_column); "
                f"the records have {sorted(columns)}"
            )
        setups = columns.get(o.setup_column) if o.setup_column else None
        jobs = []  # (program, tests)
        for i, completion in enumerate(completions):
            program = program_of(completion)
            if setups is not None and setups[i]:
                program = f"{setups[i]}\n{program}"
            jobs.append((program, parse_tests(columns[o.tests_column][i], i, o.tests_column)))
        limits = Limits(**{**self.limits.__dict__, "hide": private_paths()})
        with ThreadPoolExecutor(max_workers=o.workers) as pool:
            outcomes = list(pool.map(lambda job: self._passed(*job, limits), jobs))
        batch = Counter(name for _, tried in outcomes for name in tried)
        self.hacks.update(batch)
        log_metric = columns.get("log_metric")
        if callable(log_metric):
            log_metric("code_tests/hacks", float(sum(1 for _, tried in outcomes if tried)))
            for name, count in sorted(batch.items()):
                log_metric(f"code_tests/hacks/{name}", float(count))
        return [self._score(passed, len(tests)) for (passed, _), (_, tests) in zip(outcomes, jobs, strict=True)]

    def _score(self, passed: int, total: int) -> float:
        if total == 0:
            return 0.0
        return passed / total if self.options.partial_credit else float(passed == total)

    def _passed(self, program: str, tests: list[CodeTest], limits: Limits) -> tuple[int, set[str]]:
        """Tests passed, and the names of what the program tried against them."""
        if not tests:
            return 0, set()
        if tests[0].assertion is not None:
            results = run_tests(program, [t.assertion for t in tests], "assert", limits)
            passed = [r.status == "pass" for r in results]
        else:
            results = run_tests(program, [t.stdin for t in tests], "stdio", limits)
            passed = [r.ok and same_output(r.stdout, t.expected or "") for r, t in zip(results, tests, strict=True)]
        return sum(passed), {name for r in results for name in r.hacks}
