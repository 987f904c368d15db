"""What a checkpoint, an export or a run directory holds is data (issue 25): tokenizer files by allowed names into
their own directory, module classes from ptm_app's registry (or ``--trust_checkpoint``, honoured by every loading
command and for every checkpoint it reads), no code named by a config, no path outside a DeepSpeed checkpoint, run
names that stay in the runs directory, and the model family from the config."""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.checkpoint_io.reading import CheckpointUnsafe, check_tokenizer_files, deepspeed_tag, verify, write_tokenizer_files
from ptm_app.errors import PtmError
from ptm_app.main import main
from ptm_app.paths import PROJECT_ROOT, check_run_name
from tests.conftest import run_main
from tests.security.attacks import make_attack

pytestmark = pytest.mark.usefixtures("one_thread")


def one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) >= 1 and lines[-1].startswith("error:") and sum(x.startswith("error:") for x in lines) == 1
    return lines[-1]


# -- tokenizer files ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["/etc/x", "../x", "sub/tokenizer.json", "tokenizer.json/..", "evil.py", "", "."])
def test_a_tokenizer_entry_that_is_not_a_tokenizer_file_name_is_refused(name, tmp_path):
    with pytest.raises(CheckpointUnsafe, match="tokenizer entry") as err:
        write_tokenizer_files({"tokenizer.json": "{}", name: "x"}, tmp_path / "tok", "run.ckpt")
    assert repr(name) in str(err.value) and "\n" not in str(err.value)
    assert not list(tmp_path.rglob("*"))  # nothing written, not even the good entry


def test_tokenizer_files_are_written_into_the_target_only(tmp_path):
    (tmp_path / "tok").mkdir()
    write_tokenizer_files({"tokenizer.json": "{}", "vocab.txt": "a\nb\n"}, tmp_path / "tok", "run.ckpt")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == \
        ["tok", "tok/tokenizer.json", "tok/vocab.txt"]
    with pytest.raises(CheckpointUnsafe, match="tokenizer record is a list"):
        check_tokenizer_files(["tokenizer.json"], "run.ckpt")


