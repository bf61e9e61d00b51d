"""Train with SCORE: ``python src/train.py experiment=tiny_score`` (CPU) or ``experiment=qwen_score`` (4 GPUs)."""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="train")
def main(cfg: DictConfig) -> None:
    from score_lightning.training import run

    run(cfg)


if __name__ == "__main__":
    main()
