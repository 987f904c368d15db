"""The multilabel task kind (task_kinds.multilabel): its loss, F1 and threshold tuning against hand-computed numbers,
its data's bad input in one line, the OpenMoji source's records, and a tiny run whose tuned thresholds travel in the
checkpoint and the export and decide ``predict``'s label sets."""
import io
import json
import math
import tarfile
from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.errors import PtmError
from ptm_app.main import main
from ptm_app.task_kinds.multilabel import KIND, LabelSetMetrics, SigmoidBCE, f1_scores, tune_thresholds
from ptm_app.task_kinds.registry import TASK_KINDS
from tests.conftest import TINY_BERT, run_main, write_jsonl

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_kind_is_one_registry_entry_of_the_sequence_classification_model():
    assert TASK_KINDS["multilabel"] is KIND and KIND.auto_class == "AutoModelForSequenceClassification"
    assert KIND.peft_task_type == "SEQ_CLS" and KIND.problem_type == "multi_label_classification"
    assert KIND.main_metric == "f1_micro" and KIND.prediction.form.name == "text"


def test_loss_is_the_mean_binary_cross_entropy_of_each_labels_sigmoid():
    logits, gold = torch.tensor([[2.0, -1.0], [0.5, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    hand = -(math.log(sig(2.0)) + math.log(1 - sig(-1.0)) + math.log(1 - sig(0.5)) + math.log(sig(0.0))) / 4
    assert SigmoidBCE()(logits, {"labels": gold}).item() == pytest.approx(hand, rel=1e-6)


def test_micro_and_macro_f1_match_hand_computed_values():
    probs = torch.tensor([[0.9, 0.2, 0.6], [0.4, 0.8, 0.1], [0.7, 0.3, 0.9]])
    gold = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]])
    # at 0.5: label 0 TP 1 FP 1 FN 1 (F1 1/2), label 1 TP 1 (F1 1), label 2 TP 1 FP 1 (F1 2/3)
    scores = f1_scores(probs, gold, torch.full((3,), 0.5))
    assert scores["f1_micro"].item() == pytest.approx(6 / 9)  # 2·3 / (2·3 + 2 FP + 1 FN)
    assert scores["f1_macro"].item() == pytest.approx((1 / 2 + 1 + 2 / 3) / 3)
    # a label neither predicted nor present counts 0 in the macro mean (scikit-learn's zero_division=0)
    assert f1_scores(torch.tensor([[0.9, 0.1]]), torch.tensor([[1, 0]]), torch.full((2,), 0.5))["f1_macro"] == 0.5


def test_threshold_tuner_picks_each_labels_best_f1_cut_on_a_constructed_case():
    probs = torch.tensor([[0.9, 0.3, 0.7], [0.8, 0.2, 0.7], [0.6, 0.1, 0.5], [0.4, 0.1, 0.5], [0.3, 0.4, 0.5],
                          [0.1, 0.2, 0.1]])
    gold = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 0, 0], [1, 0, 0], [0, 0, 1], [0, 0, 0]])
    cuts = tune_thresholds(probs, gold)
    # label 0 (3 positives): F1 at cuts 0.9 .8 .6 .4 .3 .1 = 2/4, 2/5, 4/6, 6/7, 6/8, 6/9: the best cut is 0.4
    # label 1: no positive in validation, keeps 0.5
    # label 2 (2 positives, ties): cut 0.7 predicts both 0.7s (F1 2/4), cut 0.5 five rows (F1 4/7 > 1/2); never half a
    # tie group (the first 0.7 alone would score 2/3)
    assert cuts.tolist() == pytest.approx([0.4, 0.5, 0.5])
    metric = LabelSetMetrics()
    val, test = metric.build(["a", "b", "c"]), metric.build(["a", "b", "c"])
    metric.update(val, torch.logit(probs), {"labels": gold}, {})
    values = metric.compute(val, lambda: None, val)  # the validation stage tunes and keeps its cuts
    assert val.thresholds.tolist() == pytest.approx([0.4, 0.5, 0.5])
    assert values["f1_micro"].item() == pytest.approx(f1_scores(probs, gold, cuts)["f1_micro"].item())
    metric.update(test, torch.logit(probs), {"labels": gold}, {})
    metric.compute(test, lambda: None, val)  # the test stage uses validation's cuts, tunes nothing
    assert test.thresholds.tolist() == [0.5, 0.5, 0.5] and "thresholds" in val.state_dict()


