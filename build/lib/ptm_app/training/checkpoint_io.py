"""Checkpoints are written atomically: to a temp file, fsync'd, then renamed into place; the previous
``last.ckpt`` is kept as ``last-1.ckpt`` (``checkpoints.resolve_last`` falls back to it)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ptm_app.checkpoints import LAST, PREVIOUS
from ptm_app.paths import atomic_file, keep_copy


class AtomicCheckpointIO(TorchCheckpointIO):
    """A crash while saving leaves the previous checkpoint intact, never a truncated file."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Optional[Any] = None) -> None:
        path = Path(path)
        if path.name == LAST:
            keep_copy(path, path.with_name(PREVIOUS))
        with atomic_file(path, "wb") as fh:
            torch.save(checkpoint, fh)
