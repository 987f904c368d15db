"""A run's console: the run directory, one model line, the progress bar and the final metrics, none of the known
third-party noise; ``<run>/logs/console.log`` holds the console and the noise (training/console.py)."""
from __future__ import annotations

import contextlib
import re
import warnings

import pytest
import yaml

from ptm_app.training.console import load_report_line
from tests.scale.conftest import launch

NOISE = [  # what every run printed before (issue 11): none of it may reach the console
    r"LOAD REPORT", r"\|\s*(UNEXPECTED|MISSING)\s*\|",  # transformers' load report table
    r"LeafSpec", r"FLOPs", r"Total params", r"weights_only` was not set", r"loss_type=None", r"litlogger",
    r"GPU available", r"Loading weights",
]


@pytest.fixture(scope="module")
def finetune_run(tiny_corpus, tmp_path_factory):
    """2 steps of MiniLM topic classification on the tiny corpus (its classifier is new, its pooler unused: a
    load report), in a subprocess of main.py as a user runs it."""
    tmp = tmp_path_factory.mktemp("console")
    cfg = {
        "seed_everything": 3,
        "trainer": {"max_steps": 2, "accelerator": "cpu", "devices": 1, "precision": "32-true",
                    "val_check_interval": 2, "limit_val_batches": 1, "log_every_n_steps": 1},
        "model": {"class_path": "SequenceClassificationModule", "init_args": {"backbone": "minilm"}},
        "data": {"class_path": "TaskDataModule",
                 "init_args": {"source": str(tiny_corpus), "tokenizer": {"pretrained": "minilm"},
                               "max_length": 32, "batch_size": 4}},
    }
    config = tmp / "console_run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    runs = tmp / "runs"
    out = launch(["fit", "--config", str(config)], runs, env={"OMP_NUM_THREADS": "1"})
    return out.stdout + out.stderr, runs / "console_run"


def test_the_console_shows_the_run_and_no_known_noise(finetune_run):
    console, run = finetune_run
    noise = [line for line in console.splitlines() if any(re.search(p, line) for p in NOISE)]
    assert noise == []
    assert f"run directory: {run}" in console
    model = [line for line in console.splitlines() if line.startswith("model: SequenceClassificationModule")]
    assert len(model) == 1 and "parameters" in model[0] and "32-true" in model[0], model
    # the load report in one line: the new classifier and the unused pooler, counted
    report = [line for line in console.splitlines() if "the list in" in line]
    assert len(report) == 1 and re.search(r"\d+ missing \(newly initialised\)", report[0]), report
    final = console[console.index("final metrics (step 2):"):].splitlines()
    assert any(re.match(r"\s+train/loss\s+\d", line) for line in final)
    assert any(re.match(r"\s+throughput/tokens_per_s\s+\d", line) for line in final)


def test_console_log_holds_the_console_and_the_noise(finetune_run):
    console, run = finetune_run
    log = (run / "logs" / "console.log").read_text(encoding="utf-8")
    for line in ("run directory: ", "model: SequenceClassificationModule", "final metrics (step 2):"):
        assert line in log
    assert "LOAD REPORT" in log and re.search(r"classifier\.\w+\s*\|\s*MISSING", log)  # the full table
    assert "GPU available" in log and "Seed set to 3" in log  # Lightning's notices
    assert "\x1b[" not in log  # no terminal colour codes


def test_a_load_report_becomes_one_line():
    report = ("\x1b[1mBertForMaskedLM LOAD REPORT\x1b[0m from: data/minilm\nKey | Status | \n---+---+-\n"
              "pooler.dense.bias | UNEXPECTED | \npooler.dense.weight | UNEXPECTED | \n"
              "cls.predictions.bias | MISSING | \n\nNotes:\n- UNEXPECTED:\tcan be ignored\n- MISSING:\tnewly")
    line = load_report_line(report)
    assert line.startswith("BertForMaskedLM from data/minilm: 1 missing (newly initialised), 2 unexpected (ignored)")
    assert "\n" not in line


def test_deepspeed_says_nothing_about_the_cpu_once_main_has_named_it():
    """DeepSpeed (imported by transformers when a model is saved) warns "Setting accelerator to CPU" unless
    DS_ACCELERATOR names it; main() names it on a machine without CUDA."""
    import os
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA, DeepSpeed finds its accelerator and says nothing")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    code = "import deepspeed.accelerator as a; a.get_accelerator()"
    before = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "Setting accelerator to CPU" in before.stdout + before.stderr  # the noise exists without the name
    after = subprocess.run([sys.executable, "-c", "from ptm_app.main import name_cpu_for_deepspeed; "
                            "name_cpu_for_deepspeed(); " + code], env=env, capture_output=True, text=True, timeout=120)
    assert after.returncode == 0, after.stderr[-2000:]
    assert "Setting accelerator" not in after.stdout + after.stderr


