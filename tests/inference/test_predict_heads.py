"""``main.py predict --text/--input`` for every head: regression values, word tags, QA spans and generated text
equal the rows LightningCLI's ``predict --config`` writes for the same examples (tiny runs trained a few steps)."""
import json
import random
from pathlib import Path

import pytest
import yaml

from ptm_app.main import main
from tests.conftest import TINY_BERT, TINY_GPT2, WORDS, make_docs, native_bf16_cpu, run_main, write_jsonl
from tests.inference.conftest import QUIET

pytestmark = pytest.mark.usefixtures("one_thread")
WORDPIECE = {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}
TAGS = {w: ("DET" if w in ("the", "a") else "VERB" if w.endswith(("ed", "s", "ng")) else "NOUN") for w in WORDS}


def fit_and_predict(tmp: Path, name: str, model: dict, data: dict, steps: int = 6,
                    **trainer) -> tuple[Path, list[dict]]:
    """Fit a tiny run, then LightningCLI's ``predict --config`` on its test split: the run and its rows."""
    cfg = {"seed_everything": 5, "trainer": {"max_steps": steps, "val_check_interval": steps, **QUIET, **trainer},
           "model": model, "data": data}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp / "runs"
    assert run_main(["fit", "--config", str(path), "--run_name", name], runs) == 0
    assert run_main(["predict", "--config", str(path), "--run_name", name, "--ckpt_path", "last"], runs) == 0
    run = runs / name
    return run, [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]


