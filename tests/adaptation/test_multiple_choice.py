"""Multiple choice as a task kind (task_kinds.registry "choice"): one registry entry plus its data module, usable alone
(MultipleChoiceModule) and in multitask runs; the WordNet-derived set it ships with."""
import json
import random

import pytest
import torch
import yaml

from ptm_app.data.choice_data import MultipleChoiceDataModule
from ptm_app.data.collators import ChoiceCollator
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.errors import DataFormatError
from ptm_app.task_kinds.registry import TASK_KINDS, task_kind
from tests.conftest import TINY_BERT, WORDS, run_main, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")


def questions(n: int, seed: int) -> list[dict]:
    """The right choice is the one that says 'right'; the others say 'wrong' (a rule a tiny model can learn)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = rng.randrange(4)
        choices = [" ".join(rng.choice(WORDS) for _ in range(4)) + (" right" if c == label else " wrong")
                   for c in range(4)]
        rows.append({"id": f"q{seed}-{i}", "text": " ".join(rng.choice(WORDS) for _ in range(3)),
                     "choices": choices, "label": label})
    return rows


@pytest.fixture(scope="module")
def choice_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("choice")
    for split, n, seed in (("train", 96, 1), ("validation", 32, 2), ("test", 32, 3)):
        write_jsonl(root / f"{split}.jsonl", questions(n, seed))
    return root


def test_choice_loss_is_the_softmax_cross_entropy_over_each_questions_choices():
    scores, labels = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 1.0, 3.0, 0.0]]), torch.tensor([0, 2])
    expected = -(torch.log_softmax(scores, -1)[0, 0] + torch.log_softmax(scores, -1)[1, 2]) / 2
    kind = TASK_KINDS["choice"]
    assert kind.loss(scores, {"labels": labels}).item() == pytest.approx(expected.item())
    assert task_kind("multiple_choice") is kind  # the old name still reads
    out = kind.outputs(torch.arange(8.0).view(8, 1), {"labels": labels})  # [B*N, 1] head output -> [B, N]
    assert out.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]] and kind.main_metric == "acc"


def test_collator_flattens_questions_times_choices():
    examples = [{"choices": [torch.tensor([1, 2]), torch.tensor([1, 2, 3])], "label": 1, "key": 0},
                {"choices": [torch.tensor([4]), torch.tensor([5, 6])], "label": 0, "key": 1}]
    batch = ChoiceCollator(pad_token_id=0)(examples)
    assert batch["input_ids"].tolist() == [[1, 2, 0], [1, 2, 3], [4, 0, 0], [5, 6, 0]]
    assert batch["attention_mask"].sum(-1).tolist() == [2, 3, 1, 2] and batch["labels"].tolist() == [1, 0]


@pytest.mark.parametrize("bad, message", [
    ({"text": "q", "choices": ["a", "b", "c", "d"], "label": 4}, "is not a choice index 0..3"),
    ({"text": "q", "choices": ["a", "b", "c"], "label": 0}, "3 choices where the others have 4"),
    ({"text": "q", "choices": "not a list", "label": 0}, "must be a list of at least 2 strings"),
])
def test_a_malformed_question_is_named_by_file_and_line(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "train.jsonl", [*questions(2, 0), bad])
    data = MultipleChoiceDataModule(source=str(path), tokenizer=TokenizerSpec(pretrained="minilm"))
    with pytest.raises(DataFormatError) as err:
        data.prepare_data()
    assert str(err.value).startswith(f"{path}:3: ") and message in str(err.value)


def _config(tmp_path, corpus, multitask: bool):
    tok = {"train": "wordpiece", "vocab_size": 120, "min_frequency": 1}
    choice = {"source": str(corpus), "max_length": 24, "batch_size": 8}
    if multitask:
        from tests.conftest import make_docs

        write_jsonl(tmp_path / "cls" / "train.jsonl", make_docs(40, 1))
        write_jsonl(tmp_path / "cls" / "validation.jsonl", make_docs(10, 2))
        model = {"class_path": "MultitaskModule", "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 2e-3}}}
        data = {"class_path": "MultitaskDataModule", "init_args": {"tokenizer": tok, "mixing": "uniform", "tasks": {
            "topic": {"class_path": "TaskDataModule", "init_args": {"source": str(tmp_path / "cls"), "max_length": 32}},
            "choice": {"class_path": "MultipleChoiceDataModule", "init_args": choice}}}}
    else:
        model = {"class_path": "MultipleChoiceModule", "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 2e-3}}}
        data = {"class_path": "MultipleChoiceDataModule", "init_args": {**choice, "tokenizer": tok}}
    cfg = {"seed_everything": 5, "model": model, "data": data,
           "trainer": {"max_steps": 60, "accelerator": "cpu", "val_check_interval": 60, "check_val_every_n_epoch": None,
                       "log_every_n_steps": 10, "enable_progress_bar": False, "enable_model_summary": False}}
    path = tmp_path / "choice.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_multiple_choice_module_learns_and_predicts(choice_corpus, tmp_path):
    cfg = _config(tmp_path, choice_corpus, multitask=False)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(cfg), "--run_name", "mc"], runs) == 0
    metrics = json.loads((runs / "mc" / "summary.json").read_text())["metrics"]
    assert metrics["val/acc"] > 0.8  # chance is 0.25
    assert run_main(["predict", "--config", str(cfg), "--run_name", "mc", "--ckpt_path", "last"], runs) == 0
    rows = [json.loads(line) for line in (runs / "mc" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and set(rows[0]["probs"]) == {"0", "1", "2", "3"}
    gold = {q["id"]: str(q["label"]) for q in questions(32, 3)}
    assert sum(r["label"] == gold[r["id"]] for r in rows) / len(rows) > 0.8


def test_multiple_choice_is_a_multitask_task(choice_corpus, tmp_path):
    cfg = _config(tmp_path, choice_corpus, multitask=True)
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(cfg), "--run_name", "mt"], runs) == 0
    metrics = json.loads((runs / "mt" / "summary.json").read_text())["metrics"]
    assert metrics["val/choice/acc"] > 0.6 and "val/topic/acc" in metrics
    assert metrics["val/macro"] == pytest.approx((metrics["val/choice/acc"] + metrics["val/topic/acc"]) / 2, abs=1e-6)


def test_the_wordnet_choice_set_has_one_right_definition_per_word():
    from ptm_app.data.sources import prepared_dir

    root = prepared_dir("wordnet_choice")
    rows = [json.loads(line) for line in (root / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 2000 and all(len(r["choices"]) == 4 and 0 <= r["label"] < 4 for r in rows)
    assert all(len(set(r["choices"])) == 4 for r in rows)  # four different definitions
    positions = [sum(r["label"] == k for r in rows) / len(rows) for k in range(4)]
    assert all(abs(p - 0.25) < 0.04 for p in positions)  # the right answer is not always in one place
    first = json.loads((root / "train.jsonl").read_text().splitlines()[0])
    assert first["id"] == "00001837-r" and first["text"] == "AD"
    assert first["choices"][first["label"]].startswith("in the Christian era")
