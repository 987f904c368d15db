"""MaskedLMModule checkpoints written before targets (``sentence_objective``, ``loss_weights`` ... and ``heads.*``
weights) keep loading: two tiny runs saved by that code (``tests/fixtures/checkpoints/*_e99ee14.*``: the BERT recipe
with NSP weighted 0.5, and SenseBERT with its sense-aware input), with the losses that code computed on a fixed batch,
load through every path and give the same numbers."""
import json
from pathlib import Path

import pytest
import torch

from ptm_app.objectives import MaskedLMModule
from ptm_app.knowledge.sensebert import Supersense
from ptm_app.objectives.targets import MaskedLM, NextSentence, SpanBoundary

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "checkpoints"
RENAMED = {"sentence": "nsp", "sentence_acc": "nsp_acc"}  # the loss names of the NSP target


def recorded(name: str) -> tuple[dict, dict]:
    record = json.loads((FIXTURES / f"{name}_e99ee14.json").read_text())
    batch = {k: torch.tensor(v) for k, v in record["batch"].items()}
    return batch, record


def assert_same_losses(module, name: str) -> None:
    batch, record = recorded(name)
    with torch.no_grad():
        losses = module.eval()._losses(batch)
        total = module._total(losses)
    assert {RENAMED.get(k, k) for k in record["losses"]} == set(losses)
    for key, value in record["losses"].items():
        assert losses[RENAMED.get(key, key)].item() == pytest.approx(value, rel=0, abs=1e-6), key
    assert total.item() == pytest.approx(record["total"], rel=0, abs=1e-6)


def test_an_old_nsp_checkpoint_loads_as_targets_with_the_same_losses():
    module = MaskedLMModule.load_from_checkpoint(FIXTURES / "mlm_nsp_e99ee14.ckpt")
    assert [type(t) for t in module.targets] == [MaskedLM, NextSentence]
    assert module.weights == {"mlm": 1.0, "nsp": 0.5} and module.mlm.static_copies == 1
    assert set(module.target_layers) == {"nsp"}
    assert "sentence_objective" not in module.hparams and "targets" in module.hparams
    assert_same_losses(module, "mlm_nsp")


def test_an_old_sensebert_checkpoint_keeps_its_sense_input_and_losses():
    module = MaskedLMModule.load_from_checkpoint(FIXTURES / "sensebert_e99ee14.ckpt")
    assert [type(t) for t in module.targets] == [MaskedLM, Supersense]
    assert module.targets[1].sense_input and module.supersense_input and module.mlm.masking == "whole_word"
    assert module.word_senses.any()  # M came with the checkpoint
    batch, _ = recorded("sensebert")
    assert "inputs_embeds" in module.model_inputs(batch)
    assert_same_losses(module, "sensebert")


def test_an_old_checkpoint_exports_and_its_export_loads_with_the_same_losses(tmp_path):
    from ptm_app.inference.export import load_exported_module
    from ptm_app.main import main

    assert main(["export", "--ckpt_path", str(FIXTURES / "mlm_nsp_e99ee14.ckpt"), "--output_dir", str(tmp_path)]) == 0
    module = load_exported_module(tmp_path)
    assert [type(t) for t in module.targets] == [MaskedLM, NextSentence]
    assert_same_losses(module, "mlm_nsp")


def test_a_new_checkpoint_keeps_its_targets_as_plain_data(tmp_path):
    """Saved now, the targets are records with short class names (read back through ``known_targets``, never imported),
    and the round trip gives the same targets and weights."""
    module = MaskedLMModule.load_from_checkpoint(FIXTURES / "mlm_nsp_e99ee14.ckpt")
    import lightning

    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
            "pytorch-lightning_version": lightning.__version__}
    module.on_save_checkpoint(ckpt)
    assert ckpt["hyper_parameters"]["targets"][1] == {"class_path": "NextSentence", "init_args": {"weight": 0.5}}
    assert {k.split(".")[1] for k in ckpt["state_dict"] if k.startswith("target_layers.")} == {"nsp"}
    torch.save(ckpt, tmp_path / "new.ckpt")
    again = MaskedLMModule.load_from_checkpoint(tmp_path / "new.ckpt")
    assert again.weights == module.weights and again.mlm.settings() == module.mlm.settings()
    assert_same_losses(again, "mlm_nsp")


