"""Gradient accumulation (``--trainer.accumulate_grad_batches``) through main.py: equal to one big batch, the LR
schedule counts optimizer steps, checkpoints and stops land on optimizer steps (exact resume, also after a SIGTERM),
and the throughput monitor counts every micro-batch."""
from __future__ import annotations

import json

import lightning.pytorch as pl
import pytest
import torch
import yaml

from ptm_app.training.trainer import PtmTrainer
from ptm_app.data.datamodules import PretrainDataModule
from ptm_app.data.tokenizer import TokenizerSpec
from ptm_app.objectives import MaskedLMModule
from ptm_app.training.throughput import ThroughputMonitor
from tests.conftest import TINY_BERT, assert_resumes_exactly, logged_losses, run_main, tiny_mlm_config

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def classifier_config(corpus, tmp, batch_size: int, **trainer) -> str:
    """A tiny BERT classifier without dropout, in plain shuffled batches (no length grouping: with it the batches
    would depend on the batch size).  The fixture corpus has 60 training texts."""
    cfg = {
        "seed_everything": 5,
        "trainer": {"max_steps": 3, "accelerator": "cpu", "limit_val_batches": 0, "log_every_n_steps": 1,
                    "enable_progress_bar": False, "enable_model_summary": False, **trainer},
        "model": {"class_path": "SequenceClassificationModule",
                  "init_args": {"backbone_config": {**TINY_BERT, **NO_DROPOUT},
                                "optim": {"lr": 1e-3, "warmup": 0, "schedule": "linear"}}},
        "data": {"class_path": "TaskDataModule", "init_args": {
            "source": str(corpus), "batch_size": batch_size, "max_length": 32, "group_by_length": False,
            "tokenizer": {"train": "wordpiece", "vocab_size": 100, "min_frequency": 1}}},
    }
    path = tmp / f"cls_b{batch_size}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def weights(run) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def test_two_micro_batches_of_b_equal_one_batch_of_2b(tiny_corpus, tmp_path):
    """Exact here, not only close: the classification loss is a mean over the batch's examples, every micro-batch
    has B of them, and Lightning divides each micro-batch's loss by ``accumulate_grad_batches``, so the summed
    gradient is the mean over the 2B examples: the big batch's.  (A masked-LM loss is a mean over masked tokens,
    whose count differs between micro-batches: accumulation then weighs tokens a little unequally.)"""
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", classifier_config(tiny_corpus, tmp_path, 8), "--run_name", "big"], runs) == 0
    small = classifier_config(tiny_corpus, tmp_path, 4)
    argv = ["fit", "--config", small, "--trainer.accumulate_grad_batches", "2", "--run_name", "accumulated"]
    assert run_main(argv, runs) == 0
    assert run_main(["fit", "--config", small, "--run_name", "small"], runs) == 0
    big, accumulated, plain = weights(runs / "big"), weights(runs / "accumulated"), weights(runs / "small")
    for name, value in big.items():  # only the padding differs (a batch pads to its longest text): fp32 noise
        torch.testing.assert_close(accumulated[name], value, rtol=1e-5, atol=1e-6, msg=name)
    moved = max((plain[n] - big[n]).abs().max().item() for n in big)
    assert moved > 1e-3  # three steps on batches of 4 are a different run: the comparison can tell
    assert torch.load(runs / "accumulated" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3


def test_lr_schedule_counts_optimizer_steps(tiny_corpus, tmp_path):
    """One epoch of 15 micro-batches with accumulation 2 is 8 optimizer steps (Lightning also steps on the epoch's
    last, odd micro-batch): the linear schedule must reach 0 exactly there (counting micro-batches, it would stop
    at 1 - 8/15 of the peak)."""
    runs = tmp_path / "runs"
    argv = ["fit", "--config", classifier_config(tiny_corpus, tmp_path, 4, max_steps=-1, max_epochs=1),
            "--trainer.accumulate_grad_batches", "2", "--run_name", "epoch"]
    assert run_main(argv, runs) == 0
    ckpt = torch.load(runs / "epoch" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 8
    scheduler = ckpt["lr_schedulers"][0]
    assert scheduler["last_epoch"] == 8  # stepped once per optimizer step
    assert scheduler["_last_lr"] == pytest.approx([0.0] * len(scheduler["_last_lr"]), abs=1e-12)


def test_pause_mid_epoch_resumes_exactly(tiny_corpus, tmp_path):
    """7 micro-batches per epoch: steps 1-3 take two each, step 4 the epoch's last one alone; paused at step 3."""
    cfg = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=6))
    assert_resumes_exactly(["fit", "--config", cfg, "--trainer.accumulate_grad_batches", "2"], tmp_path / "runs",
                           stop=3, steps=6)


