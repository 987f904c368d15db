"""Checkpoints are read safely (issue 11): no code runs from a crafted file on any path that loads one, damaged
files are refused in one line (``last`` falls back to ``last-1``), one process per run directory, and
command-line values inside dict settings are typed."""
from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import pytest
import torch

from ptm_app.checkpoint_io.reading import CheckpointCorrupt, CheckpointUnsafe, read_checkpoint, verify
from ptm_app.main import main
from tests.cli.test_report import classifier_config
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


class _CreatesFile:
    """Unpickling this calls ``open(path, "w")``: it creates a file, as a malicious checkpoint would run code."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.fixture(scope="module")
def trained(tiny_corpus, tmp_path_factory):
    """A tiny classifier run (4 steps, last.ckpt every 2 steps): its config and run directory."""
    tmp = tmp_path_factory.mktemp("trained")
    config = classifier_config(tiny_corpus, tmp, steps=4, val_every=2, val_batches=1)
    runs = tmp / "runs"
    assert run_main(["fit", "--config", str(config), "--run_name", "cls", "--checkpoint_every", "2"], runs) == 0
    return config, runs


def crafted(trained_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of a real checkpoint with one extra entry whose unpickling would create ``marker``."""
    marker = tmp_path / "pwned"
    ckpt = torch.load(trained_run / "checkpoints" / "last.ckpt", weights_only=True)
    ckpt["extra"] = _CreatesFile(marker)
    path = tmp_path / "crafted.ckpt"
    torch.save(ckpt, path)
    return path, marker


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert err and err[-1].startswith("error:") and sum(line.startswith("error:") for line in err) == 1, err
    return err[-1]


@pytest.mark.parametrize("command", ["fit", "validate", "test", "predict"])
def test_lightning_commands_refuse_a_crafted_checkpoint(trained, tmp_path, capsys, command):
    config, runs = trained
    path, marker = crafted(runs / "cls", tmp_path)
    code = run_main([command, "--config", str(config), "--run_name", f"c_{command}", "--ckpt_path", str(path)],
                    tmp_path / "runs")
    line = one_error_line(capsys)
    assert code == 2 and not marker.exists()
    assert str(path) in line and "--trust_checkpoint" in line and "io.open" in line


def test_export_refuses_a_crafted_checkpoint_and_trust_reads_it(trained, tmp_path, capsys):
    _, runs = trained
    path, marker = crafted(runs / "cls", tmp_path)
    assert main(["export", "--ckpt_path", str(path), "--output_dir", str(tmp_path / "out")]) == 2
    assert "--trust_checkpoint" in one_error_line(capsys) and not marker.exists() and not (tmp_path / "out").exists()
    # the explicit opt-in is honoured: the full unpickler runs (and so does the file's code)
    assert main(["export", "--ckpt_path", str(path), "--output_dir", str(tmp_path / "out"), "--trust_checkpoint"]) == 0
    assert marker.exists() and (tmp_path / "out" / "config.json").is_file()


def test_python_loaders_refuse_a_crafted_checkpoint(trained, tmp_path):
    from ptm_app.adaptation import SequenceClassificationModule
    from ptm_app.adaptation.chaining import InitFrom, source_state_dict
    from ptm_app.backbones.build import build_backbone

    _, runs = trained
    path, marker = crafted(runs / "cls", tmp_path)
    with pytest.raises(CheckpointUnsafe):
        SequenceClassificationModule.load_from_checkpoint(path)
    with pytest.raises(CheckpointUnsafe):  # init_from
        source_state_dict(InitFrom(path=str(path)).path)
    with pytest.raises(CheckpointUnsafe):  # backbone: a .ckpt (exported into the cache first)
        build_backbone("sequence_classification", str(path), None)
    assert not marker.exists()
    module = SequenceClassificationModule.load_from_checkpoint(runs / "cls" / "checkpoints" / "last.ckpt")
    assert module.backbone.config.hidden_size == 32  # a real checkpoint still loads


def test_init_from_a_crafted_checkpoint_is_refused_through_main(trained, tmp_path, capsys):
    import yaml

    config, runs = trained
    path, marker = crafted(runs / "cls", tmp_path)
    cfg = yaml.safe_load(Path(config).read_text())
    cfg["model"]["init_args"]["init_from"] = {"path": str(path)}
    (tmp_path / "init.yaml").write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(tmp_path / "init.yaml")], tmp_path / "runs") == 2
    assert "--trust_checkpoint" in one_error_line(capsys) and not marker.exists()


def _evil_pickle(marker: Path) -> bytes:
    return pickle.dumps({"state_dict_metadata": _CreatesFile(marker)})


@pytest.mark.parametrize("layout", ["fsdp_metadata", "fsdp_meta_pt", "deepspeed"])
def test_sharded_checkpoints_are_checked_before_their_loaders_run(tmp_path, capsys, layout):
    """torch.distributed.checkpoint unpickles ``.metadata`` with plain pickle and DeepSpeed loads with
    weights_only=False: the directory is checked file by file first."""
    marker = tmp_path / "pwned"
    shard = tmp_path / "last.ckpt"
    shard.mkdir()
    if layout == "fsdp_metadata":
        (shard / ".metadata").write_bytes(_evil_pickle(marker))
        torch.save({"ptm_app": {}}, shard / "meta.pt")
    elif layout == "fsdp_meta_pt":
        (shard / ".metadata").write_bytes(pickle.dumps({"plain": [1, 2]}))
        torch.save({"ptm_app": _CreatesFile(marker)}, shard / "meta.pt")
    else:
        (shard / "latest").write_text("checkpoint")
        (shard / "checkpoint").mkdir()
        torch.save({"module": _CreatesFile(marker)}, shard / "checkpoint" / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointUnsafe):
        read_checkpoint(shard)
    assert main(["export", "--ckpt_path", str(shard), "--output_dir", str(tmp_path / "out")]) == 2
    assert "--trust_checkpoint" in one_error_line(capsys) and not marker.exists()


