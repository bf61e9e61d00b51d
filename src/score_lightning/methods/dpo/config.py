"""``solver.dpo``: online DPO's settings (their defaults and explanations: ``configs/train.yaml``)."""

from dataclasses import dataclass

from score_lightning.config.fields import knob


@dataclass
class DPOConfig:
    beta: float = knob(gt=0.0, why="how sharply DPO prefers the chosen report")
    loss_type: str = knob(choices=("sigmoid", "robust"))
    label_smoothing: float = knob(ge=0.0, lt=0.5, why="robust only: the probability that a pair's order is wrong")


#: where this node sits in the run's config
NODES = {"solver.dpo": DPOConfig}
