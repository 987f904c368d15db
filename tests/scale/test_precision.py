"""``trainer.precision: auto`` picks by hardware capability (the probes are monkeypatched), and fp16 on a CPU is
refused with one line."""
from __future__ import annotations

import pytest
import torch

from ptm_app.training import precision as prec
from ptm_app.training.trainer import PtmTrainer


@pytest.fixture
def hardware(monkeypatch):
    """Set the capability probes: ``hardware(cuda=..., cuda_bf16=..., mkldnn_bf16=..., avx512_bf16=..., amx=...)``."""
    def set_(cuda=False, cuda_bf16=False, mkldnn_bf16=True, avx512_bf16=False, amx=False, machine="x86_64"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: cuda_bf16)
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: mkldnn_bf16)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(prec.platform, "machine", lambda: machine)
    return set_


@pytest.mark.parametrize("probes, accelerator, expected", [
    (dict(avx512_bf16=True), "cpu", "bf16-mixed"),          # Zen 4/5, Cooper Lake: native bf16
    (dict(amx=True), "auto", "bf16-mixed"),                 # Sapphire Rapids AMX
    (dict(), "cpu", "32-true"),                             # AVX512 without bf16: oneDNN only emulates it
    (dict(mkldnn_bf16=False, avx512_bf16=True), "cpu", "32-true"),
    (dict(machine="aarch64"), "cpu", "bf16-mixed"),         # oneDNN reports bf16 on ARM only with the extension
    (dict(machine="aarch64", mkldnn_bf16=False), None, "32-true"),
    (dict(cuda=True, cuda_bf16=True), "gpu", "bf16-mixed"),  # Ampere and newer
    (dict(cuda=True, cuda_bf16=False, avx512_bf16=True), "auto", "16-mixed"),  # V100, T4: GPU wins over the CPU
    (dict(cuda=True, cuda_bf16=True, avx512_bf16=False), "cpu", "32-true"),    # asked for the CPU
])
def test_auto_precision_follows_capabilities(hardware, probes, accelerator, expected):
    hardware(**probes)
    assert prec.auto_precision(accelerator) == expected


def test_trainer_resolves_auto(hardware):
    hardware(avx512_bf16=True)
    trainer = PtmTrainer(precision="auto", accelerator="cpu", logger=False, enable_checkpointing=False,
                              enable_progress_bar=False, enable_model_summary=False)
    assert trainer.precision == "bf16-mixed"
    hardware(avx512_bf16=False)
    assert PtmTrainer(precision="auto", accelerator="cpu", logger=False).precision == "32-true"
    assert PtmTrainer(precision="bf16-mixed", accelerator="cpu", logger=False).precision == "bf16-mixed"


def test_auto_through_the_cli_and_fp16_on_cpu_refused(tiny_corpus, tmp_path, capsys, hardware):
    from tests.conftest import run_main, tiny_mlm_config

    hardware(avx512_bf16=True)
    cfg = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2, val_check_interval=2, precision="auto"))
    assert run_main(["fit", "--config", cfg, "--run_name", "auto"], tmp_path / "runs") == 0
    import yaml

    saved = yaml.safe_load((tmp_path / "runs" / "auto" / "config.yaml").read_text())
    assert saved["trainer"]["precision"] == "auto"  # resolved per machine: the saved config stays portable
    assert run_main(["fit", "--config", cfg, "--run_name", "fp16", "--trainer.precision", "16-mixed"],
                    tmp_path / "runs") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: precision=16-mixed (fp16) is not supported on CPU")