def test_a_real_torch_distributed_checkpoint_passes(tmp_path):
    """What ``torch.distributed.checkpoint`` really writes (``.metadata`` in pickle protocol 4, its metadata
    dataclasses, paths, dtypes) is plain data and passes; the same file with one foreign global does not."""
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"model": {"w": torch.randn(3, 4)}, "step": 3, "optim": {"betas": (0.9, 0.99)}},
                 checkpoint_id=tmp_path / "good", no_dist=True)
    torch.save({"global_step": 3}, tmp_path / "good" / "meta.pt")
    assert verify(tmp_path / "good") == tmp_path / "good"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / ".metadata").write_bytes(pickle.dumps({"hook": os.system}, protocol=4))
    with pytest.raises(CheckpointUnsafe, match="system"):
        verify(tmp_path / "bad")


# -- damaged checkpoints ------------------------------------------------------------------------------------------
def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # random bytes flipped in the middle (tensor data): only the zip records' CRC-32 finds these
        rng = random.Random(0)
        for i in rng.sample(range(len(data) // 4, 3 * len(data) // 4), 8):
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "bytes"])
def test_last_falls_back_to_the_previous_checkpoint(trained, tmp_path, capsys, how):
    import shutil

    config, runs = trained
    runs2 = tmp_path / "runs"
    shutil.copytree(runs / "cls", runs2 / "cls")
    ckpts = runs2 / "cls" / "checkpoints"
    assert torch.load(ckpts / "last-1.ckpt", weights_only=True)["global_step"] == 2  # kept by the step-4 save
    _damage(ckpts / "last.ckpt", how)
    with pytest.raises(CheckpointCorrupt):
        verify(ckpts / "last.ckpt")
    assert run_main(["fit", "--config", str(config), "--run_name", "cls", "--ckpt_path", "last",
                     "--trainer.max_steps", "6"], runs2) == 0
    out = capsys.readouterr().out
    assert f"resuming from the previous checkpoint {ckpts / 'last-1.ckpt'} (step 2)" in out
    assert torch.load(ckpts / "last.ckpt", weights_only=True)["global_step"] == 6


def test_an_explicit_damaged_checkpoint_is_one_line(trained, tmp_path, capsys):
    config, runs = trained
    path = tmp_path / "damaged.ckpt"
    path.write_bytes((runs / "cls" / "checkpoints" / "last.ckpt").read_bytes())
    _damage(path, "truncated")
    assert run_main(["test", "--config", str(config), "--run_name", "d", "--ckpt_path", str(path)], tmp_path) == 2
    line = one_error_line(capsys)
    assert str(path) in line and "unreadable" in line


def test_both_last_checkpoints_damaged_is_one_line(trained, tmp_path, capsys):
    import shutil

    config, runs = trained
    shutil.copytree(runs / "cls", tmp_path / "runs" / "cls")
    for name in ("last.ckpt", "last-1.ckpt"):
        _damage(tmp_path / "runs" / "cls" / "checkpoints" / name, "truncated")
    assert run_main(["fit", "--config", str(config), "--run_name", "cls", "--ckpt_path", "last"],
                    tmp_path / "runs") == 2
    assert "last-1.ckpt" in one_error_line(capsys)


# -- one process per run directory --------------------------------------------------------------------------------
def test_a_second_process_on_a_run_directory_is_refused(trained, tmp_path, capsys):
    from ptm_app.paths import RunLock

    config, _ = trained
    runs = tmp_path / "runs"
    held = RunLock().acquire(runs / "busy")  # another open file description: conflicts as another process would
    try:
        assert run_main(["fit", "--config", str(config), "--run_name", "busy"], runs) == 2
        line = one_error_line(capsys)
        assert f"PID {os.getpid()}" in line and "--run_name" in line
    finally:
        held.release()
    # a lock file left by a dead process (no flock held) is stale: the run goes ahead
    (runs / "busy" / ".lock").write_text("PID 999999 on elsewhere (main.py fit)\n")
    assert run_main(["fit", "--config", str(config), "--run_name", "busy", "--trainer.max_steps", "2"], runs) == 0


# -- typed command-line overrides ----------------------------------------------------------------------------------
def test_dict_settings_overridden_on_the_command_line_are_typed(trained, tmp_path):
    config, _ = trained
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(config), "--run_name", "typed", "--trainer.max_steps", "1",
                     "--model.init_args.backbone_config.hidden_size", "48",
                     "--model.init_args.backbone_config.hidden_dropout_prob", "0.25",
                     "--model.init_args.backbone_config.use_cache=false",
                     "--model.init_args.delta.method", "lora",
                     "--model.init_args.delta.target_modules", "[query, value]"], runs) == 0
    hp = torch.load(runs / "typed" / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]
    config_ = hp["backbone_config"]
    assert config_["hidden_size"] == 48 and config_["hidden_dropout_prob"] == 0.25 and config_["use_cache"] is False
    assert hp["delta"]["method"] == "lora" and hp["delta"]["target_modules"] == ["query", "value"]
