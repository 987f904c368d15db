"""Deltas stay applied: an adapter run and its export (base + delta.safetensors) embed and predict alike, and
differently from the base model without its adapters."""
import numpy as np
import pytest

from ptm_app.inference.embed import embed_texts
from ptm_app.inference.loading import load_for_inference
from ptm_app.inference.predict import predict_rows
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the cat sat on a mat", "markets rose as shares fell after the bank said profits would grow"]


def test_adapter_run_and_its_export_give_the_same_outputs(adapter_run, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from ptm_app.backbones.adapters import list_adapters
    from ptm_app.inference.loading import LoadedModel

    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(adapter_run), "--output_dir", str(out)], adapter_run.parent) == 0
    assert (out / "delta.safetensors").is_file() and not (out / "module_config.json").exists()
    run, export = load_for_inference(str(adapter_run)), load_for_inference(str(out))
    assert list(list_adapters(run.model)) and list(list_adapters(export.model))
    assert export.model_class == "sequence_classification" and export.module is None

    from_run, from_export = embed_texts(run, TEXTS), embed_texts(export, TEXTS)
    np.testing.assert_allclose(from_export, from_run, atol=1e-5)
    base = AutoModelForSequenceClassification.from_pretrained(out).eval()  # the same weights without the adapters
    bare = embed_texts(LoadedModel("base", base, export.tokenizer, "sequence_classification"), TEXTS)
    assert np.abs(bare - from_run).max() > 1e-3  # the adapters change the states: they were really applied

    rows, exported = predict_rows(run, TEXTS), predict_rows(export, TEXTS)  # module vs the plain model's logits
    assert [r["label"] for r in rows] == [r["label"] for r in exported] == [max(r["probs"], key=r["probs"].get)
                                                                            for r in rows]
    assert set(rows[0]["probs"]) == {"neg", "pos"}
    for mine, theirs in zip(exported, rows):
        for label, p in theirs["probs"].items():
            assert mine["probs"][label] == pytest.approx(p, abs=2e-6)
