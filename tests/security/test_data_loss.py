"""Fallbacks survive two faults (issue 25): a ``last.ckpt`` that fails verification never replaces the good
``last-1.ckpt``, so a second damaged ``last.ckpt`` still has a checkpoint to fall back to; temp files left by a
save that was killed are removed at the next start, in one line."""
from __future__ import annotations

import shutil

import pytest
import torch

from ptm_app.checkpoint_io.reading import CheckpointCorrupt, verify
from tests.cli.test_report import classifier_config
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def paused(tiny_corpus, tmp_path_factory):
    """A classifier fit to step 4 with last.ckpt every 2 steps: last.ckpt (step 4) and last-1.ckpt (step 2)."""
    tmp = tmp_path_factory.mktemp("paused")
    config = classifier_config(tiny_corpus, tmp, steps=4, val_every=2, val_batches=1)
    assert run_main(["fit", "--config", str(config), "--run_name", "cls", "--checkpoint_every", "2"], tmp / "runs") == 0
    return config, tmp / "runs" / "cls"


def truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def step(path) -> int:
    return torch.load(path, weights_only=True)["global_step"]


def test_a_damaged_last_never_replaces_the_fallback(paused, tmp_path, capsys):
    config, run = paused
    runs = tmp_path / "runs"
    shutil.copytree(run, runs / "cls")
    ckpts = runs / "cls" / "checkpoints"
    truncate(ckpts / "last.ckpt")  # fault 1
    resume = ["fit", "--config", str(config), "--run_name", "cls", "--ckpt_path", "last", "--checkpoint_every", "2"]
    assert run_main([*resume, "--trainer.max_steps", "4"], runs) == 0
    out = capsys.readouterr().out
    assert "resuming from the previous checkpoint" in out and "(step 2)" in out
    assert f"keeping {ckpts / 'last-1.ckpt'} as the fallback" in out  # the damaged file was not kept
    verify(ckpts / "last-1.ckpt")
    assert step(ckpts / "last.ckpt") == 4 and step(ckpts / "last-1.ckpt") == 2  # still the good step-2 file
    truncate(ckpts / "last.ckpt")  # fault 2: the fallback is still there
    with pytest.raises(CheckpointCorrupt):
        verify(ckpts / "last.ckpt")
    assert run_main([*resume, "--trainer.max_steps", "6"], runs) == 0
    assert "resuming from the previous checkpoint" in capsys.readouterr().out
    assert step(ckpts / "last.ckpt") == 6 and step(ckpts / "last-1.ckpt") == 4  # good saves are kept as before


def test_temp_files_of_an_interrupted_save_are_removed_at_the_next_start(paused, tmp_path, capsys):
    config, run = paused
    runs = tmp_path / "runs"
    shutil.copytree(run, runs / "cls")
    ckpts = runs / "cls" / "checkpoints"
    kept = {p.name: p.read_bytes() for p in ckpts.iterdir()}
    left = [ckpts / ".last.ckpt.tmp-k1ll3d", ckpts / ".last-1.ckpt.tmp-4242", runs / "cls" / ".config.yaml.tmp-x1"]
    for path in left:
        path.write_bytes(b"half a checkpoint")
    (runs / "cls" / ".tokenizer.tmp-q9").mkdir()
    (runs / "cls" / ".tokenizer.tmp-q9" / "tokenizer.json").write_text("{")
    assert run_main(["validate", "--config", str(config), "--run_name", "cls", "--ckpt_path", "last"], runs) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "interrupted save" in line]
    assert len(notes) == 2, notes  # one line per directory
    assert ".last.ckpt.tmp-k1ll3d" in notes[1] and ".last-1.ckpt.tmp-4242" in notes[1] and "2 temp file(s)" in notes[1]
    assert ".tokenizer.tmp-q9" in notes[0] and ".config.yaml.tmp-x1" in notes[0]
    assert not any(p.exists() for p in [*left, runs / "cls" / ".tokenizer.tmp-q9"])
    assert {p.name: p.read_bytes() for p in ckpts.iterdir()} == kept  # the checkpoints untouched
