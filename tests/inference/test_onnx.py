"""``export --format onnx`` and ``predict --backend onnxruntime``: the graph (dynamic batch and sequence axes)
matches PyTorch within the tolerance written into its metadata, for a classifier and a delta-tuned run."""
import json

import onnxruntime  # noqa: F401  (the `onnx` extra, installed by make setup: a missing one fails, never skips)
import pytest

from ptm_app.inference.onnx_export import TOLERANCE
from ptm_app.main import main
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def rows_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("fixture", ["classifier_run", "adapter_run"])
def test_onnx_export_matches_pytorch_and_predict_runs_on_onnxruntime(fixture, request, tiny_corpus, tmp_path, capsys):
    run = request.getfixturevalue(fixture)
    out = tmp_path / "export"
    assert run_main(["export", "--format", "onnx", "--ckpt_path", str(run), "--output_dir", str(out)], run.parent) == 0
    info = json.loads((out / "onnx.json").read_text())
    assert info["inputs"][:2] == ["input_ids", "attention_mask"] and info["outputs"] == ["logits"]
    assert info["model_class"] == "sequence_classification" and "head" not in info  # the name since the rename
    assert info["check"]["tolerance_abs"] == TOLERANCE == 1e-4
    assert 0 <= info["check"]["max_abs_diff"] <= TOLERANCE
    assert "## ONNX" in (out / "README.md").read_text()  # the model card says what the graph is

    test = str(tiny_corpus / "test.jsonl")
    # batch sizes 4 and 3 and the fixture's lengths: neither is the traced (2, 8) shape
    torch_rows = rows_of_predict(["--ckpt_path", str(out), "--input", test, "--batch_size", "4"], tmp_path / "t.jsonl")
    ort_rows = rows_of_predict(["--ckpt_path", str(out), "--input", test, "--batch_size", "3", "--backend",
                                "onnxruntime"], tmp_path / "o.jsonl")
    assert len(ort_rows) == len(torch_rows) == 10
    for mine, theirs in zip(ort_rows, torch_rows):
        assert (mine["id"], mine["label"]) == (theirs["id"], theirs["label"])
        for label, p in theirs["probs"].items():
            assert mine["probs"][label] == pytest.approx(p, abs=TOLERANCE)
    assert len({r["probs"]["pos"] for r in ort_rows}) > 1  # the texts differ to the model (rows keep 6 decimals)

    # the server's worker on the same graph (serve --backend onnxruntime): a batch of requests, the same rows
    from ptm_app.inference.serve import ServeSettings, TextAPI, TextRequest

    api = TextAPI(ServeSettings(str(out), "predict", "text", backend="onnxruntime"), max_batch_size=4)
    api.setup("cpu")
    assert api.loaded.session is not None
    served = api.predict([api.decode_request(TextRequest(text=r["text"])) for r in torch_rows[:4]])
    for mine, theirs in zip(served, torch_rows[:4]):
        assert mine["label"] == theirs["label"]
        assert mine["probs"] == pytest.approx(theirs["probs"], abs=TOLERANCE)


def rows_of_predict(argv: list[str], out) -> list[dict]:
    assert main(["predict", *argv, "--output", str(out)]) == 0
    return rows_of(out)


def test_onnx_refusals_are_one_line(clm_run, classifier_run, tmp_path, capsys):
    assert main(["export", "--format", "onnx", "--ckpt_path", str(clm_run), "--output_dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--format onnx" in err[0] and "CausalLMModule" in err[0], err
    assert not (tmp_path / "x").exists()  # nothing half-written
    assert main(["predict", "--ckpt_path", str(classifier_run), "--text", "a cat", "--backend", "onnxruntime"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.onnx" in err[0] and "export --format onnx" in err[0], err
