"""Checkpoints written by earlier ptm_app versions keep loading: a tiny classifier saved by the code before the
architecture change (issue 12; ``tests/fixtures/checkpoints/classifier_800ed2c.*``, with its outputs recorded by
that code) loads through every path and gives the same numbers."""
import json
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "classifier_800ed2c"


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(FIXTURE.with_suffix(".json").read_text())


def outputs(backbone, tokenizer, texts):
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = backbone.eval()(**batch, output_hidden_states=True)
    return out.logits, out.hidden_states[-1][:, 0, :]


def test_old_checkpoint_loads_as_a_module_with_the_same_outputs(expected):
    from ptm_app.adaptation import SequenceClassificationModule

    module = SequenceClassificationModule.load_from_checkpoint(FIXTURE.with_suffix(".ckpt"))
    assert list(module.hparams.labels) == expected["labels"]
    logits, hidden = outputs(module.backbone, module.tokenizer, expected["texts"])
    torch.testing.assert_close(logits, torch.tensor(expected["logits"]), rtol=0, atol=1e-5)
    torch.testing.assert_close(hidden, torch.tensor(expected["cls_hidden"]), rtol=0, atol=1e-5)


def test_old_checkpoint_exports_to_the_same_transformers_model(expected, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ptm_app.main import main

    assert main(["export", "--ckpt_path", str(FIXTURE.with_suffix(".ckpt")), "--output_dir", str(tmp_path / "x")]) == 0
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "x")
    logits, hidden = outputs(model, AutoTokenizer.from_pretrained(tmp_path / "x"), expected["texts"])
    torch.testing.assert_close(hidden, torch.tensor(expected["cls_hidden"]), rtol=0, atol=1e-5)
    torch.testing.assert_close(logits, torch.tensor(expected["logits"]), rtol=0, atol=1e-5)
