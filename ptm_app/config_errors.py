"""Reduce jsonargparse's multi-line validation errors to one line naming the key and the fix."""
from __future__ import annotations

import re

_HELP = "python main.py fit --help lists the keys"


def one_line(exc: Exception) -> str:
    text = str(exc)
    group = re.search(r'Parser key "([^"]+)"', text)
    prefix = f"{group.group(1)}." if group else ""
    if group and "class_path" in text:
        prefix += "init_args."
    option = re.search(r"Option '([^']+)' is not accepted", text) or re.search(r"Key '([^']+)' is not expected", text)
    if option:
        return f"unknown config key '{prefix}{option.group(1)}'; check its spelling ({_HELP})"
    unrecognized = re.search(r"[Uu]nrecognized arguments: (.+)", text)
    if unrecognized:
        return f"unknown command-line argument {unrecognized.group(1).strip()}; check its spelling ({_HELP})"
    klass = re.search(r"import path string: ([\w.]+)", text) or re.search(r"[Ii]mport path '([\w.]+)'", text)
    if klass:
        where = group.group(1) if group else "config"
        return f"unknown class '{klass.group(1)}' for '{where}'; use one of ptm_app's modules (README: Config catalogue)"
    lines = [ln.strip(" -") for ln in text.splitlines() if ln.strip()]
    detail = [ln for ln in lines if not ln.startswith(("Subtypes", "Given value", "Errors", "Expected a"))]
    return (prefix.rstrip(".") + ": " if prefix else "") + " ".join(detail[:3])[:400]