def test_bad_multilabel_records_are_one_line_with_file_and_line(tmp_path):
    from ptm_app.data.multilabel_data import MultiLabelDataModule
    from ptm_app.data.tokenizer import TokenizerSpec

    tok = TokenizerSpec(train="wordpiece", vocab_size=120, min_frequency=1)
    write_jsonl(tmp_path / "train.jsonl", [{"id": "a", "text": "the cat", "labels": ["animal"]},
                                           {"id": "b", "text": "the bank", "labels": ["money"]}])
    write_jsonl(tmp_path / "test.jsonl", [{"id": "c", "text": "a dog", "labels": ["animal", "pet"]}])
    data = MultiLabelDataModule(tok, source=str(tmp_path), batch_size=2)
    with pytest.raises(PtmError, match=r"test.jsonl:1: label 'pet' is not in the label set \(the labels seen in "
                                       r"training, 2 labels\); fix the label or add it to data.labels"):
        data.setup()
    write_jsonl(tmp_path / "test.jsonl", [{"id": "c", "text": "a dog", "labels": "animal"}])
    with pytest.raises(PtmError, match=r"test.jsonl:1: 'labels' must be a list of label names"):
        MultiLabelDataModule(tok, source=str(tmp_path), batch_size=2).setup()


def test_openmoji_source_keeps_tags_with_enough_emoji_and_drops_skin_tone_variants(tmp_path, monkeypatch):
    from ptm_app.data.sources import SOURCES, openmoji

    monkeypatch.setattr(openmoji, "MIN_EXAMPLES", 2)
    entries = [{"hexcode": "1F600", "annotation": "grinning face", "group": "smileys-emotion", "skintone": "",
                "tags": "face, grin", "openmoji_tags": "Smile"},
               {"hexcode": "1F603", "annotation": "smiling face", "group": "smileys-emotion", "skintone": "",
                "tags": "face, smile", "openmoji_tags": ""},
               {"hexcode": "1F44B-1F3FB", "annotation": "waving hand: light skin tone", "group": "people-body",
                "skintone": 1, "tags": "face", "openmoji_tags": ""},
               {"hexcode": "1F4B0", "annotation": "money bag", "group": "objects", "skintone": "", "tags": "bag",
                "openmoji_tags": ""}]
    archive = tmp_path / "openmoji-17.0.0.tgz"
    with tarfile.open(archive, "w:gz") as tf:
        raw = json.dumps(entries).encode()
        info = tarfile.TarInfo("package/data/openmoji.json")
        info.size = len(raw)
        tf.addfile(info, io.BytesIO(raw))
    records, stats = openmoji.read(archive)
    assert records == [{"id": "1F600", "text": "grinning face", "labels": ["face", "smile"], "group": "smileys-emotion"},
                       {"id": "1F603", "text": "smiling face", "labels": ["face", "smile"], "group": "smileys-emotion"}]
    assert (stats["dropped_skin_tone_variants"], stats["dropped_without_a_label"], stats["labels"]) == (1, 1, 2)
    source = SOURCES["openmoji"]
    assert source.artifact.registry == "npm" and source.artifact.version == "17.0.0" and len(source.artifact.sha256) == 64
    assert "CC BY-SA 4.0" in source.licence and source.split_by == "group" and source.private_fields == ("group",)


WORDS = {"animal": ["cat", "dog", "bird"], "money": ["bank", "shares", "profit"], "weather": ["rain", "sun", "wind"]}


def label_sets(n: int, seed: int) -> list[dict]:
    import random

    rng, rows = random.Random(seed), []
    for i in range(n):
        labels = sorted(rng.sample(list(WORDS), rng.randint(1, 2)))
        words = [rng.choice(WORDS[label]) for label in labels for _ in range(2)] + ["the", "a"]
        rng.shuffle(words)
        rows.append({"id": f"m{seed}-{i}", "text": " ".join(words), "labels": labels})
    return rows


