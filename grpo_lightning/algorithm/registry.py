"""Name -> variant registries: a new policy loss or advantage estimator is one decorated function.

The habit of verl's ``register_policy_loss`` / ``register_adv_est``: the config names a
variant (``algorithm.policy_loss``, ``algorithm.advantage_estimator``), validation lists the
registered names, and the module looks the variant up by name. Nothing else changes when a
variant is added.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Registry(Generic[T]):
    """Registered entries by name, in registration order."""

    kind: str  # what an entry is, for error messages ("policy loss")
    config_field: str  # the config field that selects an entry ("algorithm.policy_loss")
    entries: dict[str, T]

    def add(self, name: str, entry: T) -> None:
        if name in self.entries:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        self.entries[name] = entry

    def __getitem__(self, name: str) -> T:
        if name not in self.entries:
            raise KeyError(f"{self.config_field}={name!r} is not a registered {self.kind}; choose one of {self.names}")
        return self.entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)


def make_registry(kind: str, config_field: str) -> Registry:
    return Registry(kind, config_field, {})
