"""``ResumableCSVLogger``: the CSV logger of ``logger=csv``, which keeps the rows of the run it resumes.

Lightning's ``CSVLogger`` deletes the ``metrics.csv`` it finds in its folder, so a run resumed in place
(``launch/runs.py``) lost every row before the resume; and it warns "Previous log files in this directory will be
deleted" whenever the folder is not empty, on a fresh run too (the cold start's ``csv/sft`` sits inside it).
"""

from __future__ import annotations

import csv

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class KeepingWriter(ExperimentWriter):
    """Appends to an existing ``metrics.csv`` under its header (a new tag rewrites the header, rows kept)."""

    def _check_log_dir_exists(self) -> None:  # Lightning's deletes metrics.csv here, and warns that it will
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as fh:
                self.metrics_keys = next(csv.reader(fh), [])


class ResumableCSVLogger(CSVLogger):
    """``CSVLogger`` writing through :class:`KeepingWriter`."""

    @property
    @rank_zero_experiment
    def experiment(self) -> KeepingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = KeepingWriter(log_dir=self.log_dir)
        return self._experiment
