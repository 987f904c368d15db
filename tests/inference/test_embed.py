"""``main.py embed``: sentence embeddings equal to the hand-computed pooling; bad input files are one line."""
import json

import numpy as np
import pytest
import torch

from ptm_app.data.sources import prepared_dir
from ptm_app.main import main
from tests.conftest import write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["A cat sat on the mat.", "Shares in the bank fell after the profit warning.", "The dog ran.",
         "Markets rose on Monday as oil prices eased and investors returned to technology stocks."]


def mean_pooled_by_hand(texts: list[str]) -> np.ndarray:
    """sentence-transformers' all-MiniLM-L6-v2 Transformer + Pooling(mean) steps, written out with AutoModel."""
    from transformers import AutoModel, AutoTokenizer

    where = prepared_dir("minilm")
    tok, model = AutoTokenizer.from_pretrained(where), AutoModel.from_pretrained(where).eval()
    rows = []
    for text in texts:  # one at a time: no padding at all
        enc = tok(text, truncation=True, max_length=256, return_tensors="pt")
        with torch.no_grad():
            states = model(**enc).last_hidden_state[0]
        rows.append(states.mean(0).numpy())
    return np.stack(rows)


def one_error_line(argv, capsys) -> str:
    code = main(argv)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_minilm_embeddings_equal_mean_pooling_by_hand(tmp_path, capsys):
    texts_file = tmp_path / "texts.txt"
    texts_file.write_text("\n".join(TEXTS[:2]) + "\n\n" + "\n".join(TEXTS[2:]) + "\n")  # a blank line is skipped
    out = tmp_path / "vectors.npy"
    assert main(["embed", "--ckpt_path", "minilm", "--input", str(texts_file), "--output", str(out),
                 "--batch_size", "3"]) == 0  # two batches, padded
    assert capsys.readouterr().out.strip() == f"wrote 4 embeddings of dimension 384 to {out}"
    got, want = np.load(out), mean_pooled_by_hand(TEXTS)
    assert got.shape == (4, 384)
    np.testing.assert_allclose(got, want, atol=2e-5)
    normalized = tmp_path / "unit.jsonl"
    assert main(["embed", "--ckpt_path", "minilm", "--text", TEXTS[0], "--text", TEXTS[3], "--normalize",
                 "--output", str(normalized)]) == 0
    rows = [json.loads(line) for line in normalized.read_text().splitlines()]
    assert [r["text"] for r in rows] == [TEXTS[0], TEXTS[3]]
    unit = want[[0, 3]] / np.linalg.norm(want[[0, 3]], axis=1, keepdims=True)
    np.testing.assert_allclose(np.array([r["embedding"] for r in rows]), unit, atol=2e-6)


