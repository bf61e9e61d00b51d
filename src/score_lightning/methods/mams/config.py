"""``solver.mams``: the token budgets of MaMs' roles (their defaults and explanations: ``configs/train.yaml``)."""

from dataclasses import dataclass

from score_lightning.config.fields import knob


@dataclass
class MamsRoleBudgets:
    chunk_tokens: int = knob(ge=8)
    max_observation_tokens: int = knob(ge=8)
    search_tokens: int = knob(ge=8)
    state_tokens: int = knob(ge=8)
    report_tokens: int = knob(ge=8)
    memory_tokens: int = knob(ge=8)
    plan_tokens: int = knob(ge=8)
    max_context_tokens: int = knob(ge=8)


#: where this node sits in the run's config
NODES = {"solver.mams": MamsRoleBudgets}
#: the names it registers, by the config key that selects them (read before torch loads)
NAMES = {"solver.agent": ("mams",)}
