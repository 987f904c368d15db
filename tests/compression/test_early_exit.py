"""Early exit: DeeBERT's entropy rule and PABEE's patience rule on hand-set logits, PABEE's weighted loss by hand,
and both trainings through main.py (resumed exactly, exported with their off-ramps, the exit table reported)."""
import csv
import json
import math

import pytest
import torch
import yaml

from tests.conftest import TINY_BERT, assert_resumes_exactly, run_main

pytestmark = pytest.mark.usefixtures("one_thread")
QUIET = {"accelerator": "cpu", "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 1,
         "num_sanity_val_steps": 0, "limit_val_batches": 2}
TOKENIZER = {"train": "wordpiece", "vocab_size": 100, "min_frequency": 1}


def test_deebert_exits_at_the_first_layer_under_the_threshold():
    from ptm_app.compression.early_exit_policy import entropy, entropy_exit_layers

    # 3 layers, 2 classes; entropies: ln 2 = 0.693, H([3, 0]) = 0.186, H([10, 0]) = 0.0005
    logits = torch.tensor([[[0.0, 0.0], [3.0, 0.0], [10.0, 0.0]],
                           [[6.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    p = torch.softmax(torch.tensor([3.0, 0.0]), -1)
    assert entropy(logits)[0, 1].item() == pytest.approx(-(p * p.log()).sum().item())
    assert entropy(logits)[0, 0].item() == pytest.approx(math.log(2))
    assert entropy_exit_layers(logits, 1.0).tolist() == [1, 1]  # everything is under 1 nat
    assert entropy_exit_layers(logits, 0.3).tolist() == [2, 1]  # H([6, 0]) = 0.017
    assert entropy_exit_layers(logits, 0.01).tolist() == [3, 3]  # row 1: never confident -> the last layer
    assert entropy_exit_layers(logits, 0.0001).tolist() == [3, 3]


def test_pabee_exits_after_patience_unchanged_predictions():
    from ptm_app.compression.early_exit_policy import patience_exit_layers

    def layers(predictions, classes=3):  # one-hot logits giving these per-layer predictions
        return torch.nn.functional.one_hot(torch.tensor(predictions), classes).float()

    logits = torch.stack([layers([0, 1, 1, 1, 0, 0]), layers([2, 2, 2, 2, 2, 2]), layers([0, 1, 0, 1, 0, 1])])
    assert patience_exit_layers(logits, 1).tolist() == [3, 2, 6]  # layer 3 repeats layer 2; row 2 never repeats
    assert patience_exit_layers(logits, 2).tolist() == [4, 3, 6]
    assert patience_exit_layers(logits, 3).tolist() == [6, 4, 6]  # row 0: the run of 1s ends at 2 repeats
    assert patience_exit_layers(logits, 5).tolist() == [6, 6, 6]


def test_pabee_weighted_loss_and_exit_table_by_hand():
    from ptm_app.adaptation import EarlyExitModule
    from ptm_app.compression.early_exit_policy import pabee_loss

    assert pabee_loss([torch.tensor(1.0), torch.tensor(2.0), torch.tensor(4.0)]).item() == pytest.approx(17 / 6)
    module = EarlyExitModule(backbone_config={**TINY_BERT, "num_hidden_layers": 3, "vocab_size": 50},
                             labels=["a", "b"], entropy_thresholds=[0.3], patiences=[1]).build()
    assert len(module.exits) == 2  # off-ramps after layers 1 and 2; layer 3 is the model's own head
    logits = torch.tensor([[[0.0, 1.0], [3.0, 0.0], [10.0, 0.0]],    # entropy exit 2 (class 0), patience exit 3
                           [[0.0, 6.0], [0.0, 6.0], [5.0, 0.0]]])    # entropy exit 1 (class 1), patience exit 2
    rows = module.exit_table(logits, torch.tensor([0, 0]))
    assert rows[0] == {"criterion": "entropy", "value": 0.3, "acc": 0.5, "exit_layer": 1.5, "speedup": 2.0}
    assert rows[1] == {"criterion": "patience", "value": 1, "acc": 0.5, "exit_layer": 2.5, "speedup": 1.2}


def config(tmp_path, corpus, model: dict, steps: int = 4):
    cfg = {"seed_everything": 3, "trainer": {"max_steps": steps, "val_check_interval": 2, **QUIET},
           "model": {"class_path": "EarlyExitModule",
                     "init_args": {"backbone_config": {**TINY_BERT, "num_hidden_layers": 3}, "optim": {"lr": 1e-3},
                                   "entropy_thresholds": [0.3, 0.6], "patiences": [1, 2], **model}},
           "data": {"class_path": "TaskDataModule",
                    "init_args": {"source": str(corpus), "batch_size": 8, "max_length": 32, "tokenizer": TOKENIZER}}}
    path = tmp_path / f"early_exit_{model.get('method', 'pabee')}_{steps}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_pabee_trains_jointly_resumes_exports_and_reports_the_exit_table(tiny_corpus, tmp_path):
    from ptm_app.inference.export import load_exported_module

    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", str(config(tmp_path, tiny_corpus, {"method": "pabee"}))], runs,
                           stop=2, steps=4)
    rows = list(csv.DictReader(open(runs / "full" / "logs" / "metrics.csv")))
    for r in [r for r in rows if r.get("train/layer_1")]:
        layer = [float(r[f"train/layer_{j}"]) for j in (1, 2, 3)]
        assert float(r["train/loss"]) == pytest.approx((layer[0] + 2 * layer[1] + 3 * layer[2]) / 6, rel=1e-4)
    last = [r for r in rows if r.get("val/patience_1/acc")][-1]
    for name in ("entropy_0.3", "entropy_0.6", "patience_1", "patience_2"):
        exit_layer, speedup = float(last[f"val/{name}/exit_layer"]), float(last[f"val/{name}/speedup"])
        assert 1.0 <= exit_layer <= 3.0 and speedup == pytest.approx(3.0 / exit_layer, rel=1e-4)
        assert 0.0 <= float(last[f"val/{name}/acc"]) <= 1.0
    assert float(last["val/patience_2/exit_layer"]) == 3.0  # 3 layers: 2 repeats need layers 1..3 -> never early
    summary = json.loads((runs / "full" / "summary.json").read_text())
    table = summary["early_exit"]
    assert table["layers"] == 3 and table["examples"] == 10 and len(table["rows"]) == 4
    assert table["rows"][2]["exit_layer"] == pytest.approx(float(last["val/patience_1/exit_layer"]))
    # the export carries the off-ramps: the rebuilt module gives the same per-layer logits
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(tmp_path / "x")], runs) == 0
    from ptm_app.adaptation import EarlyExitModule

    module = EarlyExitModule.load_from_checkpoint(runs / "full" / "checkpoints" / "last.ckpt").eval()
    exported = load_exported_module(tmp_path / "x").eval()
    batch = {"input_ids": torch.tensor([[2, 10, 11, 12, 3]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    with torch.no_grad():
        for a, b in zip(module.layer_logits(batch), exported.layer_logits(batch)):
            assert torch.allclose(a, b, atol=1e-5)


def test_deebert_fine_tunes_then_trains_only_the_off_ramps(tiny_corpus, tmp_path):
    """Stage 1 (2 steps): ordinary fine-tuning, no off-ramp loss.  Stage 2 (2 steps): only the off-ramps change:
    the backbone and final head equal those of the same run stopped after stage 1."""
    from ptm_app.adaptation import EarlyExitModule

    runs = tmp_path / "runs"
    model = {"method": "deebert", "final_steps": 2}
    assert run_main(["fit", "--config", str(config(tmp_path, tiny_corpus, model, steps=4)), "--run_name", "both"],
                    runs) == 0
    assert run_main(["fit", "--config", str(config(tmp_path, tiny_corpus, model, steps=4)), "--run_name", "first",
                     "--stop_at_step", "2"], runs) == 0  # the same run (and LR schedule), stopped after stage 1
    rows = [r for r in csv.DictReader(open(runs / "both" / "logs" / "metrics.csv")) if r.get("train/loss")]
    assert [bool(r.get("train/layer_1")) for r in rows] == [False, False, True, True]
    assert not any(r.get("train/layer_3") for r in rows)  # the final head is not an off-ramp
    for r in rows[2:]:  # stage 2: the sum of the off-ramps' losses
        assert float(r["train/loss"]) == pytest.approx(float(r["train/layer_1"]) + float(r["train/layer_2"]),
                                                       rel=1e-4)
    both = EarlyExitModule.load_from_checkpoint(runs / "both" / "checkpoints" / "last.ckpt")
    first = EarlyExitModule.load_from_checkpoint(runs / "first" / "checkpoints" / "last.ckpt")
    for (name, a), b in zip(both.backbone.state_dict().items(), first.backbone.state_dict().values()):
        assert torch.equal(a, b), name
    changed = [not torch.equal(a, b) for a, b in zip(both.exits.parameters(), first.exits.parameters())]
    assert all(changed)


@pytest.mark.parametrize("model, message", [
    ({"method": "pabee", "final_steps": 3}, "final_steps is DeeBERT's first training stage"),
    ({"patiences": [0]}, "a patience is a number of layers, at least 1"),
    ({"backbone_config": {"model_type": "ptm_cnn", "num_filters": 4}}, "early exit needs a BERT-style classifier"),
])
def test_bad_early_exit_settings_are_one_line(tiny_corpus, tmp_path, capsys, model, message):
    assert run_main(["fit", "--config", str(config(tmp_path, tiny_corpus, model, steps=1))], tmp_path / "runs") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("kind", ["entropy", "patience"])
def test_exit_forward_stops_after_the_exit_layer_and_matches_the_evaluation_rules(kind):
    """Real early exit: the blocks after the last exit never run (counted by a hook), and each example's exit layer
    and logits are those the evaluation computes from all layers."""
    from ptm_app.adaptation import EarlyExitModule
    from ptm_app.compression.early_exit_policy import (entropy, entropy_exit_layers, exit_predictions,
                                                       patience_exit_layers)

    torch.manual_seed(0)
    module = EarlyExitModule(backbone_config={**TINY_BERT, "num_hidden_layers": 4, "vocab_size": 50},
                             labels=["a", "b", "c"]).build().eval()
    with torch.no_grad():  # confident, varied off-ramps so that examples exit at different layers
        for ramp in module.exits:
            ramp.classifier.weight.mul_(60)
    ids = torch.randint(4, 50, (6, 7), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    ran = []
    hooks = [b.register_forward_hook(lambda *_: ran.append(1)) for b in module.backbone.bert.encoder.layer]
    with torch.no_grad():
        layer_logits = torch.stack(module.layer_logits(batch), 1)
        rule = ("entropy", entropy(layer_logits[:, 0]).median().item()) if kind == "entropy" else ("patience", 1)
        simulate = entropy_exit_layers if kind == "entropy" else patience_exit_layers
        expected = simulate(layer_logits, rule[1])
        for i in range(6):  # batch size 1: exactly the exit layer's blocks run
            ran.clear()
            logits, exits, run = module.exit_forward({k: v[i:i + 1] for k, v in batch.items()}, rule)
            assert exits.item() == expected[i].item() and run == len(ran) == expected[i].item()
            assert torch.allclose(logits[0], exit_predictions(layer_logits, expected)[i], atol=1e-5)
        ran.clear()
        logits, exits, run = module.exit_forward(batch, rule)  # a batch stops once all its examples have exited
    for h in hooks:
        h.remove()
    assert torch.equal(exits, expected) and run == len(ran) == int(expected.max())
    assert torch.allclose(logits, exit_predictions(layer_logits, expected), atol=1e-5)
    assert len(set(expected.tolist())) > 1  # the examples really exit at different layers


def test_predict_writes_the_exit_layer_and_bad_rules_are_one_line(tiny_corpus, tmp_path, capsys):
    runs = tmp_path / "runs"
    path = config(tmp_path, tiny_corpus, {"method": "pabee", "predict_exit": "entropy:0.69"}, steps=2)
    assert run_main(["fit", "--config", str(path), "--run_name", "ee"], runs) == 0
    assert run_main(["predict", "--config", str(path), "--run_name", "ee", "--ckpt_path", "last"], runs) == 0
    rows = [json.loads(line) for line in (runs / "ee" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and all(1 <= r["exit_layer"] <= 3 for r in rows)
    assert all(sum(r["probs"].values()) == pytest.approx(1.0, abs=1e-5) for r in rows)
    capsys.readouterr()
    bad = config(tmp_path, tiny_corpus, {"predict_exit": "patience:1.5"}, steps=1)
    assert run_main(["fit", "--config", str(bad)], tmp_path / "runs2") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "predict_exit 'patience:1.5'" in err[0], err
    from ptm_app.main import main  # main.py predict --input: the same rows, exit layers included

    out = tmp_path / "rows.jsonl"
    assert main(["predict", "--ckpt_path", str(runs / "ee"), "--input", str(tiny_corpus / "test.jsonl"),
                 "--output", str(out)]) == 0
    mine = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["exit_layer"] for r in mine] == [r["exit_layer"] for r in rows]
