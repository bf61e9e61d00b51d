"""Cold-start demonstrations for the solver workflows and the item-writing rubric sources, added only when the run
uses them.

``solver.agent=mams`` adds MaMs runs (:mod:`~score_lightning.methods.mams.demos`), ``reward.step=rubric``
adds step judgements (:mod:`~score_lightning.methods.arco.demos`), and ``rubric=evolving`` or ``rubric=drrubric`` add
RLER's and DR-rubric's item writing (:mod:`~score_lightning.methods.rler.demos`; the same demos for both, so
``rler_tiny`` and ``drrubric_tiny`` share one cold start). The default cold start (ReAct, no step
rewards) is untouched: no demo, seed stream or cache-key input changes for it, so its cached
checkpoint stays valid. A workflow run's cache key gains :func:`workflow_key_inputs` (the workflow,
its budgets, the counts and :data:`WORKFLOW_DEMO_VERSION`), so it never reuses the default cold start.

Counts come from ``sft.workflow_demos`` (``mams``, ``mams_per_prompt``, ``step``, ``step_per_prompt``, ``items``,
``items_per_prompt``), set by ``experiment=mams_tiny`` / ``experiment=arco_tiny``; absent keys take the defaults below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from omegaconf import OmegaConf

from score_lightning.methods.mams.agent import MamsConfig
from score_lightning.sft.demo_types import Demo
from score_lightning.methods.rler.demos import (
    DISTIL, ITEMS_CONTRAST, ITEMS_INIT, RESEARCH, contrast_group, distil_group, init_group, research_group,
)
from score_lightning.methods.mams.demos import mams_group
from score_lightning.methods.rubricem.demos import RUBRICEM, STAGE_JUDGE, rubricem_group, stage_judge_group
from score_lightning.methods.arco.demos import STEP, step_group

#: Bump whenever the workflow demonstrations change (only workflow runs' caches are rebuilt).
WORKFLOW_DEMO_VERSION = 3  # 2: step-judgement prompts show the step's passages; 3: item-writing demos
MAMS_KINDS = ("mams_search", "mams_state", "mams_report")
_DEFAULTS = {"mams": 240, "mams_per_prompt": 2, "step": 480, "step_per_prompt": 4, "items": 240, "items_per_prompt": 4,
             "rubricem": 480, "rubricem_per_prompt": 4, "stage": 480, "stage_per_prompt": 4}
#: spec fields added after cold starts were packaged: left out of the key while their kind is off (keys unchanged)
_LATER_FIELDS = {"num_rubricem": ("num_rubricem", "rubricem_per_prompt"), "num_stage": ("num_stage", "stage_per_prompt")}
#: the rubric sources whose writer writes <rubric_items> (their runs get the item-writing demos)
ITEM_WRITERS = ("EvolvingRubrics", "DeepResearchRubrics")


@dataclass(frozen=True)
class ExtraKind:
    """A demo kind registered beside the three default ones: about ``n`` demos, ``per_prompt`` responses
    per prompt, built by ``group(ctx, rng, query, per_prompt)``."""

    kind: str
    n: int
    per_prompt: int
    group: Callable[..., list[Demo]]


@dataclass(frozen=True)
class WorkflowDemoSpec:
    """Which workflow demos to build and how many (``None`` from :meth:`from_cfg`: none)."""

    mams: MamsConfig | None = None
    num_mams: int = 0  # MaMs runs (each gives one demo per role call)
    mams_per_prompt: int = 2  # runs per query and rubric (their first search prompt is shared)
    num_step: int = 0  # step judgements
    step_per_prompt: int = 4  # judgements per step prompt
    step_max_tokens: int = 96
    num_items: int = 0  # demos of each item-writing kind (RLER's contrast kind: half as many)
    items_per_prompt: int = 4
    num_rubricem: int = 0  # RubricEM's four-stage trajectories (solver.agent=rubricem)
    rubricem_per_prompt: int = 4
    num_stage: int = 0  # RubricEM's stage judgements (reward.step=stage)
    stage_per_prompt: int = 4

    @classmethod
    def from_cfg(cls, cfg) -> "WorkflowDemoSpec | None":
        mams = str(OmegaConf.select(cfg, "solver.agent", default="react")) == "mams"
        step = str(OmegaConf.select(cfg, "reward.step", default="none")) == "rubric"
        items = str(OmegaConf.select(cfg, "rubric._target_", default="")).endswith(ITEM_WRITERS)
        rubricem = str(OmegaConf.select(cfg, "solver.agent", default="react")) == "rubricem"
        stage = str(OmegaConf.select(cfg, "reward.step", default="none")) == "stage"
        if not (mams or step or items or rubricem or stage):
            return None
        n = {**_DEFAULTS, **(OmegaConf.to_container(cfg.sft.workflow_demos, resolve=True)
                             if OmegaConf.select(cfg, "sft.workflow_demos") else {})}
        return cls(MamsConfig.from_cfg(cfg) if mams else None, int(n["mams"]) if mams else 0, int(n["mams_per_prompt"]),
                   int(n["step"]) if step else 0, int(n["step_per_prompt"]),
                   int(OmegaConf.select(cfg, "reward.step_max_tokens", default=96)),
                   int(n["items"]) if items else 0, int(n["items_per_prompt"]),
                   int(n["rubricem"]) if rubricem else 0, int(n["rubricem_per_prompt"]),
                   int(n["stage"]) if stage else 0, int(n["stage_per_prompt"]))


def workflow_key_inputs(cfg) -> dict:
    """Extra SFT cache-key inputs of a workflow run; ``{}`` for the default (ReAct, no step rewards)."""
    spec = WorkflowDemoSpec.from_cfg(cfg)
    if spec is None:
        return {}
    fields = asdict(spec)
    for switch, names in _LATER_FIELDS.items():
        if not fields[switch]:
            for name in names:
                fields.pop(name)
    return {"workflow_demos": {**fields, "version": WORKFLOW_DEMO_VERSION}}


def workflow_kinds(spec: WorkflowDemoSpec | None) -> list[ExtraKind]:
    """The workflow demo kinds to register with :meth:`~score_lightning.sft.demos.DemoBuilder.build`."""
    if spec is None:
        return []
    kinds = []
    if spec.num_mams > 0 and spec.mams is not None:
        mams = spec.mams
        kinds.append(ExtraKind("mams", spec.num_mams, spec.mams_per_prompt,
                               lambda ctx, rng, query, n: mams_group(ctx, rng, query, n, mams)))
    if spec.num_step > 0:
        kinds.append(ExtraKind(STEP, spec.num_step, spec.step_per_prompt,
                               lambda ctx, rng, query, n: step_group(ctx, rng, query, n, spec.step_max_tokens)))
    if spec.num_items > 0:
        for kind, group in ((ITEMS_INIT, init_group), (ITEMS_CONTRAST, contrast_group), (RESEARCH, research_group),
                            (DISTIL, distil_group)):
            n = spec.num_items // 2 if kind == ITEMS_CONTRAST else spec.num_items
            kinds.append(ExtraKind(kind, n, spec.items_per_prompt, group))
    if spec.num_rubricem > 0:
        kinds.append(ExtraKind(RUBRICEM, spec.num_rubricem, spec.rubricem_per_prompt, rubricem_group))
    if spec.num_stage > 0:
        kinds.append(ExtraKind(STAGE_JUDGE, spec.num_stage, spec.stage_per_prompt, stage_judge_group))
    return kinds
