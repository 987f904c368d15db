"""Red team (issue 25): a checkpoint, a sharded checkpoint directory or an export is data.  Every crafted input
(``conftest.make_attack``) goes through every command that loads one; each must refuse it in one line naming the
entry, with no file written outside the run's own directory, the attacker's module never imported, and stdin never
read (a transformers prompt here would read "y" and run the shipped code)."""
from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path
from typing import Callable

import pytest
import yaml

from ptm_app.errors import PtmError
from tests.conftest import run_main
from tests.security.attacks import CHECKPOINT_ATTACKS, EXPORT_ATTACKS, SHARDED_ATTACKS, Attack, make_attack

pytestmark = pytest.mark.usefixtures("one_thread")

RUN = "rt"  # the run name of the LightningCLI commands: their own directory is runs/rt


def _lightning(command: str) -> Callable:
    return lambda a, s: [command, "--config", str(s.victim.config), "--run_name", RUN, "--ckpt_path", str(a.path)]


def _fit_with(key: str, value_of, class_path: str = "SequenceClassificationModule", **settings) -> Callable:
    """fit with the attack as a model setting (init_from, backbone, teacher): a config written into the sandbox."""
    def argv(a: Attack, s) -> list[str]:
        cfg = yaml.safe_load(s.victim.config.read_text())
        cfg["model"]["class_path"] = class_path
        cfg["model"]["init_args"].update({key: value_of(a), **settings})
        if key != "init_from":  # the model comes from the attack: the backbone, or the teacher's layers
            cfg["model"]["init_args"].pop("backbone_config")
        path = s.root / "cwd" / f"{key}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return ["fit", "--config", str(path), "--run_name", RUN]
    return argv


def _out(s) -> str:
    return str(s.root / "cwd" / "out")


COMMANDS: dict[str, Callable] = {
    "fit": _lightning("fit"),
    "validate": _lightning("validate"),
    "test": _lightning("test"),
    "predict": _lightning("predict"),
    "predict_text": lambda a, s: ["predict", "--ckpt_path", str(a.path), "--text", "the cat sat"],
    "embed": lambda a, s: ["embed", "--ckpt_path", str(a.path), "--text", "the cat sat"],
    "generate": lambda a, s: ["generate", "--ckpt_path", str(a.path), "--prompt", "the", "--max_new_tokens", "2"],
    "export": lambda a, s: ["export", "--ckpt_path", str(a.path), "--output_dir", _out(s)],
    "export_onnx": lambda a, s: ["export", "--ckpt_path", str(a.path), "--output_dir", _out(s), "--format", "onnx"],
    "quantize": lambda a, s: ["quantize", "--ckpt_path", str(a.path), "--output_dir", _out(s), "--repeats", "1"],
    "prune": lambda a, s: ["prune", "--ckpt_path", str(a.path), "--output_dir", _out(s), "--drop_layers", "top:1",
                           "--repeats", "1"],
    "compress_report_teacher": lambda a, s: [
        "compress-report", "--teacher", json.dumps({"name": "teacher", "model": str(a.path)}), "--rows", "[]",
        "--source", "bbc", "--examples", "4", "--repeats", "1", "--output_dir", _out(s)],
    "probe": lambda a, s: ["probe", "--models", str(a.path), "--tasks", "brown_pos", "--output_dir", _out(s)],
    "contextuality": lambda a, s: ["contextuality", "--models", str(a.path), "--output_dir", _out(s)],
    "attention": lambda a, s: ["attention", "--models", str(a.path), "--output_dir", _out(s)],
    "knowledge_probe": lambda a, s: ["knowledge-probe", "--models", str(a.path), "--relations", "antonym",
                                     "--output_dir", _out(s)],
    "robustness": lambda a, s: ["robustness", "--runs", str(a.path), "--source", "bbc", "--examples", "4",
                                "--perturbations", "typo_swap", "--output_dir", _out(s)],
    "fit_init_from": _fit_with("init_from", lambda a: {"path": str(a.path)}),
    "fit_backbone": _fit_with("backbone", lambda a: str(a.path)),
    "fit_teacher": _fit_with("teacher", lambda a: str(a.path), "DistillationModule", student_layers="every_other"),
}
# what reads an export directory's module or tokenizer: the commands that rebuild the model from it
EXPORT_COMMANDS = ("predict_text", "embed", "generate", "quantize", "prune", "compress_report_teacher")
# an auto_map tokenizer directory: everything that takes a model directory
AUTO_MAP_DIR_COMMANDS = (*EXPORT_COMMANDS, "probe", "contextuality", "attention", "knowledge_probe", "fit_backbone",
                         "fit_teacher")
