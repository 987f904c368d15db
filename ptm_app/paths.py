"""Where things live: the prepared-data root, run directories, atomic writes."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

from ptm_app.errors import PtmError

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


RUN_NAME = re.compile(r"[A-Za-z0-9._-]+")


def check_run_name(name: Any, what: str = "--run_name") -> str:
    """``name`` if it is one directory name (letters, digits, ``.``, ``_``, ``-``; not ``.`` or ``..``), so a run
    directory stays inside the runs directory; else one line."""
    if isinstance(name, str) and RUN_NAME.fullmatch(name) and name not in (".", ".."):
        return name
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._") or "my_run"
    raise PtmError(f"{what} {str(name)[:120]!r}: a run name is one directory name of letters, digits, '.', '_' and '-' "
                 f"(not '.' or '..'), so the run stays inside the runs directory; use e.g. --run_name {safe}")


def run_name_for(name: Optional[str], configs: list) -> Optional[str]:
    """A run's name: ``name`` (``--run_name`` or the config's ``run_name``), else the last config file's stem;
    either is checked to be one directory name (``check_run_name``)."""
    if name:
        return check_run_name(name)
    if not configs:
        return None
    return check_run_name(Path(str(configs[-1])).stem, f"the run name from the config file {configs[-1]}")


def run_path(name: str, what: str = "run_name") -> Path:
    """The directory of the run ``name`` under the runs directory (``check_run_name``)."""
    return runs_root() / check_run_name(name, what)


def remove_interrupted_writes(directory: str | os.PathLike) -> list[str]:
    """Delete the temp files and directories that ``atomic_file``, ``atomic_dir`` and ``keep_copy`` leave in
    ``directory`` when a process is killed mid-write (``.<name>.tmp-*``); returns their names.  Only for a directory
    no other process writes (a run directory under its ``RunLock``)."""
    removed = []
    for entry in sorted(Path(directory).glob(".*.tmp-*")) if Path(directory).is_dir() else []:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry.name)
    return removed


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


def replace_dir(new: str | os.PathLike, target: str | os.PathLike, keep: str | os.PathLike | None = None) -> None:
    """Move the complete directory ``new`` to ``target``, replacing the file or directory there.

    Two renames: ``target`` to ``.<name>.old-<pid>``, then ``new`` to ``target``; the old one is deleted last, or
    becomes ``keep`` (the previous checkpoint).  A crash between the renames leaves no ``target`` but the old one
    complete: ``restore_replaced`` puts it back.
    """
    new, target = Path(new), Path(target)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None and keep is not None:
        replace_dir(old, keep)
    elif old is not None:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()


def _checkpoints_inside(directory: Path) -> Optional[Path]:
    """The first thing under ``directory`` that marks checkpoints or a run: a ``*.ckpt`` file or sharded directory,
    a ``checkpoints/`` directory, or a run's ``config.yaml`` beside its ``logs/`` or ``.lock``; None if nothing."""
    for folder, dirs, files in os.walk(directory):  # symlinked directories are not followed
        here = Path(folder)
        names = set(dirs) | set(files)
        found = next((n for n in sorted(names) if n.endswith(".ckpt") or n == "checkpoints"), None)
        if found is None and "config.yaml" in files and ({"logs", ".lock"} & names):
            found = "config.yaml"
        if found is not None:
            return here / found
    return None


def check_output_dir(output_dir: str | os.PathLike, overwrite: bool = False,
                     sources: tuple[str | os.PathLike, ...] = ()) -> Path:
    """Refuse, in one line, an ``--output_dir`` whose replacement (``atomic_dir``) would delete what the user did not
    name for deletion: an existing non-empty directory unless ``overwrite``, and even with it a directory holding
    checkpoints or a run, one that holds a ``sources`` path (what the command reads), the working directory or one
    above it, or a file."""
    from ptm_app.errors import PtmError

    out = Path(output_dir)
    if not out.exists() and not out.is_symlink():
        return out
    if out.is_symlink() or not out.is_dir():
        what = "a symbolic link" if out.is_symlink() else "not a directory"
        raise PtmError(f"--output_dir {out} exists and is {what}; give a new directory path")
    resolved = out.resolve()
    if not any(resolved.iterdir()):
        return out
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise PtmError(f"--output_dir {out} holds the working directory, which writing it would delete (even with "
                       f"--overwrite); give a new directory")
    for source in sources:
        src = Path(source).expanduser().resolve()
        if src == resolved or resolved in src.parents:
            raise PtmError(f"--output_dir {out} holds --ckpt_path {source}, which writing it would delete (even with "
                           f"--overwrite); give a new directory")
    found = _checkpoints_inside(resolved)
    if found is not None:
        raise PtmError(f"--output_dir {out} holds checkpoints or a run ({found}), which writing it would delete "
                       f"(refused even with --overwrite); give a new directory")
    if not overwrite:
        raise PtmError(f"--output_dir {out} exists and is not empty; give a new directory, or add --overwrite to "
                       f"replace it")
    return out


