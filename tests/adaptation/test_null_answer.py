"""SQuAD 2.0-style unanswerable questions (Rajpurkar et al. 2018; BERT §4.3): the v2.0 scoring of "no answer", the
null score s_null = S·C + E·C at [CLS], its lowest value over an example's windows, the threshold τ tuned on
validation to maximise F1, the HasAns / NoAns split, the data's [CLS] targets, and a run end to end through
``main.py`` whose predictions say "no answer"."""
import json
import math
import random

import pytest
import torch
import yaml

from ptm_app.data.qa_data import QADataModule
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import DataFormatError
from ptm_app.task_kinds.metrics import squad_em, squad_f1
from ptm_app.task_kinds.spans import Answer, BestSpans, answer_row, squad_scores, tune_null_threshold, with_null
from tests.conftest import TINY_BERT, WORDS, assert_resumes_exactly, run_main, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")


class Records:
    def __init__(self, answers, contexts=None):
        self.fields = {"answers": answers, "context": contexts or ["" for _ in answers]}


def test_no_gold_answer_scores_as_the_v2_script():
    # evaluate-v2.0.py: a question without answers has the one gold answer "", EM and F1 1 only for an empty prediction
    assert squad_em("", []) == 1.0 and squad_f1("", []) == 1.0
    assert squad_em("paris", []) == 0.0 and squad_f1("paris", []) == 0.0
    assert squad_f1("", ["Paris"]) == 0.0  # "no answer" to an answerable question


def test_the_threshold_maximises_f1_and_sits_between_two_null_diffs():
    golds = [["Paris"], [], ["Rome"], []]
    answers = {0: Answer(5.0, 0, 5, "paris", 3.0), 1: Answer(4.0, 0, 1, "x", 1.0),
               2: Answer(6.0, 0, 4, "rome", 2.0), 3: Answer(1.0, 0, 1, "y", -1.0)}
    # answered top k by null_diff (3, 2, 1, -1): summed F1 2, 3, 4, 3, 2: the best answers e0 and e2 only
    tau = tune_null_threshold(answers, golds)
    assert tau == pytest.approx(1.5)
    chosen = with_null(answers, tau)
    assert [a.text for a in chosen.values()] == ["paris", "", "rome", ""]
    scores = squad_scores(chosen, Records(golds))
    assert {k: float(v) for k, v in scores.items()} == pytest.approx(
        {"em": 1.0, "f1": 1.0, "has_ans_em": 1.0, "has_ans_f1": 1.0, "no_ans_acc": 1.0})
    raw = squad_scores(answers, Records(golds))  # without τ every question gets its span: NoAns all wrong
    assert float(raw["no_ans_acc"]) == 0.0 and float(raw["f1"]) == 0.5


def test_equal_f1_keeps_the_fewest_answers_and_the_extremes_are_all_or_none():
    golds = [["a"], ["b"]]
    right = {0: Answer(1.0, 0, 1, "a", 0.5), 1: Answer(1.0, 0, 1, "b", -0.5)}
    assert tune_null_threshold(right, golds) == -math.inf  # every span right: answer everything
    wrong = {0: Answer(1.0, 0, 1, "z", 0.5), 1: Answer(1.0, 0, 1, "z", -0.5)}
    assert tune_null_threshold(wrong, [[], []]) == 0.5  # every question unanswerable: answer nothing
    # answering e0 adds its F1 0 and loses its null F1 0: equal F1, so it stays "no answer"
    tie = {0: Answer(1.0, 0, 1, "z", 0.5), 1: Answer(1.0, 0, 1, "q", -0.5)}
    assert tune_null_threshold(tie, [["a"], []]) == 0.5