# robustness takes a run directory or a .ckpt file (a sharded directory is neither: a refusal of another kind)
SHARDED_COMMANDS = tuple(c for c in COMMANDS if c != "robustness")

CASES = ([(a, c) for a in CHECKPOINT_ATTACKS for c in COMMANDS]
         + [(a, c) for a in SHARDED_ATTACKS for c in SHARDED_COMMANDS]
         + [("export_module_config", c) for c in EXPORT_COMMANDS]
         + [("export_auto_map", c) for c in AUTO_MAP_DIR_COMMANDS])
assert {a for a, _ in CASES} == {*CHECKPOINT_ATTACKS, *SHARDED_ATTACKS, *EXPORT_ATTACKS}


class Sandbox:
    """The test's whole world: ``runs/`` (the runs directory), ``cwd/`` (the working directory), ``systmp/`` (the
    temp directory), ``outside/`` (what an attack aims at)."""

    def __init__(self, root: Path, victim):
        self.root, self.victim = root, victim

    def files(self) -> set[Path]:
        return {p.relative_to(self.root) for p in self.root.rglob("*") if not p.is_dir()}


@pytest.fixture
def sandbox(tmp_path, victim, monkeypatch) -> Sandbox:
    for name in ("runs", "cwd", "systmp"):
        (tmp_path / name).mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "systmp"))
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 8))  # a prompt would answer yes: the code would run
    return Sandbox(tmp_path, victim)


def assert_contained(sandbox: Sandbox, before: set[Path], attack: Attack, marker, cache: Path) -> None:
    """No file outside the run's own directory, nothing at the attack's targets, the marker never imported."""
    new = sandbox.files() - before
    outside_run = sorted(str(p) for p in new if p.parts[:2] != ("runs", RUN))
    assert not outside_run, outside_run
    escaped = [p for p in [*sandbox.root.rglob("escaped*"), *cache.rglob("escaped*"), *attack.escapes] if p.exists()]
    assert not escaped, escaped
    assert not marker.fired(), "the attacker's module was imported"


def one_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines[-5:]
    return errors[0]


@pytest.mark.parametrize("kind, command", CASES, ids=[f"{a}-{c}" for a, c in CASES])
def test_every_loading_command_refuses_the_attack_in_one_line(kind, command, sandbox, marker, isolated_cache, capsys):
    attack = make_attack(kind, sandbox.victim, marker, sandbox.root)
    argv = COMMANDS[command](attack, sandbox)
    before = sandbox.files()
    capsys.readouterr()
    code = run_main(argv, sandbox.root / "runs")
    line = one_line(capsys)
    assert code == 2, line
    missing = [n for n in attack.names if n not in line]
    assert not missing, (missing, line)
    assert_contained(sandbox, before, attack, marker, isolated_cache)


@pytest.mark.parametrize("kind", [*CHECKPOINT_ATTACKS, *SHARDED_ATTACKS])
def test_load_from_checkpoint_refuses_the_attack(kind, sandbox, marker, isolated_cache):
    from ptm_app.adaptation import SequenceClassificationModule

    attack = make_attack(kind, sandbox.victim, marker, sandbox.root)
    before = sandbox.files()
    with pytest.raises(PtmError) as err:
        SequenceClassificationModule.load_from_checkpoint(attack.path)
    assert "\n" not in str(err.value) and all(n in str(err.value) for n in attack.names), str(err.value)
    assert_contained(sandbox, before, attack, marker, isolated_cache)


def test_the_victims_load_untouched(victim, tmp_path, capsys):
    """The control: the same commands accept the uncrafted run (so the refusals above are the attacks')."""
    from ptm_app.adaptation import SequenceClassificationModule
    from ptm_app.main import main

    assert main(["predict", "--ckpt_path", str(victim.ckpt), "--text", "the cat sat"]) == 0
    assert set(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["probs"]) == {"neg", "pos"}
    assert main(["export", "--ckpt_path", str(victim.ckpt), "--output_dir", str(tmp_path / "x")]) == 0
    assert (tmp_path / "x" / "tokenizer.json").is_file()
    assert SequenceClassificationModule.load_from_checkpoint(victim.ckpt).tokenizer is not None
    assert run_main(["test", "--config", str(victim.config), "--run_name", "ok", "--ckpt_path", str(victim.ckpt)],
                    tmp_path / "runs") == 0