def keep_copy(target: str | os.PathLike, keep: str | os.PathLike) -> None:
    """Make ``keep`` a copy of the file ``target`` (a hard link, renamed into place: atomic, no data copied)."""
    target, keep = Path(target), Path(keep)
    if not target.is_file():
        return
    tmp = keep.with_name(f".{keep.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(target, tmp)
    except OSError:  # a file system without hard links
        shutil.copy2(target, tmp)
    os.replace(tmp, keep)


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


def _marker_split(text: str, name: str) -> Optional[tuple[str, str, str, str]]:
    """``(before, start line, end line, after)`` around the ``<!-- name:start/end -->`` section, or None."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    head, found, rest = text.partition(start)
    _, found_end, tail = rest.partition(end)
    return (head, start, end, tail) if found and found_end else None


def require_markers(path: str | os.PathLike, name: str) -> None:
    """Refuse, in one line, a document that is missing or has no ``<!-- name:start/end -->`` section (checked
    before a long report runs, not after)."""
    path = Path(path)
    if not path.is_file():
        raise PtmError(f"readme {path} not found; give an existing file with the lines '<!-- {name}:start -->' and "
                       f"'<!-- {name}:end -->' where the table goes")
    if _marker_split(path.read_text(encoding="utf-8"), name) is None:
        raise PtmError(f"readme {path} has no '<!-- {name}:start -->' and '<!-- {name}:end -->' lines; add them "
                       f"where the table goes")


def write_between_markers(path: str | os.PathLike, name: str, text: str) -> bool:
    """Replace what stands between the lines ``<!-- name:start -->`` and ``<!-- name:end -->`` of ``path`` (a README)
    with ``text``, atomically: generated tables go into documents without being typed.  False when ``path`` lacks the
    markers (nothing is written)."""
    split = _marker_split(Path(path).read_text(encoding="utf-8"), name)
    if split is None:
        return False
    head, start, end, tail = split
    with atomic_file(path, "w", encoding="utf-8") as fh:
        fh.write(f"{head}{start}\n{text.rstrip()}\n{end}{tail}")
    return True


def write_json(path: str | os.PathLike, obj: Any) -> None:
    with atomic_file(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, ensure_ascii=False)
        fh.write("\n")


def read_object(path: str | os.PathLike) -> dict:
    """A JSON object file (a kept result: a ledger's derived file, an attack's progress); one line if it is not one."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise PtmError(f"{path}: not readable JSON ({err}); move it away to make it again") from None
    if not isinstance(value, dict):
        raise PtmError(f"{path}: holds a JSON {type(value).__name__}, not an object; move it away to make it again")
    return value


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's content, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_first_process() -> bool:
    """True in the process that owns a run directory: rank 0 of node 0 (or a plain single-process run)."""
    ranks = (os.environ.get(name, "0") for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"))
    return all(r in ("", "0") for r in ranks)


class RunLock:
    """An exclusive lock on a run directory (``<run>/.lock``, with the owner's PID, host and command), so two
    processes never write one run.  The kernel drops an ``flock`` when its process dies, so a lock left by a
    killed run is stale and simply taken over; the file's PID only names the owner in the message."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._fh = None

    def acquire(self, run_dir: str | os.PathLike) -> "RunLock":
        import fcntl
        import socket
        import sys

        self.release()
        self.path = Path(run_dir) / ".lock"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            owner = fh.read().strip() or "another process"
            fh.close()
            raise PtmError(f"run directory {self.path.parent} is in use by {owner}; wait for it to finish, "
                           f"or give this run another --run_name") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"PID {os.getpid()} on {socket.gethostname()} ({' '.join(sys.argv[:3])})\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing drops the flock; the file stays (its content is only informative)
            self._fh = None
