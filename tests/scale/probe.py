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


class CrashInSave(Callback):
    """Kills global rank 1 (``os._exit``) once it has written its shards of the checkpoint of global step ``step``:
    a crash in the middle of a sharded save, before every rank has confirmed its part."""

    def __init__(self, step: int):
        self.step = step

    def setup(self, trainer, pl_module, stage: str) -> None:
        strategy = trainer.strategy
        write = strategy.write_shards

        def crashing(checkpoint, directory, storage_options=None):
            step = checkpoint.get("global_step")
            write(checkpoint, directory, storage_options)
            if step == self.step and strategy.global_rank == 1:
                os._exit(3)

        strategy.write_shards = crashing


class ThroughputProbe(Callback):
    """Writes ``<dir>/throughput<global rank>.json``: the ``ThroughputMonitor``'s last logged window on this rank
    (its own counts and seconds), the metrics it logged for it, and its device peak."""

    def __init__(self, directory: str):
        self.directory = Path(directory)

    def on_train_end(self, trainer, pl_module) -> None:
        from ptm_app.training.throughput import ThroughputMonitor

        monitor = next(c for c in trainer.callbacks if isinstance(c, ThroughputMonitor))
        self.directory.mkdir(parents=True, exist_ok=True)
        info = {"window": monitor.last_window, "metrics": monitor.last_metrics, "peak": monitor.peak,
                "world_size": trainer.world_size, "step": trainer.global_step}
        (self.directory / f"throughput{trainer.global_rank}.json").write_text(json.dumps(info))


class ZeROProbe(Callback):
    """Writes ``<dir>/zero.json`` on global rank 0: what DeepSpeed's ZeRO optimizer really runs (stage, whether
    it offloads the optimizer states and the parameters, and which optimizer steps them)."""

    def __init__(self, directory: str):
        self.directory = Path(directory)

    def on_train_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        zero = trainer.strategy.deepspeed_engine.optimizer
        info = {"zero": type(zero).__name__, "offload_optimizer": bool(zero.offload_optimizer),
                "offload_param": bool(zero.offload_param), "optimizer": type(zero.optimizer).__name__}
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "zero.json").write_text(json.dumps(info))
