"""Token classification and extractive QA: alignment, windows, metrics, post-processing, and MiniLM end to
end through main.py on the prepared brown_pos and wordnet_qa sets."""
import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from ptm_app.training.trainer import PtmTrainer
from ptm_app.task_kinds.spans import BestSpans, best_span
from ptm_app.adaptation.token_classification import TokenClassificationModule
from ptm_app.data.sources import prepared_dir
from ptm_app.data.qa_data import QADataModule
from ptm_app.data.tagging_data import TokenTaskDataModule
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import DataFormatError
from ptm_app.task_kinds.metrics import (EntityF1, entity_f1, entity_spans, squad_em, squad_f1, squad_normalize,
                                   token_accuracy)
from tests.conftest import TINY_BERT, run_main, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
MINILM = TokenizerSpec(pretrained="minilm")
EVAL = ["--data.init_args.max_length", "64", "--data.init_args.eval_batch_size", "32",
        "--trainer.enable_progress_bar", "false"]
# 20 steps of 8 examples: a MiniLM step on 32 x 64 tokens takes seconds on 2 shared cores
QUICK = ["--trainer.max_steps", "20", "--trainer.max_epochs", "1", "--trainer.val_check_interval", "20",
         "--trainer.limit_val_batches", "4", "--trainer.num_sanity_val_steps", "0", "--data.init_args.batch_size", "8",
         *EVAL]


def val_metrics(run: Path) -> dict[str, float]:
    rows = [r for r in csv.DictReader(open(run / "logs" / "metrics.csv")) if r.get("val/loss")]
    return {k: float(v) for k, v in rows[-1].items() if v and k.startswith("val/")}


# -- first sub-token alignment (BERT §4.3) -----------------------------------------------------------
def test_only_the_first_sub_token_of_a_word_carries_its_label(tmp_path):
    rows = [{"id": "s1", "words": ["The", "unaffordable", "cat"], "tags": ["DET", "ADJ", "NOUN"]}]
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "validation.jsonl", rows)
    dm = TokenTaskDataModule(source=str(tmp_path), tokenizer=MINILM)
    dm.setup("fit")
    item = dm.datasets["train"][0]
    tokens = dm.tokenizer.convert_ids_to_tokens(item["input_ids"].tolist())
    assert tokens == ["[CLS]", "the", "una", "##ff", "##ord", "##able", "cat", "[SEP]"]
    tag = {t: i for i, t in enumerate(dm.label_set())}
    assert item["labels"].tolist() == [-100, tag["DET"], tag["ADJ"], -100, -100, -100, tag["NOUN"], -100]
    assert item["word_index"].tolist() == [-1, 0, 1, -1, -1, -1, 2, -1]


def test_words_beyond_max_length_are_counted_not_labelled(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"words": ["a", "unaffordable", "b", "c"], "tags": ["X", "Y", "X", "Y"]}])
    dm = TokenTaskDataModule(source=str(tmp_path / "train.jsonl"), tokenizer=MINILM, max_length=6, holdout=0.0)
    enc = dm._encode(dm.files["train"])  # [CLS] a una ##ff ##ord [SEP]: "b" and "c" are cut
    assert enc.columns["first_token"] == [[1, 2, -1, -1]] and enc.stats == {"truncated_words": 2, "empty_words": 0}


# -- tagging metrics ---------------------------------------------------------------------------------
def test_entity_spans_and_f1_are_exact_match_seqeval_style():
    gold = ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O", "B-ORG"]
    assert entity_spans(gold) == {("PER", 0, 1), ("LOC", 3, 4), ("ORG", 6, 6)}
    # I- without B- (IOB1 / ill-formed IOB2) starts an entity, as seqeval's default mode does;
    # I- of another type also starts a new one
    assert entity_spans(["O", "I-PER", "I-PER", "O"]) == {("PER", 1, 2)}
    assert entity_spans(["B-PER", "I-LOC", "B-LOC", "I-LOC"]) == {("PER", 0, 0), ("LOC", 1, 1), ("LOC", 2, 3)}
    assert entity_f1([gold], [gold]) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    # PER cut short (partial overlap = wrong), LOC right, ORG missed, a spurious MISC
    pred = ["B-PER", "O", "O", "B-LOC", "I-LOC", "B-MISC", "O"]
    scores = entity_f1([pred], [gold])
    assert scores["precision"] == pytest.approx(1 / 3) and scores["recall"] == pytest.approx(1 / 3)
    assert scores["f1"] == pytest.approx(1 / 3)
    assert entity_f1([["O", "O"]], [["O", "O"]])["f1"] == 0.0
    metric = EntityF1()  # accumulated over batches = computed over the concatenation
    metric.update([pred], [gold])
    metric.update([gold], [gold])
    assert float(metric.compute()["entity_f1"]) == pytest.approx(entity_f1([pred, gold], [gold, gold])["f1"])
    assert float(metric.compute()["entity_f1"]) == pytest.approx(4 / 6)


