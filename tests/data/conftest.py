"""Fixtures: every registered real source (datasets, derived task sets, models) prepared once per session
into a temp data root.

Downloads go to the normal shared cache (``$PTM_DOWNLOAD_CACHE`` or ``<project>/data/.cache/downloads``),
so after the first run nothing is downloaded again.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from ptm_app import paths
from ptm_app.data.prepare import _is_current, prepare
from ptm_app.data.sources import SOURCES
from ptm_app.data.sources.fetch import download_dir

# Big models are not converted again per session: the project's own prepared copy (``make data``) is linked
# into the temp root when it is current, else prepared like the rest.  Tests must not rewrite them (--force).
LINKED = ("smollm2", "squad", "squad_unanswerable")  # ~540 MB of float32 weights, about a minute to convert
# from the GGUF; SQuAD's 98k questions and the 196k derived pairs (~280 MB, ~25 s): test_benchmark_sources builds them


@pytest.fixture(scope="session")
def shared_downloads() -> Path:
    return download_dir()  # resolved with the environment as it was before any test changed it


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