# -- remote code -------------------------------------------------------------------------------------------------
def _calls_without_remote_code_off(path: Path) -> list[str]:
    """``X.from_pretrained(...)`` / ``X.from_config(...)`` calls that neither pass ``trust_remote_code`` nor
    ``**REMOTE_CODE``."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("from_pretrained", "from_config"):
            named = {k.arg for k in node.keywords}
            spread = {k.value.id for k in node.keywords if k.arg is None and isinstance(k.value, ast.Name)}
            if "trust_remote_code" not in named and "REMOTE_CODE" not in spread:
                bad.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}")
    return bad


def test_every_transformers_loader_runs_without_remote_code():
    """``trust_remote_code=False`` wherever transformers takes it: code shipped with a model never runs, and
    transformers never asks about it on stdin."""
    bad = [c for path in sorted((PROJECT_ROOT / "ptm_app").rglob("*.py")) for c in _calls_without_remote_code_off(path)]
    assert not bad, bad


def test_a_model_directory_naming_its_own_code_is_refused(tmp_path):
    from ptm_app.data.sources.references import resolve_pretrained

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "auto_map": {"AutoModel": "m.Evil"}}))
    with pytest.raises(PtmError, match=r"auto_map.*m\.Evil.*never runs") as err:
        resolve_pretrained(str(tmp_path))
    assert "config.json" in str(err.value)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert resolve_pretrained(str(tmp_path)) == str(tmp_path.resolve())


# -- DeepSpeed checkpoints ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("tag", ["", ".", "..", "../x", "/tmp", "a/b", "missing"])
def test_deepspeed_latest_must_name_a_directory_inside(tag, tmp_path):
    shard = tmp_path / "last.ckpt"
    (shard / "global_step2").mkdir(parents=True)
    (shard / "latest").write_text(tag)
    with pytest.raises(CheckpointUnsafe, match="not a directory inside"):
        deepspeed_tag(shard)
    (shard / "latest").write_text("global_step2\n")
    assert deepspeed_tag(shard) == "global_step2"


def test_a_symlinked_file_in_a_sharded_checkpoint_is_refused(tmp_path):
    shard = tmp_path / "last.ckpt"
    shard.mkdir()
    torch.save({"global_step": 1}, tmp_path / "elsewhere.pt")
    (shard / ".metadata").write_bytes(b"")
    (shard / "meta.pt").symlink_to(tmp_path / "elsewhere.pt")
    with pytest.raises(CheckpointUnsafe, match=r"meta\.pt is a symlink"):
        verify(shard)


# -- module classes ----------------------------------------------------------------------------------------------
def test_the_registry_knows_every_name_a_checkpoint_gives_a_module_class():
    from ptm_app.adaptation import SequenceClassificationModule
    from ptm_app.checkpoint_io.module_classes import module_class, module_classes, registered
    from ptm_app.objectives import MaskedLMModule

    table = module_classes()
    assert len(set(table.values())) >= 30 and all(registered(name) is cls for name, cls in table.items())

    # the golden fixture's two names (tests/fixtures/checkpoints/classifier_800ed2c.ckpt)
    assert module_class("ptm_app.adaptation.SequenceClassificationModule", "x") is SequenceClassificationModule
    assert module_class("ptm_app.adaptation.classification.SequenceClassificationModule", "x") \
        is SequenceClassificationModule
    assert module_class("MaskedLMModule", "x") is MaskedLMModule
    with pytest.raises(CheckpointUnsafe, match="os.system"):
        module_class("os.system", "x")
    with pytest.raises(CheckpointUnsafe, match="not one of ptm_app's"):
        module_class(["not", "a", "name"], "x")


@pytest.fixture
def trusted_marker(tmp_path, monkeypatch):
    """A marker module of its own (imported on purpose here, so it must not be the session's)."""
    from tests.security.attacks import Marker

    name = "ptm_trusted_marker"
    (tmp_path / f"{name}.py").write_text(f"open({str(tmp_path / 'IMPORTED')!r}, 'w').close()\n"
                                         f"from ptm_app.adaptation import SequenceClassificationModule as Evil\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield Marker(name, tmp_path / "IMPORTED")
    sys.modules.pop(name, None)


def test_trust_checkpoint_is_the_explicit_way_to_a_foreign_class(victim, trusted_marker, tmp_path, capsys):
    """A class outside the registry is refused, and imported only with --trust_checkpoint."""
    ckpt = torch.load(victim.ckpt, weights_only=True)
    ckpt["ptm_app"]["module"] = f"{trusted_marker.name}.Evil"
    torch.save(ckpt, tmp_path / "own.ckpt")
    assert main(["predict", "--ckpt_path", str(tmp_path / "own.ckpt"), "--text", "the cat"]) == 2
    assert "--trust_checkpoint" in one_error_line(capsys) and not trusted_marker.fired()
    assert main(["predict", "--ckpt_path", str(tmp_path / "own.ckpt"), "--text", "the cat", "--trust_checkpoint"]) == 0
    assert trusted_marker.fired()
    assert set(json.loads(capsys.readouterr().out.splitlines()[-1])["probs"]) == {"neg", "pos"}


@pytest.mark.parametrize("setting", ["init_from", "backbone", "teacher"])
def test_fit_honours_trust_checkpoint_for_the_checkpoints_its_model_loads(setting, victim, marker, tmp_path, capsys):
    """The teacher, init_from and backbone checkpoints: refused without the flag, read with it."""
    attack = make_attack("module_record", victim, marker, tmp_path)
    cfg = yaml.safe_load(victim.config.read_text())
    cfg["trainer"].update(max_steps=1, val_check_interval=1)
    init = cfg["model"]["init_args"]
    if setting == "init_from":
        init["init_from"] = {"path": str(attack.path)}
    else:
        init.pop("backbone_config")
        init[setting] = str(attack.path)
    if setting == "teacher":
        cfg["model"]["class_path"] = "DistillationModule"
        init["student_layers"] = "every_other"
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(cfg))
    argv = ["fit", "--config", str(tmp_path / "fit.yaml"), "--run_name", "t"]
    assert run_main(argv, tmp_path / "runs") == 2
    assert f"{marker.name}.Evil" in one_error_line(capsys)
    assert run_main([*argv, "--trust_checkpoint", "true"], tmp_path / "runs") == 0
    assert (tmp_path / "runs" / "t" / "checkpoints" / "last.ckpt").is_file() and not marker.fired()


def test_analysis_commands_accept_and_honour_trust_checkpoint(victim, marker, tmp_path, capsys):
    attack = make_attack("module_record", victim, marker, tmp_path)
    argv = ["attention", "--models", str(attack.path), "--sentences", "4", "--output_dir", str(tmp_path / "out")]
    assert main(argv) == 2 and "--trust_checkpoint" in one_error_line(capsys)
    assert main([*argv, "--trust_checkpoint", "true"]) == 0
    assert (tmp_path / "out" / "attention.csv").is_file() and not marker.fired()
    assert main(["plot", str(victim.run), "--trust_checkpoint", "true"]) == 2  # plot reads no checkpoint
    assert "trust_checkpoint" in one_error_line(capsys)


# -- the model family comes from the config ------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["fit", "validate", "test"])
def test_a_checkpoint_of_another_family_is_refused_naming_both(command, victim, tmp_path, capsys):
    clm_ckpt = victim.clm_run / "checkpoints" / "last.ckpt"
    argv = [command, "--config", str(victim.config), "--run_name", "x", "--ckpt_path", str(clm_ckpt)]
    assert run_main(argv, tmp_path / "runs") == 2
    line = one_error_line(capsys)
    assert all(w in line for w in ("CausalLMModule (causal_lm model class)", "SequenceClassificationModule",
                                   "sequence task", str(clm_ckpt))), line
    assert not (tmp_path / "runs" / "x" / "summary.json").exists()


def test_a_run_directory_of_another_family_is_refused(victim, tmp_path, capsys):
    """``--ckpt_path last`` of a run made by another config (its run directory under this name)."""
    import shutil

    shutil.copytree(victim.clm_run, tmp_path / "runs" / "clm")
    argv = ["test", "--config", str(victim.config), "--run_name", "clm", "--ckpt_path", "last"]
    assert run_main(argv, tmp_path / "runs") == 2
    assert "CausalLMModule" in one_error_line(capsys)


# -- run names ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["..", ".", "../x", "/abs/x", "a/b", "x y", "~x"])
def test_a_run_name_is_one_path_component(name, victim, tmp_path, capsys):
    runs = tmp_path / "deep" / "runs"
    assert run_main(["test", "--config", str(victim.config), "--run_name", name, "--ckpt_path", str(victim.ckpt)],
                    runs) == 2
    assert "--run_name" in one_error_line(capsys)
    assert not any(p.name in (".lock", "logs") for p in tmp_path.rglob("*"))
    with pytest.raises(PtmError):
        check_run_name(name)
    assert main(["attention", "--models", "minilm", "--run_name", name]) == 2
    assert "run_name" in one_error_line(capsys)


def test_good_run_names_pass():
    for name in ("minilm_full_bbc", "run-2.v1", "A1"):
        assert check_run_name(name) == name
