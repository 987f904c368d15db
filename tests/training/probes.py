"""Test-only callbacks for in-process ``main.py`` runs, loaded through class paths in the config."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class SigtermAt(Callback):
    """Sends this process a real SIGTERM while training batch ``batch`` (0-based, this launch) runs."""

    def __init__(self, batch: int):
        self.batch = batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


class SaveRecorder(Callback):
    """Appends to ``path`` one JSON line per checkpoint save: the optimizer step, the micro-batches done in the
    epoch and the loader position that went into it."""

    def __init__(self, path: str):
        self.path = Path(path)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        loop = trainer.fit_loop.epoch_loop
        row = {"step": checkpoint["global_step"], "ready": loop.batch_progress.current.ready,
               "consumed": trainer.train_dataloader.consumed}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
