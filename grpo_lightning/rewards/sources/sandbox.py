"""Run untrusted Python against tests, in a sandbox the program cannot read the verdict of or leave.

One sandbox per completion: :mod:`.sandbox_launcher` (the program's interpreter, stdlib only)
builds its namespaces and private root, then the checker (:mod:`.sandbox_checker`) runs each
test in a fresh process of the program under :class:`Limits` and writes one JSON line per test
to a pipe only it holds. Assert tests are evaluated by the checker with the program's values
brought over as plain data, stdin/stdout tests are compared here: the expected values never
enter the program's process, so it has nothing to print, forge or find (threat model:
docs/security.md). The parent enforces a deadline for the whole completion; as root every
process of the run's own uid is killed afterwards (which catches one that left the group).
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from grpo_lightning.errors import RewardError

HERE = Path(__file__).parent
LAUNCHER = str(HERE / "sandbox_launcher.py")  # run as a script, never imported here
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
UID_BASE = 200000 + (os.getpid() % 10000) * 64  # per trainer process: concurrent runs get distinct uids
WORKDIR_PREFIX = "grpo-sandbox-"  # + the trainer's pid: its leftovers are told from another process's
STARTUP_S = 15.0  # building the namespaces and the root, on a loaded machine; not a test's time


class SandboxError(RewardError):
    """The sandbox itself failed (not the program): it cannot be built on this machine, or its interpreter is missing."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 2
    wall_s: float = 5.0
    memory_mb: int = 512
    output_kb: int = 64
    file_mb: int = 16
    processes: int = 16
    isolate: bool = True
    python: str = "python3"
    scratch_mb: int = 64
    visible: tuple[str, ...] = ()  # host folders shown read-only besides the system's
    hide: tuple[str, ...] = ()  # folders never shown (a run's output folder)


@dataclass(frozen=True)
class RunResult:
    """How one test ended: ``status`` is pass (an assert held), ok (exit 0; stdout is compared by the
    caller), fail, error, timeout or output_limit; ``hacks`` names what the program tried."""

    status: str
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    reason: str = ""
    hacks: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "pass")


class UidPool:
    """Distinct uids for concurrent runs (as root): a run's process limit and its reaping are its own."""

    def __init__(self, base: int, size: int = 64):
        self.free = list(range(base, base + size))
        self.lock = threading.Condition()

    def take(self) -> int:
        with self.lock:
            self.lock.wait_for(lambda: self.free)
            return self.free.pop()

    def give(self, uid: int) -> None:
        with self.lock:
            self.free.append(uid)
            self.lock.notify()


UIDS = UidPool(UID_BASE)


def interpreter(python: str) -> str:
    """``python`` as a path: a bare name is looked up on the sandbox's PATH (a system Python the
    run's unprivileged uid can execute), falling back to this interpreter."""
    return shutil.which(python, path=SANDBOX_PATH) or (python if os.sep in python else sys.executable)


