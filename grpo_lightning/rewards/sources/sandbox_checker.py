"""The checker: runs each test of one completion in a fresh process of the program and judges it.

Runs after :mod:`.sandbox_wire`'s text in the process :mod:`.sandbox_launcher` prepares (inside
the sandbox's namespaces, never imported by the package). For each test it starts the program as
a child with the run's limits and uid, then:

- stdin/stdout tests: feeds the test's stdin and sends back what the program printed and how it
  ended; the trainer compares it with the expected output, which never enters the sandbox.
- assert tests: evaluates ``assert <expr>`` itself, in this process, with each name the program
  defines standing for a reference to it in the program's process (:mod:`.sandbox_harness`):
  a call sends plain arguments there and brings back a plain result, so ``add(1, 2) == 3`` is
  compared here, as plain data, and the program never sees the 3. A reference cannot be compared
  or tested for truth (an object whose ``__eq__`` always says True scores nothing), only called,
  read, iterated, measured or printed. Builtins, modules and what the program imported from a
  library (``from fractions import Fraction``) are this process's own.

The program's process cannot reach this one: it is not dumpable (no ptrace, no /proc/<pid>/mem),
it is the init of the program's pid namespace when isolated (which its processes cannot signal),
and the verdict goes out on a pipe the program has no descriptor of. It runs as the program's
own uid, never as root. One JSON line per test is written to stdout.
"""

import ast
import builtins
import ctypes
import fcntl
import importlib
import json
import os
import resource
import select
import signal
import time

TYPE_CHECKING = False  # (no typing import: this file is imported by nothing, and typing costs time)
if TYPE_CHECKING:  # the launcher runs sandbox_wire.py's text before this file's: these exist then
    from grpo_lightning.rewards.sources.sandbox_wire import WireError, decode, encode, frame, loads

PR_SET_PDEATHSIG = 1
EXITS = ("SystemExit", "KeyboardInterrupt")
# Libraries whose functions the checker runs itself when a test names them (math.isclose, a
# Fraction): computation only, no I/O, no code loading. Another module a test names stays the
# program's (a reference), as anything the program defines.
PURE = frozenset(
    "array bisect cmath collections copy datetime decimal enum fractions functools heapq itertools json math "
    "numbers operator random re statistics string textwrap typing unicodedata".split()
)


class TestFailed(Exception):
    def __init__(self, status, reason, hack=None, raised=None):
        super().__init__(reason)
        self.status, self.reason, self.hack, self.raised = status, reason, hack, raised


class NotPlain(Exception):
    """A test compared, hashed or tested for truth a value that is not plain data."""


