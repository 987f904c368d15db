"""The console of a run: what it prints, and ``<run>/logs/console.log``, which holds that and everything else.

A run prints its run directory, one model line (``RunConsole``), the progress bar and, at the end of a fit, its
final metrics.  Known third-party noise is taken off the console at its source, each by a targeted rule, and
written to ``console.log`` only:

- Lightning's info notices (``lightning.pytorch`` / ``lightning.fabric`` loggers below WARNING: "GPU available",
  "Seed set to", the litlogger tip, "`weights_only` was not set"); their warnings stay on the console;
- warnings whose category (or a base of it) and text match ``NOISE_WARNINGS`` (deprecations inside third-party
  code, and Lightning notices about what ptm_app does on purpose, such as a frozen backbone kept in eval mode);
- transformers' records matching ``NOISE_TRANSFORMERS`` (the ``loss_type=None`` notice ...), and its weight-loading
  progress bar;
- transformers' load report (a table of every missing / unexpected key) becomes one line; the table goes to
  ``console.log``.  A missing MLM head for PET has its own warning (``adaptation/prompting.py``).

Only the first process of a run writes ``console.log`` (``paths.is_first_process``); what is diverted before the
run directory is known is kept and written when it is.
"""
from __future__ import annotations

import inspect
import io
import logging
import re
import sys
import warnings
from pathlib import Path
from typing import Optional

from lightning.pytorch.callbacks import Callback

NOISE_WARNINGS = (  # (category name, message pattern): third-party notices that say nothing about the run
    ("FutureWarning", r"`isinstance\(treespec, LeafSpec\)` is deprecated"),  # torch 2.13 via lightning _pytree
    ("UserWarning", r"Precision .* is not supported by the model summary"),  # lightning's summary under bf16
    ("FutureWarning", r"`is_gradient_checkpointing` is deprecated"),  # transformers 5, asked by peft
    ("UserWarning", r"Found \d+ module\(s\) in eval mode at the start of training"),  # frozen backbones, on purpose
    ("UserWarning", r"Checkpoint directory .* exists and is not empty"),  # every resume; the CLI says it once
    # few-shot recipes: Lightning logs by optimizer steps across epochs, so a step-bounded run still logs every n
    ("UserWarning", r"The number of training batches \(\d+\) is smaller than the logging interval"),
    # MaskedLMModule reads the batch on the CPU before the transfer (mlm.py): on purpose, with any DataModule
    ("UserWarning", r"You have overridden `on_before_batch_transfer` in `LightningModule` but have passed in a"),
)
NOISE_TRANSFORMERS = (  # messages of transformers' loggers that say nothing about the run
    r"`loss_type=None` was set in the config but it is unrecognized",  # every decoder-only model, once
    r"The tied weights mapping for this model specifies to tie",  # a head absent from the checkpoint: load report
    r"Token indices sequence length is longer than the specified maximum",  # measuring lengths: ptm_app says it
)
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")  # "lightning": the unified package's handler
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BUFFER_LIMIT = 1 << 20


class _ConsoleLog:
    """The run's ``console.log``: a copy of stdout and stderr, plus what is diverted from the console."""

    def __init__(self) -> None:
        self.file: Optional[io.TextIOBase] = None
        self.path: Optional[Path] = None
        self.pending: list[str] = []  # diverted before the file was opened
        self.streams: Optional[tuple] = None

    def write(self, text: str) -> None:
        text = _ANSI.sub("", text)
        if self.file is not None:
            self.file.write(text)
            self.file.flush()
        elif sum(map(len, self.pending)) < _BUFFER_LIMIT:
            self.pending.append(text)

    def open(self, path: Path) -> None:
        """Copy the console to ``path`` (appended: a resumed run continues its log) from now on."""
        self.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file, self.path = open(path, "a", encoding="utf-8"), path
        for text in self.pending:
            self.write(text)
        self.pending = []
        self.streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = _Tee(sys.stdout, self), _Tee(sys.stderr, self)
        _repoint_handlers(self.streams, (sys.stdout, sys.stderr))

    def close(self) -> None:
        if self.streams is not None:
            for i, name in enumerate(("stdout", "stderr")):
                current = getattr(sys, name)
                if isinstance(current, _Tee) and current.log is self:  # not if someone replaced it since
                    _repoint_handlers((current,), (self.streams[i],))
                    setattr(sys, name, self.streams[i])
            self.streams = None
        if self.file is not None:  # what comes after this run is kept for the next one
            self.file.close()
            self.file, self.path = None, None
            self.pending = []


