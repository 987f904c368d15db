"""VisualBERT-style single stream (Li et al. 2019 §3): golden input layout, image-text matching negatives, masked LM
on true pairs only, exact resume and export."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.objectives.visualbert import (MATCH, MISMATCH, SingleStreamCollator, itm_negatives, patch_tokens,
                                           visual_dim)
from tests.conftest import assert_resumes_exactly, image_text_set, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
PAD, CLS, SEP, MASK = 0, 2, 3, 4


def test_patch_tokens_golden_layout():
    img = torch.arange(3 * 4 * 4, dtype=torch.float32).reshape(3, 4, 4)  # channel c, row y, column x: 16c + 4y + x
    tokens = patch_tokens(img[None], 2)[0]
    assert tokens.shape == (4, 3 * 2 * 2 + 4) == (4, visual_dim(4, 2))
    # patch 1 = rows 0-1, columns 2-3; values channels last: (y, x, c) for y in 0..1, x in 2..3
    want = [16 * c + 4 * y + x for y in (0, 1) for x in (2, 3) for c in range(3)]
    assert tokens[1, :12].tolist() == want
    assert tokens[:, 12:].tolist() == torch.eye(4).tolist()  # the one-hot of the patch's position


def _examples(concepts: list[int]) -> list[dict]:
    return [{"pixel_values": torch.full((3, 4, 4), float(i)), "concept": c, "key": (0, i),
             "input_ids": torch.tensor([CLS, 10 + i, 20 + i, SEP])} for i, c in enumerate(concepts)]


def _collator(**kw) -> SingleStreamCollator:
    return SingleStreamCollator(PAD, MASK, vocab_size=40, special_ids=(PAD, 1, CLS, SEP, MASK), patch_size=2, **kw)


def test_input_layout_text_then_patches_with_segment_embeddings():
    batch = _collator(itm_probability=0.0, mlm_probability=0.0)(_examples([0, 1, 2]))
    assert batch["input_ids"].tolist() == [[CLS, 10, 20, SEP], [CLS, 11, 21, SEP], [CLS, 12, 22, SEP]]
    assert batch["token_type_ids"].tolist() == [[0] * 4] * 3 and batch["visual_token_type_ids"].tolist() == [[1] * 4] * 3
    assert batch["visual_embeds"].shape == (3, 4, 16) and batch["visual_attention_mask"].tolist() == [[1] * 4] * 3
    assert batch["labels"].shape == (3, 8) and (batch["labels"][:, 4:] == -100).all()  # no target on a patch
    assert batch["sentence_image_labels"].tolist() == [MATCH] * 3
    assert torch.equal(batch["visual_embeds"][2, :, :12], torch.full((4, 12), 2.0))  # row 2's own picture


def test_itm_negatives_take_another_concepts_caption_and_are_not_masked():
    concepts = [0, 0, 1, 2, 2, 3]
    batch = _collator(itm_probability=1.0, mlm_probability=1.0)(_examples(concepts))
    assert batch["sentence_image_labels"].tolist() == [MISMATCH] * 6
    for row in range(6):
        donor = batch["input_ids"][row, 1].item() - 10  # the caption's first word names the row it came from
        assert concepts[donor] != concepts[row]
    assert (batch["labels"] == -100).all()  # masked LM on true pairs only
    true_pairs = _collator(itm_probability=0.0, mlm_probability=1.0)(_examples(concepts))
    assert (true_pairs["labels"][:, 1:3] != -100).all() and (true_pairs["labels"][:, [0, 3]] == -100).all()
    rng = random.Random(0)
    picks = [itm_negatives([0, 1, 2, 3], 0.5, rng) for _ in range(2000)]
    share = sum(j is not None for p in picks for j in p) / 8000
    assert abs(share - 0.5) < 0.02
    assert itm_negatives([5, 5, 5], 1.0, rng) == [None, None, None]  # no other concept: all kept true
    again = _collator(itm_probability=0.5)(_examples(concepts))
    assert torch.equal(again["input_ids"], _collator(itm_probability=0.5)(_examples(concepts))["input_ids"])


def test_visualbert_resumes_exactly_and_exports(tmp_path: Path):
    from transformers import VisualBertForPreTraining

    cfg = {"seed_everything": 5,
           "trainer": {"max_steps": 6, "accelerator": "cpu", "devices": 1, "val_check_interval": 3,
                       "log_every_n_steps": 1, "enable_progress_bar": False, "enable_model_summary": False},
           "model": {"class_path": "SingleStreamModule",
                     "init_args": {"backbone_config": {"model_type": "visual_bert", "hidden_size": 32,
                                                       "num_hidden_layers": 2, "num_attention_heads": 2,
                                                       "intermediate_size": 64, "max_position_embeddings": 64},
                                   "image_size": 16, "patch_size": 4, "optim": {"lr": 1e-3, "warmup": 0}}},
           "data": {"class_path": "ImageTextDataModule",
                    "init_args": {"source": str(image_text_set(tmp_path / "set")), "image_size": 16,
                                  "tokenizer": {"train": "wordpiece", "vocab_size": 60, "min_frequency": 1},
                                  "batch_size": 5}}}
    path = tmp_path / "vb.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(path)], runs, stop=2, steps=6)
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(out)], runs) == 0
    model = VisualBertForPreTraining.from_pretrained(out).eval()
    assert model.config.visual_embedding_dim == visual_dim(16, 4) == 3 * 16 + 16
