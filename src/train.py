"""Train with SCORE: ``python src/train.py experiment=tiny_score`` (CPU) or ``experiment=qwen_score`` (4 GPUs)."""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
EXIT_HALTED = 3  # the run stopped itself (NaNs, retrieval outage); 75 = preempted (see callbacks/preemption.py)
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing


EXIT_CONFIG = 2  # a refused config, checkpoint, unloadable model, unreachable retriever or uninstallable cold start


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="train")
def main(cfg: DictConfig) -> None:
    from score_lightning.errors import (ColdStartUnavailable, ConfigError, ModelUnavailable, RetrieverUnavailable,
                                        TrainingHalted)
    from score_lightning.launch.threads import export_wait_policy
    from score_lightning.telemetry.console import quiet_libraries

    export_wait_policy(cfg)  # before torch loads: OpenMP reads OMP_WAIT_POLICY once, when its library loads
    quiet_libraries()  # before Lightning loads: importing it may build matplotlib's font cache, and say so
    from score_lightning.launch.training import run  # torch loads with it (the config checks import it)

    try:
        run(cfg)
    except (ConfigError, ModelUnavailable, RetrieverUnavailable, ColdStartUnavailable) as exc:  # the user's to fix
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except TrainingHalted as exc:  # a safety stop: the checkpoint is saved, the message says why
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_HALTED)


def check_command_line(argv: list[str]) -> None:
    """Every problem of the command line's config at once, before Hydra and torch (launch/config_check.py).
    Hydra's own flags (``--cfg``, ``-m``, ...) skip it; a multirun checks each job's config in ``run``."""
    if any(a.startswith("-") for a in argv):
        return
    from score_lightning.errors import ConfigError
    from score_lightning.launch.config_check import check_command_line as check

    try:
        check(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


if __name__ == "__main__":
    from score_lightning.launch.schema import register_schema

    register_schema()  # the schema the YAML merges onto (configs/train.yaml lists it first)
    check_command_line(sys.argv[1:])
    main()
