"""Multilingual MLM (mBERT / XLM-R) and XLM's mix of CLM, MLM and TLM (Lample & Conneau 2019 §3) at tiny size on a
small three-language set written here: the objectives alternate step by step, CLM's targets are the next tokens
under causal attention, blocks carry their language, the recipes resume exactly and export."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from ptm_app.data import IGNORE_INDEX
from tests.conftest import TINY_BERT, assert_resumes_exactly, run_main, write_jsonl
from tests.objectives.test_tlm import PAIRS, TINY_XLM

ROOT = Path(__file__).resolve().parents[2]
ES = {"I": "yo", "am": "soy", "the": "el", "is": "es", "cat": "gato", "dog": "perro", "today": "hoy", "have": "tengo"}
QUICK = ["--trainer.precision", "32-true", "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1",
         "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false", "--data.init_args.batch_size", "4",
         "--data.init_args.max_length", "24", "--data.init_args.tokenizer",
         json.dumps({"train": "unigram", "vocab_size": 200, "alpha": 0.5})]


@pytest.fixture(scope="module")
def three_languages(tmp_path_factory) -> Path:
    """en / fr from test_tlm's pairs, es a word-by-word rendering (enough to be a third language here); English
    also has extra monolingual lines (the high-resource language)."""
    root = tmp_path_factory.mktemp("trilingual")
    rows = [{"id": f"{i:03d}", "en": en, "fr": fr, "es": " ".join(ES.get(w, w + "o") for w in en.split())}
            for i, (en, fr) in enumerate(PAIRS)]
    write_jsonl(root / "train.jsonl", rows[:30])
    write_jsonl(root / "validation.jsonl", rows[30:])
    write_jsonl(root / "test.jsonl", rows[30:])
    extra = tmp_path_factory.mktemp("english")
    write_jsonl(extra / "train.jsonl", [{"id": f"x{i}", "en": f"{en} and {PAIRS[(-1 - i) % len(PAIRS)][0]}"} for i, (en, _) in
                                        enumerate(PAIRS * 3)])
    write_jsonl(extra / "validation.jsonl", [{"id": "x", "en": "the cat is here"}])
    return root, extra


def mix_args(data, *more) -> list[str]:
    root, extra = data
    return ["fit", "--config", str(ROOT / "configs/pretrain/xlm_clm_mlm_tlm_quran_bible.yaml"), "--model.init_args.backbone_config",
            json.dumps(TINY_XLM), "--data.init_args.sources", json.dumps([str(root), str(extra)]),
            "--data.init_args.pairs", json.dumps(["en-es", "en-fr"]), *QUICK, *more]


def test_xlm_mix_alternates_clm_mlm_tlm_and_exports(three_languages, tmp_path):
    from transformers import AutoModelForMaskedLM

    assert run_main(mix_args(three_languages, "--trainer.max_steps", "6"), tmp_path) == 0
    rows = list(csv.DictReader(open(tmp_path / "xlm_clm_mlm_tlm_quran_bible" / "logs" / "metrics.csv")))
    turns = {int(r["step"]): float(r["train/objective"]) for r in rows if r.get("train/objective")}
    assert turns == {0: 0, 1: 1, 2: 2, 3: 0, 4: 1, 5: 2}  # clm, mlm, tlm: one objective per step, in turn
    losses = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    for step, name in ((3, "clm"), (4, "mlm"), (5, "tlm")):  # the step's loss is its objective's
        assert float(next(r for r in rows if r["step"] == str(step) and r.get("train/loss"))[f"train/{name}"]) \
            == losses[step]
    val = next(r for r in rows if r.get("val/clm"))
    assert float(val["val/loss"]) == float(val["val/mlm"]) and float(val["val/tlm"]) > 0
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(tmp_path / "xlm_clm_mlm_tlm_quran_bible"), "--output_dir", str(out)], tmp_path) == 0
    hf = AutoModelForMaskedLM.from_pretrained(out)
    assert hf.config.lang2id == {"en": 0, "fr": 1, "es": 2} and hf.config.n_langs == 3
    assert not hf.config.causal  # CLM steps made attention causal for their call only


@pytest.mark.slow  # three runs, ~30 s on 2 busy cores
def test_xlm_mix_resumes_exactly(three_languages, tmp_path):
    assert_resumes_exactly(mix_args(three_languages, "--trainer.max_steps", "7"), tmp_path, stop=4, steps=7)


def test_clm_step_predicts_the_next_token_under_causal_attention(three_languages, tmp_path, monkeypatch):
    """The CLM part: the block with its masked tokens restored, labels = the next token (the last and padding
    ignored), and the backbone called with causal attention (a later token changes no earlier logit)."""
    from ptm_app.training.cli import PtmCLI

    monkeypatch.chdir(tmp_path)
    cli = PtmCLI(args=mix_args(three_languages)[1:], run=False)
    module, dm = cli.model, cli.datamodule
    from ptm_app.data.contract import connect

    connect(module, dm)
    dm.setup("fit")
    module.configure_model()
    batch = dm._collate()([dm.datasets["train"][(0, k)] for k in range(3)])
    mono = batch["mono"]
    assert (mono["langs"][mono["attention_mask"].bool()] >= 0).all() and "langs" in batch["para"]
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs, causal=module.backbone.transformer.causal)
        return original(**kwargs)

    original = module.backbone.forward
    monkeypatch.setattr(module.backbone, "forward", spy)
    module._objective_loss(batch, "clm")
    ids = torch.where(mono["labels"] != IGNORE_INDEX, mono["labels"], mono["input_ids"])
    assert seen["causal"] is True and not module.backbone.transformer.causal
    assert torch.equal(seen["input_ids"], ids) and not (seen["input_ids"] == dm.tokenizer.mask_token_id).any()
    n = mono["attention_mask"].sum(1)
    for row in range(3):
        assert torch.equal(seen["labels"][row, : n[row] - 1], ids[row, 1: n[row]])
        assert (seen["labels"][row, n[row] - 1:] == IGNORE_INDEX).all()
    monkeypatch.setattr(module.backbone, "forward", original)
    module.eval()
    module.backbone.transformer.causal = True
    changed = ids.clone()
    changed[0, 10] = 7
    with torch.no_grad():
        a = module.backbone(input_ids=ids[:1], langs=mono["langs"][:1]).logits
        b = module.backbone(input_ids=changed[:1], langs=mono["langs"][:1]).logits
    assert torch.allclose(a[0, :10], b[0, :10]) and not torch.allclose(a[0, 10:], b[0, 10:])


def mmlm_args(data) -> list[str]:
    root, extra = data
    return ["fit", "--config", str(ROOT / "configs/pretrain/mbert_mlm_quran_bible.yaml"), "--model.init_args.backbone_config",
            json.dumps(TINY_BERT), "--data.init_args.sources", json.dumps([str(root), str(extra)]), *QUICK,
            "--trainer.max_steps", "6"]


def test_mmlm_samples_languages_with_alpha(three_languages, tmp_path, monkeypatch):
    from ptm_app.training.cli import PtmCLI

    monkeypatch.chdir(tmp_path)
    counts = {}
    for alpha in (1.0, 0.3):
        cli = PtmCLI(args=[*mmlm_args(three_languages)[1:], "--data.init_args.alpha", str(alpha),
                           "--run_name", f"alpha{alpha}"], run=False)
        cli.datamodule.setup("fit")
        blocks = cli.datamodule.block_counts["train"]
        counts[alpha] = cli.datamodule.sampled_languages()
        example = cli.datamodule.datasets["train"][(0, 0)]
        assert example["input_ids"][0] == cli.datamodule.tokenizer.cls_token_id and "mono" not in example
    assert blocks["en"] > 3 * blocks["fr"]  # English has the extra text
    share = {a: c["fr"] / sum(c.values()) for a, c in counts.items()}
    assert share[1.0] == pytest.approx(blocks["fr"] / sum(blocks.values()), abs=0.06)
    assert share[0.3] > share[1.0] + 0.05  # balancing up-samples the low-resource language


@pytest.mark.slow  # three runs, ~35 s on 2 busy cores
def test_mmlm_resumes_exactly_and_exports(three_languages, tmp_path):
    from transformers import AutoModelForMaskedLM

    assert_resumes_exactly(mmlm_args(three_languages), tmp_path, stop=3, steps=6)
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(tmp_path / "full"), "--output_dir", str(out)], tmp_path) == 0
    assert type(AutoModelForMaskedLM.from_pretrained(out)).__name__ == "BertForMaskedLM"
