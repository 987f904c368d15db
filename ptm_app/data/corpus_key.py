"""The tokenize-once key of a prepared corpus, and the input files it covers (paths, globs, HF ``datasets`` dirs).

A prepared corpus (``data.litcorpus``) is keyed by the content hash of every input file, the text field, the
tokenizer fingerprint, the format version and the piece size, so a second run, or another rank, reuses it and a
directory written for other inputs is refused in one line (design principle 5: tokenize once).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

from ptm_app.data.tokenizer import tokenizer_fingerprint
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_file, cache_root, sha256_file


def file_digest(path: Path) -> str:
    """``sha256_file(path)``, remembered per (path, size, mtime) so that setup on a prepared corpus does not
    re-read every input file (time to first batch stays independent of the corpus size)."""
    stat = path.stat()
    memo_key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    memo = cache_root() / "digests" / memo_key
    if memo.exists():
        return memo.read_text().strip()
    digest = sha256_file(path)
    with atomic_file(memo, "w") as fh:
        fh.write(digest)
    return digest


def corpus_key(files: Sequence[Path], text_field: str, tokenizer, format_version: int, piece_bytes: int) -> dict:
    return {"format_version": format_version, "files": [file_digest(f) for f in files],
            "text_field": text_field, "tokenizer": tokenizer_fingerprint(tokenizer), "piece_bytes": piece_bytes}


def corpus_dir_for(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / "corpora" / digest


def check_key(target: Path, found: dict, key: dict) -> None:
    """Refuse a prepared directory written for other inputs, another tokenizer or another format version."""
    what = [k for k in key if found.get(k) != key[k]]
    if not what:
        return
    said = [f"{k} {found.get(k)!r} (this run: {key[k]!r})" if k != "files" else "input files (other contents)"
            for k in what]
    raise PtmError(f"corpus directory {target} was written with another {'; '.join(said)}; point "
                   f"data.init_args.shard_dir elsewhere or delete {target} to rebuild it")


def hf_saved_splits(directory: Path) -> dict[str, tuple[Path, ...]] | None:
    """The Arrow files of a HF ``datasets`` directory written by ``save_to_disk`` (a ``Dataset``: its files are the
    train split; a ``DatasetDict``: one entry per split), in the dataset's row order; ``None`` if it is not one."""
    if (directory / "dataset_dict.json").is_file():
        splits = json.loads((directory / "dataset_dict.json").read_text())["splits"]
        found = {split: hf_saved_splits(directory / split) for split in splits}
        return {split: files["train"] for split, files in found.items() if files}
    state = directory / "state.json"
    if not state.is_file():
        return None
    files = tuple(directory / f["filename"] for f in json.loads(state.read_text()).get("_data_files", []))
    if not files:
        raise PtmError(f"HF datasets directory {directory} lists no data files in state.json; save it again with "
                       f"save_to_disk")
    return {"train": files}


def expand_inputs(patterns: Iterable[str | Path]) -> list[Path]:
    """Files named by paths or globs, sorted within each glob; a glob that matches nothing is an error."""
    import glob

    files: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise PtmError(f"data source glob '{pattern}' matches no file; check the pattern and the directory")
            files.extend(Path(m).resolve() for m in matches)
        else:
            files.append(Path(pattern).resolve())
    return files
