"""How the CLI ends on an error: what the user can fix in one or two lines, a bug with its traceback.

- :class:`~grpo_lightning.errors.UserError` (a config value, a data file, a reward function, a
  checkpoint, a server) and Hydra's own errors for a bad override (unknown key, wrong type, no
  such config file): ``error: ...`` on stderr, exit code 2. A config error with several problems
  lists one per line.
- :class:`~grpo_lightning.errors.TrainingStopped` (the NaN guard, a health check with action
  ``raise``): ``stopped: <diagnosis>``, exit code 3.
- Anything else is a bug of ours: its full traceback, as Python prints it.

``--debug`` (or ``HYDRA_FULL_ERROR=1``) shows the traceback of every error.

Two places end the process: :func:`end_on_error` inside the Hydra task function (so Hydra never
sees the error: it would print "Error executing job ..." first), and :func:`run_cli` around Hydra,
for the errors of composing the config.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from grpo_lightning.env_vars import environment_variable
from grpo_lightning.errors import TrainingStopped, UserError

DEBUG_FLAG = "--debug"
FULL_ERROR = "HYDRA_FULL_ERROR"  # Hydra's own switch for full tracebacks
_debug: bool | None = None  # run_cli's choice while it runs; None: not under run_cli


def _lines(text: str) -> list[str]:
    return [line.strip() for line in str(text).splitlines() if line.strip()]


def hydra_message(err: BaseException) -> str:
    """Hydra's and OmegaConf's message in at most two lines, without the ``full_key:`` /
    ``object_type=`` details, the config search path or the ``HYDRA_FULL_ERROR`` hint."""
    first = (_lines(str(err)) or [type(err).__name__])[0]
    cause = err.__cause__
    if isinstance(err, OverrideParseException):
        return f"cannot parse the override {err.override!r}: {first}"
    if isinstance(err, MissingConfigException) and err.options:
        return f"{first}\n  choose one of: {', '.join(err.options)}"
    if isinstance(cause, OmegaConfBaseException) and _lines(str(cause)):
        return f"{first}\n  {_lines(str(cause))[0]}"
    return first


def report_user_error(err: BaseException, user_errors: tuple[type[BaseException], ...] = ()) -> int | None:
    """Print ``err`` for the user and return the exit code, or None when it is a bug (re-raise it)."""
    if isinstance(err, (UserError, *user_errors)):
        print(f"error: {err}", file=sys.stderr)
        return UserError.exit_code
    if isinstance(err, TrainingStopped):
        print(f"stopped: {err}", file=sys.stderr)
        return TrainingStopped.exit_code
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        print(f"error: {hydra_message(err)}", file=sys.stderr)
        return UserError.exit_code
    return None


def debugging() -> bool:
    """Whether every error keeps its traceback: ``--debug`` or ``HYDRA_FULL_ERROR=1``."""
    if _debug is not None:
        return _debug
    return DEBUG_FLAG in sys.argv[1:] or os.environ.get(FULL_ERROR) == "1"


def end_on_error(err: BaseException, user_errors: tuple[type[BaseException], ...] = ()) -> None:
    """Exit as the module docstring says when ``err`` is the user's or a stop by design; return
    (the caller re-raises) for a bug, or always under ``--debug``."""
    if not debugging():
        code = report_user_error(err, user_errors)
        if code is not None:
            sys.exit(code)


def _hydra_raises():
    """Hydra prints its errors itself (several lines, exit 1) unless ``HYDRA_FULL_ERROR=1``; with
    it set, they reach :func:`run_cli`. Restored afterwards: a launched server inherits the rest."""
    return environment_variable(FULL_ERROR, "1")


def run_cli(entry: Callable[[], None], user_errors: tuple[type[BaseException], ...] = ()) -> None:
    """Run the Hydra entry point ``entry`` (which parses ``sys.argv``) and end on errors as above.

    ``user_errors``: more classes to treat as user errors, for ones not yet in the hierarchy."""
    global _debug
    _debug = debugging()
    sys.argv = [sys.argv[0], *(arg for arg in sys.argv[1:] if arg != DEBUG_FLAG)]  # Hydra's parser refuses it
    try:
        with _hydra_raises():
            entry()
    except Exception as err:
        end_on_error(err, user_errors)
        raise
    finally:
        _debug = None
