"""One encoded-split type for every labelled kind, kept in the tokenize-once cache (data.encoded)."""
import os
from pathlib import Path

import numpy as np

from ptm_app.data.choice_data import MultipleChoiceDataModule
from ptm_app.data.datamodules import TaskDataModule
from ptm_app.data.encoded import EncodedSplit, Ragged, encoded_split
from ptm_app.data.generation_data import Seq2SeqDataModule
from ptm_app.data.prompt_data import PromptDataModule
from ptm_app.data.qa_data import QADataModule
from ptm_app.data.tagging_data import TokenTaskDataModule
from ptm_app.data.tokenizer import TokenizerSpec
from tests.conftest import write_jsonl

MINILM = TokenizerSpec(pretrained="minilm")
CONTEXT = "the cat sat on the mat while dogs ran in the park"


def _cached() -> set[Path]:
    return set((Path(os.environ["PTM_CACHE_DIR"]) / "encoded").glob("*.json"))


def test_every_labelled_kind_is_one_split_type_built_once(tmp_path):
    rows = {
        "text": [{"id": "a", "text": "the cat sat", "label": "x"}, {"text": "dogs ran in the park", "label": "y"}],
        "tagged": [{"id": "a", "words": ["the", "cat"], "tags": ["D", "N"]}, {"words": ["dogs"], "tags": ["N"]}],
        "qa": [{"id": "a", "question": "who sat?", "context": CONTEXT,
                "answers": {"text": ["the cat"], "answer_start": [0]}},
               {"question": "where?", "context": CONTEXT, "answers": {"text": ["the park"], "answer_start": [41]}}],
        "choice": [{"id": "a", "text": "cat", "choices": ["an animal", "a tree", "a car"], "label": 0},
                   {"text": "oak", "choices": ["an animal", "a tree", "a car"], "label": 1}],
        "pairs": [{"id": "a", "text": "the cat sat on the mat", "target": "cat sits"},
                  {"text": "dogs ran in the park", "target": "dogs run"}],
    }
    files = {name: write_jsonl(tmp_path / name / "train.jsonl", r) for name, r in rows.items()}
    modules = {
        "sequence": lambda: TaskDataModule(MINILM, str(files["text"])),
        "prompt": lambda: PromptDataModule(MINILM, str(files["text"])),
        "tagged": lambda: TokenTaskDataModule(MINILM, str(files["tagged"])),
        "qa": lambda: QADataModule(MINILM, str(files["qa"]), max_length=12, doc_stride=2, max_question_length=3),
        "choice": lambda: MultipleChoiceDataModule(MINILM, str(files["choice"])),
        "seq2seq": lambda: Seq2SeqDataModule(MINILM, str(files["pairs"])),
    }

    def encode(dm) -> EncodedSplit:
        return (dm._read if isinstance(dm, MultipleChoiceDataModule) else dm._encode)(dm.files["train"])

    before, splits = _cached(), {}
    for kind, make in modules.items():
        enc = splits[kind] = encode(make())
        assert isinstance(enc, EncodedSplit) and len(enc) == 2 and enc.lines == [1, 2]
        assert enc.ids == ["a", "train.jsonl:2"] and enc.path.endswith("train.jsonl")
        assert encode(make()) == enc  # a new data module reads the cached split back unchanged
    assert len(_cached() - before) == len(modules)  # one cache file per kind, none shared
    tok = TaskDataModule(MINILM, str(files["text"])).load_tokenizer()
    sequence, prompt = splits["sequence"], splits["prompt"]
    assert sequence.fields == prompt.fields == {"text": ["the cat sat", "dogs ran in the park"], "label": ["x", "y"]}
    # same file and fields, two kinds: [CLS] text [SEP] for classification, the bare text for a prompt's template
    assert sequence.columns["input_ids"][0] == [tok.cls_token_id, *prompt.columns["text_ids"][0], tok.sep_token_id]
    assert set(prompt.columns) == {"text_ids"}  # no text pair field: no pair column
    assert splits["tagged"].columns["first_token"] == [[1, 2], [1]]
    assert splits["tagged"].stats == {"truncated_words": 0, "empty_words": 0}
    qa = splits["qa"]
    assert len(qa.columns["input_ids"]) == len(qa.columns["example"]) > 2  # more windows than records
    assert qa.fields["answers"] == [["the cat"], ["the park"]] and qa.stats == {"truncated_questions": 0, "unanswerable": 0}
    choice = splits["choice"]
    assert [len(q) for q in choice.columns["input_ids"]] == [3, 3] and choice.fields["label"] == [0, 1]
    assert tok.convert_ids_to_tokens(splits["seq2seq"].columns["target_ids"][1]) == ["dogs", "run"]


def test_a_cached_split_is_built_once_per_kind_and_key():
    built = []

    def build(n: int):
        built.append(n)
        return EncodedSplit(columns={"input_ids": [[n]]}, fields={}, lines=[1], path="f")

    key = ["a-key-only-this-test-uses"]
    first = encoded_split("one", key, lambda: build(1))
    again = encoded_split("one", key, lambda: build(2))
    other = encoded_split("two", key, lambda: build(3))
    assert built == [1, 3] and again == first and first.columns == {"input_ids": [[1]]}
    assert other.columns == {"input_ids": [[3]]}  # the kind is part of the key


def test_ragged_rows_slice_flat_values():
    rows = Ragged(np.arange(1, 7, dtype=np.int32), np.array([0, 2, 2, 6]))
    assert len(rows) == 3 and [rows[i] for i in range(3)] == [[1, 2], [], [3, 4, 5, 6]]
