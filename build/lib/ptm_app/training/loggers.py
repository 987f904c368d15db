"""A CSV logger whose ``metrics.csv`` continues across resumes instead of starting over."""
from __future__ import annotations

import csv

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


class _AppendingWriter(ExperimentWriter):
    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as fh:
                self.metrics_keys = sorted(next(csv.reader(fh), []))

    def _check_log_dir_exists(self) -> None:  # a resumed run appends to its own log on purpose
        pass


class RunCSVLogger(CSVLogger):
    """``CSVLogger`` for a run directory: one ``metrics.csv`` for the whole run, resumes included."""

    @property
    @rank_zero_experiment
    def experiment(self) -> _AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