def test_an_examples_null_score_is_its_lowest_over_windows_and_its_span_the_best():
    spans = BestSpans(null_answer=True)
    spans.update(torch.tensor([0, 0, 1]), torch.tensor([2.0, 5.0, 1.0]), torch.tensor([0, 3, 0]),
                 torch.tensor([2, 6, 1]), torch.tensor([4.0, 7.0, 9.0]))
    best = spans.compute()
    assert best[0] == (5.0, 3, 6, 4.0) and best[1] == (1.0, 0, 1, 9.0)
    assert "null_threshold" in spans.state_dict()  # τ travels with the module's weights
    assert "null_threshold" not in BestSpans().state_dict()  # a v1.1 model's checkpoints keep their keys
    row = answer_row(Answer(5.0, -1, -1, "", 1.0), null_answer=True)
    assert row == {"answer": "", "answer_start": -1, "answer_end": -1, "score": 5.0, "no_answer": True,
                   "null_diff": 1.0}


def unanswerable_rows(n, seed):
    """Questions "where is W ?" whose context holds W (answerable, the answer is W and the word after it) or not."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(8, 12))]
        if i % 2:
            word = next(w for w in ("zebra", "violin", "comet", "harbour") if w not in words)
            rows.append({"id": f"n{seed}-{i}", "question": f"where is {word} ?", "context": " ".join(words),
                         "answers": {"text": [], "answer_start": []}})
            continue
        k = rng.randrange(len(words) - 1)
        start = len(" ".join(words[:k])) + (1 if k else 0)
        rows.append({"id": f"a{seed}-{i}", "question": f"where is {words[k]} ?", "context": " ".join(words),
                     "answers": {"text": [" ".join(words[k:k + 2])], "answer_start": [start]}})
    return rows


def test_an_unanswerable_record_needs_the_flag_and_then_targets_cls_in_every_window(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", unanswerable_rows(6, 1))
    spec = TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1)
    with pytest.raises(DataFormatError, match=r"train.jsonl:2.*no answer.*data.unanswerable: true"):
        dm = QADataModule(spec, str(path), max_length=16, doc_stride=4, max_question_length=6)
        dm.prepare_data()
    dm = QADataModule(spec, str(path), max_length=16, doc_stride=4, max_question_length=6, unanswerable=True)
    dm.prepare_data()
    dm.setup("fit")
    enc = dm.records("train")
    assert enc.stats["unanswerable"] == 3 and enc.fields["answers"][1] == []
    windows = [i for i, e in enumerate(enc.columns["example"]) if e % 2]
    assert len(windows) > 3  # long contexts: several windows each
    assert all(enc.columns["start"][i] == enc.columns["end"][i] == 0 for i in windows)
    answered = [i for i, e in enumerate(enc.columns["example"]) if not e % 2 and enc.columns["start"][i]]
    assert answered  # an answerable question points inside the window that holds its answer
    assert dm.facts().unanswerable is True


def test_a_squad2_run_tunes_tau_logs_hasans_noans_and_predicts_no_answer(tmp_path, capsys):
    from ptm_app.main import main

    root = tmp_path / "data"
    for split, seed, n in (("train", 1, 40), ("validation", 2, 12), ("test", 3, 8)):
        write_jsonl(root / f"{split}.jsonl", unanswerable_rows(n, seed))
    data = {"class_path": "QADataModule",
            "init_args": {"source": str(root), "batch_size": 8, "max_length": 32, "doc_stride": 8,
                          "max_question_length": 8, "unanswerable": True,
                          "tokenizer": {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}}}
    model = {"class_path": "QuestionAnsweringModule",
             "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 1e-2, "warmup": 0}}}
    cfg = {"seed_everything": 3, "model": model, "data": data,
           "trainer": {"max_steps": 6, "val_check_interval": 6, "accelerator": "cpu", "devices": 1,
                       "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1}}
    path = tmp_path / "squad2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    capsys.readouterr()
    assert run_main(["fit", "--config", str(path), "--run_name", "no_null"], runs) == 2  # the model lacks null_answer
    assert "set model.init_args.null_answer: true" in capsys.readouterr().err

    model["init_args"]["null_answer"] = True
    path.write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(path), "--run_name", "squad2"], runs) == 0
    run = runs / "squad2"
    import csv
    logged = [r for r in csv.DictReader(open(run / "logs" / "metrics.csv")) if r.get("val/no_ans_acc")]
    assert logged and {"val/has_ans_em", "val/has_ans_f1", "val/null_threshold"} <= set(logged[-1])
    f1, has_f1, no_acc = (float(logged[-1][k]) for k in ("val/f1", "val/has_ans_f1", "val/no_ans_acc"))
    assert f1 == pytest.approx((6 * has_f1 + 6 * no_acc) / 12, abs=1e-5)  # half of validation is unanswerable
    # best.ckpt is saved after validation has tuned τ (last.ckpt at the step, before it)
    ckpt = torch.load(run / "checkpoints" / "best.ckpt", weights_only=True, map_location="cpu")
    tau = float(ckpt["state_dict"]["stage_metrics.val.null_threshold"])
    assert tau == pytest.approx(float(logged[-1]["val/null_threshold"]))
    assert "stage_metrics.test.null_threshold" not in ckpt["state_dict"]  # tuned on validation: saved there only
    old = {**ckpt, "state_dict": {**ckpt["state_dict"], "stage_metrics.test.null_threshold": torch.tensor(0.0)}}
    torch.save(old, tmp_path / "old.ckpt")  # as checkpoints were written before: every stage kept a copy
    from ptm_app.adaptation.qa import QuestionAnsweringModule
    reloaded = QuestionAnsweringModule.load_from_checkpoint(tmp_path / "old.ckpt")
    assert float(reloaded.stage_metrics["val"].null_threshold) == pytest.approx(tau)

    # the export keeps τ: a context that cannot hold the answer is "no answer" once τ is above every null_diff
    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(run), "--output_dir", str(export)], runs) == 0
    from safetensors.torch import load_file, save_file
    weights = load_file(str(export / "module_weights.safetensors"))
    assert float(weights["stage_metrics.val.null_threshold"]) == pytest.approx(tau)
    question = ["--question", "where is zebra ?", "--context", "the cat sat on a mat while dogs ran"]
    for forced, no_answer in ((1e9, True), (-1e9, False)):
        weights["stage_metrics.val.null_threshold"] = torch.tensor(forced)
        save_file(weights, str(export / "module_weights.safetensors"))
        capsys.readouterr()
        assert main(["predict", "--ckpt_path", str(export), *question]) == 0
        row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert row["no_answer"] is no_answer and (row["answer"] == "") is no_answer


def test_a_squad2_run_paused_at_a_validation_resumes_exactly_with_its_tuned_threshold(tmp_path):
    root = tmp_path / "data"
    for split, seed, n in (("train", 1, 40), ("validation", 2, 12)):
        write_jsonl(root / f"{split}.jsonl", unanswerable_rows(n, seed))
    cfg = {"seed_everything": 3,
           "model": {"class_path": "QuestionAnsweringModule",
                     "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 1e-2, "warmup": 0},
                                   "null_answer": True}},
           "data": {"class_path": "QADataModule",
                    "init_args": {"source": str(root), "batch_size": 8, "max_length": 32, "doc_stride": 8,
                                  "max_question_length": 8, "unanswerable": True,
                                  "tokenizer": {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}}},
           "trainer": {"max_steps": 6, "val_check_interval": 3, "accelerator": "cpu", "devices": 1,
                       "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1}}
    path = tmp_path / "squad2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(path)], runs, stop=3, steps=6)
    import csv
    taus = [float(r["val/null_threshold"]) for r in csv.DictReader(open(runs / "part" / "logs" / "metrics.csv"))
            if r.get("val/null_threshold")]
    last = torch.load(runs / "part" / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert float(last["state_dict"]["stage_metrics.val.null_threshold"]) == pytest.approx(taus[-1])
