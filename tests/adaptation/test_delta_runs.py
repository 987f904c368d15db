"""Delta tuning from YAML through main.py on the real tweets with MiniLM: only the delta trains and is
checkpointed, the run resumes exactly, and export gives a usable transformers directory."""
from pathlib import Path

import pytest
import torch

from tests.conftest import assert_resumes_exactly, run_main

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--trainer.max_steps", "6", "--trainer.val_check_interval", "6", "--trainer.limit_val_batches", "2",
         "--trainer.log_every_n_steps", "1", "--trainer.precision", "32-true", "--data.init_args.max_length", "32",
         "--data.init_args.batch_size", "8", "--data.init_args.limit_train", "400", "--trainer.enable_progress_bar",
         "false", "--trainer.enable_model_summary", "false"]


@pytest.mark.parametrize("method", ["lora", *(pytest.param(m, marks=pytest.mark.slow)
                                              for m in ("houlsby", "prefix", "prompt", "bitfit"))])
def test_delta_config_trains_resumes_and_exports(method, tmp_path):
    cfg = str(ROOT / "configs" / "adapt" / f"minilm_{method}_tweets.yaml")
    runs = tmp_path / "runs"
    assert_resumes_exactly(["fit", "--config", cfg, *QUICK], runs, stop=3, steps=6)

    ckpt = torch.load(runs / "full" / "checkpoints" / "last.ckpt", weights_only=True)
    backbone_keys = [k for k in ckpt["state_dict"] if k.startswith("backbone.")]
    assert 0 < len(backbone_keys) < 60  # the delta (+ head), not the 100+ tensors of MiniLM
    assert sum(ckpt["state_dict"][k].numel() for k in backbone_keys) < 0.2 * 22_700_000

    from ptm_app.adaptation import SequenceClassificationModule
    from ptm_app.backbones.delta import load_delta

    module = SequenceClassificationModule.load_from_checkpoint(runs / "full" / "checkpoints" / "last.ckpt").eval()
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(out)], runs) == 0
    from transformers import AutoModelForSequenceClassification

    exported = AutoModelForSequenceClassification.from_pretrained(out).eval()
    if (out / "delta.safetensors").exists():
        exported = load_delta(exported, out).eval()
    else:
        assert method in ("lora", "bitfit")  # merged: a plain transformers model
    batch = module.tokenizer(["what a great flight", "the delay was awful"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.allclose(module.backbone(**batch).logits, exported(**batch).logits, atol=1e-5)
