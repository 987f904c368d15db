"""GLUE-style metrics (MCC, the positive class's F1, Pearson / Spearman) on hand-computed cases, regression
targets read with file:line errors, and regression fine-tuning from YAML through main.py."""
import csv
import json
import math
import random
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.task_kinds.label_scores import label_metrics, regression_metrics
from tests.conftest import TINY_BERT, run_main, write_jsonl


def test_mcc_and_positive_f1_match_hand_computed_values():
    preds = torch.tensor([1, 1, 0, 0, 1, 0, 1, 1])
    gold = torch.tensor([1, 0, 0, 0, 1, 1, 1, 1])
    tp, fp, tn, fn = 4, 1, 2, 1
    metrics = label_metrics(2)
    values = {k: float(v) for k, v in metrics(preds, gold).items()}
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert values["mcc"] == pytest.approx(mcc, abs=1e-6)
    assert values["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-6)
    assert values["acc"] == pytest.approx(6 / 8)
    # with class 0 as the positive class, its F1 is scored instead
    neg = {k: float(v) for k, v in label_metrics(2, positive=0)(preds, gold).items()}
    assert neg["f1"] == pytest.approx(2 * tn / (2 * tn + fn + fp), abs=1e-6)
    assert "f1" not in label_metrics(3)  # multiclass: macro-F1 only


def test_pearson_and_spearman_match_hand_computed_values():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    y = torch.tensor([2.0, 1.0, 4.0, 3.0, 10.0])
    values = {k: float(v) for k, v in regression_metrics()(x, y).items()}
    xm, ym = x - x.mean(), y - y.mean()
    assert values["pearson"] == pytest.approx(float((xm * ym).sum() / (xm.norm() * ym.norm())), abs=1e-5)
    # ranks of y: 2,1,4,3,5 -> Spearman = 1 - 6*sum(d^2)/(n(n^2-1)) with d = (1,1,1,1,0)
    assert values["spearman"] == pytest.approx(1 - 6 * 4 / (5 * 24), abs=1e-5)
    assert values["mse"] == pytest.approx(float(((x - y) ** 2).mean()))


def test_a_non_numeric_regression_target_names_file_and_line(tmp_path, capsys):
    rows = _scored(40, 5)
    rows[1]["score"] = "high"
    write_jsonl(tmp_path / "data" / "train.jsonl", rows)
    cfg = _config(tmp_path, tmp_path / "data", steps=1)
    assert run_main(["fit", "--config", str(cfg)], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == err[-1], err
    assert "train.jsonl:2" in errors[0] and "'high'" in errors[0]


def _scored(n: int, seed: int) -> list[dict]:
    """Six-word texts; the target is the share of the words 'joy' and 'song' in them (0 .. 1)."""
    rng = random.Random(seed)
    pool = "cat sat mat dog ran park bird rose fell bank said".split()
    rows = []
    for i in range(n):
        k = rng.randint(0, 6)
        words = [rng.choice(["joy", "song"]) for _ in range(k)] + [rng.choice(pool) for _ in range(6 - k)]
        rng.shuffle(words)
        rows.append({"id": f"r{seed}-{i}", "text": " ".join(words), "score": k / 6})
    return rows


def _config(tmp: Path, data: Path, steps: int) -> Path:
    cfg = {
        "seed_everything": 3,
        "trainer": {"max_steps": steps, "accelerator": "cpu", "check_val_every_n_epoch": None,
                    "val_check_interval": steps, "log_every_n_steps": 1,
                    "enable_progress_bar": False, "enable_model_summary": False},
        "model": {"class_path": "SequenceRegressionModule",
                  "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 3e-3, "warmup": 5}}},
        "data": {"class_path": "TaskDataModule",
                 "init_args": {"source": str(data), "task": "regression", "label_field": "score", "max_length": 16,
                               "batch_size": 16,
                               "tokenizer": {"train": "wordpiece", "vocab_size": 120, "min_frequency": 1}}},
    }
    path = tmp / "regression.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_regression_fine_tuning_learns_a_real_valued_target(tmp_path):
    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", _scored(320, 1))
    write_jsonl(data / "validation.jsonl", _scored(80, 2))
    write_jsonl(data / "test.jsonl", _scored(40, 3))
    cfg, runs = _config(tmp_path, data, steps=120), tmp_path / "runs"
    assert run_main(["fit", "--config", str(cfg)], runs) == 0
    rows = list(csv.DictReader(open(runs / "regression" / "logs" / "metrics.csv")))
    val = [r for r in rows if r.get("val/pearson")][-1]
    assert float(val["val/pearson"]) > 0.8 and float(val["val/spearman"]) > 0.8  # an untrained head is ~0
    assert float(val["val/mse"]) < 0.03  # the targets' variance is ~0.1
    assert run_main(["predict", "--config", str(cfg), "--ckpt_path", "last"], runs) == 0
    preds = [json.loads(line) for line in open(runs / "regression" / "predictions.jsonl")]
    assert len(preds) == 40 and all(isinstance(p["value"], float) for p in preds)
    assert {"id", "text", "value"} <= set(preds[0])


def test_records_without_a_target_are_an_error_or_skipped_and_counted(tmp_path, capsys):
    from ptm_app.data.tasks import read_labelled

    rows = _scored(6, 9)
    rows[2]["score"] = None
    del rows[4]["score"]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    fields = dict(text_field="text", text_pair_field=None, label_field="score", id_field="id")
    from ptm_app.errors import DataFormatError

    with pytest.raises(DataFormatError, match="train.jsonl:3"):
        read_labelled(path, **fields)
    kept = read_labelled(path, **fields, unlabelled="skip")
    assert kept.lines == [1, 2, 4, 6] and len(kept.labels) == 4
    assert "skipped 2 of 6 records without 'score'" in capsys.readouterr().out
