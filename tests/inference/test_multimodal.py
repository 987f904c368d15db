"""Using an image–text model: ``embed --image``, ``predict --image`` (ranked captions), the multimodal report
(recall@k, zero-shot, random-init floor, seed intervals) and the locked text tower."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ptm_app.experiments.multimodal_report import chance, prompt, recall_at, seed_interval
from tests.conftest import TINY_BERT, TINY_VIT, image_text_set, run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_recall_at_k_counts_the_true_column_among_the_top_k():
    sim = torch.tensor([[0.9, 0.1, 0.0],   # row 0: truth first
                        [0.8, 0.5, 0.9],   # row 1: truth third
                        [0.2, 0.7, 0.6]])  # row 2: truth second
    assert recall_at(sim, (1, 2, 3)) == {1: pytest.approx(1 / 3), 2: pytest.approx(2 / 3), 3: pytest.approx(1.0)}
    assert recall_at(torch.ones(2, 2), (1,)) == {1: 0.0}  # a tie is not a hit
    assert chance(100, 4, 10)["i2t_R@5"] == 0.05 and chance(100, 4, 10)["zero_shot_subgroup"] == 0.1
    assert prompt("face-smiling") == "an emoji of face smiling"


def test_seed_interval_is_the_student_t_95_percent_half_width():
    mean, half = seed_interval([0.2, 0.4])
    assert mean == pytest.approx(0.3) and half == pytest.approx(12.7062047 * 0.1414214 / 1.4142136, rel=1e-6)  # t(0.975, 1)
    assert seed_interval([0.5]) == (0.5, None)  # one seed: an observation, no interval


def _png(path: Path, rgb=(230, 30, 30), alpha: int = 255) -> Path:
    from PIL import Image

    img = Image.new("RGBA", (20, 20), (0, 0, 0, 0))
    img.paste(Image.new("RGBA", (12, 12), (*rgb, alpha)), (4, 4))
    img.save(path)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A 4-step CLIP-style run on the colour set, its export, and the runs folder."""
    tmp = tmp_path_factory.mktemp("clip_use")
    cfg = {"seed_everything": 2,
           "trainer": {"max_steps": 4, "accelerator": "cpu", "devices": 1, "val_check_interval": 2,
                       "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1},
           "model": {"class_path": "DualEncoderModule",
                     "init_args": {"backbone_config": TINY_BERT, "vision_config": TINY_VIT, "projection_dim": 16,
                                   "optim": {"lr": 5e-3, "warmup": 0}}},
           "data": {"class_path": "ImageTextDataModule",
                    "init_args": {"source": str(image_text_set(tmp / "set")), "image_size": 16, "max_length": 8,
                                  "tokenizer": {"train": "wordpiece", "vocab_size": 60, "min_frequency": 1},
                                  "batch_size": 6}}}
    config = tmp / "clip.yaml"
    config.write_text(yaml.safe_dump(cfg))
    runs = tmp / "runs"
    assert run_main(["fit", "--config", str(config), "--run_name", "c"], runs) == 0
    assert run_main(["export", "--ckpt_path", str(runs / "c"), "--output_dir", str(tmp / "export")], runs) == 0
    return runs / "c", tmp / "export", config


def test_embed_image_and_text_land_in_one_space_and_predict_ranks_captions(trained, tmp_path, capsys):
    from ptm_app.data.image_text import normalise
    from ptm_app.data.images import load_image
    from ptm_app.main import main
    from ptm_app.objectives.clip import DualEncoderModule

    run, export, _ = trained
    picture = _png(tmp_path / "red.png", alpha=128)  # half-transparent: composited on white
    capsys.readouterr()
    assert main(["embed", "--ckpt_path", str(export), "--image", str(picture), "--text", "a red square"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["a red square", f"image:{picture}"] and len(rows[1]["embedding"]) == 16
    module = DualEncoderModule.load_from_checkpoint(run / "checkpoints" / "last.ckpt").eval()
    with torch.no_grad():
        want = module.image_embeds(normalise(torch.from_numpy(load_image(picture, 16).copy()))[None])[0]
    np.testing.assert_allclose(rows[1]["embedding"], want.numpy(), atol=1e-4)
    captions = ["a red square", "a blue square", "a green square"]
    assert main(["predict", "--ckpt_path", str(export), "--image", str(picture),
                 *[a for c in captions for a in ("--text", c)]]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    probs = [r["probability"] for r in row["ranking"]]
    assert sorted(r["text"] for r in row["ranking"]) == sorted(captions) and probs == sorted(probs, reverse=True)
    assert sum(probs) == pytest.approx(1.0, abs=1e-5)


def test_bad_pictures_and_text_models_are_one_line(trained, tmp_path, capsys):
    from ptm_app.main import main

    _, export, _ = trained
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n...")
    assert main(["embed", "--ckpt_path", str(export), "--image", str(broken)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.png: the image does not decode" in err[0]
    too_long = " ".join(["red"] * 40)
    assert main(["predict", "--ckpt_path", str(export), "--image", str(_png(tmp_path / "x.png")), "--text", too_long,
                 "--too_long", "refuse"]) != 0
    assert "longer than the text tower's max_length" in capsys.readouterr().err


def test_the_report_evaluates_trained_and_random_init_rows_with_chance(trained, tmp_path, monkeypatch, capsys):
    """... and a run made by an earlier recipe of its cell is left out, in one line."""
    from ptm_app.errors import PtmError
    from ptm_app.experiments.multimodal_report import multimodal

    run, _, config = trained
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"name": "mm", "set": {"trainer.max_steps": 2},
                                    "cells": [{"name": "s1", "config": str(config), "set": {"seed_everything": 1}}]}))
    readme = tmp_path / "results.md"
    readme.write_text("# results\n<!-- mm:start -->\nold\n<!-- mm:end -->\n")
    monkeypatch.setenv("PTM_RUNS_DIR", str(tmp_path / "runs"))
    assert multimodal(str(plan), readme=str(readme), figure=str(tmp_path / "fig.png")) == 0
    rows = json.loads((tmp_path / "runs" / "mm" / "multimodal_rows.json").read_text())
    assert {(r["model"], r["tested on"]) for r in rows} == {(m, s) for m in ("CLIP-style, trained",
                                                                           "same model, random init")
                                                           for s in ("flat", "ring")}
    for r in rows:
        assert r["concepts"] == 2 and r["i2t_R@1"] <= r["i2t_R@5"] == 1.0  # 2 test concepts: the top 5 holds both
        assert r["group_classes"] == 2 and r["subgroup_classes"] == 3
    text = readme.read_text()
    assert "old" not in text and "| chance |" in text and "same model, random init" in text
    assert (tmp_path / "fig.png").stat().st_size > 1000
    plan.write_text(yaml.safe_dump({"name": "mm", "set": {"trainer.max_steps": 3},  # the cell's recipe changed
                                    "cells": [{"name": "s1", "config": str(config), "set": {"seed_everything": 1}}]}))
    capsys.readouterr()
    with pytest.raises(PtmError, match="none of its runs has a checkpoint made by its current recipe"):
        multimodal(str(plan), collect_only=True)
    assert "left out: 1 run(s) made by an earlier recipe of their cell (s1)" in capsys.readouterr().out


def test_a_locked_text_tower_is_memoised_exactly_and_gets_no_gradient():
    from ptm_app.objectives.clip import DualEncoderModule

    class Tok:
        pad_token_id = 0

        def __len__(self):
            return 60

    module = DualEncoderModule(backbone_config=TINY_BERT, vision_config=TINY_VIT, projection_dim=8, freeze_text=True)
    module.tokenizer = Tok()
    module.build().train()
    ids = torch.tensor([[2, 10, 11, 3, 0], [2, 12, 3, 0, 0], [2, 10, 11, 3, 0]])
    mask = (ids != 0).long()
    got = module.text_embeds(ids, mask)
    tower = module.backbone.text_model.eval()
    with torch.no_grad():
        want = torch.stack([tower(input_ids=row[m.bool()][None]).pooler_output[0] for row, m in zip(ids, mask)])
    torch.testing.assert_close(got, module.backbone.text_projection(want))
    assert len(module._text_memo) == 2  # rows 0 and 2 are one caption
    got.sum().backward()
    assert all(p.grad is None for p in tower.parameters()) and module.backbone.text_projection.weight.grad is not None