def test_checkpoints_land_on_optimizer_steps(tiny_corpus, tmp_path):
    """``--checkpoint_every 1`` with accumulation 3: one save per optimizer step, after its third micro-batch (or
    the epoch's last), never between micro-batches, where the accumulated gradients would be lost."""
    runs, saves = tmp_path / "runs", tmp_path / "saves.jsonl"
    cfg = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=4, limit_val_batches=0))
    argv = ["fit", "--config", cfg, "--trainer.accumulate_grad_batches", "3", "--checkpoint_every", "1",
            "--run_name", "every", "--trainer.callbacks+=tests.training.probes.SaveRecorder",
            "--trainer.callbacks.path", str(saves)]
    assert run_main(argv, runs) == 0
    rows = [json.loads(line) for line in saves.read_text().splitlines()]
    # 7 micro-batches an epoch: steps 1, 2 after 3 and 6, step 3 after the 7th (epoch end), step 4 after 3 more
    assert [(r["step"], r["ready"], r["consumed"]) for r in rows] == [(1, 3, 3), (2, 6, 6), (3, 7, 7), (4, 3, 3)]


def test_sigterm_mid_accumulation_waits_for_the_step_then_resumes_exactly(tiny_corpus, tmp_path):
    runs = tmp_path / "runs"
    cfg = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=5))
    base = ["fit", "--config", cfg, "--trainer.accumulate_grad_batches", "2"]
    assert run_main([*base, "--run_name", "full"], runs) == 0
    killed = [*base, "--run_name", "part", "--trainer.callbacks+=tests.training.probes.SigtermAt",
              "--trainer.callbacks.batch", "2"]  # the first micro-batch of step 2
    assert run_main(killed, runs) == 143
    ckpt = torch.load(runs / "part" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2  # it finished step 2's accumulation before stopping
    loader = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert loader["consumed"] == 4
    assert run_main([*base, "--run_name", "part", "--ckpt_path", "last"], runs) == 0
    full, part = logged_losses(runs / "full"), logged_losses(runs / "part")
    assert sorted(part) == sorted(full) == list(range(5))
    for step in range(5):
        assert part[step] == pytest.approx(full[step], rel=1e-5, abs=1e-6), step


def test_throughput_counts_every_micro_batch(tiny_corpus):
    dm = PretrainDataModule(TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1), source=str(tiny_corpus),
                            max_length=32, batch_size=4, limit_documents=20)
    seen = []

    class Recorder(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(batch["input_ids"].shape[0])

    monitor = ThroughputMonitor(measure_peak=False)
    trainer = PtmTrainer(max_steps=3, accumulate_grad_batches=2, accelerator="cpu", log_every_n_steps=2,
                         limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[monitor, Recorder()], use_distributed_sampler=False)
    trainer.fit(MaskedLMModule(backbone_config=TINY_BERT, optim={"lr": 1e-3, "warmup": 1}), datamodule=dm)
    assert trainer.global_step == 3 and len(seen) == 6  # 3 optimizer steps of 2 micro-batches
    assert monitor.samples == sum(seen) == 24  # the totals: the logged window and the tail after it
    window = monitor.last_window  # logged at step 2: steps 1 and 2, so four micro-batches
    assert window["samples"] == 16
    rate = float(trainer.logged_metrics["throughput/samples_per_s"])
    assert rate * window["seconds"] == pytest.approx(16, rel=1e-6)
