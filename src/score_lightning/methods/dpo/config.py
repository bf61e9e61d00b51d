"""``solver.dpo``: online DPO's settings (their defaults and explanations: ``configs/train.yaml``)."""

from dataclasses import dataclass

from score_lightning.config.fields import knob


@dataclass
class DPOConfig:
    beta: float = knob(gt=0.0, why="how sharply DPO prefers the chosen report")
    loss_type: str = knob(choices=("sigmoid", "robust"))
    label_smoothing: float = knob(ge=0.0, lt=0.5, why="robust only: the probability that a pair's order is wrong")


def check(cfg) -> list[str]:
    """What DPO cannot be combined with (each line names the keys and the fix). Each ``solver.dpo`` value on its own
    (beta > 0, the loss types, smoothing in [0, 0.5)) is :class:`DPOConfig`'s to refuse, so only the rules across
    keys are here, beside the schema, where the checks run before torch loads."""
    errors = []
    smoothing, loss_type = cfg.solver.dpo.label_smoothing, cfg.solver.dpo.loss_type
    if smoothing != 0 and loss_type == "sigmoid":
        errors.append(f"solver.dpo.label_smoothing={smoothing} with solver.dpo.loss_type=sigmoid: TRL's sigmoid DPO "
                      "has no label smoothing; set solver.dpo.loss_type=robust (robust DPO) or label_smoothing=0")
    kl = cfg.loss.kl_coef
    if isinstance(kl, (int, float)) and kl <= 0:
        errors.append(f"solver.objective=dpo with loss.kl_coef={kl}: DPO compares each report with the frozen "
                      "reference, which the run loads only while loss.kl_coef > 0 (its value does not enter DPO's "
                      "loss, beta is DPO's pull to the reference); set loss.kl_coef=0.05")
    if cfg.reward.step != "none":
        errors.append(f"solver.objective=dpo with reward.step={cfg.reward.step}: DPO compares whole reports and "
                      "has no per-token advantage for step credit to add to; set reward.step=none")
    if cfg.reward.overlong.enabled is True:
        errors.append("solver.objective=dpo with reward.overlong.enabled=true: the overlong penalty shapes GRPO's "
                      "advantages, which DPO has none of; set reward.overlong.enabled=false")
    return errors


#: where this node sits in the run's config
NODES = {"solver.dpo": DPOConfig}
#: the names it registers, by the config key that selects them (read before torch loads)
NAMES = {"solver.objective": ("dpo",)}
#: its rules across keys, run when the key selects it (the registry entry's ``check`` is the same function)
CHECKS = {("solver.objective", "dpo"): check}
