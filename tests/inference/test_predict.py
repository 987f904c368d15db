"""``main.py predict --text/--input``: the rows LightningCLI's ``predict --config`` writes, for any texts."""
import json
import shutil

import pytest

from ptm_app.main import main
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_predict_input_equals_lightning_predict(classifier_run, tiny_corpus, tmp_path, capsys):
    runs = tmp_path / "runs"
    run = runs / "classifier"
    shutil.copytree(classifier_run, run)  # the shared run stays untouched
    config = classifier_run.parent.parent / "classifier.yaml"
    assert run_main(["predict", "--config", str(config), "--run_name", "classifier", "--ckpt_path", "last"], runs) == 0
    cli_rows = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]

    out = tmp_path / "labels.jsonl"
    assert main(["predict", "--ckpt_path", str(run), "--input", str(tiny_corpus / "test.jsonl"), "--output", str(out),
                 "--batch_size", "3"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(cli_rows) == 10
    for mine, theirs in zip(rows, cli_rows):
        assert (mine["id"], mine["text"], mine["label"]) == (theirs["id"], theirs["text"], theirs["label"])
        assert set(mine["probs"]) == {"neg", "pos"}
        for label, p in theirs["probs"].items():
            assert mine["probs"][label] == pytest.approx(p, abs=2e-6)
    assert len({round(r["probs"]["pos"], 4) for r in rows}) > 1  # the texts really differ to the model

    capsys.readouterr()
    one = cli_rows[3]
    assert main(["predict", "--ckpt_path", str(run), "--text", one["text"]]) == 0
    printed = json.loads(capsys.readouterr().out.strip())
    assert printed["text"] == one["text"] and printed["label"] == one["label"] and "id" not in printed
    assert printed["probs"]["pos"] == pytest.approx(one["probs"]["pos"], abs=2e-6)


def test_predict_refuses_a_language_model(clm_run, capsys):
    assert main(["predict", "--ckpt_path", str(clm_run), "--text", "the cat"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CausalLMModule" in err[0] and "predict --config" in err[0], err


def test_predict_input_that_is_not_utf8_names_the_file_and_line(classifier_run, tmp_path, capsys):
    """A cp1252 .txt (a UnicodeDecodeError traceback before): one line with the file, the line and the byte; the
    same file saved as UTF-8 is labelled."""
    path = tmp_path / "texts.txt"
    path.write_bytes("the cat sat\n\n\u201cquoted\u201d dogs ran\n".encode("cp1252"))
    assert main(["predict", "--ckpt_path", str(classifier_run), "--input", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {path}:3: not UTF-8 text (byte 0x93 at byte 1 of the line); save it as UTF-8 "
                   f"(e.g. iconv -f latin1 -t utf-8)"], err
    path.write_text("the cat sat\n\n\u201cquoted\u201d dogs ran\n", encoding="utf-8")
    assert main(["predict", "--ckpt_path", str(classifier_run), "--input", str(path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == ["the cat sat", "\u201cquoted\u201d dogs ran"]
