"""Fixtures: every registered real source (datasets, derived task sets, models) prepared once per session
into a temp data root.

Downloads go to the normal shared cache (``$PTM_DOWNLOAD_CACHE`` or ``<project>/data/.cache/downloads``),
so after the first run nothing is downloaded again.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from ptm_app.data.prepare import prepare
from ptm_app.data.sources.fetch import download_dir


@pytest.fixture(scope="session")
def shared_downloads() -> Path:
    return download_dir()  # resolved with the environment as it was before any test changed it


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory, shared_downloads: Path) -> Path:
    """Data root holding every registered source (the environment is restored afterwards)."""
    root = tmp_path_factory.mktemp("prepared")
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