@functools.cache
def prefixes(python: str) -> tuple[str, ...]:
    """The folders an interpreter needs to run (its binary's folder, its prefixes), as real paths."""
    code = "import sys, json; print(json.dumps([sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]))"
    try:
        found = json.loads(subprocess.run([python, "-I", "-S", "-c", code], capture_output=True, timeout=60).stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        raise SandboxError(f"the sandbox's interpreter {python!r} does not run (rewards.code_tests.python)") from None
    return tuple(dict.fromkeys(os.path.realpath(p) for p in [os.path.dirname(os.path.realpath(python)), *found]))


@functools.cache
def isolation_problem(python: str = "python3") -> str | None:
    """Why this machine cannot build the isolated sandbox (it needs namespaces: root, or unprivileged
    user namespaces), or None when it can."""
    try:
        [result] = run_tests("print(1)", [""], "stdio", Limits(python=python, wall_s=30.0))
    except SandboxError as err:
        return str(err).removeprefix("code sandbox failed: ")
    return None if result.ok and result.stdout == "1\n" else f"a test program ended {result.status}"


def isolation_available(python: str = "python3") -> bool:
    return isolation_problem(python) is None


_PRIVATE: set[str] = set()


def keep_private(path: str | os.PathLike) -> None:
    """Never show ``path`` to a program (a run's output folder), even inside a visible folder."""
    _PRIVATE.add(os.path.realpath(path))


def private_paths() -> tuple[str, ...]:
    return tuple(sorted(_PRIVATE))


def run_python(code: str, stdin: str = "", limits: Limits = Limits()) -> RunResult:
    """Run ``code`` as ``program.py`` with ``stdin`` (one stdin/stdout test)."""
    return run_tests(code, [stdin], "stdio", limits)[0]


def run_tests(program: str, tests: list[str], mode: str, limits: Limits = Limits()) -> list[RunResult]:
    """Each test (assert statements with ``mode="assert"``, stdin texts with ``"stdio"``) against
    ``program``, in one sandbox; a :class:`SandboxError` when the sandbox itself fails."""
    python = interpreter(limits.python)
    root = os.geteuid() == 0
    uid = UIDS.take() if root else -1
    # Unisolated, the program's working folder; isolated, only the launcher's cwd (its root is a tmpfs)
    workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")) if not limits.isolate else Path("/")
    try:
        request = launch_request(program, tests, mode, limits, uid)
        if root and not limits.isolate:
            os.chown(workdir, uid, uid)
        return _launch(python, request, workdir, limits, len(tests))
    finally:
        if root:
            reap(uid)  # raises rather than give a uid with live processes to the next run
            if not limits.isolate:
                remove_files_of(uid)
            UIDS.give(uid)
        if not limits.isolate:
            shutil.rmtree(workdir, ignore_errors=True)


def launch_request(program: str, tests: list[str], mode: str, limits: Limits, uid: int) -> dict:
    """What the launcher reads on stdin (JSON): the program, the tests, the limits, the uid (-1: ours)."""
    python = interpreter(limits.python)
    return {
        "mode": mode,
        "program": program,
        "tests": list(tests),
        "python": python,
        "isolate": limits.isolate,
        "uid": uid,
        "prefixes": list(prefixes(python)),
        "visible": [os.path.realpath(p) for p in limits.visible],
        "hide": [os.path.realpath(p) for p in limits.hide],
        "limits": {k: getattr(limits, k) for k in ("cpu_s", "wall_s", "memory_mb", "output_kb", "file_mb")}
        | {"processes": limits.processes, "scratch_mb": limits.scratch_mb},
    }


def _launch(python: str, request: dict, workdir: Path, limits: Limits, count: int) -> list[RunResult]:
    env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8"}
    process = subprocess.Popen(
        [python, "-I", "-S", LAUNCHER],  # stdlib only: the checker imports the standard library alone
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: one kill ends it and its children
    )
    deadline = time.monotonic() + STARTUP_S + count * (limits.wall_s + 1.0)
    cap = count * (limits.output_kb * 1024 * 6 + 4096) + 65536
    out, err, killed = _collect(process, json.dumps(request).encode(), deadline, cap)
    code = process.returncode
    if code == 125 or (code != 0 and not killed and code > 0):
        line = (err.decode(errors="replace").strip().splitlines() or [f"exit code {code}"])[-1]
        raise SandboxError(f"code sandbox failed: {line[:300]}")
    results = []
    for line in out.splitlines()[:count]:
        record = json.loads(line)
        results.append(
            RunResult(
                record["status"],
                record.get("stdout", ""),
                record.get("stderr", ""),
                record.get("seconds", 0.0),
                record.get("reason", ""),
                tuple(record.get("hacks", ())),
            )
        )
    why = "timeout" if killed else "error"
    hacks = () if killed else ("killed_checker",)  # its process ended by a signal we did not send
    results += [RunResult(why, reason="the sandbox ended before this test", hacks=hacks)] * (count - len(results))
    return results


def _collect(process: subprocess.Popen, request: bytes, deadline: float, cap: int) -> tuple[bytes, bytes, bool]:
    """stdout and stderr of the launcher, killing its group past ``deadline`` or ``cap`` bytes."""
    killed = False
    out = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    try:
        try:
            process.stdin.write(request)
            process.stdin.close()
        except BrokenPipeError:
            pass
        with selectors.DefaultSelector() as selector:
            for stream in (process.stdout, process.stderr):
                selector.register(stream, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0 or sum(len(b) for b in out.values()) > cap:
                    killed = True
                    break
                for key, _ in selector.select(timeout=min(left, 1.0)):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    out[key.fd] += chunk
    finally:
        _kill_group(process.pid)
        process.wait()
    stdout, stderr = (bytes(b) for b in out.values())
    if killed:  # a line cut by the kill is no verdict
        stdout = stdout[: stdout.rfind(b"\n") + 1]
    return stdout, stderr, killed


def reap(uid: int, patience_s: float = 5.0) -> None:
    """SIGKILL every process of ``uid`` (a run's leftovers, wherever they went) and wait until
    none is alive; a uid whose processes outlive ``patience_s`` is not handed to another run."""
    deadline = time.monotonic() + patience_s
    while processes_of(uid):
        if time.monotonic() > deadline:
            raise SandboxError(f"code sandbox: processes of uid {uid} survived SIGKILL for {patience_s} s")
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", REAPER, str(uid)], capture_output=True, timeout=30, check=False
        )
        time.sleep(0.01)


# Becomes the uid and kills all its processes (kill(-1) as that uid); a fork in flight may survive one sweep.
REAPER = "import os, sys\nu = int(sys.argv[1])\nos.setgroups([]); os.setgid(u); os.setuid(u)\n" + (
    "for _ in range(3):\n    try:\n        os.kill(-1, 9)\n    except ProcessLookupError:\n        break\n"
)


def processes_of(*uids: int) -> list[int]:
    """Live (not zombie) processes of these uids, from /proc."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:  # it ended while we looked
            continue
        if int(fields["Uid"].split()[0]) in uids and not fields["State"].strip().startswith("Z"):
            found.append(int(status.parent.name))
    return found


@functools.cache
def world_writable_dirs(top: str = "/", depth: int = 4) -> tuple[str, ...]:
    """Folders anyone may write to, ``depth`` levels below ``top`` (not /proc, /sys): where an
    unisolated program of another uid can leave files (``/tmp``, ``/var/tmp``, ``/run/lock``, ...)."""
    found = []
    base = top.rstrip("/").count("/")
    for folder, subdirs, _ in os.walk(top):
        if folder in ("/proc", "/sys") or folder.count("/") - base >= depth:
            subdirs.clear()
        try:
            if os.stat(folder).st_mode & 0o002:
                found.append(folder)
        except OSError:
            continue
    return tuple(found)


def remove_files_of(uid: int) -> None:
    """Without namespaces, as root: remove what ``uid`` left in the world-writable folders."""
    for folder in world_writable_dirs():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
