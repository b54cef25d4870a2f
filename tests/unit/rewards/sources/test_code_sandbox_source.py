"""The code_tests source and its sandbox: correct, wrong, crashing, looping, forking, memory-hungry,
network-using and file-writing programs each end with the right reward, within their limits,
leaving no process, file or temporary directory behind."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from grpo_lightning.errors import DataError
from grpo_lightning.rewards.sources.code_sandbox import CodeTestsOptions, CodeTestsReward, parse_tests, program_of
from grpo_lightning.rewards.sources.sandbox import (
    LAUNCHER,
    UID_BASE,
    WORKDIR_PREFIX,
    Limits,
    interpreter,
    isolation_available,
    launch_request,
    processes_of,
    run_python,
)

FAST = {"cpu_s": 1, "wall_s": 2.0, "memory_mb": 256, "workers": 2}
ADD_IO = {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}
ADD_ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def sandbox_dirs() -> set[str]:
    """This process's sandbox folders (another xdist worker's may come and go meanwhile)."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), f"{WORKDIR_PREFIX}{os.getpid()}-*")))


def run_processes() -> list[int]:
    """Live processes of the sandbox's uids (as root)."""
    return processes_of(*range(UID_BASE, UID_BASE + 64))


# The leak checks look at every sandbox folder and uid: the sandbox's tests share one xdist worker.
pytestmark = [
    pytest.mark.skipif(os.name != "posix", reason="the sandbox uses POSIX rlimits and process groups"),
    pytest.mark.xdist_group("sandbox"),
]


@pytest.fixture
def clean():
    before = sandbox_dirs()
    yield
    assert sandbox_dirs() == before, "a temporary directory was left behind"
    assert run_processes() == [], "a sandboxed process survived"


def score(code: str, tests=None, **options) -> float:
    reward = CodeTestsReward(CodeTestsOptions(**{**FAST, **options}))
    return reward(prompts=["p"], completions=[f"Here:\n```python\n{code}\n```"], tests=[tests or ADD_IO])[0]


CORRECT = "a, b = map(int, input().split())\nprint(a + b)"


@pytest.mark.parametrize(
    ("name", "code", "expected"),
    [
        ("correct", CORRECT, 1.0),
        ("wrong", "a, b = map(int, input().split())\nprint(a * b)", 0.0),
        ("crashing", "raise SystemExit(3)", 0.0),
        ("syntax error", "def (:", 0.0),
    ],
)
def test_stdin_stdout_programs(clean, name, code, expected):
    assert score(code) == expected, name


def test_a_program_runs_whatever_the_umask(clean):
    """A run's umask is 077 (its output is private): the sandbox's own uid must still read the program."""
    before = os.umask(0o077)
    try:
        assert run_python("print(6 * 7)").stdout.strip() == "42"
        assert score("def add(a, b):\n    return a + b", ADD_ASSERTS) == 1.0  # the checker, /dev, the harness
        assert run_python("print(6 * 7)", limits=Limits(isolate=False)).stdout.strip() == "42"
    finally:
        os.umask(before)


def test_assert_tests_and_partial_credit(clean):
    half = "def add(a, b):\n    return a + b if a >= 0 else 99"
    assert score("def add(a, b):\n    return a + b", ADD_ASSERTS) == 1.0
    assert score(half, ADD_ASSERTS) == 0.0
    assert score(half, ADD_ASSERTS, partial_credit=True) == pytest.approx(2 / 3)
    assert score("import os\nos._exit(0)", ADD_ASSERTS) == 0.0  # exiting before the asserts is no pass


def test_infinite_loop_is_stopped_by_cpu_time_or_the_wall_clock(clean):
    start = time.monotonic()
    result = run_python("while True: pass", limits=Limits(cpu_s=1, wall_s=2.0))
    assert result.status in ("error", "timeout") and time.monotonic() - start < 3.5
    result = run_python("import time\ntime.sleep(60)", limits=Limits(wall_s=0.5))
    assert result.status == "timeout" and result.seconds < 1.5


def test_fork_bomb_is_contained_and_reaped(clean):
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)"
    result = run_python(bomb, limits=Limits(wall_s=1.0, processes=8))
    assert result.status == "timeout" and result.seconds < 2.5


