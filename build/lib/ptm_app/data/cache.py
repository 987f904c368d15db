"""The tokenize-once cache for small labelled sets: JSON files under ``<cache>/encoded`` keyed by content."""
from __future__ import annotations

import hashlib
import json
from typing import Callable

from ptm_app.paths import atomic_file, cache_root


def cached_json(key: list, build: Callable[[], dict]) -> dict:
    """``build()`` once per key (file digest, fields, settings, tokenizer fingerprint ...); later calls read it."""
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]
    cache = cache_root() / "encoded" / f"{digest}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    data = build()
    with atomic_file(cache, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data))  # one shot: the C encoder (json.dump streams through the Python one)
    return data
