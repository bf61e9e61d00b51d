"""Cold-start demonstrations for the methods' prompts (solver workflows, step judges, item-writing rubric sources),
added only when the run uses them.

Each method registers its demos as a :class:`~score_lightning.sft.demo_registry.DemoSource` under the switch that
turns it on: ``solver.agent=mams`` adds MaMs runs, ``reward.step=rubric`` step judgements, ``rubric=evolving`` or
``rubric=drrubric`` RLER's and DR-rubric's item writing (the same demos for both, so ``rler_tiny`` and
``drrubric_tiny`` share one cold start), ``solver.agent=rubricem`` and ``reward.step=stage`` RubricEM's. The default
cold start (ReAct, no step rewards) is untouched: no demo, seed stream or cache-key input changes for it, so its cached
checkpoint stays valid. A workflow run's cache key gains :func:`workflow_key_inputs` (every source's fields: the
workflow's budgets, the counts, and :data:`WORKFLOW_DEMO_VERSION`), so it never reuses the default cold start.

Counts come from ``sft.workflow_demos`` (``mams``, ``mams_per_prompt``, ``step``, ``step_per_prompt``, ``items``,
``items_per_prompt`` ...), set by ``experiment=mams_tiny`` / ``experiment=arco_tiny``; absent keys take each source's
defaults.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from omegaconf import OmegaConf

from score_lightning.sft.demo_registry import ExtraKind, registered_sources, sources_for

#: Bump whenever the workflow demonstrations change (only workflow runs' caches are rebuilt).
WORKFLOW_DEMO_VERSION = 3  # 2: step-judgement prompts show the step's passages; 3: item-writing demos


@dataclass(frozen=True)
class WorkflowDemoSpec(Mapping):
    """Which workflow demos to build and how many: every registered source's key fields (``None`` from
    :func:`workflow_demo_spec`: no source is on). Read as a mapping: ``spec["num_mams"]``,
    ``spec["mams"].max_searches``."""

    fields: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)


def workflow_demo_spec(cfg) -> WorkflowDemoSpec | None:
    """The run's workflow demos. The whole config, because the switches that turn sources on live in three groups
    (``solver.agent``, ``reward.step``, ``rubric``) and each source's key fields read its own method's node; the
    counts are ``sft.workflow_demos`` over every source's defaults."""
    sources = sources_for(cfg)
    if not any(on for _, on in sources):
        return None
    counts = {k: v for s, _ in sources for k, v in s.defaults.items()}
    if cfg.sft.workflow_demos:  # counts an experiment sets (mams_tiny, arco_tiny); none: the sources' defaults
        counts.update(OmegaConf.to_container(cfg.sft.workflow_demos, resolve=True))
    return WorkflowDemoSpec({k: v for s, on in sources for k, v in s.key_fields(cfg, counts, on).items()})


def workflow_key_inputs(cfg) -> dict:
    """Extra SFT cache-key inputs of a workflow run; ``{}`` for the default (ReAct, no step rewards)."""
    spec = workflow_demo_spec(cfg)
    if spec is None:
        return {}
    fields = {k: asdict(v) if is_dataclass(v) else v for k, v in spec.items()}
    return {"workflow_demos": {**fields, "version": WORKFLOW_DEMO_VERSION}}


def workflow_kinds(spec: WorkflowDemoSpec | None) -> list[ExtraKind]:
    """The workflow demo kinds to register with :meth:`~score_lightning.sft.demos.DemoBuilder.build`, in the
    sources' order (each source's kinds from the spec's fields; none when its count is 0)."""
    if spec is None:
        return []
    return [kind for source in registered_sources() for kind in source.kinds(spec)]
