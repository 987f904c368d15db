"""Ctrl-C and SIGTERM finish the current step, write last.ckpt, and the run resumes from it."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

from tests.conftest import run_main, tiny_mlm_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 0, marks=pytest.mark.slow)],
                         ids=["sigterm", "ctrl-c"])
def test_signal_writes_last_checkpoint_then_resume_continues(tiny_corpus, tmp_path, sig, code):
    cfg = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=100000, val_check_interval=3)
    env = {**os.environ, "PTM_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "main.py"), "fit", "--config", str(cfg), "--run_name", "sig"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    best = tmp_path / "runs" / "sig" / "checkpoints" / "best.ckpt"
    deadline = time.time() + 120
    while not best.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert best.exists(), proc.communicate()[0][-2000:]
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out[-2000:]
    ckpt = torch.load(tmp_path / "runs" / "sig" / "checkpoints" / "last.ckpt", weights_only=True)
    step = ckpt["global_step"]
    assert 3 <= step < 100000
    # the resume needs no signal: in this process (a real process costs ~8 s of imports)
    assert run_main(cmd[2:] + ["--ckpt_path", "last", "--stop_at_step", str(step + 2)], tmp_path / "runs") == 0
    after = torch.load(tmp_path / "runs" / "sig" / "checkpoints" / "last.ckpt", weights_only=True)
    assert after["global_step"] == step + 2


class SigtermDuringValidation(pl.Callback):
    """Sends this process a real SIGTERM during the first validation after ``after_step`` training steps: in the
    middle of it (``when="batch"``) or at its very end, after the checkpoints are written (``when="end"``, the
    moment the subprocess test above signals at: right after ``best.ckpt`` appears)."""

    def __init__(self, after_step: int = 3, when: str = "batch"):
        self.after_step, self.when, self.sent_at = after_step, when, None

    def _send(self, trainer):
        if self.sent_at is None and not trainer.sanity_checking and trainer.global_step >= self.after_step:
            self.sent_at = trainer.global_step
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.when == "batch":
            self._send(trainer)

    def on_validation_end(self, trainer, pl_module):
        if self.when == "end":
            self._send(trainer)


@pytest.mark.parametrize("when", ["batch", "end"])
def test_sigterm_during_validation_finishes_it_and_saves_after_the_next_step(tiny_corpus, tmp_path, when):
    """Lightning's own handler stops mid-validation, or right after it, with no last.ckpt: LastCheckpoint owns
    SIGTERM during training, lets the validation finish, saves after the next step and stops (exit 143)."""

    cfg = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=100, val_check_interval=3, limit_val_batches=3)
    data = yaml.safe_load(cfg.read_text())
    data["trainer"]["callbacks"] = [{"class_path": f"{__name__}.SigtermDuringValidation",
                                     "init_args": {"when": when}}]
    cfg.write_text(yaml.safe_dump(data))
    runs = tmp_path / "runs"
    before = signal.getsignal(signal.SIGTERM)
    assert run_main(["fit", "--config", str(cfg), "--run_name", "val"], runs) == 143
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back
    ckpt = torch.load(runs / "val" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 4  # validation after step 3 finished, then one more step was saved


def test_a_finished_run_leaves_no_handler_and_no_trainer_behind(tiny_corpus, tmp_path):
    """After ``main`` returns in-process (a sweep, a notebook, the test suite), SIGTERM and SIGINT have their handlers
    of before, and no Trainer or LightningModule stays alive.  Before the fix, Lightning's SIGTERM handler was put
    back after Lightning's own teardown and held the trainer, the model and the optimizer state: each in-process
    MiniLM fine-tuning left about 260 MB behind."""
    import gc

    def alive() -> dict[int, str]:
        gc.collect()
        return {id(o): type(o).__name__ for o in gc.get_objects() if isinstance(o, (pl.Trainer, pl.LightningModule))}

    before, earlier = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}, alive()  # other tests'
    cfg = tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2, val_check_interval=2)
    for name in ("one", "two"):
        assert run_main(["fit", "--config", str(cfg), "--run_name", name], tmp_path / "runs") == 0
    assert {s: signal.getsignal(s) for s in before} == before
    assert [kind for i, kind in alive().items() if i not in earlier] == []
