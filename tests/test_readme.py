"""The README and its pages under docs/ say what is true: the config catalogue (configs/README.md) lists exactly the
shipped configs, the README shows the two set-up commands and stays short, every link and figure resolves, and the
tables the pages name are checked against the code."""
from pathlib import Path
import re

ROOT = Path(__file__).resolve().parents[1]


DOC_PAGES = [ROOT / "README.md", ROOT / "configs" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_catalogue_matches_configs():
    readme = (ROOT / "configs" / "README.md").read_text()
    listed = set(re.findall(r"`(configs/[\w/.-]+\.yaml)`", readme))
    shipped = {str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml")}
    assert listed == shipped


def test_quickstart_has_the_two_commands():
    quick = (ROOT / "README.md").read_text().split("## Quickstart")[1].split("##")[0]
    assert "make demo" in quick and "make test" in quick


def test_taxonomy_rows_match_their_configs():
    import yaml

    section = (ROOT / "docs" / "pretrain.md").read_text().split("## Pre-training taxonomy")[1].split("\n## ")[0]
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and "configs/" in line]
    listed = {row[5] for row in rows}
    shipped = {str(p.relative_to(ROOT)) for p in (ROOT / "configs" / "pretrain").glob("*.yaml")  # from scratch
               if {"backbone_config", "vision_config"} & set(yaml.safe_load(p.read_text())["model"]["init_args"])}
    assert listed == shipped
    for model, _, model_type, _, module, config in rows:
        cfg = yaml.safe_load((ROOT / config).read_text())
        assert cfg["model"]["class_path"].split(".")[-1] == module, model
        args = cfg["model"]["init_args"]  # a dual encoder with a pretrained text tower: its ViT's type
        assert (args.get("backbone_config") or args.get("vision_config"))["model_type"] == model_type, model


def test_architecture_names_only_paths_that_exist():
    section = (ROOT / "README.md").read_text().split("## Architecture")[1].split("\n## ")[0]
    named = set(re.findall(r"`((?:ptm_app|configs|benchmarks|tests|docs)[\w/.-]*|main\.py)`", section))
    assert len(named) > 20
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


def test_the_readme_is_short_and_links_its_pages():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 300
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)\)", text))
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")} - {"docs/design.md", "docs/data_engine_plan.md"}
    assert pages <= linked, pages - linked  # every tutorial page is reachable from the README


def test_every_relative_link_resolves():
    """Links between the README, configs/README.md and docs/ (relative to the page that holds them) name files that
    exist, so a moved page or figure fails here."""
    checked = 0
    for page in DOC_PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).resolve().exists(), f"{page.relative_to(ROOT)}: {target}"
            checked += 1
    assert checked > 20


def test_every_figure_the_pages_show_is_in_the_repo():
    """The pictures (docs/figures/, copied from the runs that made their tables) exist and are PNGs."""
    figures = [(page.parent / f).resolve() for page in DOC_PAGES
               for f in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page.read_text())]
    assert len(figures) >= 6
    for path in figures:
        assert path.is_file() and path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG", path


def test_generated_tables_sit_between_their_commands_markers():
    """The results pages hold the tables their commands write (``--readme PAGE``, between ``<!-- name:start -->``
    and ``<!-- name:end -->``), and the Makefile target that regenerates each page names that page."""
    makefile = (ROOT / "Makefile").read_text()
    for page, markers in {"docs/results/compression.md": ["compress_report_bbc", "compress_report_tweets"],
                          "docs/results/knowledge.md": ["knowledge_brown"],
                          "docs/results/robustness.md": ["attack_tweets_minilm"],
                          "docs/results/adaptation.md": ["adapt_minilm"],
                          "docs/results/translation.md": ["translation_bible"],
                          "docs/analyse.md": ["probe_minilm", "probe_own_pretrained", "probe_mlp_minilm_smollm2",
                                              "contextuality_minilm", "attention_minilm", "knowledge_probe_smollm2",
                                              "robustness_tweets_minilm", "robustness_bbc_minilm"]}.items():
        text = (ROOT / page).read_text()
        for name in markers:
            block = text.split(f"<!-- {name}:start -->")[1].split(f"<!-- {name}:end -->")[0]
            assert block.count("\n|") > 3, (page, name)
        assert f"--readme {page}" in makefile, page


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
    sentence = (ROOT / "docs" / "pretrain.md").read_text().split("Corruptions are pure, seeded functions in")[1].split("\n\n")[0]
    modules = re.split(r",\s+", re.search(r"\(([a-z0-9,\s]+)\)", sentence).group(1))
    assert len(modules) >= 8 and "canonical" in sentence
    found = golden_tests_by_corruption_module()
    for module in modules:
        assert (ROOT / "ptm_app" / "data" / "corruption" / f"{module}.py").exists(), module
        assert found.get(module), module
