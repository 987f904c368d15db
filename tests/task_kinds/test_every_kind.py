"""Every task kind of the registry (``task_kinds.registry.TASK_KINDS``) end to end: a tiny run fits through
``main.py``, exports, predicts with ``--input`` and ``--text`` (or ``--question``/``--context``), and its export
answers a ``serve`` request in process with the row ``predict`` printed.  A kind without a case here, or one that
misses a piece (data module, head, loss, metrics, export, predict rows, serve form), fails."""
import json
import random
from pathlib import Path

import pytest
import yaml

from ptm_app.main import main
from ptm_app.task_kinds.registry import TASK_KINDS
from tests.conftest import TINY_BERT, TINY_GPT2, WORDS, make_docs, run_main, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")
QUIET = {"accelerator": "cpu", "devices": 1, "log_every_n_steps": 1, "enable_progress_bar": False,
         "enable_model_summary": False}
WORDPIECE = {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}
OPTIM = {"lr": 1e-2, "warmup": 0}


def splits(root: Path, make, sizes=(("train", 1, 24), ("validation", 2, 8), ("test", 3, 6))) -> Path:
    for split, seed, n in sizes:
        write_jsonl(root / f"{split}.jsonl", make(n, seed))
    return root


def regression_rows(n, seed):
    rng = random.Random(seed)
    return [{**d, "label": round(rng.uniform(0, 5), 2)} for d in make_docs(n, seed)]


def tagged(n, seed):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
        rows.append({"id": f"s{seed}-{i}", "words": words, "tags": ["DET" if w in ("the", "a") else "X" for w in words]})
    return rows


def qa_rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 14))]
        k = rng.randrange(len(words) - 1)
        start = len(" ".join(words[:k])) + (1 if k else 0)
        answer = " ".join(words[k:k + 2])
        rows.append({"id": f"q{seed}-{i}", "question": f"what follows {words[k]} ?", "context": " ".join(words),
                     "answers": {"text": [answer], "answer_start": [start]}})
    return rows


def choice_rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        options = [" ".join(rng.choice(WORDS) for _ in range(3)) for _ in range(3)]
        rows.append({"id": f"c{seed}-{i}", "text": f"which one starts with {options[0].split()[0]} ?",
                     "choices": options, "label": 0})
    return rows


def copy_rows(n, seed):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 7))]
        rows.append({"id": f"p{seed}-{i}", "text": " ".join(words), "target": " ".join(words[:2])})
    return rows


def label_set_rows(n, seed):
    return [{"id": d["id"], "text": d["text"], "labels": sorted({d["label"], "long" if len(d["text"]) > 60 else "short"})}
            for d in make_docs(n, seed)]


def text_input(record):
    return ["--text", record["text"]], {"text": record["text"]}


# per kind: its records, the module and data module (class_path, init_args), the fields the rows carry, and the
# --text style arguments plus the serve request body for one test record
CASES = {
    "sequence": (make_docs, ("SequenceClassificationModule", {}), ("TaskDataModule", {"max_length": 32}),
                 {"label", "probs"}, text_input),
    "regression": (regression_rows, ("SequenceRegressionModule", {}),
                   ("TaskDataModule", {"max_length": 32, "task": "regression"}), {"value"}, text_input),
    "token": (tagged, ("TokenClassificationModule", {}), ("TokenTaskDataModule", {"max_length": 16}),
              {"words", "tags"}, lambda r: (["--text", " ".join(r["words"])], {"text": " ".join(r["words"])})),
    "qa": (qa_rows, ("QuestionAnsweringModule", {}),
           ("QADataModule", {"max_length": 32, "doc_stride": 8, "max_question_length": 8}),
           {"question", "context", "answer", "answer_start", "answer_end", "score"},
           lambda r: (["--question", r["question"], "--context", r["context"]],
                      {"question": r["question"], "context": r["context"]})),
    "choice": (choice_rows, ("MultipleChoiceModule", {}), ("MultipleChoiceDataModule", {"max_length": 16}),
               {"question", "choices", "choice", "answer", "probs"},
               lambda r: (["--text", json.dumps({"question": r["text"], "choices": r["choices"]})],
                          {"question": r["text"], "choices": r["choices"]})),
    "generation": (copy_rows, ("GenerationModule", {"backbone_config": TINY_GPT2, "prompt": " =>"}),
                   ("Seq2SeqDataModule", {"max_source_length": 16, "max_target_length": 4,
                                          "tokenizer": {"train": "bpe", "vocab_size": 300, "min_frequency": 1}}),
                   {"generated"}, text_input),
    "multilabel": (label_set_rows, ("SequenceClassificationModule", {"kind": "multilabel"}),
                   ("MultiLabelDataModule", {"max_length": 32}), {"labels", "probs"}, text_input),
}