def test_module_logs_token_accuracy_and_entity_f1_for_bio_tags():
    module = TokenClassificationModule(backbone_config={**TINY_BERT, "vocab_size": 50}, labels=["B-PER", "I-PER", "O"]).build()
    # gold words: B-PER I-PER O B-PER; predicted: B-PER O O B-PER (argmax of these logits)
    logits = torch.nn.functional.one_hot(torch.tensor([[2, 0, 2, 2, 0, 1]]), 3).float()
    module.forward = lambda batch: logits
    batch = {"input_ids": torch.ones(1, 6, dtype=torch.long), "labels": torch.tensor([[-100, 0, 1, 2, 0, -100]])}
    trainer = PtmTrainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    metrics = trainer.validate(module, DataLoader([batch], batch_size=None), verbose=False)[0]
    assert metrics["val/acc"] == pytest.approx(3 / 4)  # the two -100 positions are not counted
    assert metrics["val/entity_f1"] == pytest.approx(1 / 2)  # (PER, 3, 3) right; (PER, 0, 0) != (PER, 0, 1)


def test_token_accuracy_ignores_minus_100():
    acc = token_accuracy(3)
    acc.update(torch.tensor([[1, 2, 0, 0]]), torch.tensor([[1, -100, 1, -100]]))
    assert float(acc.compute()) == 0.5


# -- SQuAD EM / F1 -----------------------------------------------------------------------------------
def test_squad_em_f1_normalisation_and_overlap():
    assert squad_normalize("  The Cat's, HAT!  an apple ") == "cats hat apple"
    assert squad_em("the Eiffel Tower.", ["Eiffel tower"]) == 1.0
    assert squad_em("Eiffel", ["Eiffel tower"]) == 0.0
    # pred {big, red, dog} vs gold {red, dog, barks}: 2 shared, P = R = 2/3
    assert squad_f1("the big red dog", ["red dog barks"]) == pytest.approx(2 / 3)
    # max over golds: "red" vs "red dog" has P = 1, R = 1/2, F1 = 2/3
    assert squad_f1("red", ["blue", "a red dog"]) == pytest.approx(2 / 3)
    assert squad_f1("", ["red"]) == 0.0 and squad_f1("green", ["red"]) == 0.0


# -- QA windows and post-processing (BERT §4.2) ------------------------------------------------------
@pytest.fixture(scope="module")
def long_context(tmp_path_factory) -> QADataModule:
    words = [f"w{i}" for i in range(60)]
    words[45:47] = ["purple", "elephants"]
    context = " ".join(words)
    row = {"id": "long", "question": "which animal is it?", "context": context,
           "answers": {"text": ["purple elephants"], "answer_start": [context.index("purple")]}}
    root = tmp_path_factory.mktemp("qa")
    write_jsonl(root / "train.jsonl", [row])
    write_jsonl(root / "validation.jsonl", [row])
    dm = QADataModule(source=str(root), tokenizer=MINILM, max_length=48, doc_stride=8, max_question_length=8)
    dm.setup("fit")
    return dm


def test_long_context_gives_overlapping_windows_with_exact_answer_positions(long_context):
    records = long_context.records("validation")
    f, context = SimpleNamespace(**records.columns), records.fields["context"][0]
    n = len(f.example)
    assert n >= 3 and f.example == [0] * n
    inside = [i for i in range(n) if f.start[i] > 0]
    assert inside and all(f.start[i] == f.end[i] == 0 for i in range(n) if i not in inside)  # else: [CLS]
    for i in inside:
        s, e = f.offsets[i][f.start[i]][0], f.offsets[i][f.end[i]][1]
        assert context[s:e] == "purple elephants"
    question = [i for i, o in enumerate(f.offsets[0]) if o == [-1, -1]]
    assert question[:2] == [0, 1] and len(f.input_ids[0]) == 48  # [CLS] + question tokens are outside the context
    shared = [{tuple(o) for o in f.offsets[i] if o != [-1, -1]} for i in (0, 1)]
    assert len(shared[0] & shared[1]) == 8  # doc_stride = tokens shared by consecutive windows


def test_post_processing_picks_the_best_context_span_never_the_question(long_context):
    records = long_context.records("validation")
    f = SimpleNamespace(**records.columns)
    window = next(i for i in range(len(f.example)) if f.start[i] > 0)
    first, last = f.start[window], f.end[window]
    offsets = torch.tensor(f.offsets[window])
    start, end = torch.zeros(len(offsets)), torch.zeros(len(offsets))
    start[1], end[2] = 50.0, 50.0  # the question's tokens score highest: must be ignored
    start[first], end[last] = 5.0, 5.0
    start[last + 1], end[first] = 9.0, 1.0  # a start after the answer's end: any span from it scores <= 9
    score, s, e = best_span(start, end, offsets)
    assert records.fields["context"][0][s:e] == "purple elephants" and score == 10.0
    assert best_span(start, end, offsets, max_answer_length=1)[0] < 10.0  # the 2-token answer is too long now
    assert best_span(start, end, torch.full_like(offsets, -1)) == (float("-inf"), -1, -1)
    spans = BestSpans()  # the best window of each example wins
    spans.update(torch.tensor([0, 0, 1]), torch.tensor([3.0, 7.0, 1.0]), torch.tensor([0, 5, 2]),
                 torch.tensor([4, 9, 3]))
    assert spans.compute() == {0: (7.0, 5, 9, float("-inf")), 1: (1.0, 2, 3, float("-inf"))}  # no null score given


