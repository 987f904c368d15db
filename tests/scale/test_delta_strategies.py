"""LoRA (peft) and bottleneck adapters under DDP, FSDP and DeepSpeed: MiniLM on the tweets, 2 CPU processes.

Other tools fail here with FSDP1's "uniform requires_grad" error (frozen and trainable tensors in one flat
parameter); FSDP2 shards per parameter.  Checkpoints hold only the delta (``delta_only``): FSDP loads them
partially and DeepSpeed excludes the frozen tensors.  A paused-and-resumed FSDP run must log the losses of an
uninterrupted run under every other strategy, and the export (LoRA merged into plain weights) must give the
delta-tuned model's outputs.
"""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from tests.adaptation.test_delta_runs import QUICK
from tests.conftest import run_main
from tests.scale.conftest import ROOT, launch, strategy_config, train_losses


def fit(method: str, strategy: str, runs: Path, *extra: str) -> Path:
    cfg = str(ROOT / "configs" / "adapt" / f"minilm_{method}_tweets.yaml")
    launch(["fit", "--config", cfg, "--config", strategy_config(strategy), *QUICK, "--run_name", strategy, *extra],
           runs)
    return runs / strategy


@pytest.fixture(scope="module")
def lora_fsdp(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("lora_runs")
    fit("lora", "fsdp", runs, "--stop_at_step", "3")
    assert max(train_losses(runs / "fsdp")) == 2
    return fit("lora", "fsdp", runs, "--ckpt_path", "last")


def consolidated_module(run: Path):
    from ptm_app.adaptation import SequenceClassificationModule
    from ptm_app.checkpoint_io.reading import read_checkpoint

    buffer = io.BytesIO()
    torch.save(read_checkpoint(run), buffer)
    buffer.seek(0)
    return SequenceClassificationModule.load_from_checkpoint(buffer, map_location="cpu").eval()


def test_lora_under_fsdp_resumes_with_delta_only_shards_and_exports(lora_fsdp, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from ptm_app.checkpoint_io.reading import read_checkpoint

    losses = train_losses(lora_fsdp)
    assert sorted(losses) == list(range(6))
    ckpt = read_checkpoint(lora_fsdp)
    keys = [k for k in ckpt["state_dict"] if k.startswith("backbone.")]
    assert keys and all("lora_" in k or "classifier" in k for k in keys)  # the delta and the head only
    assert ckpt["ptm_app"]["delta_only"] and ckpt["global_step"] == 6

    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(lora_fsdp), "--output_dir", str(out)], lora_fsdp.parent) == 0
    assert not (out / "delta.safetensors").exists()  # LoRA merged into plain weights
    exported = AutoModelForSequenceClassification.from_pretrained(out).eval()
    module = consolidated_module(lora_fsdp)
    lora_b = [p for n, p in module.backbone.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b)  # trained: B starts at zero
    batch = module.tokenizer(["what a great flight", "the delay was awful"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.allclose(module.backbone(**batch).logits, exported(**batch).logits, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "deepspeed_stage_2"])
def test_lora_gives_the_same_losses_under_every_strategy(strategy, lora_fsdp, tmp_path):
    run = fit("lora", strategy, tmp_path / "runs")
    ours, fsdp = train_losses(run), train_losses(lora_fsdp)
    assert sorted(ours) == list(range(6))
    for step in range(6):
        assert ours[step] == pytest.approx(fsdp[step], abs=1e-5), step


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2"])
def test_adapters_resume_and_export_under_sharding(strategy, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from ptm_app.backbones.delta import load_delta

    runs = tmp_path / "runs"
    full = fit("houlsby", strategy, runs)
    fit("houlsby", strategy, runs / "paused", "--stop_at_step", "3")
    paused = fit("houlsby", strategy, runs / "paused", "--ckpt_path", "last")
    assert train_losses(paused) == pytest.approx(train_losses(full), abs=1e-5)
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(full), "--output_dir", str(out)], runs) == 0
    exported = load_delta(AutoModelForSequenceClassification.from_pretrained(out), out).eval()
    module = consolidated_module(full)
    batch = module.tokenizer(["what a great flight", "the delay was awful"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.allclose(module.backbone(**batch).logits, exported(**batch).logits, atol=1e-5)
