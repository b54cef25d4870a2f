"""Logging setup: a quiet console, every line once on the console and in ``train.log``, one CSV per run.

Third-party notes a user did not ask for are dropped, what matters stays.

Dropped: Lightning's litlogger tip, its notes on settings we chose on purpose (``limit_val_batches``,
``val_check_interval``, callbacks from ``configure_callbacks``, TPU/HPU availability), torch's
``LeafSpec`` deprecation (raised inside Lightning, nothing for the user to change), the CSV
logger's "will be deleted" warning on resume (it appends), transformers' weight-loading bars,
vLLM's rotary-embedding notes, its doubt about chunked prefill turned off (on a CPU, on purpose)
and any vLLM warning repeated word for word. Health alerts, errors
and every other warning stay.

Under Hydra (the root logger has handlers) Lightning's own stderr handlers are removed and its
records propagate: each line reaches the console and ``train.log`` once, through Hydra's handlers,
also when something imported Lightning before Hydra configured logging (a plug-in file), which
left ``train.log`` empty.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import warnings

# Messages (regular expressions, searched) of log records nobody acts on.
NOISE = (
    r"litlogger",
    r"LitLogger",
    r"was configured so",  # `Trainer(limit_val_batches=1.0)` was configured so 100% of the batches will be used
    r"LightningModule\.configure_callbacks` will override",
    r"^(TPU|HPU|IPU) available",
    r"RotaryEmbedding",
    r"Custom op \S+ was not registered",
    # Chunked prefill is off on a CPU on purpose (rollout/vllm_cpu_steps.py); F8 checks the engine's
    # log-probs against the trainer's every step, which is what this warning asks to doubt.
    r"does not officially support disabling chunked prefill",
)
_NOISE = re.compile("|".join(NOISE))
# Client libraries that log every HTTP request at INFO (one line per request to a vLLM server).
HTTP_LOGGERS = ("httpx", "httpcore", "urllib3", "huggingface_hub")
LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
WARNINGS = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    (r"Experiment logs directory .* exists and is not empty", UserWarning),
)


class NoiseFilter(logging.Filter):
    """Drops :data:`NOISE` below ERROR; with ``once``, also a warning seen before word for word."""

    def __init__(self, once: bool = False):
        super().__init__("grpo_lightning.console")
        self.once = once
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        message = record.getMessage()
        if _NOISE.search(message):
            return False
        if self.once and record.levelno >= logging.WARNING:
            if message in self.seen:
                return False
            self.seen.add(message)
        return True


def _add_filter(target, once: bool = False) -> None:
    if not any(isinstance(f, NoiseFilter) for f in target.filters):
        target.addFilter(NoiseFilter(once))


def quiet_http_logs() -> None:
    """HTTP clients at WARNING unless the user set their level (hydra.job_logging.loggers.httpx.level=INFO)."""
    for name in HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def quiet_console(load_vllm: bool = False) -> None:
    """Install the filters (idempotent); call after logging is configured (Hydra) and before training.
    ``load_vllm``: the run will load vLLM in this process; its logging is set up now, to be filtered."""
    for message, category in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in LIGHTNING_LOGGERS:
        _add_filter(logging.getLogger(name))
    if logging.getLogger().handlers:  # Hydra (or the user) configured the root: one copy of each line, there
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if type(handler) is logging.StreamHandler:
                    logger.removeHandler(handler)
            logger.propagate = True
    quiet_http_logs()
    quiet_vllm(load_vllm)
    if "transformers" in sys.modules:  # its "Loading weights" bars would break into the run's one bar
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def quiet_vllm(load: bool = False) -> None:
    """vLLM logs through its own handlers (not the root's), set up when ``vllm.logger`` is imported:
    filter those (``load``: import it first). Its engine processes forked later inherit the filter."""
    if load and "vllm.logger" not in sys.modules:
        importlib.import_module("vllm.logger")
    if "vllm.logger" not in sys.modules:
        return
    for handler in logging.getLogger("vllm").handlers:
        _add_filter(handler, once=True)
