"""A reward source: a reward function built from options (``rewards.<name>.*``) on first use.

``@register_source("judge", options=JudgeOptions)`` on a class whose ``__init__`` takes the
options and whose ``__call__`` is a TRL reward function registers two things: the options class
into :data:`~grpo_lightning.config.reward_sources.REWARD_SOURCES` (the schema's node) and a
:class:`SourceReward` into ``REWARD_FUNCTIONS`` under the same name, so ``task.rewards`` names it
like any function. The source is built lazily (loading a model or checking an endpoint only
when a run scores with it) and rebuilt when :func:`bind_sources` gives it different options.

A second instance with other options (two reward models) is one line in a plug-in file::

    register_reward("helpfulness")(RewardModelReward(RewardModelOptions(path="rm/helpful")))
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from grpo_lightning.config.reward_sources import REWARD_SOURCES
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS


class SourceReward:
    """The registered reward function of a source: TRL's keyword signature, built on first call.

    A source bounds its own time with its options (the judge's timeout_s and retries, the sandbox's
    wall_s): ``task.reward_timeout_s`` leaves it alone (``bounds_itself``)."""

    bounds_itself = True

    def __init__(self, name: str, factory: Callable[[Any], Callable[..., list]], options_cls: type):
        self.name = name
        self.factory = factory
        self.options = options_cls()
        self._built: Callable[..., list] | None = None
        self._lock = threading.Lock()
        self.__name__ = name

    def bind(self, options: Any) -> None:
        """Use these options from now on; the built source is dropped when they differ."""
        if options != self.options:
            self.options = dataclasses.replace(options)
            self._built = None

    def built(self) -> Callable[..., list]:
        with self._lock:
            if self._built is None:
                self._built = self.factory(self.options)
            return self._built

    def __call__(self, prompts: list | None = None, completions: list | None = None, **columns: Any) -> list:
        return self.built()(prompts=prompts, completions=completions, **columns)

    def __getstate__(self) -> dict:  # a worker process (task.reward_process) builds its own copy
        return {**self.__dict__, "_built": None, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


def register_source(name: str, *, options: type) -> Callable[[type], type]:
    """Register a source class (``cls(options)`` is a TRL reward function) under ``name``."""

    def decorator(cls: type) -> type:
        REWARD_SOURCES.add(name, cls, options=options)
        REWARD_FUNCTIONS.add(name, SourceReward(name, cls, options))
        return cls

    return decorator


def build_sources(functions: Any) -> None:
    """Build now each reward source among ``functions`` (as a scorer holds them, under a time limit
    or not), so a bad URL, key or folder stops the run when it starts, not at its first batch."""
    for fn in functions:
        fn = getattr(fn, "fn", fn)  # a LimitedReward's function
        if isinstance(fn, SourceReward):
            fn.built()


def bind_sources(config: Any) -> None:
    """Give each registered source its options from the ``rewards`` config group (build calls it)."""
    for name, options in config.nodes().items():
        entry = REWARD_FUNCTIONS.get(name)
        if isinstance(entry, SourceReward):
            entry.bind(options)
