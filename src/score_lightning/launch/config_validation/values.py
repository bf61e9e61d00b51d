"""What every group's checks share: reading a key, a predicate, and an error line naming both."""

from __future__ import annotations

from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from score_lightning.errors import ConfigError

Predicate = Callable[[Any], bool]


class Checks:
    """The errors found in one config so far; every group appends to the same list, so a user sees all of them."""

    def __init__(self, cfg: DictConfig, live: Callable[[str], list[str]] | None = None):
        self.cfg, self.errors, self.live = cfg, [], live

    def registered(self, key: str) -> set[str]:
        """The names a registry-backed ``key`` may take: the registry's own with ``live``, else the declared ones."""
        from score_lightning.launch.schema import known_names

        return set(self.live(key)) if self.live is not None else known_names(key)

    def get(self, key: str) -> Any:
        """``key``'s value, None where an open node lacks it (a callback removed, another option's key): no default
        of its own, the schema and the YAML hold every default."""
        return OmegaConf.select(self.cfg, key)

    def __call__(self, key: str, ok: Predicate, allowed: str) -> None:
        """``key`` must be present and satisfy ``ok``; else one line: the key, its value and what is allowed."""
        value = OmegaConf.select(self.cfg, key, throw_on_missing=False, default="__missing__")
        if value == "__missing__":
            self.errors.append(f"{key}: missing from the config")
            return
        try:
            good = ok(value)
        except Exception:  # a wrong type makes the predicate raise: that is a bad value too
            good = False
        if not good:
            self.errors.append(f"{key}={value!r}: allowed {allowed}")

    def add(self, line: str) -> None:
        self.errors.append(line)

    def raise_any(self) -> None:
        if self.errors:
            raise ConfigError("invalid config:\n  - " + "\n  - ".join(self.errors))


def integer(lo: int, hi: int | None = None) -> Predicate:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo and (hi is None or v <= hi)


def number(lo: float, hi: float | None = None, lo_open: bool = False, hi_open: bool = False) -> Predicate:
    def ok(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if (v <= lo) if lo_open else (v < lo):
            return False
        if hi is not None and ((v >= hi) if hi_open else (v > hi)):
            return False
        return True
    return ok


def one_of(*values: Any) -> Predicate:
    return lambda v: v in values


BOOL = (lambda v: isinstance(v, bool), "true or false")
