"""Turn a model/tokenizer reference into something ``from_pretrained`` can open, offline first (a ptm_app
checkpoint as a reference is ``backbones.build.model_dir``'s part).

A reference is, in order of precedence: an existing local path, the name of a prepared
model (``python main.py data prepare NAME``), or a Hugging Face hub id (used only when the
user names one and the hub is reachable).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ptm_app.data.sources import SOURCES, prepared_dir
from ptm_app.errors import PtmError


def resolve_pretrained(ref: str) -> str:
    """Return a local directory for ``ref`` or the hub id itself; raise one clear line otherwise."""
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir():
            refuse_local_code(path)
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


REMOTE_CODE = {"trust_remote_code": False}  # every transformers loader: code shipped with a model never runs
CODE_NAMING_FILES = ("config.json", "tokenizer_config.json")  # where transformers reads ``auto_map``


def config_json(text: str) -> object:
    """A config file's JSON, or None when it is not JSON (transformers' own loader then says what is wrong)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def refuse_remote_code(data: object, what: str) -> None:
    """One line when a config (a dict, as in config.json or tokenizer_config.json) names code of its own
    (``auto_map``), which ptm_app never runs."""
    if isinstance(data, dict) and data.get("auto_map"):
        named = json.dumps(data["auto_map"], default=str)[:200]
        raise PtmError(f"{what} names code of its own (auto_map: {named}), which ptm_app "
                       f"never runs (trust_remote_code is off); use a model that transformers supports natively "
                       f"(or remove auto_map if it is one)")


def refuse_local_code(directory: Path) -> None:
    """A model or tokenizer directory whose config names code of its own is refused in one line (transformers
    would ask on stdin whether to run the ``.py`` files shipped with it)."""
    for name in CODE_NAMING_FILES:
        file = directory / name
        if file.is_file():
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue  # transformers' own loader says what is wrong with it
            refuse_remote_code(config_json(text), str(file))


def load_tokenizer_dir(where: str | os.PathLike, ref: str | os.PathLike | None = None):
    """``AutoTokenizer.from_pretrained(where)`` without remote code (``auto_map`` is ignored, never asked about on
    stdin); a failure is one line naming ``ref``."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(where), **REMOTE_CODE)
    except (OSError, ValueError) as exc:
        raise load_error(str(ref if ref is not None else where), exc) from None


def load_error(ref: str, exc: Exception) -> PtmError:
    """Convert a ``from_pretrained`` failure into one line."""
    if "trust_remote_code" in str(exc) or "custom code" in str(exc):
        return PtmError(f"could not load '{ref}': it needs code shipped with the model (auto_map), which ptm_app "
                        f"never runs (trust_remote_code is off); use a model that transformers supports natively")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return PtmError(f"could not load '{ref}': {first}; check the path, or run: python main.py data prepare")
