"""Named extension points: the core looks a plug-in up by the name a config key gives, never by import.

Why: the core (the step, rollouts, rewards, policy) must not name a method, yet a switch such as
``solver.agent=mams`` or ``optim.loss_type=gspo`` has to reach that method's code. Each extension point is a
:class:`Registry` owned by the layer that calls it; a method registers its entries when its package under
:mod:`score_lightning.methods` is imported (verl's ``register_policy_loss``, torchtitan's ``TrainSpec``).
The first lookup of a name nobody registered imports the plug-in packages once, so a test or a script that
builds a stage directly finds the methods as ``src/train.py`` does; a name still unknown after that is refused
with the names that exist.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

#: the module whose import registers every method shipped with score-lightning (each method's ``plugin`` module)
PLUGINS = "score_lightning.methods.plugins"


class Registry(Generic[T]):
    """One extension point: names to entries. ``key`` is the config key whose value selects an entry (for errors)."""

    def __init__(self, key: str):
        self.key = key
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None) -> Callable[[T], T] | T:
        """``registry.register("gspo", fn)``, or as a decorator ``@registry.register("gspo")``."""
        if entry is None:
            return lambda e: self.register(name, e)
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.key}={name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        if name not in self._entries:
            load_plugins()
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"{self.key}={name!r}: no such entry (registered: {', '.join(self.names())})") from None

    def __contains__(self, name: str) -> bool:
        if name not in self._entries:
            load_plugins()
        return name in self._entries

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        load_plugins()
        return iter(sorted(self._entries.items()))


def load_plugins() -> None:
    """Import the shipped methods so they register (idempotent: Python imports a package once)."""
    importlib.import_module(PLUGINS)
