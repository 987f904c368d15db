"""Test-only observers for multi-process runs, loaded by ``main.py`` through class paths in the config."""
from __future__ import annotations

import json
import os
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from ptm_app.data.datamodules import PretrainDataModule


class ShardProbe(Callback):
    """Writes ``<dir>/rank<global rank>.json``: the dataset indices of every training example this rank consumed."""

    def __init__(self, directory: str):
        self.directory = Path(directory)
        self.seen: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.extend(int(key[1]) for key in batch["keys"])

    def on_train_end(self, trainer, pl_module) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        info = {"global_rank": trainer.global_rank, "world_size": trainer.world_size, "seen": self.seen,
                "train_size": len(trainer.datamodule.datasets["train"]), "node_rank": trainer.node_rank}
        (self.directory / f"rank{trainer.global_rank}.json").write_text(json.dumps(info))


class CountingPretrainData(PretrainDataModule):
    """``PretrainDataModule`` that leaves a marker file each time ``prepare_data`` (tokenization) runs."""

    def __init__(self, *args, marker_dir: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.marker_dir = Path(marker_dir)

    def prepare_data(self) -> None:
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        (self.marker_dir / f"prepare_data.node{os.environ.get('NODE_RANK', '0')}").write_text("ran")
        super().prepare_data()