def test_a_child_that_leaves_the_group_is_still_killed(clean):
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    result = run_python(escape, limits=Limits(wall_s=2.0))
    assert result.ok and result.stdout == "parent done\n"
    if os.geteuid() != 0:
        pytest.skip("only a root trainer gives each run its own uid to reap by (docs/rewards.md)")


def test_memory_hog_fails_within_its_limit(clean):
    result = run_python("x = bytearray(2 * 2**30)\nprint(len(x))", limits=Limits(memory_mb=256))
    assert result.status == "error" and "MemoryError" in result.stderr
    assert score("x = bytearray(2 * 2**30)\n" + CORRECT) == 0.0


def test_output_flood_is_cut(clean):
    result = run_python("while True: print('y' * 1000)", limits=Limits(output_kb=16, wall_s=5.0))
    assert result.status == "output_limit" and len(result.stdout) <= 16 * 1024


@pytest.mark.skipif(not isolation_available(), reason="no network namespaces on this machine")
def test_network_is_unreachable(clean):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n" + CORRECT
        assert score(code) == 0.0
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected
            listener.accept()


def test_written_files_stay_in_the_removed_directory(clean):
    outside = os.path.join(tempfile.gettempdir(), f"sandbox-escape-{os.getpid()}.txt")
    code = f"open('mine.txt', 'w').write('x')\ntry:\n    open({outside!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
    assert score(code + CORRECT) == 1.0
    if isolation_available():  # a private /tmp; without namespaces the shared one keeps it (docs/rewards.md)
        assert not os.path.exists(outside)
    else:
        os.remove(outside)
    big = "open('big', 'wb').write(b'0' * (64 * 2**20))\n" + CORRECT
    assert score(big, file_mb=1) == 0.0


def test_test_formats_and_program_extraction():
    io = [("1\n", "2\n")]
    assert parse_tests({"inputs": ["1\n"], "outputs": ["2\n"]}, 0, "t")[0].expected == "2\n"
    assert parse_tests({"input": ["1\n"], "output": ["2\n"]}, 0, "t")[0].stdin == io[0][0]
    assert parse_tests([{"input": "1\n", "output": "2\n"}], 0, "t")[0].stdin == "1\n"
    assert parse_tests('{"inputs": ["1"], "outputs": ["2"]}', 0, "t")[0].expected == "2"
    assert [t.assertion for t in parse_tests("assert f(1) == 2\nassert f(2) == 3", 0, "t")] == [
        "assert f(1) == 2",
        "assert f(2) == 3",
    ]
    with pytest.raises(DataError, match="row 3: column 't'"):
        parse_tests(42, 3, "t")
    text = "First:\n```python\nx = 1\n```\nBetter:\n```\nx = 2\n```"
    assert program_of(text) == "x = 2\n" and program_of("x = 3") == "x = 3"
    assert program_of([{"role": "assistant", "content": "```py\nx = 4\n```"}]) == "x = 4\n"


def test_a_missing_tests_column_names_the_columns():
    with pytest.raises(DataError, match=r"needs a 'tests' column .* \['answer'\]"):
        CodeTestsReward(CodeTestsOptions())(prompts=["p"], completions=["c"], answer=["1"])


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to become nobody")
def test_the_isolated_sandbox_builds_without_root(tmp_path):
    """What a user without root gets: a user namespace, the same private root, the same checker."""
    tmp_path.chmod(0o777)
    program = "import os\nprint(os.getuid(), sorted(os.listdir('/')))\nopen('/tmp/x', 'w').write('x')\n"
    request = launch_request(program, [""], "stdio", Limits(), -1) | {"python": interpreter("python3")}
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", request["python"], "-I", LAUNCHER]
    done = subprocess.run(nobody, input=json.dumps(request), capture_output=True, text=True, cwd=tmp_path, timeout=60)
    if "can't open file" in done.stderr or "Permission denied" in done.stderr and "unshare" not in done.stderr:
        pytest.skip(f"nobody cannot read the package here: {done.stderr[-200:]}")
    if done.returncode == 125:
        pytest.skip(f"no unprivileged user namespaces here: {done.stderr.strip()}")
    record = json.loads(done.stdout)
    assert record["status"] == "ok", record
    uid, listing = record["stdout"].split(" ", 1)
    assert uid == "65534" and "sandbox" in listing and "root" not in listing and "work" not in listing
    assert not os.path.exists("/tmp/x") or os.stat("/tmp/x").st_uid != 65534
