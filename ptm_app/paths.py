"""Where things live: the prepared-data root, run directories, atomic writes."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def data_root() -> Path:
    """Root of prepared data: ``$PTM_DATA_DIR`` or ``<project>/data`` (independent of the cwd)."""
    return Path(os.environ.get("PTM_DATA_DIR") or PROJECT_ROOT / "data").expanduser().resolve()


def cache_root() -> Path:
    """Caches (downloads, tokenized corpora, trained tokenizers): ``$PTM_CACHE_DIR`` or ``<data_root>/.cache``."""
    return Path(os.environ.get("PTM_CACHE_DIR") or data_root() / ".cache").expanduser().resolve()


def runs_root() -> Path:
    """Run directories: ``$PTM_RUNS_DIR`` or ``./checkpoints`` relative to the working directory."""
    return Path(os.environ.get("PTM_RUNS_DIR") or "checkpoints").expanduser().resolve()


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Build a directory in a sibling temp dir and move it into place only on success.

    Readers never see a half-written directory; a failure leaves the old one (if any) intact.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp creates 0700
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Move the complete directory ``new`` to ``target``, replacing the file or directory there.

    Two renames: ``target`` to ``.<name>.old-<pid>``, then ``new`` to ``target``; the old one is deleted last.
    A crash between the renames leaves no ``target`` but the old one complete: ``restore_replaced`` puts it back.
    """
    new, target = Path(new), Path(target)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()


def restore_replaced(target: str | os.PathLike) -> Path:
    """``target``; if a ``replace_dir`` was interrupted between its renames, the previous one moved back first."""
    target = Path(target)
    if not target.exists():
        olds = sorted(target.parent.glob(f".{target.name}.old-*"), key=lambda p: p.stat().st_mtime)
        if olds:
            with contextlib.suppress(FileNotFoundError):  # another rank restored it first
                os.replace(olds[-1], target)
    return target


def fsync_tree(root: str | os.PathLike) -> None:
    """Flush every file below ``root``, and the directories, to disk (before a rename makes them visible)."""
    for folder, _, files in os.walk(root):
        for name in [*files, "."]:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[Any]:
    """Open a temp file next to ``target``; rename it over ``target`` when the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_file(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, ensure_ascii=False)
        fh.write("\n")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's content, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
