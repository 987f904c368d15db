"""Checkpoints are written atomically: to a temp file, fsync'd, then renamed into place."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ptm_app.paths import atomic_file


class AtomicCheckpointIO(TorchCheckpointIO):
    """A crash while saving leaves the previous checkpoint intact, never a truncated file."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Optional[Any] = None) -> None:
        with atomic_file(Path(path), "wb") as fh:
            torch.save(checkpoint, fh)
