"""Run folders: which checkpoint ``ckpt_path=last`` means, and resuming inside the run it came from.

A resumed run continues in the folder of the checkpoint it resumes (``resume_in_place``), so its
TensorBoard events, CSV rows and checkpoints extend the same run and the curves do not split. The
Hydra launch folder of the resume then only holds that launch's own log and config.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig, open_dict

from score_lightning.launch.config_validation import ConfigError

log = logging.getLogger(__name__)


def latest_checkpoint(task_dir: Path) -> Path | None:
    """The newest ``checkpoints/last.ckpt`` (file or FSDP directory) below a task's log folder."""
    found = [p for p in task_dir.rglob("last.ckpt") if p.parent.name == "checkpoints"]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def run_dir_of(ckpt: Path) -> Path | None:
    """``<run>/checkpoints/last.ckpt`` -> ``<run>``; ``None`` for a checkpoint outside a run folder."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None


def resolve_resume(cfg: DictConfig, output_dir_overridden: bool) -> None:
    """Turn ``ckpt_path=last`` into a path, and move ``paths.output_dir`` to the resumed run's folder.

    ``output_dir_overridden``: the user set ``paths.output_dir`` on the command line; it then wins.
    """
    ckpt = cfg.ckpt_path
    if ckpt is None:
        return
    if str(ckpt) == "last":
        task_dir = Path(cfg.paths.log_dir) / str(cfg.task_name)
        found = latest_checkpoint(task_dir)
        if found is None:
            raise ConfigError(f"ckpt_path=last: no checkpoints/last.ckpt below {task_dir}; "
                              "give the checkpoint's path instead")
        log.info("ckpt_path=last: resuming from %s", found)
        with open_dict(cfg):
            cfg.ckpt_path = str(found)
    run_dir = run_dir_of(Path(cfg.ckpt_path))
    if bool(cfg.resume_in_place) and not output_dir_overridden and run_dir is not None:
        with open_dict(cfg):
            cfg.paths.output_dir = str(run_dir)
        log.info("resuming in the checkpoint's run folder %s (one continuous set of curves)", run_dir)
    if run_dir is not None and Path(cfg.paths.output_dir).resolve() == run_dir.resolve():
        from score_lightning.telemetry.console import quiet_resume_in_place

        quiet_resume_in_place()  # its checkpoints/ holds the checkpoint it resumes: no news
