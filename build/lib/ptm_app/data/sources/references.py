"""Turn a model/tokenizer reference into something ``from_pretrained`` can open, offline first (a ptm_app
checkpoint as a reference is ``backbones.build.model_dir``'s part).

A reference is, in order of precedence: an existing local path, the name of a prepared
model (``python main.py data prepare NAME``), or a Hugging Face hub id (used only when the
user names one and the hub is reachable).
"""
from __future__ import annotations

import os
from pathlib import Path

from ptm_app.data.sources import SOURCES, prepared_dir
from ptm_app.errors import PtmError


def resolve_pretrained(ref: str) -> str:
    """Return a local directory for ``ref`` or the hub id itself; raise one clear line otherwise."""
    path = Path(ref).expanduser()
    if path.exists():
        return str(path.resolve())
    if ref in SOURCES:
        return str(prepared_dir(ref))
    looks_like_path = ref.startswith((".", "/", "~")) or ref.endswith((".ckpt", ".json", ".yaml"))
    if looks_like_path or "/" not in ref or os.environ.get("HF_HUB_OFFLINE") == "1":
        known = ", ".join(sorted(SOURCES))
        raise PtmError(
            f"model '{ref}' not found: it is not a local path nor a prepared name ({known}); "
            f"prepare one with: python main.py data prepare NAME, or give a local directory"
        )
    return ref  # a hub id such as 'org/name'; loading it needs a network


def load_error(ref: str, exc: Exception) -> PtmError:
    """Convert a ``from_pretrained`` failure into one line."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return PtmError(f"could not load '{ref}': {first}; check the path, or run: python main.py data prepare")
