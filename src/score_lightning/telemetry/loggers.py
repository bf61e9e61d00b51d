"""Loggers from config, and the things a step logs beyond scalars: text samples, histograms, a layout.

Loggers are built with ``hydra.utils.instantiate`` from ``configs/logger/*.yaml`` (TensorBoard by
default; CSV, W&B or several at once). Text and histograms go to every logger that can take them
(TensorBoard text and histograms, W&B tables and histograms). Text never disappears silently: when
no configured logger takes text, it is appended to ``<output_dir>/text_samples.jsonl``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: the TensorBoard "custom scalars" page: the curves a SCORE user watches first, grouped
SCORE_LAYOUT: dict[str, dict[str, list[str]]] = {
    "SCORE": {
        "solver reward and its parts": ["solver/reward_mean", "solver/reward_validity_part", "solver/reward_score_part"],
        "answer validity and citations": ["solver/answer_valid_rate", "solver/citation_validity",
                                          "solver/ungrounded_citation_rate"],
        "entropy and KL": ["solver/entropy", "solver/kl"],
        "evaluator: consistency, baseline, advantage": ["evaluator/consistency", "evaluator/baseline",
                                                        "evaluator/advantage"],
        "rubric and scoring validity": ["evaluator/rubric_valid_rate", "evaluator/scoring_valid_rate",
                                        "evaluator/verified_rate", "evaluator/incomplete_rate"],
        "do scores separate valid from invalid reports": ["evaluator/score_valid_reports",
                                                          "evaluator/score_invalid_reports",
                                                          "evaluator/score_gap_valid_invalid"],
        "harness version": ["harness/version"],
    },
}


def build_loggers(loggers: Mapping[str, Any] | None, version: str | None = None) -> list:
    """Instantiate every logger of the ``logger`` node (``cfg.logger``: name -> its node) that has a ``_target_``;
    ``logger=none`` holds none.

    ``version`` (e.g. ``"sft"``) gives a sub-run its own folder in loggers that have one (TensorBoard,
    CSV); other loggers get it appended to their run name.
    """
    from hydra.utils import instantiate

    out = []
    for node in (loggers or {}).values():
        if not isinstance(node, Mapping) or "_target_" not in node:
            continue
        kwargs: dict[str, Any] = {}
        if version is not None:
            if "version" in node:
                kwargs["version"] = version
            elif "name" in node:
                kwargs["name"] = f"{node['name']}-{version}"
        out.append(instantiate(node, **kwargs))
    return out


def log_texts(loggers: Sequence, texts: Mapping[str, str], step: int, fallback_dir: str | Path | None) -> None:
    """Markdown texts to every logger that takes text; to ``text_samples.jsonl`` when none does."""
    taken = False
    for lg in loggers:
        exp = getattr(lg, "experiment", None)
        if hasattr(exp, "add_text"):  # TensorBoard
            for tag, text in texts.items():
                exp.add_text(tag, text, step)
            taken = True
        elif hasattr(lg, "log_text"):  # W&B: one-cell tables
            for tag, text in texts.items():
                lg.log_text(key=tag, columns=["text"], data=[[text]], step=step)
            taken = True
    if not taken and fallback_dir is not None:
        path = Path(fallback_dir) / "text_samples.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            for tag, text in texts.items():
                fh.write(json.dumps({"step": step, "tag": tag, "text": text}) + "\n")


def log_histograms(loggers: Sequence, values: Mapping[str, Sequence[float]], step: int) -> None:
    """Distributions (reward, advantage, response length, tool calls) to loggers that draw histograms."""
    import numpy as np

    for lg in loggers:
        exp = getattr(lg, "experiment", None)
        if hasattr(exp, "add_histogram"):
            for tag, vals in values.items():
                if len(vals):
                    exp.add_histogram(tag, np.asarray(vals, dtype=np.float64), step)
        elif type(lg).__name__ == "WandbLogger":
            import wandb

            lg.log_metrics({tag: wandb.Histogram(list(vals)) for tag, vals in values.items() if len(vals)}, step=step)


def add_score_layout(loggers: Sequence) -> None:
    """Register the "SCORE" custom-scalars page with TensorBoard loggers (once per run)."""
    for lg in loggers:
        exp = getattr(lg, "experiment", None)
        if hasattr(exp, "add_custom_scalars"):
            layout = {cat: {title: ["Multiline", tags] for title, tags in charts.items()}
                      for cat, charts in SCORE_LAYOUT.items()}
            exp.add_custom_scalars(layout)