# -- one-line data errors ----------------------------------------------------------------------------
def test_tag_outside_the_label_set_names_file_and_line(tmp_path, capsys):
    write_jsonl(tmp_path / "data" / "train.jsonl", [{"words": ["a", "cat"], "tags": ["DET", "NOUN"]}] * 4)
    write_jsonl(tmp_path / "data" / "validation.jsonl", [{"words": ["a", "cat"], "tags": ["DET", "NOUN"]},
                                                         {"words": ["a", "dog"], "tags": ["DET", "ANIMAL"]}])
    dm = TokenTaskDataModule(source=str(tmp_path / "data"), tokenizer=MINILM)
    with pytest.raises(DataFormatError, match=r"validation\.jsonl:2: tag 'ANIMAL' is not in the label set"):
        dm.setup("fit")
    cfg = {"seed_everything": 1, "trainer": {"max_steps": 1, "accelerator": "cpu", "enable_progress_bar": False},
           "model": {"class_path": "ptm_app.adaptation.token_classification.TokenClassificationModule",
                     "init_args": {"backbone_config": TINY_BERT}},
           "data": {"class_path": "ptm_app.data.tagging_data.TokenTaskDataModule",
                    "init_args": {"source": str(tmp_path / "data"), "tokenizer": {"pretrained": "minilm"}}}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    assert run_main(["fit", "--config", str(tmp_path / "bad.yaml")], tmp_path / "runs") == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0] and "validation.jsonl:2: tag 'ANIMAL'" in errors[0], err


# -- MiniLM end to end through main.py ---------------------------------------------------------------
@pytest.fixture(scope="module")
def pos_run(tmp_path_factory):
    prepared_dir("brown_pos"), prepared_dir("minilm")
    runs, cfg = tmp_path_factory.mktemp("pos"), str(ROOT / "configs" / "adapt" / "minilm_full_brown_pos.yaml")
    assert run_main(["fit", "--config", cfg, *QUICK], runs) == 0
    return runs / "minilm_full_brown_pos", cfg


@pytest.fixture(scope="module")
def qa_run(tmp_path_factory):
    prepared_dir("wordnet_qa"), prepared_dir("minilm")
    runs, cfg = tmp_path_factory.mktemp("qa"), str(ROOT / "configs" / "adapt" / "minilm_full_wordnet_qa.yaml")
    assert run_main(["fit", "--config", cfg, *QUICK], runs) == 0
    return runs / "minilm_full_wordnet_qa", cfg


def test_minilm_learns_brown_pos_and_predicts_one_tag_per_word(pos_run):
    run, cfg = pos_run
    acc = val_metrics(run)["val/acc"]
    assert acc > 0.5, acc  # 12 tags; the majority tag (NOUN) is ~23 % of the words
    assert "val/entity_f1" not in val_metrics(run)  # POS tags are not BIO
    argv = ["predict", "--config", cfg, "--ckpt_path", "best", "--trainer.limit_predict_batches", "1", *EVAL]
    assert run_main(argv, run.parent) == 0
    rows = [json.loads(line) for line in open(run / "predictions.jsonl")]
    gold = [json.loads(line) for line in open(prepared_dir("brown_pos") / "test.jsonl")][: len(rows)]
    assert len(rows) == 32 and [r["id"] for r in rows] == [g["id"] for g in gold]
    pairs = [(p, t) for r, g in zip(rows, gold) for p, t in zip(r["tags"], g["tags"], strict=True) if p is not None]
    assert sum(p == t for p, t in pairs) / len(pairs) > 0.5


def test_minilm_learns_wordnet_qa_and_tests_from_best(qa_run):
    run, cfg = qa_run
    metrics = val_metrics(run)
    assert metrics["val/f1"] > 0.05 and 0.0 <= metrics["val/em"] <= metrics["val/f1"], metrics
    argv = ["--config", cfg, "--ckpt_path", "best", *EVAL]
    assert run_main(["test", *argv, "--trainer.limit_test_batches", "2"], run.parent) == 0
    summary = json.loads((run / "summary.json").read_text())["metrics"]
    assert summary["test/f1"] > 0.05 and "test/em" in summary, summary
    assert run_main(["predict", *argv, "--trainer.limit_predict_batches", "1"], run.parent) == 0
    rows = [json.loads(line) for line in open(run / "predictions.jsonl")]
    assert len(rows) >= 28  # one row per example (32 windows, nearly all from distinct examples)
    for r in rows:
        start = r["answer_start"]
        assert r["answer"] and r["context"][start:start + len(r["answer"])] == r["answer"]
