"""The machine chooses (issue 24): no shipped config names a precision or an accelerator unless the recipe needs
one, and then a comment (on the line or the line above) says why.  The test also fails on a bare hard-coded line,
so it is checked against one here."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEY = re.compile(r"^\s*(precision|accelerator)\s*:")


def unexplained(text: str) -> list[str]:
    """The ``precision:``/``accelerator:`` lines of a YAML text without a comment on them or just above them."""
    lines = text.splitlines()
    bad = []
    for i, line in enumerate(lines):
        if not KEY.match(line):
            continue
        commented = "#" in line.split(":", 1)[1] or (i > 0 and lines[i - 1].strip().startswith("#"))
        if not commented:
            bad.append(f"{i + 1}: {line.strip()}")
    return bad


def test_the_check_finds_a_bare_hard_coded_precision():
    assert unexplained("trainer:\n  accelerator: cpu\n  precision: bf16-mixed\n") == [
        "2: accelerator: cpu", "3: precision: bf16-mixed"]
    assert unexplained("trainer:\n  # QAT observers need fp32\n  precision: 32-true\n") == []
    assert unexplained("trainer:\n  precision: 32-true  # reason\n") == []


@pytest.mark.parametrize("config", sorted((ROOT / "configs").rglob("*.yaml")),
                         ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_no_config_hard_codes_hardware_without_a_reason(config):
    assert unexplained(config.read_text(encoding="utf-8")) == [], (
        f"{config}: let trainer.precision and trainer.accelerator default to auto, or say why in a comment")


def test_most_configs_leave_the_choice_to_the_machine():
    configs = sorted((ROOT / "configs").rglob("*.yaml"))
    naming = [c for c in configs if any(KEY.match(line) for line in c.read_text().splitlines())]
    assert len(configs) > 90 and len(naming) <= 12, [str(c) for c in naming]
