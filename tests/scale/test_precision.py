"""``trainer.precision: auto`` (the default) picks by hardware capability (the probes are monkeypatched) and says
why; what the hardware cannot run is one line; an explicit bf16 on a CPU without bf16 instructions warns once."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ptm_app.training import precision as prec
from ptm_app.training.trainer import PtmTrainer


@pytest.fixture
def hardware(monkeypatch):
    """Set the capability probes: ``hardware(cuda=..., cuda_bf16=..., mkldnn_bf16=..., avx512_bf16=..., amx=...)``."""
    monkeypatch.delenv(prec.SEAM, raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)

    def set_(cuda=False, cuda_bf16=False, mkldnn_bf16=True, avx512_bf16=False, amx=False, machine="x86_64",
             gpus=1):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus if cuda else 0)
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

    hardware(avx512_bf16=False)  # (a bf16 run here would take minutes on a CPU that only emulates bf16)
    cfg = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2, val_check_interval=2, precision="auto"))
    assert run_main(["fit", "--config", cfg, "--run_name", "auto"], tmp_path / "runs") == 0
    assert "precision 32-true (auto: this CPU has no bf16 instructions)" in capsys.readouterr().out
    import yaml

    saved = yaml.safe_load((tmp_path / "runs" / "auto" / "config.yaml").read_text())
    assert saved["trainer"]["precision"] == "auto"  # resolved per machine: the saved config stays portable
    assert run_main(["fit", "--config", cfg, "--run_name", "fp16", "--trainer.precision", "16-mixed"],
                    tmp_path / "runs") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: precision=16-mixed (fp16) is not supported on CPU")


@pytest.mark.parametrize("probes, env, accelerator, expected", [
    (dict(avx512_bf16=True), {}, "cpu", ("bf16-mixed", "auto: AVX512-BF16 found")),
    (dict(avx512_bf16=True, amx=True), {}, "auto", ("bf16-mixed", "auto: AVX512-BF16 and AMX found")),
    (dict(), {}, "cpu", ("32-true", "auto: this CPU has no bf16 instructions")),
    (dict(avx512_bf16=True), {"PTM_CPU_BF16": "0"}, "auto", ("32-true", "auto: PTM_CPU_BF16=0")),
    (dict(), {"PTM_CPU_BF16": "1"}, "cpu", ("bf16-mixed", "auto: PTM_CPU_BF16=1")),
    (dict(avx512_bf16=True), {"ONEDNN_MAX_CPU_ISA": "avx2"}, "cpu",
     ("32-true", "auto: ONEDNN_MAX_CPU_ISA=AVX2 leaves out oneDNN's bf16 instructions")),
    (dict(avx512_bf16=True), {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "cpu", ("bf16-mixed", "auto: AVX512-BF16 found")),
    (dict(cuda=True, cuda_bf16=True), {"PTM_CPU_BF16": "0"}, "auto", ("bf16-mixed", "auto: this GPU runs bf16")),
])
def test_the_choice_names_its_reason_and_the_seam_forces_it(hardware, monkeypatch, probes, env, accelerator, expected):
    hardware(**probes)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    choice = prec.choose_precision(accelerator)
    assert (choice.value, choice.reason) == expected


@pytest.mark.parametrize("accelerator, devices, precision, probes, message", [
    ("gpu", 1, "auto", dict(), "trainer.accelerator gpu: no CUDA GPU is visible here"),
    ("cuda", 1, "auto", dict(), "trainer.accelerator cuda: no CUDA GPU is visible here"),
    ("cpu", 1, "16-mixed", dict(cuda=True, cuda_bf16=True), "precision=16-mixed (fp16) is not supported on CPU"),
    ("auto", 1, "16-true", dict(), "precision=16-true (fp16) is not supported on CPU"),
    ("gpu", 3, "auto", dict(cuda=True, gpus=2), "trainer.devices 3: this machine has 2 CUDA GPUs"),
    ("gpu", [0, 2], "auto", dict(cuda=True, gpus=2), "trainer.devices [0, 2]: this machine has 2 CUDA GPUs"),
    ("cpu", 4096, "auto", dict(), "trainer.devices 4096: this machine has"),
    ("auto", "4096", "auto", dict(), "trainer.devices 4096: this machine has"),  # as the command line gives it
])
def test_what_the_hardware_cannot_run_is_one_line(hardware, accelerator, devices, precision, probes, message):
    hardware(**probes)
    with pytest.raises(prec.PtmError) as err:
        prec.check_hardware(accelerator, devices, precision)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_what_the_hardware_runs_passes(hardware):
    hardware(cuda=True, cuda_bf16=False, gpus=2)
    prec.check_hardware("gpu", 2, "16-mixed")   # fp16 on a GPU
    prec.check_hardware("cpu", 1, "bf16-mixed")
    prec.check_hardware("auto", "auto", None)
    prec.check_hardware("cpu", -1, "32-true")   # all of them


def test_explicit_bf16_on_a_cpu_without_it_runs_after_one_warning(hardware, monkeypatch, capsys):
    hardware(avx512_bf16=False)
    monkeypatch.setattr(prec, "bf16_slowdown", lambda: 68.4)
    trainer = PtmTrainer(precision="bf16-mixed", accelerator="cpu", logger=False, enable_checkpointing=False)
    assert trainer.precision == "bf16-mixed" and trainer.precision_reason == "set by the config"
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["warning: precision bf16-mixed on a CPU without bf16 instructions: bf16 matmuls run 68x slower "
                   "than fp32 here (measured); use trainer.precision: auto (the default) or 32-true"]
    hardware(avx512_bf16=True)
    PtmTrainer(precision="bf16-mixed", accelerator="cpu", logger=False, enable_checkpointing=False)
    PtmTrainer(precision="32-true", accelerator="cpu", logger=False, enable_checkpointing=False)
    assert capsys.readouterr().out == ""  # native bf16, or no bf16 at all: nothing to say


def test_bf16_slowdown_is_measured():
    slowdown = prec.bf16_slowdown(size=64, repeats=1)
    assert 0 < slowdown < 10_000


def test_the_trainer_defaults_to_auto(hardware):
    hardware(avx512_bf16=False)
    trainer = PtmTrainer(logger=False, enable_checkpointing=False)
    assert (trainer.precision, trainer.precision_reason) == ("32-true", "auto: this CPU has no bf16 instructions")
    assert type(trainer.accelerator).__name__ == "CPUAccelerator"


def test_the_demo_on_a_cpu_without_bf16_chooses_fp32(tmp_path, monkeypatch, capsys):
    """The seam forces the choice of a CPU without bf16 instructions, whatever this CPU has: the demo's first stage,
    as shipped (2 steps, 64 documents), runs in fp32 and says why on its model line."""
    from ptm_app.data.sources import prepared_dir
    from tests.conftest import run_main

    prepared_dir("bbc"), prepared_dir("minilm")
    monkeypatch.setenv(prec.SEAM, "0")
    config = Path(__file__).resolve().parents[2] / "configs" / "demo" / "minilm_mlm_bbc.yaml"
    argv = ["fit", "--config", str(config), "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1",
            "--data.init_args.limit_documents", "64", "--trainer.enable_progress_bar", "false"]
    assert run_main(argv, tmp_path / "runs") == 0
    model = [line for line in capsys.readouterr().out.splitlines() if line.startswith("model: ")]
    assert len(model) == 1 and "on CPU, precision 32-true (auto: PTM_CPU_BF16=0)" in model[0], model