def test_old_span_boundary_settings_and_weights_map_onto_targets():
    """The SpanBERT arguments of before (span masking, ``span_boundary_objective``, ``loss_weights``) and its
    ``heads.sbo.*`` weights: the same recipe and the same weights under today's names."""
    old = {"masking": "span", "span_p": 0.3, "max_span_length": 6, "span_boundary_objective": True,
           "loss_weights": {"mlm": 1.0, "sbo": 2.0}, "static_masking": True, "static_copies": 4,
           "sentence_objective": None, "supersense_objective": False, "backbone": None}
    state = {"heads.sbo.positions.weight": torch.ones(2), "backbone.x": torch.zeros(1)}
    new = MaskedLMModule.upgrade_checkpoint(dict(old), state)
    assert new["backbone"] is None and not set(old) - {"backbone"} & set(new)
    assert set(state) == {"target_layers.sbo.positions.weight", "backbone.x"}
    module = MaskedLMModule(**new)
    mlm, sbo = module.targets
    assert isinstance(sbo, SpanBoundary) and module.weights == {"mlm": 1.0, "sbo": 2.0}
    assert (mlm.masking, mlm.span_p, mlm.max_span_length, mlm.static_copies) == ("span", 0.3, 6, 4)


def test_a_target_record_names_only_known_targets(tmp_path):
    """A target's class named in a checkpoint is looked up among the targets, never imported: a crafted name is one
    line, in the constructor and before a checkpoint's module is built."""
    from ptm_app.errors import PtmError

    with pytest.raises(PtmError, match="unknown target 'os.system'"):
        MaskedLMModule(targets=[{"class_path": "os.system"}])
    ckpt = torch.load(FIXTURES / "mlm_nsp_e99ee14.ckpt", weights_only=True)
    ckpt["hyper_parameters"] = MaskedLMModule.upgrade_checkpoint(ckpt["hyper_parameters"])
    ckpt["hyper_parameters"]["targets"][1]["class_path"] = "tests.security.attacks.NextSentence"
    torch.save(ckpt, tmp_path / "crafted.ckpt")
    with pytest.raises(PtmError, match="unknown target 'tests.security.attacks.NextSentence'"):
        MaskedLMModule.load_from_checkpoint(tmp_path / "crafted.ckpt")


def test_a_run_resumes_from_an_old_checkpoint_with_its_weights(runs_dir):
    """``fit --ckpt_path`` an old checkpoint with today's config: its arguments (NSP weighted 0.5) are mapped and
    kept, its weights and optimiser state restored, and the run goes on from its step 2."""
    from tests.conftest import logged_losses, run_main

    if not (ROOT / "data" / "brown" / "manifest.json").is_file():
        pytest.skip("brown is not prepared (python main.py data prepare brown)")
    tiny = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 32, "max_position_embeddings": 40}
    argv = ["fit", "--config", str(ROOT / "configs" / "pretrain" / "bert_mlm_nsp_brown.yaml"), "--run_name", "old",
            "--trainer.max_steps", "3", "--trainer.limit_val_batches", "0", "--trainer.accelerator", "cpu",
            "--trainer.precision", "32-true", "--seed_everything", "3",
            "--model.init_args.backbone_config", json.dumps(tiny), "--data.init_args.max_length", "32",
            "--data.init_args.batch_size", "4", "--data.init_args.limit_documents", "10",
            "--data.init_args.tokenizer", json.dumps({"train": "wordpiece", "vocab_size": 120, "lowercase": True}),
            "--ckpt_path", str(FIXTURES / "mlm_nsp_e99ee14.ckpt")]
    assert run_main(argv, runs_dir) == 0
    assert list(logged_losses(runs_dir / "old")) == [2]
    import csv

    row = next(csv.DictReader(open(runs_dir / "old" / "logs" / "metrics.csv")))
    assert float(row["train/loss"]) == pytest.approx(float(row["train/mlm"]) + 0.5 * float(row["train/nsp"]), rel=1e-5)