def predicted(argv: list[str], out: Path) -> list[dict]:
    assert main(["predict", *argv, "--output", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def printed(argv: list[str], capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["predict", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]


def test_regression_values_equal_lightning_predict(tiny_corpus, tmp_path, capsys):
    rng = random.Random(0)
    root = tmp_path / "sts"
    for split, seed in (("train", 1), ("validation", 2), ("test", 3)):
        write_jsonl(root / f"{split}.jsonl", [{**d, "label": round(rng.uniform(0, 5), 2)} for d in make_docs(12, seed)])
    model = {"class_path": "SequenceRegressionModule", "init_args": {"backbone_config": TINY_BERT,
                                                                     "optim": {"lr": 1e-2, "warmup": 0}}}
    data = {"class_path": "TaskDataModule", "init_args": {"source": str(root), "task": "regression", "max_length": 32,
                                                          "batch_size": 4, "tokenizer": WORDPIECE}}
    run, cli = fit_and_predict(tmp_path, "sts", model, data)
    rows = predicted(["--ckpt_path", str(run), "--input", str(root / "test.jsonl"), "--batch_size", "5"],
                     tmp_path / "values.jsonl")
    assert [r["id"] for r in rows] == [r["id"] for r in cli] and len(rows) == 12
    for mine, theirs in zip(rows, cli):
        assert set(mine) == {"id", "text", "value"} and mine["value"] == pytest.approx(theirs["value"], abs=2e-6)
    assert len({round(r["value"], 3) for r in rows}) > 1  # the texts really differ to the model
    one = printed(["--ckpt_path", str(run), "--text", cli[4]["text"]], capsys)
    assert len(one) == 1 and one[0]["value"] == pytest.approx(cli[4]["value"], abs=2e-6)


def tagged(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        rows.append({"id": f"s{seed}-{i}", "words": words, "tags": [TAGS[w] for w in words]})
    return rows


def test_tagging_word_tags_equal_lightning_predict(tmp_path, capsys):
    root = tmp_path / "pos"
    for split, seed, n in (("train", 1, 40), ("validation", 2, 8), ("test", 3, 10)):
        write_jsonl(root / f"{split}.jsonl", tagged(n, seed))
    model = {"class_path": "TokenClassificationModule", "init_args": {"backbone_config": TINY_BERT,
                                                                      "optim": {"lr": 1e-2, "warmup": 0}}}
    # max_length 10 cuts the longer sentences: their last words get no tag (None), here as in predict --config
    data = {"class_path": "TokenTaskDataModule", "init_args": {"source": str(root), "max_length": 10,
                                                               "batch_size": 8, "tokenizer": WORDPIECE}}
    run, cli = fit_and_predict(tmp_path, "pos", model, data, steps=10)
    rows = predicted(["--ckpt_path", str(run), "--input", str(root / "test.jsonl"), "--batch_size", "3"],
                     tmp_path / "tags.jsonl")
    assert rows == cli and len(rows) == 10
    assert any(None in r["tags"] for r in rows) and any(None not in r["tags"] for r in rows)
    assert sum(t == TAGS[w] for r in rows for w, t in zip(r["words"], r["tags"]) if t) > 0.6 * sum(
        t is not None for r in rows for t in r["tags"])  # it learnt the tags, so the rows carry signal
    text = " ".join(cli[0]["words"])
    one = printed(["--ckpt_path", str(run), "--text", text], capsys)
    assert one == [{"text": text, "words": cli[0]["words"], "tags": cli[0]["tags"]}]


def qa_records(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(10, 40))]
        k = rng.randrange(len(words) - 1)
        answer = " ".join(words[k:k + 2])
        context = " ".join(words)
        start = len(" ".join(words[:k])) + (1 if k else 0)
        assert context[start:start + len(answer)] == answer
        rows.append({"id": f"q{seed}-{i}", "question": f"what follows {words[k]} ?", "context": context,
                     "answers": {"text": [answer], "answer_start": [start]}})
    return rows


def test_qa_answer_spans_equal_lightning_predict(tmp_path, capsys):
    root = tmp_path / "qa"
    for split, seed, n in (("train", 1, 30), ("validation", 2, 6), ("test", 3, 8)):
        write_jsonl(root / f"{split}.jsonl", qa_records(n, seed))
    model = {"class_path": "QuestionAnsweringModule", "init_args": {"backbone_config": TINY_BERT,
                                                                    "optim": {"lr": 1e-2, "warmup": 0}}}
    # 32-token windows with a stride of 8: the longer contexts span several windows
    data = {"class_path": "QADataModule", "init_args": {"source": str(root), "max_length": 32, "doc_stride": 8,
                                                        "max_question_length": 8, "batch_size": 8,
                                                        "tokenizer": WORDPIECE}}
    run, cli = fit_and_predict(tmp_path, "qa", model, data)
    rows = predicted(["--ckpt_path", str(run), "--input", str(root / "test.jsonl"), "--batch_size", "4"],
                     tmp_path / "answers.jsonl")
    assert len(rows) == len(cli) == 8
    for mine, theirs in zip(rows, sorted(cli, key=lambda r: [c["id"] for c in rows].index(r["id"]))):
        assert {k: v for k, v in mine.items() if k != "score"} == {k: v for k, v in theirs.items() if k != "score"}
        assert mine["score"] == pytest.approx(theirs["score"], abs=1e-3)
        assert mine["context"][mine["answer_start"]:mine["answer_end"]] == mine["answer"] != ""
    one = cli[2]
    again = printed(["--ckpt_path", str(run), "--question", one["question"], "--context", one["context"]], capsys)
    assert [(r["answer"], r["answer_start"], r["answer_end"]) for r in again] == \
        [(one["answer"], one["answer_start"], one["answer_end"])]
    # --text cannot say which part is the question: one line naming the flags to use
    assert main(["predict", "--ckpt_path", str(run), "--text", "what?"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--question" in err[0] and "--context" in err[0]

    # the ONNX graph of a two-output head (start, end logits) gives the same spans under ONNX Runtime
    onnx_dir = tmp_path / "qa_onnx"
    assert run_main(["export", "--format", "onnx", "--ckpt_path", str(run), "--output_dir", str(onnx_dir)],
                    run.parent) == 0
    info = json.loads((onnx_dir / "onnx.json").read_text())
    assert info["outputs"] == ["start_logits", "end_logits"] and info["check"]["max_abs_diff"] <= 1e-4
    ort_rows = predicted(["--ckpt_path", str(onnx_dir), "--input", str(root / "test.jsonl"), "--batch_size", "3",
                          "--backend", "onnxruntime"], tmp_path / "ort_answers.jsonl")
    for mine, theirs in zip(ort_rows, rows):
        assert {k: v for k, v in mine.items() if k != "score"} == {k: v for k, v in theirs.items() if k != "score"}
        assert mine["score"] == pytest.approx(theirs["score"], abs=1e-3)


def copy_pairs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 9))]
        rows.append({"id": f"p{seed}-{i}", "text": " ".join(words), "target": " ".join(words[:3])})
    return rows


def test_generation_text_equals_lightning_predict(tmp_path, capsys):
    root = tmp_path / "copy"
    for split, seed, n in (("train", 1, 24), ("validation", 2, 4), ("test", 3, 6)):
        write_jsonl(root / f"{split}.jsonl", copy_pairs(n, seed))
    model = {"class_path": "GenerationModule",
             "init_args": {"backbone_config": TINY_GPT2, "prompt": " =>", "optim": {"lr": 3e-3, "warmup": 0}}}
    data = {"class_path": "Seq2SeqDataModule",
            "init_args": {"source": str(root), "max_source_length": 24, "max_target_length": 6, "batch_size": 4,
                          "eval_batch_size": 6, "tokenizer": {"train": "bpe", "vocab_size": 300, "min_frequency": 1}}}
    run, cli = fit_and_predict(tmp_path, "copy", model, data)
    rows = predicted(["--ckpt_path", str(run), "--input", str(root / "test.jsonl"), "--batch_size", "6"],
                     tmp_path / "generated.jsonl")
    assert [(r["id"], r["text"], r["generated"]) for r in rows] == [(r["id"], r["text"], r["generated"]) for r in cli]
    assert any(r["generated"] for r in rows)  # max_target_length + 1 new tokens, not an empty string
    one = printed(["--ckpt_path", str(run), "--text", cli[1]["text"]], capsys)
    assert one == [{"text": cli[1]["text"], "generated": cli[1]["generated"]}]


def test_too_long_inputs_are_refused_in_one_line_or_truncated_with_a_warning(classifier_run, capsys):
    long_text = " ".join(["the cat sat on a mat"] * 20)  # far beyond the run's max_length of 32
    assert main(["predict", "--ckpt_path", str(classifier_run), "--text", long_text, "--too_long", "refuse"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_length=32" in err[0] and "--too_long truncate" in err[0], err
    assert main(["predict", "--ckpt_path", str(classifier_run), "--text", long_text, "--text", "a cat"]) == 0
    out = capsys.readouterr()
    warning = out.err.strip().splitlines()
    assert len(warning) == 1 and "1 of 2 inputs" in warning[0] and "truncated" in warning[0]
    assert len(out.out.strip().splitlines()) == 2


@pytest.mark.skipif(not native_bf16_cpu(), reason="bf16 is emulated on this CPU (minutes, not seconds)")
def test_a_bf16_run_predicts_under_bf16_autocast_as_predict_config_does(tiny_corpus, tmp_path):
    model = {"class_path": "SequenceClassificationModule", "init_args": {"backbone_config": TINY_BERT,
                                                                         "optim": {"lr": 1e-2, "warmup": 0}}}
    data = {"class_path": "TaskDataModule", "init_args": {"source": str(tiny_corpus), "max_length": 32,
                                                          "batch_size": 8, "tokenizer": WORDPIECE}}
    run, cli = fit_and_predict(tmp_path, "bf16", model, data, precision="bf16-mixed")
    test = str(tiny_corpus / "test.jsonl")
    rows = predicted(["--ckpt_path", str(run), "--input", test, "--batch_size", "8"], tmp_path / "run.jsonl")
    fp32 = predicted(["--ckpt_path", str(run), "--input", test, "--batch_size", "8", "--precision", "32"],
                     tmp_path / "fp32.jsonl")
    bf16_gap = max(abs(a["probs"]["pos"] - b["probs"]["pos"]) for a, b in zip(rows, cli))
    fp32_gap = max(abs(a["probs"]["pos"] - b["probs"]["pos"]) for a, b in zip(fp32, cli))
    assert [r["label"] for r in rows] == [r["label"] for r in cli]
    assert bf16_gap < 1e-6 < fp32_gap, (bf16_gap, fp32_gap)  # the run's precision, not fp32
