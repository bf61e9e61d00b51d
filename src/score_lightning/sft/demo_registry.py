"""The methods' cold-start demonstrations as registered sources, keyed by the switch that turns each on.

Why: a run that uses a method's prompts (``solver.agent=mams``, ``reward.step=rubric``, ``rubric=evolving`` ...) needs
demos of them in its cold start, yet the cold start names no method. A method registers a :class:`DemoSource` in
:data:`DEMO_SOURCES` under the switch and value that turn it on (the ``rubric`` switch's value is the rubric source's
class name, ``rubric._target_``'s last part); :mod:`~score_lightning.sft.workflow_demos` asks every source for its
cache-key fields and, when on, its demo kinds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from score_lightning.registry import Registry
from score_lightning.sft.demo_types import Demo


@dataclass(frozen=True)
class ExtraKind:
    """A demo kind registered beside the three default ones: about ``n`` demos, ``per_prompt`` responses
    per prompt, built by ``group(ctx, rng, query, per_prompt)``."""

    kind: str
    n: int
    per_prompt: int
    group: Callable[..., list[Demo]]


@dataclass(frozen=True)
class DemoSource:
    """One method's cold-start demonstrations.

    ``counts`` below is the merged ``sft.workflow_demos`` (every source's ``defaults`` under the config's values).
    """

    #: where its kinds go among the others': the order sources were added in, which fixes the demos' group numbers
    position: int
    #: its counts' defaults in ``sft.workflow_demos`` (kept out of configs/: a key there would change every cache key)
    defaults: Mapping[str, int]
    #: ``(cfg, counts, on) -> {field: value}``: what the SFT cache key holds of it (``on``: its switch is set)
    key_fields: Callable[[Any, Mapping[str, Any], bool], dict[str, Any]]
    #: ``fields -> kinds``: its demo kinds from the merged key fields (none when its count is 0)
    kinds: Callable[[Mapping[str, Any]], list[ExtraKind]]


#: switch -> value -> source; a source may be registered under several values (rubric=evolving and rubric=drrubric
#: share RLER's item-writing demos, and so one cold start)
DEMO_SOURCES: dict[str, Registry[DemoSource]] = {
    "solver.agent": Registry("solver.agent"), "reward.step": Registry("reward.step"), "rubric": Registry("rubric"),
}


def switch_value(cfg, switch: str) -> str:
    """The value of ``switch`` in ``cfg`` that selects a source (``rubric``: the rubric source's class name)."""
    if switch == "rubric":
        return str(cfg.rubric._target_).rsplit(".", 1)[-1]
    return str(OmegaConf.select(cfg, switch))


def registered_sources() -> list[DemoSource]:
    """Every registered source once, in ``position`` order."""
    unique = {id(s): s for registry in DEMO_SOURCES.values() for _, s in registry.items()}
    return sorted(unique.values(), key=lambda s: s.position)


def sources_for(cfg) -> list[tuple[DemoSource, bool]]:
    """Every registered source once, in ``position`` order, each with whether ``cfg``'s switches turn it on."""
    on = {id(DEMO_SOURCES[switch].get(value)) for switch in DEMO_SOURCES
          if (value := switch_value(cfg, switch)) in DEMO_SOURCES[switch]}
    return [(s, id(s) in on) for s in registered_sources()]