class _Tee(io.TextIOBase):
    """A console stream that also writes to the console log (terminal queries go to the console)."""

    def __init__(self, stream, log: _ConsoleLog):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.log.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _repoint_handlers(old: tuple, new: tuple) -> None:
    """Logging handlers made at import time hold the streams of then: point them at ``new``."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler) \
                    and not isinstance(inspect.getattr_static(handler, "stream", None), property):  # lastResort's
                # kind (dill attaches one) reads sys.stderr at each record, so it follows by itself
                for before, after in zip(old, new):
                    if handler.stream is before:
                        handler.setStream(after)


CONSOLE_LOG = _ConsoleLog()


class _Divert(logging.Filter):
    """Sends matching records to the console log only (the record is formatted as its handler would)."""

    def __init__(self, keep) -> None:
        super().__init__()
        self.keep = keep

    def filter(self, record: logging.LogRecord) -> bool:
        if self.keep(record):
            return True
        CONSOLE_LOG.write(f"{record.name}: {record.getMessage()}\n")
        return False


class _LoadReport(logging.Filter):
    """transformers' load report in one line, the table to the console log."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(re.search(p, message) for p in NOISE_TRANSFORMERS):
            CONSOLE_LOG.write(f"{record.name}: {message}\n")
            return False
        if "LOAD REPORT" not in message:
            return True
        CONSOLE_LOG.write(_ANSI.sub("", message) + "\n")
        record.msg, record.args = load_report_line(message), ()
        return True


def load_report_line(report: str) -> str:
    """One line for transformers' load report: the model, where from, how many keys of each status."""
    text = _ANSI.sub("", report)
    head = text.splitlines()[0] if text else ""
    model, _, source = head.partition(" LOAD REPORT from: ")
    statuses = [line.split("|")[1].strip() for line in text.splitlines() if line.count("|") >= 2]
    meaning = {"MISSING": "missing (newly initialised)", "UNEXPECTED": "unexpected (ignored)",
               "MISMATCH": "of another shape (re-initialised)"}
    counts = [f"{statuses.count(s)} {meaning[s]}" for s in meaning if s in statuses]
    where = f" in {CONSOLE_LOG.path}" if CONSOLE_LOG.path is not None else " in the run's logs/console.log"
    return f"{model.strip()} from {source.strip()}: {', '.join(counts) or 'keys differ'}; the list{where}"


def _show_warning(original):
    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        kinds = {c.__name__ for c in category.__mro__}  # Lightning's PossibleUserWarning is a UserWarning
        if any(name in kinds and re.search(p, text) for name, p in NOISE_WARNINGS):
            CONSOLE_LOG.write(warnings.formatwarning(message, category, filename, lineno, line))
            return
        original(message, category, filename, lineno, file, line)

    show.ptm_console = True
    return show


def quiet_third_party() -> None:
    """Install the rules of the module docstring (idempotent)."""
    import transformers

    if not getattr(warnings.showwarning, "ptm_console", False):
        warnings.showwarning = _show_warning(warnings.showwarning)
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if not any(isinstance(f, _Divert) for f in handler.filters):
                handler.addFilter(_Divert(lambda r: r.levelno >= logging.WARNING))
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars, one per model load
    for name in ("transformers.modeling_utils", "transformers.configuration_utils",
                 "transformers.tokenization_utils_base"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _LoadReport) for f in logger.filters):
            logger.addFilter(_LoadReport())


def open_console_log(run_dir: Path) -> None:
    """Start copying the console to ``<run_dir>/logs/console.log`` (first process only)."""
    from ptm_app.paths import is_first_process

    if is_first_process():
        CONSOLE_LOG.open(Path(run_dir) / "logs" / "console.log")


def close_console_log() -> None:
    CONSOLE_LOG.close()


def human(n: float) -> str:
    """``7.5 M``, ``22.7 M``, ``135 K``: parameter counts as Lightning's summary writes them."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(int(n))


def _reason(trainer) -> str:
    """`` (auto: AVX512-BF16 found)``: why the precision is what it is (``PtmTrainer.precision_reason``)."""
    reason = getattr(trainer, "precision_reason", None)
    return f" ({reason})" if reason else ""


class RunConsole(Callback):
    """Prints the run's model line when it starts and, after a fit, the final metrics (rank 0)."""

    def _model_line(self, trainer, pl_module) -> None:
        from ptm_app.training.callbacks import parameter_counts
        from ptm_app.training.module import own_class

        if not trainer.is_global_zero:
            return
        total, trainable = parameter_counts(pl_module)
        backbone = getattr(pl_module, "backbone", None)
        inner = f" ({type(backbone).__name__})" if backbone is not None else ""
        device = type(trainer.accelerator).__name__.replace("Accelerator", "")
        print(f"model: {own_class(pl_module).__name__}{inner}, {human(total)} parameters, {human(trainable)} "
              f"trainable ({100.0 * trainable / max(total, 1):.2f} %), on {device}, "
              f"precision {trainer.precision}{_reason(trainer)}, "
              f"strategy {type(trainer.strategy).__name__} x {trainer.world_size}", flush=True)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._model_line(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.state.fn == "validate":
            self._model_line(trainer, pl_module)

    def on_test_start(self, trainer, pl_module) -> None:
        self._model_line(trainer, pl_module)

    def on_predict_start(self, trainer, pl_module) -> None:
        self._model_line(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items())
                   if getattr(v, "numel", lambda: 1)() == 1}
        if not metrics:
            return
        width = max(map(len, metrics))
        lines = [f"final metrics (step {trainer.global_step}):"]
        lines += [f"  {name:<{width}}  {value:.4g}" for name, value in metrics.items()]
        print("\n".join(lines), flush=True)
