"""``--output_dir`` never deletes what the user did not name (issue 25): export, quantize and prune refuse an existing
non-empty directory in one line unless ``--overwrite``, and a directory holding checkpoints or a run even with it."""
import hashlib
import shutil
from pathlib import Path

import pytest

from ptm_app.main import main

pytestmark = pytest.mark.usefixtures("one_thread")


def error_line(argv, capsys) -> str:
    code = main(argv)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def snapshot(root: Path) -> dict:
    """Every file under ``root`` with the sha256 of its content."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_export_over_an_existing_directory_needs_overwrite(classifier_run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", "--ckpt_path", str(classifier_run), "--output_dir", str(out)]) == 0
    (out / "notes.txt").write_text("the user's own file")
    before = snapshot(out)
    line = error_line(["export", "--ckpt_path", str(classifier_run), "--output_dir", str(out)], capsys)
    assert line == f"error: --output_dir {out} exists and is not empty; give a new directory, or add --overwrite " \
                   f"to replace it"
    assert snapshot(out) == before
    assert main(["export", "--ckpt_path", str(classifier_run), "--output_dir", str(out), "--overwrite"]) == 0
    assert (out / "config.json").is_file() and not (out / "notes.txt").exists()  # replaced, as asked
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", "--ckpt_path", str(classifier_run), "--output_dir", str(empty)]) == 0  # nothing to lose


def test_export_into_its_own_run_or_over_checkpoints_is_refused_even_with_overwrite(classifier_run, tmp_path,
                                                                                     capsys):
    runs = tmp_path / "runs"
    run = runs / "classifier"
    shutil.copytree(classifier_run, run)
    before = snapshot(run)
    line = error_line(["export", "--ckpt_path", str(run), "--output_dir", str(run), "--overwrite"], capsys)
    assert f"--output_dir {run} holds --ckpt_path {run}" in line and "even with --overwrite" in line
    other = error_line(["export", "--ckpt_path", str(classifier_run), "--output_dir", str(run), "--overwrite"], capsys)
    assert f"--output_dir {run} holds checkpoints or a run ({run / 'checkpoints'})" in other
    above = error_line(["export", "--ckpt_path", str(classifier_run), "--output_dir", str(runs), "--overwrite"], capsys)
    assert f"--output_dir {runs} holds checkpoints or a run" in above  # the runs directory, a run inside it
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "model.ckpt").write_bytes(b"someone's checkpoint")
    assert f"({stray / 'model.ckpt'})" in error_line(["export", "--ckpt_path", str(run), "--output_dir", str(stray),
                                                      "--overwrite"], capsys)
    assert snapshot(run) == before and (stray / "model.ckpt").read_bytes() == b"someone's checkpoint"
    assert main(["export", "--ckpt_path", str(run), "--output_dir", str(run / "export")]) == 0  # a new folder in it
    assert (run / "export" / "config.json").is_file() and before.items() <= snapshot(run).items()


def test_quantize_and_prune_refuse_in_one_line_and_quantize_overwrites_when_asked(classifier_run, tmp_path, capsys):
    out = tmp_path / "int8"
    out.mkdir()
    (out / "old.txt").write_text("an earlier result")
    for command in ("quantize", "prune"):
        line = error_line([command, "--ckpt_path", str(classifier_run), "--output_dir", str(out)], capsys)
        assert f"--output_dir {out} exists and is not empty" in line and "--overwrite" in line
        line = error_line([command, "--ckpt_path", str(classifier_run), "--output_dir", str(classifier_run),
                           "--overwrite"], capsys)
        assert "even with --overwrite" in line
    assert (out / "old.txt").read_text() == "an earlier result"
    assert main(["quantize", "--ckpt_path", str(classifier_run), "--output_dir", str(out), "--overwrite",
                 "--repeats", "1"]) == 0
    assert (out / "summary.json").is_file() and not (out / "old.txt").exists()
