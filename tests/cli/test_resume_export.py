"""End-to-end through main.py: exact resume, export round-trip, reuse in a fresh process."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import run_main, tiny_mlm_config

ROOT = Path(__file__).resolve().parents[2]


def train_losses(run: Path) -> dict[int, float]:
    rows = csv.DictReader(open(run / "logs" / "metrics.csv"))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


@pytest.fixture(scope="module")
def runs(tiny_corpus, tmp_path_factory):
    """One uninterrupted 20-step run and two paused-and-resumed ones (mid-epoch, epoch end)."""
    tmp = tmp_path_factory.mktemp("resume")
    runs = tmp / "runs"
    cfg = str(tiny_mlm_config(tiny_corpus, tmp))
    assert run_main(["fit", "--config", cfg, "--run_name", "full"], runs) == 0
    for name, stop in (("mid", 5), ("edge", 7)):  # 7 batches per epoch: step 7 ends epoch 0
        assert run_main(["fit", "--config", cfg, "--run_name", name, "--stop_at_step", str(stop)], runs) == 0
        paused = train_losses(runs / name)
        assert max(paused) == stop - 1  # it really stopped
        assert run_main(["fit", "--config", cfg, "--run_name", name, "--ckpt_path", "last"], runs) == 0
    return runs


def test_resumed_runs_log_the_same_losses(runs):
    full = train_losses(runs / "full")
    assert len(full) == 20 and full[19] < full[0]
    for name in ("mid", "edge"):
        resumed = train_losses(runs / name)  # one metrics.csv: the paused launch's rows, then the resumed ones
        assert sorted(resumed) == list(range(20))
        for step, loss in resumed.items():
            assert loss == pytest.approx(full[step], abs=1e-6), (name, step)


def test_run_directory_layout(runs):
    run = runs / "full"
    for rel in ("config.yaml", "checkpoints/last.ckpt", "checkpoints/best.ckpt", "logs/metrics.csv"):
        assert (run / rel).is_file(), rel
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)  # loadable without pickle tricks
    assert ckpt["global_step"] == 20 and ckpt["ptm_app"]["tokenizer"]


def test_export_round_trip_gives_identical_outputs(runs, tmp_path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from ptm_app.objectives import MaskedLMModule

    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(runs / "full"), "--output_dir", str(out)], runs) == 0
    hf = AutoModelForMaskedLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    module = MaskedLMModule.load_from_checkpoint(runs / "full" / "checkpoints" / "last.ckpt").eval()
    batch = tok(["the cat sat on the mat", "markets rose"], padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = module.backbone(**batch).logits
        theirs = hf(**batch).logits
    assert torch.equal(ours, theirs)
    assert json.loads((out / "ptm_app_export.json").read_text())["global_step"] == 20


def test_load_from_checkpoint_in_a_fresh_process_elsewhere(runs, tmp_path):
    ckpt = runs / "full" / "checkpoints" / "last.ckpt"
    code = (
        "import sys, torch; from ptm_app.objectives import MaskedLMModule\n"
        f"m = MaskedLMModule.load_from_checkpoint({str(ckpt)!r}).eval()\n"
        "ids = m.tokenizer(['the cat sat'], return_tensors='pt')\n"
        "print(float(m.backbone(**ids).logits.sum()))\n"
    )
    env = {**os.environ, "PTM_DATA_DIR": str(tmp_path / "nothing-here"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    from ptm_app.objectives import MaskedLMModule

    m = MaskedLMModule.load_from_checkpoint(ckpt).eval()
    with torch.no_grad():
        expected = float(m.backbone(**m.tokenizer(["the cat sat"], return_tensors="pt")).logits.sum())
    assert float(out.stdout.strip().splitlines()[-1]) == pytest.approx(expected, rel=1e-6)