def test_tuned_thresholds_travel_in_checkpoint_and_export_and_decide_predicted_label_sets(tmp_path, capsys):
    from safetensors.torch import load_file

    root = tmp_path / "sets"
    for split, seed, n in (("train", 1, 48), ("validation", 2, 16), ("test", 3, 8)):
        write_jsonl(root / f"{split}.jsonl", label_sets(n, seed))
    cfg = {"seed_everything": 5,
           "trainer": {"max_steps": 12, "val_check_interval": 6, "accelerator": "cpu", "devices": 1,
                       "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1},
           "model": {"class_path": "SequenceClassificationModule",
                     "init_args": {"backbone_config": TINY_BERT, "kind": "multilabel", "optim": {"lr": 1e-2, "warmup": 0}}},
           "data": {"class_path": "MultiLabelDataModule",
                    "init_args": {"source": str(root), "batch_size": 8, "max_length": 16,
                                  "tokenizer": {"train": "wordpiece", "vocab_size": 120, "min_frequency": 1}}}}
    path = tmp_path / "ml.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(path), "--run_name", "ml"], runs) == 0
    summary = json.loads((runs / "ml" / "summary.json").read_text())["metrics"]
    assert {"val/f1_micro", "val/f1_macro"} <= set(summary) and (runs / "ml" / "checkpoints" / "best.ckpt").is_file()
    ckpt = torch.load(runs / "ml" / "checkpoints" / "last.ckpt", weights_only=True)
    assert "stage_metrics.test.thresholds" not in ckpt["state_dict"]  # tuned on validation: saved there only
    cuts = ckpt["state_dict"]["stage_metrics.val.thresholds"]
    assert cuts.shape == (3,) and not torch.equal(cuts, torch.full((3,), 0.5))  # tuned, not the default
    export = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "ml"), "--output_dir", str(export)], runs) == 0
    assert torch.equal(load_file(str(export / "module_weights.safetensors"))["stage_metrics.val.thresholds"], cuts)
    assert main(["predict", "--ckpt_path", str(export), "--input", str(root / "test.jsonl"),
                 "--output", str(tmp_path / "rows.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    labels = ["animal", "money", "weather"]
    for row in rows:
        assert set(row) == {"id", "text", "labels", "probs"} and list(row["probs"]) == labels
        assert row["labels"] == [name for name, cut in zip(labels, cuts.tolist()) if row["probs"][name] >= cut]
    # a wrong kind for the data is one line naming the setting
    cfg["model"]["init_args"].pop("kind")
    path.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    assert run_main(["fit", "--config", str(path), "--run_name", "wrong"], runs) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "set model.init_args.kind: multilabel" in err[0], err


def test_a_new_heads_output_biases_start_at_the_training_log_odds(tmp_path):
    """Lin et al. 2017 §4.1's prior initialisation: before any step each label's probability is its training share
    (so the first steps learn from the texts, not the priors); a model loaded from a checkpoint keeps its weights."""
    from ptm_app.adaptation import SequenceClassificationModule
    from ptm_app.adaptation.task_module import output_layer
    from ptm_app.data.contract import connect
    from ptm_app.data.multilabel_data import MultiLabelDataModule
    from ptm_app.data.tokenizer import TokenizerSpec

    rows = [{"text": f"t{i}", "labels": labels} for i, labels in
            enumerate([["animal"], ["animal", "money"], [], ["animal"]] * 2)]
    for split in ("train", "validation", "test"):
        write_jsonl(tmp_path / f"{split}.jsonl", rows)
    data = MultiLabelDataModule(TokenizerSpec(train="wordpiece", vocab_size=60, min_frequency=1),
                                source=str(tmp_path), max_length=8)
    data.prepare_data()
    data.setup("fit")
    assert data.label_priors() == [0.75, 0.25]  # animal 6 of 8, money 2 of 8 (sorted label set)
    model = SequenceClassificationModule(backbone_config=TINY_BERT, kind="multilabel")
    connect(model, data)
    model.configure_model()
    bias = output_layer(model.backbone, 2).bias.detach()
    assert torch.sigmoid(bias).tolist() == pytest.approx([0.75, 0.25], abs=1e-6)
    assert output_layer(model.backbone, 2) is model.backbone.classifier
