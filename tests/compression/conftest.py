"""Fixtures of the compression tests."""
import pytest


@pytest.fixture(autouse=True)
def outside_the_repo(tmp_path, monkeypatch):
    """Every compression test runs from an empty directory: a config's relative teacher (``checkpoints/minilm_full_bbc``)
    must resolve to the test's tiny substitute under its runs directory, never to a real run a developer made in the
    repo's ``checkpoints/`` (``make analysis`` and ``make compress`` train those)."""
    where = tmp_path / "cwd"
    where.mkdir()
    monkeypatch.chdir(where)
    return where