def test_every_kind_of_the_registry_has_a_case_here():
    assert set(CASES) == set(TASK_KINDS), "a new task kind needs its case in CASES (fit, export, predict, serve)"


def same_row(mine: dict, theirs: dict) -> None:
    """Equal rows; probabilities and scores to float precision."""
    assert set(mine) == set(theirs)
    for key, value in mine.items():
        if key in ("probs", "score", "value"):
            flat = lambda v: list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else [v]  # noqa: E731
            assert flat(value) == pytest.approx(flat(theirs[key]), abs=1e-4), key
        else:
            assert value == theirs[key], key


@pytest.mark.parametrize("name", list(CASES))
def test_kind_fits_exports_predicts_and_serves(name, tmp_path, capsys):
    from ptm_app.inference.loading import load_for_inference
    from ptm_app.inference.serve import API_CLASSES, ServeSettings, choose_task

    kind = TASK_KINDS[name]
    make, (module, module_args), (data, data_args), fields, one_input = CASES[name]
    assert data == kind.data_module.__name__  # the entry names the data module the kind trains on
    root = splits(tmp_path / name, make)
    model = {"class_path": module, "init_args": {"backbone_config": TINY_BERT, "optim": OPTIM, **module_args}}
    data_cfg = {"class_path": data, "init_args": {"source": str(root), "batch_size": 8, "tokenizer": WORDPIECE,
                                                  **data_args}}
    cfg = {"seed_everything": 5, "trainer": {"max_steps": 4, "val_check_interval": 4, **QUIET},
           "model": model, "data": data_cfg}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path), "--run_name", name], runs) == 0
    run, export = runs / name, tmp_path / f"{name}_export"
    assert run_main(["export", "--ckpt_path", str(run), "--output_dir", str(export)], runs) == 0
    card = (export / "README.md").read_text()
    ref = run if name == "generation" else export
    if name == "generation":  # a plain LM export keeps no module to decode with: the run directory predicts
        capsys.readouterr()
        assert main(["predict", "--ckpt_path", str(export), "--text", "the cat"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    else:
        assert kind.intended_use in card and (kind.pipeline_tag is None or f"pipeline_tag: {kind.pipeline_tag}" in card)
    loaded = load_for_inference(str(ref))
    assert choose_task(loaded, None) == ("predict", kind.prediction.form.name)

    out = tmp_path / "rows.jsonl"
    assert main(["predict", "--ckpt_path", str(ref), "--input", str(root / "test.jsonl"), "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    records = [json.loads(line) for line in (root / "test.jsonl").read_text().splitlines()]
    assert len(rows) == len(records) and [r["id"] for r in rows] == [r["id"] for r in records]
    assert fields <= set(rows[0]), set(rows[0])

    argv, body = one_input(records[1])
    capsys.readouterr()
    assert main(["predict", "--ckpt_path", str(ref), *argv]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(printed) == 1
    same_row({k: v for k, v in printed[0].items() if k != "text"}, {k: v for k, v in rows[1].items()
                                                                    if k not in ("id", "text")})

    form = kind.prediction.form
    api = API_CLASSES[form.name](ServeSettings(str(ref), "predict", form.name), max_batch_size=4)
    api.setup("cpu")
    request = type(api).decode_request.__annotations__["request"](**body)
    served = api.encode_response(api.predict([api.decode_request(request)])[0])
    same_row(served, printed[0])


def test_a_multiple_choice_input_in_another_format_is_one_line():
    from ptm_app.errors import PtmError
    from ptm_app.task_kinds.inputs import read_choices

    assert read_choices(['{"question": "q?", "choices": ["a", "b"]}'], None) == ([("q?", ["a", "b"])], None)
    for bad in ("which one?", '{"question": "q?", "choices": ["a"]}', '["q?", "a", "b"]'):
        with pytest.raises(PtmError, match="is not a multiple-choice question; give one JSON object"):
            read_choices([bad], None)
