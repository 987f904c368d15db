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
