"""The errors a user can cause, as one small hierarchy.

A :class:`UserError` is something the user can fix (a config value, a data file, a reward
function, a checkpoint, a server): the CLI prints its message in one or two lines and exits
with code 2. Every other exception is a bug of ours and keeps its traceback.

This module imports nothing from the package: every layer may raise these.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user can fix; the message names the field, file, row or function and the fix."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """One or more config fields hold invalid values; the message names each and its fix."""


class DataError(UserError, ValueError):
    """A prompt file or dataset cannot be used; the message names the file (and row) and the fix."""


class RewardError(UserError, RuntimeError):
    """A reward function failed or returned something unusable; the message names the function."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint cannot be resumed from (corrupt, foreign, unsafe); the message names the file."""


class ServerError(UserError, RuntimeError):
    """A rollout server is unreachable, wedged or not ours; the message names the server."""


class PluginError(ConfigError):
    """A plug-in file or module named in ``plugins=`` cannot be imported or registers badly."""


class TrainingStopped(RuntimeError):
    """The run stopped itself on purpose: the non-finite guard or a health check with action ``raise``.

    Neither the user's input nor a bug of ours: the message is the diagnosis (what failed, why, what
    to change), so the CLI prints it without a traceback and exits with code 3.
    """

    exit_code = 3


class StoppedAtOnce(SystemExit):
    """A second SIGINT / SIGTERM: leave now (``SystemExit`` passes every ``except Exception``) with
    128 + signum. Raised by ``runtime/stop_signals.py``; any layer that catches broadly lets it pass."""
