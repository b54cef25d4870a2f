"""The program's side of an assert test: runs the program, then answers the checker's requests.

Runs in the program's own interpreter as ``python -I -c <sandbox_wire.py + this file>`` (never
imported by the package). It holds no test: the checker (another process,
:mod:`.sandbox_checker`) evaluates ``assert f(x) == y`` itself and only asks this side for what
the program defines (``f``), to call it with plain arguments and to send back the plain result.
So the program cannot read the expected value (it is not in this process, nor is an example of
a test in this text, which the program can read), and whatever it does to this process (patch
builtins, ``sys.exit``, walk frames, replace this loop) changes only the values it sends, as any
program could.

What the program changed in the runtime (builtins, exit functions, hooks, ``atexit``, fake test
modules) is reported with its answers, for the ``hacks`` count; it has no effect on the verdict
(patched builtins are put back: this side's own code needs them).
"""

import atexit
import builtins
import os
import sys

TYPE_CHECKING = False  # (no typing import: this file is imported by nothing, and typing costs time)
if TYPE_CHECKING:  # the launcher runs sandbox_wire.py's text before this file's: these exist then
    from grpo_lightning.rewards.sources.sandbox_wire import decode, encode, read_frame, to_json

REQUESTS, REPLIES = 3, 4
MAX_ITEMS = 100000
TEST_MODULES = ("unittest", "pytest", "doctest")


def _snapshot():
    return {
        "builtins": dict(vars(builtins)),
        "exits": (sys.exit, os._exit, sys.excepthook),
        "modules": {name: sys.modules.get(name) for name in TEST_MODULES},
    }


def _changed(before):
    """Names of what the program changed in the runtime (best effort: the program can hide it)."""
    found = []
    now = vars(builtins)
    if any(now.get(k, before) is not v for k, v in before["builtins"].items()):
        found.append("patched_builtins")
        now.update(before["builtins"])  # this side needs them (json reads isinstance); the checker has its own
    if (sys.exit, os._exit, sys.excepthook) != before["exits"]:
        found.append("patched_exit")
    if sys.gettrace() is not None or sys.getprofile() is not None:
        found.append("trace_hook")
    try:
        if atexit._ncallbacks():
            found.append("atexit_handler")
    except Exception:  # noqa: BLE001  (a program may have broken the module)
        found.append("atexit_handler")
    if any(sys.modules.get(n) is not m for n, m in before["modules"].items() if m is not None) or any(
        n in sys.modules and not hasattr(sys.modules[n], "__spec__") for n in TEST_MODULES
    ):
        found.append("patched_test_modules")
    return found


def serve(path):
    replies = os.fdopen(REPLIES, "wb", buffering=0)
    requests = os.fdopen(REQUESTS, "rb")
    write, next_request, exc_name = replies.write, read_frame, type  # kept before the program runs
    before = _snapshot()
    refs = []

    def keep(obj):
        refs.append(obj)
        return len(refs) - 1

    def send(message):
        write(to_json(message))

    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": builtins, "__doc__": None}
    sys.argv = [path]
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            code = compile(f.read(), path, "exec")
        exec(code, namespace)
    except BaseException as err:  # noqa: BLE001  (SystemExit too: the tests never ran)
        send(["load_failed", exc_name(err).__name__, str(err)[:200], _changed(before)])
        return
    send(["ready", _changed(before)])
    while True:
        request = next_request(requests)
        if request is None:
            return
        try:
            send(_answer(request, namespace, refs, keep, before))
        except BaseException as err:  # noqa: BLE001  (reported; the checker fails the test)
            send(["raised", exc_name(err).__name__, str(err)[:200], _changed(before)])


def _answer(request, namespace, refs, keep, before):
    kind = request[0]
    if kind == "ref":  # the value itself, even when it is a module or a library's
        return _ok(namespace[request[1]], keep, before)
    if kind == "get":
        if request[1] not in namespace:
            return ["missing"]
        value = namespace[request[1]]
        if type(value) is type(sys):
            return ["module", value.__name__]
        where = _importable(value)
        if where is not None:  # the checker imports its own (from fractions import Fraction)
            return ["import", *where]
        return _ok(value, keep, before)
    target = refs[request[1]] if type(request[1]) is int else None
    if kind == "call":
        args = [_value(a, refs) for a in request[2]]
        kwargs = {str(k): _value(v, refs) for k, v in request[3]}
        return _ok(target(*args, **kwargs), keep, before)
    if kind == "attr":
        return _ok(getattr(target, str(request[2])), keep, before)
    if kind == "iter":
        items = []
        for item in target:
            items.append(item)
            if len(items) > MAX_ITEMS:
                raise ValueError(f"more than {MAX_ITEMS} items")
        return _ok(items, keep, before)
    if kind == "len":
        return _ok(len(target), keep, before)
    if kind == "item":
        return _ok(target[_value(request[2], refs)], keep, before)
    if kind == "str":
        return _ok(str(target), keep, before)
    raise ValueError(f"unknown request {kind!r}")


def _importable(value):
    """(module, qualified name) of a library's function or class, or None (the program's own)."""
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module in ("__main__", "builtins"):
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return (module, qualname) if found is value and found is not None else None


def _value(data, refs):
    return decode(data, ref=refs.__getitem__)


def _ok(value, keep, before):
    odd = set()
    data = encode(value, keep, odd=odd)
    return ["ok", data, sorted(odd), _changed(before)]
