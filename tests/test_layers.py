"""The layers of docs/design.md ("Layers"): imports run one way, top to bottom, function-local imports included, and
``ptm_app/`` holds only the entry, ``errors.py``, ``paths.py`` and packages (issue 27)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "ptm_app"

# bottom first; a layer imports only layers below it (and itself).  objectives and task_kinds share a floor and
# import neither each other; the entry (main.py, __main__.py) may import anything.
LAYERS = ["errors", "paths", "data", "checkpoint_io", "backbones", "training", ("objectives", "task_kinds"),
          "compression", "adaptation", "inference", "analysis", "knowledge", "experiments"]
ENTRY = {"main", "__main__"}
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in ((layer,) if isinstance(layer, str) else layer)}


def _layer(module: str) -> str:
    """``ptm_app.data.formats`` -> ``data``."""
    return module.split(".")[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ptm_app module ``path`` imports, at any depth (function-local too), as (line, dotted name)."""
    package = ".".join(("ptm_app",) + path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("ptm_app.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "ptm_app":  # from ptm_app import paths
                found += [(node.lineno, f"ptm_app.{a.name}") for a in node.names]
            elif name.startswith("ptm_app."):
                found.append((node.lineno, name))
    return found


def test_top_level_holds_only_the_entry_errors_paths_and_packages():
    modules = {p.stem for p in ROOT.glob("*.py")} - {"__init__"}
    assert modules == ENTRY | {"errors", "paths"}
    assert {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(RANK) - {"errors", "paths"}


def test_imports_run_down_the_layers():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        here = _layer("ptm_app." + ".".join(path.relative_to(ROOT).with_suffix("").parts))
        if here in ENTRY or here == "__init__":
            continue
        for line, name in _imports(path):
            there = _layer(name)
            if there != here and RANK[there] >= RANK[here]:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line} ({here}) imports {name} ({there})")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("source, expected", [
    ("from ptm_app.data.formats import x\n", ["ptm_app.data.formats"]),
    ("def f():\n    from ptm_app.training import cli\n", ["ptm_app.training"]),
    ("from ptm_app import paths\n", ["ptm_app.paths"]),
    ("from ..errors import PtmError\n", ["ptm_app.errors"]),
])
def test_imports_are_all_found(tmp_path, monkeypatch, source, expected):
    """The reader the layer test relies on sees module-level, function-local, ``from ptm_app import`` and relative
    imports (a file in ``ptm_app/data/``)."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "m.py").write_text(source)
    assert [name for _, name in _imports(tmp_path / "data" / "m.py")] == expected
