"""The README's config catalogue lists exactly the shipped configs, and shows the two set-up commands."""
from pathlib import Path
import re

ROOT = Path(__file__).resolve().parents[1]


def test_catalogue_matches_configs():
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"`(configs/[\w/.-]+\.yaml)`", readme))
    shipped = {str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml")}
    assert listed == shipped


def test_quickstart_has_the_two_commands():
    quick = (ROOT / "README.md").read_text().split("## Quickstart")[1].split("##")[0]
    assert "make demo" in quick and "make test" in quick


def test_taxonomy_rows_match_their_configs():
    import yaml

    section = (ROOT / "README.md").read_text().split("## Pre-training taxonomy")[1].split("\n## ")[0]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and "configs/" in line]
    listed = {row[5] for row in rows}
    shipped = {str(p.relative_to(ROOT)) for p in (ROOT / "configs" / "pretrain").glob("*.yaml")}
    assert listed == shipped
    for model, _, model_type, _, module, config in rows:
        cfg = yaml.safe_load((ROOT / config).read_text())
        assert cfg["model"]["class_path"].split(".")[-1] == module, model
        assert cfg["model"]["init_args"]["backbone_config"]["model_type"] == model_type, model


def test_architecture_names_only_paths_that_exist():
    section = (ROOT / "README.md").read_text().split("## Architecture")[1].split("\n## ")[0]
    named = set(re.findall(r"`((?:ptm_app|configs|benchmarks|tests|docs)[\w/.-]*|main\.py)`", section))
    assert len(named) > 20
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


def test_every_figure_the_readme_shows_is_in_the_repo():
    """The README's pictures (docs/figures/, copied from the runs that made its tables) exist."""
    import re

    text = (ROOT / "README.md").read_text()
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(figures) >= 5
    for figure in figures:
        path = ROOT / figure
        assert path.is_file() and path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG", figure


def golden_tests_by_corruption_module() -> dict[str, set[str]]:
    """Corruption module -> the ``test_*golden*`` functions of the corruption tests (``tests/data/``) on the canonical
    example that call it."""
    import ast

    found: dict[str, set[str]] = {}
    for path in (ROOT / "tests" / "data").rglob("test_*.py"):
        text = path.read_text()
        if "I am happy" not in text:  # the ids of "I am happy to join with you today"
            continue
        tree = ast.parse(text)
        origin = {}  # imported name -> corruption module (the package re-exports masking's)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ptm_app.data.corruption"):
                module = node.module.rpartition(".")[2] if node.module != "ptm_app.data.corruption" else "masking"
                origin.update({alias.name: module for alias in node.names})
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and "golden" in node.name:
                used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                for name in used & set(origin):
                    found.setdefault(origin[name], set()).add(f"{path.name}::{node.name}")
    return found


def test_every_corruption_module_the_readme_names_has_a_golden_test_on_the_canonical_example():
    sentence = (ROOT / "README.md").read_text().split("Corruptions are pure, seeded functions in")[1].split("\n\n")[0]
    modules = re.split(r",\s+", re.search(r"\(([a-z0-9,\s]+)\)", sentence).group(1))
    assert len(modules) >= 8 and "canonical" in sentence
    found = golden_tests_by_corruption_module()
    for module in modules:
        assert (ROOT / "ptm_app" / "data" / "corruption" / f"{module}.py").exists(), module
        assert found.get(module), module