class Remote:
    """A value of the program's process: callable, readable, iterable; never compared."""

    __slots__ = ("_channel", "_id")

    def __init__(self, channel, ref_id):
        self._channel, self._id = channel, ref_id

    def __call__(self, *args, **kwargs):
        wire = self._channel.wire
        return self._channel.ask(["call", self._id, [wire(a) for a in args], [[k, wire(v)] for k, v in kwargs.items()]])

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._channel.ask(["attr", self._id, name])

    def __iter__(self):
        return iter(self._channel.ask(["iter", self._id]))

    def __len__(self):
        try:
            return _typed(self._channel.ask(["len", self._id]), int)
        except TestFailed as err:
            if err.raised == "TypeError":  # no len (a generator): list() and friends go on without it
                raise TypeError("no len()") from None
            raise

    def __getitem__(self, key):
        return self._channel.ask(["item", self._id, self._channel.wire(key)])

    def __str__(self):
        return _typed(self._channel.ask(["str", self._id]), str)

    def __repr__(self):
        return "<a value of the program>"

    def _refuse(self, *args):
        raise NotPlain("the program's value is not plain data (compared, hashed or tested for truth)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = __contains__ = _refuse


def _typed(value, kind):
    if type(value) is not kind:
        raise NotPlain(f"expected a plain {kind.__name__}")
    return value


class Channel:
    """Requests to the harness and its answers, each within the test's deadline and size limit."""

    def __init__(self, pid, requests, replies, deadline, limit):
        self.pid, self.requests, self.replies = pid, requests, replies
        self.deadline, self.limit, self.buffer = deadline, limit, b""
        self.hacks = set()

    def wire(self, value):
        if isinstance(value, Remote):
            return ["r", value._id]
        return encode(value, _no_reference)

    def receive(self):
        while b"\n" not in self.buffer:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TestFailed("timeout", "the test ran past wall_s")
            if not select.select([self.replies], [], [], left)[0]:
                continue
            chunk = os.read(self.replies, 65536)
            if not chunk:
                raise TestFailed("error", "the program ended without an answer", self._exited())
            self.buffer += chunk
            if len(self.buffer) > self.limit:
                raise TestFailed("output_limit", "an answer larger than output_kb")
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            reply = loads(line)
            self.hacks.update(_names(reply[-1]) if reply[0] in ("ok", "raised", "ready", "load_failed") else ())
        except (WireError, TypeError, IndexError):
            raise TestFailed("error", "an answer that is not the harness's", "forged_answer") from None
        return reply

    def _exited(self):
        """``exits`` when the program ended by exiting (os._exit, sys.exit), not by a signal."""
        for _ in range(50):
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return "exits" if os.WIFEXITED(status) else None
            time.sleep(0.002)
        return None

    def send(self, request):
        try:
            _write_all(self.requests, frame(request))
        except BrokenPipeError:
            raise TestFailed("error", "the program ended without an answer", self._exited()) from None

    def ask(self, request):
        self.send(request)
        return self.answer(self.receive())

    def answer(self, reply):
        """The value of an ``ok`` reply (references as :class:`Remote`); a raised one fails the test."""
        try:
            if reply[0] == "ok" and len(reply) == 4:
                if reply[2]:
                    self.hacks.add("odd_plain_type")
                return decode(reply[1], ref=lambda i: Remote(self, i))
            if reply[0] == "raised" and len(reply) == 4:
                hack = "exits" if reply[1] in EXITS else None
                reason = f"the program raised {str(reply[1])[:40]}: {str(reply[2])[:200]}"
                raise TestFailed("fail", reason, hack, str(reply[1]))
        except (WireError, TypeError, IndexError):
            pass
        raise TestFailed("error", "an answer that is not the harness's", "forged_answer")


def _names(items):
    if not isinstance(items, list):
        raise TypeError("not a list of names")
    return [str(h)[:40] for h in items if isinstance(h, str)]


def _no_reference(value):
    raise NotPlain("a test value that is not plain data")


def check_assertion(assertion, channel):
    """Evaluate ``assert <expr>`` here, with the program's names as references; raises TestFailed."""
    node = ast.parse(assertion).body[0]  # checked by the trainer: one assert statement
    names = sorted({n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)})
    scope = {"__builtins__": builtins}
    for name in names:
        if not hasattr(builtins, name):  # a builtin is this process's own, whatever the program did
            found = _lookup(channel, name)
            if found is not _MISSING:
                scope[name] = found
    try:
        passed = bool(eval(compile(ast.Expression(node.test), "<test>", "eval"), scope))
    except NotPlain as err:
        raise TestFailed("fail", str(err), "not_plain_value") from None
    except TestFailed:
        raise
    except Exception as err:  # noqa: BLE001  (the test raised: it fails, as in plain Python)
        raise TestFailed("fail", f"{type(err).__name__}: {str(err)[:200]}") from None
    if not passed:
        raise TestFailed("fail", "the assertion is false")


_MISSING = object()


def _lookup(channel, name):
    """What ``name`` is in the program: a plain value, a :class:`Remote`, a module of this process."""
    channel.send(["get", name])
    reply = channel.receive()
    if reply == ["missing"]:
        return _MISSING
    if reply[0] in ("module", "import") and all(isinstance(r, str) for r in reply[1:]) and len(reply) <= 3:
        if reply[1].split(".")[0] not in PURE:
            channel.send(["ref", name])  # not a library the checker runs: the program's own, by reference
            return channel.answer(channel.receive())
        try:
            found = importlib.import_module(reply[1])
            for part in reply[2].split(".") if len(reply) == 3 else ():
                found = getattr(found, part)
        except (ImportError, AttributeError, ValueError):
            raise TestFailed("fail", f"{'.'.join(reply[1:])[:80]!r} is not importable by the checker") from None
        return found
    return channel.answer(reply)


