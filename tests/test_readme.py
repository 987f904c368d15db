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
