"""Callbacks that make runs exact and safe: RNG state in checkpoints, a last checkpoint on
Ctrl-C / SIGTERM, and prediction files."""
from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from ptm_app.paths import atomic_file


class RNGStateCallback(Callback):
    """Saves the Python/NumPy/torch RNG states and restores them when training resumes, so
    dropout draws after a resume are the ones an uninterrupted run would have made."""

    def __init__(self) -> None:
        self._pending: dict | None = None

    def state_dict(self) -> dict:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        numpy_state = [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)]  # loadable with weights_only
        return {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self._pending = state

    def on_train_start(self, trainer, pl_module) -> None:
        if self._pending is not None:
            random.setstate(self._pending["python"])
            kind, keys, pos, has_gauss, gauss = self._pending["numpy"]
            np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
            torch.set_rng_state(self._pending["torch"])
            self._pending = None


class LastCheckpoint(Callback):
    """Writes ``last.ckpt`` at the end of a training step, where Lightning's restart logic is exact.

    It saves every ``every_n_steps`` steps, at the last step of every epoch, and before stopping:
    on ``max_steps``, on ``PtmTrainer``'s ``max_flops``, on ``stop_at_step`` (pause a run without changing its LR schedule), on
    Ctrl-C or on SIGTERM.  A second Ctrl-C aborts at once.

    SIGTERM: from the start of training this callback owns the signal (it still forwards it to the processes a
    launcher started, as Lightning's handler does).  Lightning's own handler would stop wherever the loops next look
    at the flag (mid-validation, or between the step's end and the next batch), with no ``last.ckpt``; here the
    signal is noted, the next optimizer step saves ``last.ckpt`` on every rank, and only then is Lightning told,
    so it stops with exit code 143.  A SIGTERM during validation lets the validation finish first.

    With gradient accumulation it saves and stops only after an optimizer step: a checkpoint taken between
    micro-batches would drop the gradients accumulated so far, so a Ctrl-C or SIGTERM there waits for the step
    (at most ``accumulate_grad_batches - 1`` more micro-batches); ``every_n_steps`` and ``stop_at_step`` count
    optimizer steps.  Every rank calls ``save_checkpoint`` (the strategy decides who writes: rank 0 for DDP, every
    rank its shard for FSDP and DeepSpeed, into a ``last.ckpt/`` directory swapped in whole:
    ``strategies.AtomicShardedSave``), and a stop seen by one rank stops them all.
    """

    def __init__(self, path: str | Path, every_n_steps: int = 0, stop_at_step: int = 0):
        self.path = Path(path)
        self.every_n_steps, self.stop_at_step = every_n_steps, stop_at_step
        self.requested = False  # Ctrl-C
        self.sigterm = False  # SIGTERM, held until the next optimizer step has saved last.ckpt
        self.stopping = False
        self._previous: dict[int, object] = {}
        self._trainer = None
        self._saved_at = -1  # the optimizer step last.ckpt was written at

    def on_fit_start(self, trainer, pl_module) -> None:
        self._install(signal.SIGINT, self._on_sigint)

    def on_train_start(self, trainer, pl_module) -> None:
        """Lightning registers its SIGTERM handler after ``on_fit_start``: take the signal over here."""
        self._trainer = trainer
        self._install(signal.SIGTERM, self._on_sigterm)

    def _install(self, signum: int, handler) -> None:
        if threading.current_thread() is threading.main_thread() and signum not in self._previous:
            self._previous[signum] = signal.signal(signum, handler)

    def _on_sigint(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nstopping after this step and writing the last checkpoint (Ctrl-C again to abort)", flush=True)

    def _on_sigterm(self, signum, frame) -> None:
        launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
        if not self.sigterm and launcher is not None:
            launcher.kill(signum)  # the processes this one started stop too (what Lightning's handler does)
        self.sigterm = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if getattr(trainer, "received_sigterm", False):  # a SIGTERM Lightning saw before training started
            self.sigterm = True
            trainer._signal_connector.received_sigterm = False
        if not optimizer_stepped(trainer):
            return
        step = trainer.global_step
        sigterm = self.sigterm
        budget = getattr(trainer, "training_flops", None)  # PtmTrainer's max_flops rule (decided before this callback)
        stop = (self.requested or sigterm or 0 < trainer.max_steps <= step or 0 < self.stop_at_step <= step
                or (budget is not None and budget.spent))
        if trainer.world_size > 1:  # every rank must save (sharded checkpoints) and stop together
            flags = trainer.strategy.reduce(torch.tensor([float(stop), float(sigterm)],
                                                         device=trainer.strategy.root_device), reduce_op="max")
            stop, sigterm = bool(flags[0] > 0), bool(flags[1] > 0)
        periodic = self.every_n_steps > 0 and step % self.every_n_steps == 0
        epoch_end = batch_idx + 1 >= trainer.num_training_batches
        if stop or periodic or epoch_end:
            trainer.save_checkpoint(self.path, weights_only=False)  # the full state: optimizer, loops, callbacks
            self._saved_at = step
        if stop:
            trainer.should_stop = self.stopping = True
            if sigterm:
                trainer._signal_connector.received_sigterm = True  # Lightning stops after this batch (exit 143)

    def on_validation_end(self, trainer, pl_module) -> None:
        """A validation right after a step that wrote ``last.ckpt`` (the last step, an epoch's end, a periodic save)
        may tune values the module keeps (the multi-label cuts, the QA null threshold): ``last.ckpt`` is written
        again with them, as Lightning's ``ModelCheckpoint`` saves after validation, so an export or a resume of the
        finished run uses what its last validation chose."""
        if trainer.sanity_checking or trainer.state.fn != "fit" or self._saved_at != trainer.global_step:
            return
        if not any(getattr(m, "tuned_on_validation", False) for m in pl_module.modules()):
            return  # nothing validation tunes: the step's checkpoint is already the state
        trainer.save_checkpoint(self.path, weights_only=False)

    def on_train_end(self, trainer, pl_module) -> None:
        """Give SIGTERM back to Lightning's handler before Lightning's teardown restores the one before it: put back
        after the teardown (``on_fit_end`` comes later), Lightning's handler would outlive the run and keep its
        trainer, model and optimizer alive for the rest of the process."""
        self._restore(signal.SIGTERM)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._restore()
        if self.sigterm:  # arrived after the last step (its last.ckpt is written): what follows must not run
            trainer._signal_connector.received_sigterm = True

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._restore()

    def _restore(self, *signums: int) -> None:
        for signum in signums or list(self._previous):
            if signum in self._previous:
                signal.signal(signum, self._previous.pop(signum))


def optimizer_stepped(trainer) -> bool:
    """Did this training batch end with an optimizer step (not part-way through gradient accumulation)?

    Lightning steps every ``accumulate_grad_batches`` micro-batches and on the last batch of an epoch."""
    return not trainer.fit_loop._should_accumulate()


def write_predictions(trainer, rows: list[dict]) -> None:
    """Write ``rows`` to ``<trainer.default_root_dir>/predictions.jsonl`` (the run directory under main.py): the one
    predictions writer of every module and of ``PredictionWriter``."""
    if not rows or not trainer.is_global_zero:
        return
    path = Path(trainer.default_root_dir) / "predictions.jsonl"
    with atomic_file(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} predictions to {path}")


def score_rows(outputs: dict, labels: list[str]) -> list[dict]:
    """The prediction rows of a batch's ``predict_step`` outputs: the predicted label and every label's
    probability, the chosen label set (``chosen``: one bool per label) and every label's probability, or
    (regression) the predicted value; then any per-example ``row_extras`` (an early exit's layer)."""
    if "values" in outputs:  # regression: one real value per example
        rows = [{"value": round(v, 6)} for v in outputs["values"].tolist()]
    elif "chosen" in outputs:  # labels chosen one by one (a kind whose labels are independent): the chosen set
        rows = [{"labels": [name for name, keep in zip(labels, chosen) if keep],
                 "probs": {name: round(p, 6) for name, p in zip(labels, probs)}}
                for probs, chosen in zip(outputs["probs"].tolist(), outputs["chosen"].tolist())]
    else:
        rows = [{"label": labels[int(np.argmax(probs))], "probs": {name: round(p, 6) for name, p in zip(labels, probs)}}
                for probs in outputs["probs"].tolist()]
    return [{**row, **extra} for row, extra in zip(rows, outputs.get("row_extras") or [{}] * len(rows))]


class PredictionWriter(Callback):
    """Writes ``predictions.jsonl`` in the run directory: id, text, predicted label and every label's probability
    (or the predicted value, for regression), for modules whose ``predict_step`` returns scores."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_predict_epoch_start(self, trainer, pl_module) -> None:
        self.rows = []

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not isinstance(outputs, dict) or not ({"probs", "values"} & set(outputs)):
            return
        facts = getattr(pl_module, "data_facts", None)
        try:
            records = facts.records("test") if facts is not None else None
        except KeyError:  # a data module that keeps no example records
            records = None
        rows = score_rows(outputs, outputs.get("labels") or list(pl_module.hparams.get("labels") or []))
        for key, row in zip(outputs["keys"], rows):
            index = key[1] if isinstance(key, (tuple, list)) else int(key)
            if records is not None:
                row = {"id": records["ids"][index], "text": records["texts"][index], **row}
            self.rows.append(row)

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        write_predictions(trainer, self.rows)


def parameter_counts(module) -> tuple[int, int]:
    """(total, trainable) parameters of ``module``, whole under sharding (ZeRO-3 leaves empty local tensors)."""
    params = list(module.parameters())
    numel = lambda p: getattr(p, "ds_numel", p.numel())  # noqa: E731
    return sum(numel(p) for p in params), sum(numel(p) for p in params if p.requires_grad)


class RunSummary(Callback):
    """Keeps ``<run_dir>/summary.json`` current: what ran, its size, its time and its latest metrics.

    ``python main.py report`` builds results tables from these files, never from typed numbers.
    """

    def __init__(self, run_dir: str | Path, stage: str):
        self.path = Path(run_dir) / "summary.json"
        self.stage = stage
        self._start = 0.0  # time.monotonic() at this session's fit start (0: not fitting)
        self._before = 0.0  # fit seconds of the sessions before a resume

    def _load(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def _write(self, trainer, pl_module, **updates) -> None:
        from ptm_app.training.module import own_class

        if not trainer.is_global_zero:
            return
        summary = self._load()
        total, trainable = parameter_counts(pl_module)
        datamodule = trainer.datamodule
        summary.update({
            "module": own_class(pl_module).__name__,
            "style": pl_module.style() if hasattr(pl_module, "style") else type(pl_module).__name__,
            "backbone": pl_module.hparams.get("backbone") or (pl_module.hparams.get("backbone_config") or {}).get("model_type"),
            "data": getattr(datamodule, "source", None) or "+".join(getattr(datamodule, "tasks", None) or []) or None,
            "trainable_params": trainable, "total_params": total,
            "trainable_percent": round(100.0 * trainable / max(total, 1), 4),
        })
        for name in ("last", "best"):
            ckpt = self.path.parent / "checkpoints" / f"{name}.ckpt"
            files = [ckpt] if ckpt.is_file() else [f for f in ckpt.rglob("*") if f.is_file()]  # sharded: a dir
            if files:
                summary[f"{name}_ckpt_mb"] = round(sum(f.stat().st_size for f in files) / 2**20, 2)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
        summary.setdefault("metrics", {}).update(metrics)
        facts = getattr(pl_module, "summary_facts", None)  # a module's own facts (a student's and teacher's sizes ...)
        summary.update(facts() if facts is not None else {})
        if os.environ.get("PL_GLOBAL_SEED"):  # seed_everything's seed: report --over_seeds groups runs by it
            summary["seed"] = int(os.environ["PL_GLOBAL_SEED"])
        flops = getattr(trainer, "training_flops", None)  # PtmTrainer's count (throughput.TrainingFlops)
        if flops is not None and flops.totals()["tokens"]:
            summary.update({f"train_{k}": v for k, v in flops.totals().items()})
        summary.update(updates)
        with atomic_file(self.path, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2, sort_keys=True)

    def fit_seconds(self) -> float:
        """Training time up to now, over every resumed session (restored from the checkpoint, so a
        session killed after its last checkpoint counts up to that checkpoint and no further)."""
        return self._before + (time.monotonic() - self._start if self._start else 0.0)

    def state_dict(self) -> dict:
        return {"fit_seconds": self.fit_seconds()}

    def load_state_dict(self, state_dict: dict) -> None:  # Lightning calls it before on_fit_start
        self._before = float(state_dict.get("fit_seconds", 0.0))

    def on_fit_start(self, trainer, pl_module) -> None:
        self._start = time.monotonic()

    def on_fit_end(self, trainer, pl_module) -> None:
        from ptm_app.training.throughput import device_name

        self._write(trainer, pl_module, fit_seconds=round(self.fit_seconds(), 1), global_step=trainer.global_step,
                    machine=device_name(pl_module.device))  # what fit_seconds were measured on (a ledger keeps it)
        self._start, self._before = 0.0, 0.0

    def on_test_end(self, trainer, pl_module) -> None:
        self._write(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.stage == "validate":
            self._write(trainer, pl_module)
