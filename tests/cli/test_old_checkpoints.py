"""Checkpoints written by earlier ptm_app versions keep loading: a tiny classifier saved by the code before the
architecture change (issue 12; ``tests/fixtures/checkpoints/classifier_800ed2c.*``, with its outputs recorded by
that code) loads through every path and gives the same numbers; records and export folders written before ``head``
was renamed ``model_class`` (issue 27) still load and predict."""
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


# -- "head" -> "model_class" (issue 27 item 5): records written before the rename ------------------------------------
def test_the_fixture_records_the_old_key_and_reads_under_the_new_one():
    """The fixture's ptm_app record says ``head`` (written before the rename); ``read_checkpoint`` gives it as
    ``model_class``, and the checkpoint loads for inference as that class and predicts the recorded labels."""
    from ptm_app.checkpoint_io.reading import CKPT_KEY, load_file, read_checkpoint
    from ptm_app.inference.loading import load_for_inference

    raw = load_file(FIXTURE.with_suffix(".ckpt"))[CKPT_KEY]
    assert raw["head"] == "sequence_classification" and "model_class" not in raw  # what makes the test a test
    record = read_checkpoint(FIXTURE.with_suffix(".ckpt"))[CKPT_KEY]
    assert record["model_class"] == "sequence_classification" and "head" not in record
    assert load_for_inference(str(FIXTURE.with_suffix(".ckpt"))).model_class == "sequence_classification"


def test_new_saves_write_model_class():
    """A module's checkpoint record is written under ``model_class``, never ``head`` (an export's info:
    ``_old_export``)."""
    from ptm_app.adaptation import SequenceClassificationModule
    from ptm_app.checkpoint_io.reading import CKPT_KEY

    module = SequenceClassificationModule.load_from_checkpoint(FIXTURE.with_suffix(".ckpt"))
    ckpt = {"hyper_parameters": dict(module.hparams)}
    module.on_save_checkpoint(ckpt)  # what Lightning calls when it writes a checkpoint
    assert ckpt[CKPT_KEY]["model_class"] == "sequence_classification" and "head" not in ckpt[CKPT_KEY]


def _old_export(tmp_path: Path) -> Path:
    """The fixture exported, its info file then rewritten as exports before the rename wrote it (``head``), and its
    config's ``architectures`` removed, so only the info can say what class to build (else ``base``)."""
    from ptm_app.inference.export import EXPORT_INFO
    from ptm_app.main import main

    out = tmp_path / "old_export"
    assert main(["export", "--ckpt_path", str(FIXTURE.with_suffix(".ckpt")), "--output_dir", str(out)]) == 0
    info = json.loads((out / EXPORT_INFO).read_text())
    assert info["model_class"] == "sequence_classification" and "head" not in info  # a new export's key
    assert "model class `sequence_classification`" in (out / "README.md").read_text()  # and its model card
    info["head"] = info.pop("model_class")
    (out / EXPORT_INFO).write_text(json.dumps(info))
    config = json.loads((out / "config.json").read_text())
    config.pop("architectures")
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_an_old_key_export_still_loads_and_predicts(expected, tmp_path, capsys):
    from ptm_app.inference.loading import load_for_inference
    from ptm_app.main import main

    out = _old_export(tmp_path)
    loaded = load_for_inference(str(out))
    assert loaded.model_class == "sequence_classification"
    logits, _ = outputs(loaded.model, loaded.tokenizer, expected["texts"])
    torch.testing.assert_close(logits, torch.tensor(expected["logits"]), rtol=0, atol=1e-5)
    capsys.readouterr()
    assert main(["predict", "--ckpt_path", str(out), "--text", expected["texts"][0]]) == 0
    label = expected["labels"][int(torch.tensor(expected["logits"][0]).argmax())]
    assert f'"label": "{label}"' in capsys.readouterr().out


def test_an_old_key_int8_directory_still_loads(expected, tmp_path):
    """``quantization.json`` written before the rename (``head``) rebuilds the same class."""
    from ptm_app.compression.quantization import QUANT_CONFIG, quantize_dynamic_int8, save_quantized
    from ptm_app.inference.loading import load_for_inference

    fp32 = load_for_inference(str(FIXTURE.with_suffix(".ckpt")))
    out = save_quantized(quantize_dynamic_int8(fp32.model.float().eval()), "torch_ao", tmp_path / "int8",
                         fp32.model_class, fp32.tokenizer)
    info = json.loads((out / QUANT_CONFIG).read_text())
    assert info["model_class"] == "sequence_classification" and "head" not in info
    info["head"] = info.pop("model_class")
    (out / QUANT_CONFIG).write_text(json.dumps(info))
    loaded = load_for_inference(str(out))
    assert loaded.model_class == "sequence_classification"
    logits, _ = outputs(loaded.model, loaded.tokenizer, expected["texts"])
    torch.testing.assert_close(logits, torch.tensor(expected["logits"]), rtol=0, atol=0.05)  # int8 weights
