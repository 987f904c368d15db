"""Checkpoints are written atomically: to a temp file, fsync'd, then renamed into place; the previous
``last.ckpt`` is kept as ``last-1.ckpt`` (``checkpoint_io.reading.resolve_last`` falls back to it) only if it passes
verification, so a damaged ``last.ckpt`` never replaces a good fallback (two faults in a row still leave one)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from ptm_app.checkpoint_io.reading import LAST, PREVIOUS, mark_verified, verify
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_file, keep_copy


def worth_keeping(last: Path) -> bool:
    """May the current ``last.ckpt`` (file or sharded directory) become the fallback ``last-1``?  Only if it
    passes ``checkpoint_io.reading.verify`` (one this process wrote, or resumed from, is not read again); else the fallback
    stays as it is, said in one line."""
    if not last.exists():
        return False
    try:
        verify(last)
    except PtmError as exc:
        print(f"warning: {str(exc).split(';')[0]}; keeping {last.with_name(PREVIOUS)} as the fallback instead of "
              f"replacing it with that file", flush=True)
        return False
    return True


class AtomicCheckpointIO(TorchCheckpointIO):
    """A crash while saving leaves the previous checkpoint intact, never a truncated file."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Optional[Any] = None) -> None:
        path = Path(path)
        if path.name == LAST and worth_keeping(path):
            keep_copy(path, path.with_name(PREVIOUS))
        with atomic_file(path, "wb") as fh:
            torch.save(checkpoint, fh)
        mark_verified(path)  # written and flushed by this process: the next save keeps it without re-reading it
