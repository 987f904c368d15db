"""Reduce jsonargparse's multi-line validation errors to one line naming the key and the fix."""
from __future__ import annotations

import re


def one_line(exc: Exception) -> str:
    text = str(exc)
    unexpected = re.search(r"Key '([^']+)' is not expected", text) or re.search(r"unrecognized arguments: (.+)", text)
    if unexpected:
        key = unexpected.group(1).strip()
        return f"unknown config key '{key}'; check its spelling (python main.py fit --help lists the keys)"
    klass = re.search(r"[Ii]mport path ([\w.]+)|class_path '?([\w.]+)'?", text)
    if klass and ("not found" in text or "Unable to" in text or "does not" in text):
        name = klass.group(1) or klass.group(2)
        return f"unknown class '{name}'; use one of ptm_app's modules (see README: Config catalogue)"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " ".join(lines[:2])[:400] if lines else type(exc).__name__
