"""Directory swaps that readers never see half done: ``replace_dir`` and its crash recovery ``restore_replaced``;
generated tables written between a document's markers."""
from __future__ import annotations

import os

import pytest

from ptm_app.errors import PtmError
from ptm_app.paths import replace_dir, require_markers, restore_replaced, write_between_markers


def test_replace_dir_swaps_whole_directories_and_files(tmp_path):
    target, new = tmp_path / "last.ckpt", tmp_path / ".last.ckpt.tmp-6"
    target.mkdir()
    (target / "shard0").write_text("step 4")
    new.mkdir()
    (new / "shard0").write_text("step 6")
    replace_dir(new, target)
    assert (target / "shard0").read_text() == "step 6"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # the old one deleted, the temp one moved
    best = tmp_path / "best.ckpt"
    best.write_text("a file checkpoint from a DDP run")
    replace_dir(target, best)
    assert (best / "shard0").read_text() == "step 6"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt"]


def test_a_crash_between_the_renames_is_undone_by_the_reader(tmp_path):
    target = tmp_path / "last.ckpt"
    (target / "checkpoint").mkdir(parents=True)
    (target / "checkpoint" / "shard1").write_text("step 4")
    os.replace(target, tmp_path / ".last.ckpt.old-123")  # replace_dir's first rename, then the crash
    assert restore_replaced(target) == target
    assert (target / "checkpoint" / "shard1").read_text() == "step 4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert restore_replaced(tmp_path / "best.ckpt") == tmp_path / "best.ckpt"  # nothing to restore: unchanged
    assert not (tmp_path / "best.ckpt").exists()


def test_write_between_markers_replaces_only_the_named_section(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text("a\n<!-- t:start -->\nold\nlines\n<!-- t:end -->\nb\n<!-- u:start -->\nkeep\n<!-- u:end -->\n")
    require_markers(doc, "t"), require_markers(doc, "u")
    with pytest.raises(PtmError, match=r"has no '<!-- v:start -->' and '<!-- v:end -->' lines"):
        require_markers(doc, "v")
    assert write_between_markers(doc, "t", "| x |\n|---|\n| 1 |\n\n")
    assert doc.read_text() == ("a\n<!-- t:start -->\n| x |\n|---|\n| 1 |\n<!-- t:end -->\nb\n<!-- u:start -->\nkeep\n"
                               "<!-- u:end -->\n")
    before = doc.read_text()
    assert not write_between_markers(doc, "v", "nothing")
    assert doc.read_text() == before
    doc.write_text("<!-- w:end -->\n<!-- w:start -->\n")  # the end before the start is no section
    assert not write_between_markers(doc, "w", "x")
    with pytest.raises(PtmError, match="has no"):
        require_markers(doc, "w")
    with pytest.raises(PtmError, match=r"missing.md not found"):
        require_markers(tmp_path / "missing.md", "t")


def test_check_output_dir_refuses_what_replacing_it_would_lose(tmp_path, monkeypatch):
    from ptm_app.paths import check_output_dir

    assert check_output_dir(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    assert check_output_dir(tmp_path / "empty") == tmp_path / "empty"
    full = tmp_path / "full"
    (full / "sub").mkdir(parents=True)
    (full / "sub" / "a.txt").write_text("x")
    with pytest.raises(PtmError, match="exists and is not empty; give a new directory, or add --overwrite"):
        check_output_dir(full)
    assert check_output_dir(full, overwrite=True) == full
    with pytest.raises(PtmError, match="holds --ckpt_path"):  # the source, somewhere below it
        check_output_dir(full, overwrite=True, sources=(full / "sub" / "a.txt",))
    (full / "sub" / "checkpoints").mkdir()
    with pytest.raises(PtmError, match=r"holds checkpoints or a run \(.*sub/checkpoints\)"):
        check_output_dir(full, overwrite=True)
    run = tmp_path / "run"  # a test run: config.yaml and logs/, no checkpoints yet
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n")
    with pytest.raises(PtmError, match="holds checkpoints or a run"):
        check_output_dir(run, overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(PtmError, match="is not a directory"):
        check_output_dir(tmp_path / "file", overwrite=True)
    (tmp_path / "link").symlink_to(full)
    with pytest.raises(PtmError, match="is a symbolic link"):
        check_output_dir(tmp_path / "link", overwrite=True)
    monkeypatch.chdir(full / "sub")
    with pytest.raises(PtmError, match="holds the working directory"):
        check_output_dir(tmp_path / "full" / ".." / "full", overwrite=True)
