"""Fine-tuning MiniLM on the real BBC topics through main.py; predictions; sentence pairs."""
import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.data.datamodules import TaskDataModule
from ptm_app.data.sources import prepared_dir
from ptm_app.data.tokenizer import TokenizerSpec
from tests.conftest import run_main, write_jsonl


@pytest.fixture(scope="module")
def bbc_run(tmp_path_factory):
    prepared_dir("bbc"), prepared_dir("minilm")  # fail loudly (with the fix) if `make data` was not run
    tmp = tmp_path_factory.mktemp("bbc")
    cfg = {
        "seed_everything": 1,
        "trainer": {"max_steps": 40, "accelerator": "cpu", "val_check_interval": 40,
                    "limit_val_batches": 4, "log_every_n_steps": 5, "enable_progress_bar": False},
        "model": {"class_path": "SequenceClassificationModule",
                  "init_args": {"backbone": "minilm", "optim": {"lr": 2e-4, "warmup": 0.1}}},
        "data": {"class_path": "TaskDataModule",
                 "init_args": {"source": "bbc", "tokenizer": {"pretrained": "minilm"}, "max_length": 64,
                               "batch_size": 16, "eval_batch_size": 32}},
    }
    path = tmp / "bbc.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp / "runs"
    assert run_main(["fit", "--config", str(path)], runs) == 0
    return runs / "bbc", path


def test_minilm_learns_bbc_topics(bbc_run):
    run, _ = bbc_run
    rows = [r for r in csv.DictReader(open(run / "logs" / "metrics.csv")) if r.get("val/acc")]
    acc, f1 = float(rows[-1]["val/acc"]), float(rows[-1]["val/f1_macro"])
    assert acc > 0.8 and f1 > 0.75, (acc, f1)  # 5 classes: chance is ~0.24


def test_predict_writes_labels_and_probabilities(bbc_run):
    run, cfg = bbc_run
    assert run_main(["predict", "--config", str(cfg), "--ckpt_path", "best"], run.parent) == 0
    rows = [json.loads(line) for line in open(run / "predictions.jsonl")]
    test_ids = [json.loads(line)["id"] for line in open(prepared_dir("bbc") / "test.jsonl")]
    assert [r["id"] for r in rows] == test_ids
    labels = {"business", "entertainment", "politics", "sports", "tech"}
    for r in rows:
        assert set(r["probs"]) == labels and abs(sum(r["probs"].values()) - 1) < 1e-3
        assert r["label"] == max(r["probs"], key=r["probs"].get)
    gold = {json.loads(line)["id"]: json.loads(line)["label"] for line in open(prepared_dir("bbc") / "test.jsonl")}
    assert sum(r["label"] == gold[r["id"]] for r in rows) / len(rows) > 0.8


def test_tweets_label_set_and_pairs(tmp_path):
    dm = TaskDataModule(source="tweets", tokenizer=TokenizerSpec(pretrained="minilm"), limit_train=64)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.label_set() == ["negative", "neutral", "positive"] and len(dm.datasets["train"]) == 64
    corpus = tmp_path / "pairs"
    rows = [{"premise": "a cat sat", "hypothesis": "an animal sat", "label": "yes"},
            {"premise": "a cat sat", "hypothesis": "markets fell", "label": "no"}]
    write_jsonl(corpus / "train.jsonl", rows * 4)
    pairs = TaskDataModule(source=str(corpus), tokenizer=TokenizerSpec(pretrained="minilm"),
                           text_field="premise", text_pair_field="hypothesis")
    pairs.setup("fit")
    batch = next(iter(pairs.train_dataloader()))
    assert "token_type_ids" in batch and batch["token_type_ids"].max() == 1
    assert len(pairs.datasets["validation"]) >= 1  # held out from train when there is no validation file