def test_similarity_matrix_and_cls_pooling(capsys):
    assert main(["embed", "--ckpt_path", "minilm", "--text", TEXTS[0], "--text", "A kitten sat on a rug.",
                 "--text", TEXTS[1], "--similarity"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    matrix = np.array([[float(v) for v in line.split()[1:]] for line in lines[-3:]])
    assert np.allclose(np.diag(matrix), 1.0, atol=1e-3) and np.allclose(matrix, matrix.T, atol=1e-3)
    assert matrix[0, 1] > matrix[0, 2] + 0.3  # the paraphrase is nearer than the finance sentence
    from ptm_app.inference.embed import embed_texts
    from ptm_app.inference.loading import load_for_inference

    loaded = load_for_inference("minilm")
    cls = embed_texts(loaded, [TEXTS[1]], pooling="cls")
    with torch.no_grad():
        first = loaded.model(**loaded.tokenizer([TEXTS[1]], return_tensors="pt")).last_hidden_state[0, 0]
    np.testing.assert_allclose(cls[0], first.numpy(), atol=1e-5)


def test_empty_input_file_is_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    line = one_error_line(["embed", "--ckpt_path", "minilm", "--input", str(empty)], capsys)
    assert str(empty) in line and "no texts" in line


def test_malformed_jsonl_line_is_named(tmp_path, capsys):
    path = write_jsonl(tmp_path / "texts.jsonl", [{"text": "fine"}])
    path.write_text(path.read_text() + '{"text": "broken\n')
    line = one_error_line(["embed", "--ckpt_path", "minilm", "--input", str(path)], capsys)
    assert f"{path}:2: malformed JSON (Invalid control character at column 17)" in line
    path.write_text(path.read_text().rstrip("\n"))  # the string never ends: json says "... starting at", no "at at"
    line = one_error_line(["embed", "--ckpt_path", "minilm", "--input", str(path)], capsys)
    assert f"{path}:2: malformed JSON (Unterminated string starting at column 10)" in line
    other = write_jsonl(tmp_path / "fields.jsonl", [{"sentence": "a"}, {"sentence": "b"}])
    assert "--text_field" in one_error_line(["embed", "--ckpt_path", "minilm", "--input", str(other)], capsys)
    out = tmp_path / "v.npy"
    assert main(["embed", "--ckpt_path", "minilm", "--input", str(other), "--text_field", "sentence",
                 "--output", str(out)]) == 0
    assert np.load(out).shape == (2, 384)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", "-"])
def test_an_input_that_is_not_utf8_names_the_file_and_line(tmp_path, capsys, monkeypatch, suffix):
    """Latin-1 bytes on line 3 (a UnicodeDecodeError traceback before), from a .txt, a .jsonl or standard input."""
    import io

    lines = ["a cat sat", "the dog ran", "caf\u00e9 au lait"]
    records = [json.dumps({"text": t}, ensure_ascii=False) for t in lines] if suffix == ".jsonl" else lines
    data = "\n".join(records).encode("latin-1") + b"\n"
    if suffix == "-":
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape"))
        where = "standard input"
    else:
        path = tmp_path / f"texts{suffix}"
        path.write_bytes(data)
        where = str(path)
    line = one_error_line(["embed", "--ckpt_path", "minilm", "--input", suffix if suffix == "-" else where], capsys)
    column = data.splitlines()[2].index(b"\xe9") + 1
    assert line == f"error: {where}:3: not UTF-8 text (byte 0xe9 at byte {column} of the line); save it as UTF-8 " \
                   f"(e.g. iconv -f latin1 -t utf-8)"


def test_scalar_mix_refused_without_a_trained_mix(capsys):
    line = one_error_line(["embed", "--ckpt_path", "minilm", "--text", "x", "--pooling", "scalar_mix"], capsys)
    assert "trained scalar mix" in line


def test_a_sentence_transformers_pooling_we_do_not_have_is_refused(tmp_path, capsys):
    where = prepared_dir("minilm")
    copy = tmp_path / "minilm_max"
    for item in where.iterdir():  # the same model, its Pooling config switched to max pooling
        if item.name != "1_Pooling":
            (copy / item.name).parent.mkdir(parents=True, exist_ok=True)
            (copy / item.name).symlink_to(item)
    modes = json.loads((where / "1_Pooling" / "config.json").read_text())
    (copy / "1_Pooling").mkdir()
    (copy / "1_Pooling" / "config.json").write_text(json.dumps({**modes, "pooling_mode_mean_tokens": False,
                                                                "pooling_mode_max_tokens": True}))
    line = one_error_line(["embed", "--ckpt_path", str(copy), "--text", "x"], capsys)
    assert "(max_tokens)" in line and "--pooling" in line
    assert main(["embed", "--ckpt_path", str(copy), "--text", "x", "--pooling", "mean"]) == 0


def test_standard_input_one_text_per_line(tmp_path, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(f"{TEXTS[0]}\n\n{TEXTS[2]}\n"))
    out = tmp_path / "stdin.jsonl"
    assert main(["embed", "--ckpt_path", "minilm", "--input", "-", "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in rows] == [TEXTS[0], TEXTS[2]]
    np.testing.assert_allclose(np.array([r["embedding"] for r in rows]), mean_pooled_by_hand([TEXTS[0], TEXTS[2]]),
                               atol=2e-5)
