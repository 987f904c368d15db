"""Hugging Face hub datasets (``source: hf:NAME`` or ``hf:NAME:CONFIG``), only when online.

The splits are downloaded once with the ``datasets`` library and stored as JSONL under
``<cache>/hub/<key>``; from then on they are ordinary local files and need no network.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, cache_root

SPLIT_NAMES = {"train": "train", "validation": "validation", "valid": "validation", "dev": "validation",
               "test": "test"}


def hub_dataset_dir(ref: str) -> Path:
    """Local directory of ``train/validation/test.jsonl`` for a ``hf:`` reference."""
    name, _, config = ref[len("hf:"):].partition(":")
    target = cache_root() / "hub" / hashlib.sha256(ref.encode()).hexdigest()[:16]
    if (target / "train.jsonl").is_file():
        return target
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise PtmError(f"hub dataset '{name}' is not cached and the hub is offline (HF_HUB_OFFLINE=1); "
                       f"go online once, or save the splits as local train/validation .jsonl files and set data.source to that directory")
    try:
        import datasets
    except ImportError:
        raise PtmError("hub datasets need the 'datasets' package: pip install 'ptm_app[hub]'") from None
    try:
        loaded = datasets.load_dataset(name, config or None)
    except Exception as exc:  # network, unknown id, gated dataset ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PtmError(f"could not load hub dataset '{name}': {first}") from None
    with atomic_dir(target) as tmp:
        for split, data in loaded.items():
            if split in SPLIT_NAMES:
                data.to_json(str(tmp / f"{SPLIT_NAMES[split]}.jsonl"), lines=True, force_ascii=False)
    return target