class Checker:
    """Runs each test of the request in a fresh process of the program."""

    def __init__(self, request, workdir, harness, isolated):
        self.request, self.workdir, self.harness, self.isolated = request, workdir, harness, isolated
        self.limits = request["limits"]
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.pid = self.channel = None

    def run(self):
        for test in self.request["tests"]:
            started = time.monotonic()
            record = {"status": "pass", "stdout": "", "stderr": "", "hacks": []}
            try:
                if self.request["mode"] == "assert":
                    self.assert_test(test, started)
                else:
                    record.update(self.stdio_test(test, started))
            except TestFailed as err:
                record.update(status=err.status, reason=err.reason, hacks=[err.hack] if err.hack else [])
            finally:
                self.end_processes()
            hacks = set(record["hacks"]) | (self.channel.hacks if self.channel is not None else set())
            record.update(hacks=sorted(hacks), seconds=round(time.monotonic() - started, 4))
            _write_all(1, json.dumps(record, separators=(",", ":")).encode() + b"\n")
            self.pid = self.channel = None

    def assert_test(self, assertion, started):
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        source = self.harness + f"\nserve({os.path.join(self.workdir, 'program.py')!r})\n"
        self.start(["-c", source], {3: requests_r, 4: replies_w})
        os.close(requests_r)
        os.close(replies_w)
        deadline = started + self.limits["wall_s"]
        self.channel = Channel(self.pid, requests_w, replies_r, deadline, self.limits["output_kb"] * 1024)
        try:
            first = self.channel.receive()
            if first[0] == "load_failed" and len(first) == 4:
                hack = "exits" if first[1] in EXITS else None
                raise TestFailed("fail", f"the program raised {str(first[1])[:40]} before the test", hack)
            if first[0] != "ready":
                raise TestFailed("error", "an answer that is not the harness's", "forged_answer")
            check_assertion(assertion, self.channel)
        finally:
            os.close(requests_w)
            os.close(replies_r)

    def stdio_test(self, stdin, started):
        """Feed ``stdin``, collect stdout and stderr (output_kb in all) until the program ends."""
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.start([os.path.join(self.workdir, "program.py")], {0: in_r, 1: out_w, 2: err_w})
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        data, buffers, reading = stdin.encode(), {out_r: bytearray(), err_r: bytearray()}, [out_r, err_r]
        deadline, limit, status, code = started + self.limits["wall_s"], self.limits["output_kb"] * 1024, None, None
        os.set_blocking(in_w, False)
        try:
            while status is None:
                if code is None:
                    done, wait = os.waitpid(self.pid, os.WNOHANG)
                    code = wait if done else None
                left = deadline - time.monotonic()
                if left <= 0:
                    status = "timeout"
                    break
                writers = [in_w] if in_w >= 0 else []
                wait_s = 0 if code is not None else min(left, 0.05)
                readable, writable, _ = select.select(reading, writers, [], wait_s)
                if writable:
                    try:
                        data = data[os.write(in_w, data[:65536]) :]
                    except BrokenPipeError:
                        data = b""
                    if not data:
                        os.close(in_w)
                        in_w = -1
                for fd in readable:
                    chunk = os.read(fd, 65536)
                    buffers[fd] += chunk
                    if not chunk:
                        reading.remove(fd)
                if sum(len(b) for b in buffers.values()) > limit:
                    status = "output_limit"
                elif code is not None and not readable:  # a child may hold the pipes open: stop once drained
                    status = "ok" if os.WIFEXITED(code) and os.WEXITSTATUS(code) == 0 else "error"
        finally:
            for fd in (in_w, out_r, err_r):
                if fd >= 0:
                    os.close(fd)
        out, err = (bytes(buffers[fd][:limit]).decode(errors="replace") for fd in (out_r, err_r))
        return {"status": status, "stdout": out, "stderr": err[-2000:]}

    def start(self, argv, fds):
        """Fork the program with ``fds`` at those numbers (the rest closed), the limits and the run's uid."""
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                self.become_program(argv, fds, report_w)
            except BaseException as err:  # noqa: BLE001  (reported to the checker, which stops)
                os.write(report_w, f"{type(err).__name__}: {err}".encode())
            os._exit(127)
        self.pid = pid
        os.close(report_w)
        failure = os.read(report_r, 4096)
        os.close(report_r)
        if failure:
            raise SystemExit(f"sandbox: could not start {self.request['python']}: {failure.decode(errors='replace')}")

    def become_program(self, argv, fds, report_w):
        report = fcntl.fcntl(report_w, fcntl.F_DUPFD_CLOEXEC, 200)
        null = os.open(os.devnull, os.O_RDWR)
        wanted = {n: fds.get(n, null) for n in range(max(fds) + 1) if n in fds or n < 3}
        moved = {n: fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for n, fd in wanted.items()}  # above every target
        for n, fd in moved.items():
            os.dup2(fd, n)
        os.closerange(max(wanted) + 1, report)
        os.closerange(report + 1, 65536)
        if not self.isolated:
            os.setpgid(0, 0)  # one killpg ends it and its children
        os.chdir(self.workdir)
        limits = self.limits
        for kind, value in (
            (resource.RLIMIT_CPU, limits["cpu_s"]),
            (resource.RLIMIT_AS, limits["memory_mb"] * 2**20),
            (resource.RLIMIT_FSIZE, limits["file_mb"] * 2**20),
            (resource.RLIMIT_CORE, 0),
            (resource.RLIMIT_NOFILE, 64),
        ):
            resource.setrlimit(kind, (value, value))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
        self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workdir}
        env["TMPDIR"] = "/tmp" if self.isolated else self.workdir
        python = self.request["python"]
        os.execve(python, [python, "-I", *argv], env)

    def end_processes(self):
        """Kill what the test left: every process of the pid namespace (isolated), else the group."""
        if self.isolated:
            try:
                os.kill(-1, signal.SIGKILL)  # as the namespace's init: everyone in it but this process
            except ProcessLookupError:
                pass
        elif self.pid is not None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data) :]