@pytest.mark.parametrize("kind", ["last_resort", "subclass"])
def test_the_console_log_opens_and_closes_with_logging_last_resort_attached(tmp_path, kind):
    """A library that attaches ``logging.lastResort`` (its stream is a read-only property that follows sys.stderr),
    or a handler subclassing its type, must not break closing the console log: a second run in the same process
    crashed there with AttributeError."""
    import logging
    import sys

    from ptm_app.training.console import close_console_log, open_console_log

    handler = logging.lastResort if kind == "last_resort" else type("Sub", (type(logging.lastResort),), {})(0)
    logger = logging.getLogger("test_console.last_resort")
    logger.addHandler(handler)
    try:
        open_console_log(tmp_path)
        print("inside the run", file=sys.stderr)
        close_console_log()
    finally:
        logger.removeHandler(handler)
    assert "inside the run" in (tmp_path / "logs" / "console.log").read_text()
    assert handler.stream is sys.stderr


def test_a_resume_is_quiet_and_a_fresh_fit_over_a_run_says_so_once(tiny_corpus, tmp_path):
    """Lightning warns 'Checkpoint directory ... exists and is not empty' at every resume: the log gets it; a fresh
    fit into a run that has checkpoints prints one note naming the resume flag instead.  The first run is made in
    this process (its console is the fixture's test above); the two that meet its checkpoints are real processes."""
    from tests.conftest import run_main, tiny_mlm_config

    config = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2))
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", config], runs) == 0
    resumed = launch(["fit", "--config", config, "--trainer.max_steps", "4", "--ckpt_path", "last"], runs,
                     env={"OMP_NUM_THREADS": "1"})
    again = launch(["fit", "--config", config], runs, env={"OMP_NUM_THREADS": "1"})
    for out in (resumed, again):
        assert "exists and is not empty" not in out.stdout + out.stderr
    notes = [line for line in (again.stdout + again.stderr).splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "--ckpt_path last" in notes[0], notes
    assert "note: " not in resumed.stdout + resumed.stderr
    assert "exists and is not empty" in (runs / "tiny_mlm" / "logs" / "console.log").read_text(encoding="utf-8")


@contextlib.contextmanager
def console_warnings(run_dir):
    """Warnings raised inside go through the console's rules, with ``<run_dir>/logs/console.log`` open; yields the
    list of messages that reached the console."""
    from ptm_app.training.console import _show_warning, close_console_log, open_console_log

    shown = []
    open_console_log(run_dir)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = _show_warning(lambda message, *rest: shown.append(str(message)))
            yield shown
    finally:
        close_console_log()


def test_a_frozen_backbone_notice_goes_to_the_log_under_its_subclassed_category(tmp_path):
    """Lightning's "Found N module(s) in eval mode" is a PossibleUserWarning (a UserWarning subclass): the
    NOISE_WARNINGS rule names UserWarning and must still take it off the console (a feature-extraction sweep
    printed it for every cell); another UserWarning stays on the console."""
    import warnings

    from lightning.fabric.utilities.warnings import PossibleUserWarning

    with console_warnings(tmp_path) as shown:
        warnings.warn("Found 120 module(s) in eval mode at the start of training. This may lead to unexpected "
                      "behavior", PossibleUserWarning)
        warnings.warn("a warning of the user's own", UserWarning)
    assert shown == ["a warning of the user's own"]
    assert "Found 120 module(s) in eval mode" in (tmp_path / "logs" / "console.log").read_text()


def test_a_short_epoch_notice_goes_to_the_log_because_steps_still_log_across_epochs(tmp_path):
    """Lightning warns "number of training batches (4) is smaller than the logging interval" for every few-shot
    recipe (minilm_pet_few_shot_bbc: 32 articles, batch 8, log every 5).  It is noise there: logging counts
    optimizer steps across epochs, so a step-bounded run still logs train/loss at steps 5 and 10.  The notice goes
    to console.log, not the console."""
    import csv

    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, _):
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 2)), batch_size=8)
    with console_warnings(tmp_path) as shown:
        trainer = L.Trainer(max_steps=10, log_every_n_steps=5, accelerator="cpu", logger=CSVLogger(tmp_path),
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Tiny(), data)
    assert not [m for m in shown if "smaller than the logging interval" in m], shown
    assert "is smaller than the logging interval" in (tmp_path / "logs" / "console.log").read_text()
    with open(next(tmp_path.rglob("metrics.csv"))) as f:
        steps = [int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")]
    assert steps == [4, 9]  # 0-based steps 5 and 10: logged although each epoch has 4 batches
