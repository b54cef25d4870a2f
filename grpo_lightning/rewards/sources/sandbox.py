"""Run untrusted Python in a child process with limits, and leave nothing behind.

Each run gets a fresh temporary directory (its working directory, removed afterwards), its own
process group and session, the limits of :class:`Limits` applied by
:mod:`.sandbox_launcher` before the program starts (CPU seconds, address space, file size,
processes, open files, no core files), no network (a network namespace) and private
/tmp, /var/tmp, /dev/shm (a mount namespace). The parent enforces the wall clock and the size of
stdout + stderr; on either, or when the program ends, the whole process group is killed, and
when we run as root every process of the run's own uid too (which catches one that left the
group). What it does not protect against is in docs/rewards.md (security notes).
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = str(Path(__file__).with_name("sandbox_launcher.py"))  # run as a script, never imported here
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
UID_BASE = 200000 + (os.getpid() % 10000) * 64  # per trainer process: concurrent runs get distinct uids


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


@dataclass(frozen=True)
class RunResult:
    """How one run ended: ``status`` is ok, error (non-zero exit), timeout, output_limit or sandbox."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


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


def isolation_available() -> bool:
    """Whether this machine lets us make a network namespace (root, or unprivileged user namespaces)."""
    probe = subprocess.run(
        [sys.executable, "-I", LAUNCHER, "1", "64", "1", "4", "1", "-1", "--", "/bin/true"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


def run_python(code: str, stdin: str = "", limits: Limits = Limits()) -> RunResult:
    """Run ``code`` as ``program.py`` with ``stdin``, under ``limits``."""
    root = os.geteuid() == 0
    uid = UIDS.take() if root else -1
    workdir = Path(tempfile.mkdtemp(prefix="grpo-sandbox-"))
    try:
        (workdir / "program.py").write_text(code)
        if root:  # the program's own uid must read it whatever the umask (a run's is 077: run_lock.py)
            os.chown(workdir, uid, uid)
            os.chown(workdir / "program.py", uid, uid)
        command = [
            sys.executable,
            "-I",
            "-S",  # the launcher needs the standard library only
            LAUNCHER,
            *(str(v) for v in (limits.cpu_s, limits.memory_mb, limits.file_mb, limits.processes)),
            str(int(limits.isolate)),
            str(uid),
            "--",
            interpreter(limits.python),
            "-I",
            "program.py",
        ]
        env = {"PATH": SANDBOX_PATH, "LANG": "C.UTF-8", "HOME": str(workdir), "TMPDIR": str(workdir)}
        return _supervise(command, workdir, env, stdin, limits)
    finally:
        if root:
            reap(uid)  # raises rather than give a uid with live processes to the next run
            UIDS.give(uid)
        shutil.rmtree(workdir, ignore_errors=True)


def reap(uid: int, patience_s: float = 5.0) -> None:
    """SIGKILL every process of ``uid`` (a run's leftovers, wherever they went) and wait until
    none is alive; a uid whose processes outlive ``patience_s`` is not handed to another run."""
    deadline = time.monotonic() + patience_s
    while processes_of(uid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"sandbox: processes of uid {uid} survived SIGKILL for {patience_s} s")
        subprocess.run([sys.executable, "-I", "-S", LAUNCHER, "--reap", str(uid)], capture_output=True, timeout=30)
        time.sleep(0.01)


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


def _supervise(command: list[str], workdir: Path, env: dict, stdin: str, limits: Limits) -> RunResult:
    start = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: one kill ends it and its children
    )
    status = None
    out = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    try:
        try:
            process.stdin.write(stdin.encode())
            process.stdin.close()
        except BrokenPipeError:
            pass
        with selectors.DefaultSelector() as selector:
            for stream in (process.stdout, process.stderr):
                selector.register(stream, selectors.EVENT_READ)
            while selector.get_map():
                left = limits.wall_s - (time.monotonic() - start)
                if left <= 0:
                    status = "timeout"
                    break
                exited = process.poll() is not None  # a child may hold the pipes open: stop once drained
                events = selector.select(timeout=0 if exited else min(left, 0.05))
                if exited and not events:
                    break
                for key, _ in events:
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    out[key.fd] += chunk
                if sum(len(b) for b in out.values()) > limits.output_kb * 1024:
                    status = "output_limit"
                    break
    finally:
        _kill_group(process.pid)
        returncode = process.wait()
    if status is None:
        status = "ok" if returncode == 0 else ("sandbox" if returncode == 125 else "error")
    stdout, stderr = (bytes(b[: limits.output_kb * 1024]).decode(errors="replace") for b in out.values())
    return RunResult(status, returncode, stdout, stderr, time.monotonic() - start)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
