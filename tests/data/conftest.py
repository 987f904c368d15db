"""Fixtures: every registered real source (datasets, derived task sets, models) prepared once per session
into a temp data root.

Downloads go to the normal shared cache (``$PTM_DOWNLOAD_CACHE`` or ``<project>/data/.cache/downloads``),
so after the first run nothing is downloaded again.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ptm_app import paths
from ptm_app.data.prepare import _is_current, prepare
from ptm_app.data.sources import SOURCES

# The project's own prepared copies (``make data``, which ``make test`` runs first) are linked into the temp root
# when they are current, else prepared here like a fresh machine would: converting every source again per worker
# took 77 s of the suite's wall time, and the conversions are tested on ``fresh_env`` roots and by ``make data``.
# Tests must not rewrite linked sources (--force): they are the project's data.
LINKED = tuple(SOURCES)


@pytest.fixture(scope="session")
def shared_downloads() -> Path:
    """The project's download cache (``$PTM_DOWNLOAD_CACHE`` or ``<data_root>/.cache/downloads``), not the
    session's isolated ``PTM_CACHE_DIR``: pinned artifacts are safe to share, and fetching them again per worker
    from the registries cost minutes."""
    env = os.environ.get("PTM_DOWNLOAD_CACHE")
    return Path(env).expanduser().resolve() if env else paths.data_root() / ".cache" / "downloads"


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory, shared_downloads: Path) -> Path:
    """Data root holding every registered source (the environment is restored afterwards)."""
    root, project = tmp_path_factory.mktemp("prepared"), paths.data_root()
    for name in LINKED:
        if _is_current(SOURCES[name], project / name):
            (root / name).symlink_to(project / name, target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTM_DATA_DIR", str(root))
        mp.setenv("PTM_DOWNLOAD_CACHE", str(shared_downloads))
        prepare()
    return root


@pytest.fixture
def data_env(prepared: Path, shared_downloads: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ``PTM_DATA_DIR`` at the prepared session root for one test."""
    monkeypatch.setenv("PTM_DATA_DIR", str(prepared))
    monkeypatch.setenv("PTM_DOWNLOAD_CACHE", str(shared_downloads))
    return prepared


@pytest.fixture
def fresh_env(tmp_path: Path, shared_downloads: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty data root for one test, sharing the download cache."""
    root = tmp_path / "data"
    monkeypatch.setenv("PTM_DATA_DIR", str(root))
    monkeypatch.setenv("PTM_DOWNLOAD_CACHE", str(shared_downloads))
    return root
