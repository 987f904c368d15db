"""The command line: LightningCLI for fit/validate/test/predict, plus plain subcommands.

Every run writes to ``checkpoints/<run_name>/`` (``$PTM_RUNS_DIR`` moves it): the resolved
``config.yaml``, ``checkpoints/last.ckpt`` and ``checkpoints/best.ckpt``, CSV and TensorBoard logs.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
from pathlib import Path
from typing import Optional

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger

from lightning.pytorch import LightningDataModule, LightningModule
from ptm_app.data.loader import DataPositionCallback
from ptm_app.errors import PtmError
from ptm_app.checkpoint_io.module_classes import config_classes
from ptm_app.checkpoint_io.reading import (CKPT_KEY, CheckpointUnsafe, check_record, checkpoint_path, load_file, resolve_last,
                                 trusted, trusting, verify)
from ptm_app.paths import (RunLock, atomic_dir, is_first_process, remove_interrupted_writes, restore_replaced,
                           run_name_for, runs_root)
from ptm_app.training.callbacks import LastCheckpoint, PredictionWriter, RNGStateCallback, RunSummary
from ptm_app.checkpoint_io.writing import AtomicCheckpointIO
from ptm_app.training.console import RunConsole, close_console_log, open_console_log, quiet_third_party
from ptm_app.training.throughput import ThroughputMonitor
from ptm_app.training.precision import check_hardware
from ptm_app.training.trainer import PtmTrainer
from ptm_app.training.strategies import check_checkpoint_layout, is_sharded
from ptm_app.training.loggers import RunCSVLogger

LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")
MODEL_FROM_CONFIG = ("fit", "validate", "test")  # a checkpoint of another family is refused (predict takes its own)


class RunConfigSaver(SaveConfigCallback):
    """Writes the fully resolved config to ``<run_dir>/config.yaml`` (overwritten on resume)."""

    def __init__(self, *args, run_dir: Path, **kwargs):
        super().__init__(*args, overwrite=True, **kwargs)
        self.run_dir = run_dir

    def setup(self, trainer, pl_module, stage: str) -> None:
        if trainer.is_global_zero:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.parser.save(self.config, self.run_dir / self.config_filename, skip_none=False,
                             overwrite=True, multifile=False)
            tokenizer = getattr(trainer.datamodule, "tokenizer", None)
            if tokenizer is not None:  # the run's tokenizer, next to its config (it is in every .ckpt too)
                with atomic_dir(self.run_dir / "tokenizer") as tmp:
                    tokenizer.save_pretrained(tmp)


class PtmCLI(LightningCLI):
    """LightningCLI with a run directory, exact resume and one-line errors."""

    def __init__(self, args=None, run_lock: Optional[RunLock] = None, console_log: bool = False, **kwargs):
        kwargs.setdefault("model_class", LightningModule)
        kwargs.setdefault("trainer_class", PtmTrainer)  # adds precision: auto
        kwargs.setdefault("datamodule_class", LightningDataModule)
        kwargs.setdefault("trainer_defaults", {"use_distributed_sampler": False, "log_every_n_steps": 10,
                                               "enable_model_summary": False})  # RunConsole prints a model line
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("auto_configure_optimizers", False)
        kwargs.setdefault("save_config_callback", None)  # RunConfigSaver is added per run
        kwargs.setdefault("parser_kwargs", {"exit_on_error": False, "default_env": False})
        # the classes configs name by their short names (class_path: TaskDataModule): jsonargparse resolves a short
        # name among the subclasses of the model / data / callback types, which this registry makes present
        self.classes = config_classes()
        argv = list(args) if isinstance(args, (list, tuple)) else sys.argv[1:] if args is None else []  # a dict: all
        self._requested = argv[0] if argv and argv[0] in LIGHTNING_COMMANDS else None
        self.run_lock = run_lock or RunLock()
        self.console_log = console_log  # copy the console to <run>/logs/console.log (closed by run_lightning)
        self._trust = contextlib.ExitStack()  # --trust_checkpoint, for every checkpoint this run reads
        with self._trust:
            super().__init__(args=args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        """Lightning's subcommands, only the one asked for when argv starts with it: building a subcommand's parser
        (every Trainer, model and data argument) costs ~0.1-0.2 s, paid by every run; a bare ``--help`` or an
        argv without a subcommand first still gets all four."""
        every = LightningCLI.subcommands()
        return {self._requested: every[self._requested]} if self._requested in every else every

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--run_name", type=Optional[str], default=None,
                            help="Run directory name under checkpoints/ (default: the config file's name).")
        parser.add_argument("--checkpoint_every", type=int, default=0,
                            help="Also write last.ckpt every N training steps (it is always written at epoch ends).")
        parser.add_argument("--stop_at_step", type=int, default=0,
                            help="Pause after this global step (with last.ckpt), keeping the full run's LR schedule.")
        parser.add_argument("--trust_checkpoint", type=bool, default=False,
                            help="Read --ckpt_path, and the teacher, init_from and backbone checkpoints, even if they "
                                 "hold more than plain data or name a module class outside ptm_app (their loading "
                                 "can run code): only for checkpoints you made yourself.")

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        argv = list(args) if isinstance(args, (list, tuple)) else sys.argv[1:]
        type_dict_overrides(self.config, argv)
        count_validation_in_global_steps(self.config, argv)
        subcommand = self.config.get("subcommand")
        sub = self.config[subcommand] if subcommand else self.config
        self._trust.enter_context(trusting(bool(sub.get("trust_checkpoint"))))

    def _parse_ckpt_path(self) -> None:
        """Lightning's step that reads an explicit ``--ckpt_path`` file's hyper-parameters into the model config,
        through the checkpoint layer: the file is checked (intact; plain data unless ``--trust_checkpoint``) and
        only its pickle is read (tensors memory-mapped), so a damaged or crafted file is one line, not a traceback.
        Its record is checked (``checkpoint_io.reading.check_record``) and its module class looked up among ptm_app's
        (``module_classes``: a stored name is never imported unless trusted); fit, validate and test refuse a
        checkpoint of another model family than the config's (``_check_family``)."""
        subcommand = self.config.get("subcommand")
        cfg = self.config[subcommand] if subcommand else None
        if cfg is None or not cfg.get("ckpt_path") or not Path(cfg.ckpt_path).is_file():
            return
        ckpt = self._read_pickle(cfg.ckpt_path)
        self._check_family(ckpt, cfg.ckpt_path, subcommand)
        hparams = dict(ckpt.get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if "_class_path" in hparams:
            from ptm_app.checkpoint_io.module_classes import module_class

            cls = module_class(hparams.pop("_class_path"), cfg.ckpt_path, trusted())
            hparams = {"class_path": f"{cls.__module__}.{cls.__qualname__}",
                       "dict_kwargs": upgraded(cls, hparams)}
        else:
            hparams = upgraded(self._configured_model_class(subcommand), hparams)
        self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)

    @staticmethod
    def _read_pickle(path) -> dict:
        """A checkpoint file's pickle (checked; tensors memory-mapped) with its record checked."""
        ckpt = load_file(verify(path), mmap=True)
        if not isinstance(ckpt, dict) or not isinstance(ckpt.get("hyper_parameters") or {}, dict):
            raise CheckpointUnsafe(f"{path}: not a checkpoint dict with a hyper_parameters dict; refusing it")
        check_record(ckpt, path)
        return ckpt

    def _check_family(self, ckpt: dict, path, subcommand: Optional[str]) -> None:
        """fit, validate and test take their model from the config: a checkpoint of another module class is refused
        in one line naming both, unless one class derives from the other with the same model class and task kind (a
        checkpoint's class replaces the config's, as Lightning does; predict and export take the checkpoint's)."""
        if subcommand not in MODEL_FROM_CONFIG:
            return
        from ptm_app.checkpoint_io.module_classes import module_class

        stored = (ckpt.get("hyper_parameters") or {}).get("_class_path") or (ckpt.get(CKPT_KEY) or {}).get("module")
        configured = self._configured_model_class(subcommand)
        if stored is None or configured is None:
            return
        theirs = module_class(stored, path, trusted())
        if theirs is configured:
            return
        related = issubclass(theirs, configured) or issubclass(configured, theirs)
        same = all(getattr(theirs, a, None) == getattr(configured, a, None) for a in ("model_class", "task_kind"))
        if not (related and same):
            raise PtmError(f"--ckpt_path {path} holds a {_family(theirs)}, but the config's model is a "
                           f"{_family(configured)}; {subcommand} takes its model from the config: give the config "
                           f"that trained the checkpoint (its run's config.yaml), or use predict / export, which "
                           f"take the model from the checkpoint")

    def _configured_model_class(self, subcommand: str) -> Optional[type]:
        """The model class the parsed config names: the registry's (``config_classes``), or the one jsonargparse
        imported while parsing the user's config (a class of the user's own)."""
        model = self.config[subcommand].get("model")
        name = model.get("class_path") if model is not None and hasattr(model, "get") else None
        if not isinstance(name, str):
            return None
        module_path, _, attr = name.rpartition(".")
        found = self.classes.get(attr) if module_path in ("", getattr(self.classes.get(attr), "__module__", None)) \
            else None
        found = found or getattr(sys.modules.get(module_path), attr, None)
        return found if isinstance(found, type) else None

    # -- run directory ----------------------------------------------------------------------
    def _sub(self):
        return self.config[self.subcommand] if self.subcommand else self.config

    def _run_name(self) -> str:
        cfg = self._sub()
        name = run_name_for(cfg.get("run_name"), cfg.get("config") or [])
        if name:
            return name
        raise PtmError("no run name: pass --config FILE.yaml or --run_name NAME")

    def before_instantiate_classes(self) -> None:
        self.run_dir = runs_root() / self._run_name()
        cfg = self._sub()
        # before anything is written: one line for what the hardware cannot run (PtmTrainer checks it too)
        check_hardware(cfg.trainer.get("accelerator"), cfg.trainer.get("devices"), cfg.trainer.get("precision"))
        if is_first_process():  # one process per run directory (other ranks of this run share it)
            self.run_lock.acquire(self.run_dir)
            if self.console_log:  # <run>/logs/console.log: the console and the third-party noise
                open_console_log(self.run_dir)
            print(f"run directory: {self.run_dir}", flush=True)
            for where in (self.run_dir, self.run_dir / "checkpoints"):
                removed = remove_interrupted_writes(where)
                if removed:
                    print(f"note: removed {len(removed)} temp file(s) left in {where} by an interrupted save: "
                          f"{', '.join(removed[:5])}{' ...' if len(removed) > 5 else ''}", flush=True)
            if self.subcommand == "fit" and not cfg.get("ckpt_path") and any((self.run_dir / "checkpoints").glob("*")):
                print(f"note: {self.run_dir / 'checkpoints'} holds an earlier fit's checkpoints; this fit starts "
                      f"afresh and replaces them (to continue that fit, pass --ckpt_path last)", flush=True)
        if cfg.get("ckpt_path"):
            trust = trusted()
            named_file = Path(cfg.ckpt_path).is_file()
            cfg.ckpt_path = str(self._checkpoint(cfg.ckpt_path, trust))
            cfg.weights_only = not trust  # Lightning's own loaders: torch's weights-only unpickler
            if not named_file and Path(cfg.ckpt_path).is_file():  # last, best or a run directory: checked here
                self._check_family(self._read_pickle(cfg.ckpt_path), cfg.ckpt_path, self.subcommand)

    def _checkpoint(self, ckpt_path: str, trust: bool) -> Path:
        """``last`` (falling back to ``last-1`` if the newest is unreadable), ``best`` or a path, checked to be
        intact and plain data before Lightning reads it."""
        ckpt_dir = self.run_dir / "checkpoints"
        if ckpt_path == "last":
            return resolve_last(ckpt_dir, trust)
        if ckpt_path == "best":
            # a directory for sharded strategies; restored if a save crashed while swapping it in
            path = restore_replaced(ckpt_dir / "best.ckpt")
            if not path.exists():
                raise PtmError(f"--ckpt_path best: no checkpoint at {path}; "
                               f"run 'fit' first (without --ckpt_path) or pass a checkpoint file")
            return verify(path, trust)
        if not Path(ckpt_path).exists():
            raise PtmError(f"--ckpt_path {ckpt_path}: no such checkpoint file; use 'last', 'best' or a .ckpt path")
        return checkpoint_path(ckpt_path, trust)

    def instantiate_trainer(self, **kwargs):
        cfg = self._sub()
        run_dir = self.run_dir
        ckpt_dir = run_dir / "checkpoints"
        monitor, mode = getattr(self.model, "monitor", ("val/loss", "min"))
        callbacks = [
            DataPositionCallback(),
            RNGStateCallback(),
            LastCheckpoint(ckpt_dir / "last.ckpt", cfg.get("checkpoint_every") or 0, cfg.get("stop_at_step") or 0),
            PredictionWriter(),
            RunSummary(run_dir, self.subcommand or "fit"),
            RunConsole(),
            ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor=monitor, mode=mode, save_top_k=1,
                            enable_version_counter=False),
        ]
        if self.subcommand == "fit":
            callbacks.append(ThroughputMonitor())  # tokens/s, samples/s, padding fraction, MFU, peak memory
            callbacks.append(RunConfigSaver(self._parser(self.subcommand), self.config.get(self.subcommand),
                                            run_dir=run_dir))
        kwargs.setdefault("default_root_dir", str(run_dir))
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        if trainer_cfg.get("logger") in (None, True):
            kwargs["logger"] = [RunCSVLogger(run_dir, name="logs", version=""),
                                TensorBoardLogger(run_dir, name="tensorboard", version="")]
        plugins = trainer_cfg.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        check_checkpoint_layout(cfg.get("ckpt_path"), trainer_cfg.get("strategy"))
        # sharded strategies (FSDP, DeepSpeed) write a directory from every rank, not through CheckpointIO
        kwargs["plugins"] = plugins if is_sharded(trainer_cfg.get("strategy")) else plugins + [AtomicCheckpointIO()]
        user_callbacks = trainer_cfg.get("callbacks") or []
        kwargs["callbacks"] = (user_callbacks if isinstance(user_callbacks, list) else [user_callbacks]) + callbacks
        return super().instantiate_trainer(**kwargs)


def upgraded(cls: Optional[type], hparams: dict) -> dict:
    """A checkpoint's hyper-parameters under the names ``cls`` has today (``PtmModule.upgrade_checkpoint``)."""
    upgrade = getattr(cls, "upgrade_checkpoint", None)
    return upgrade(dict(hparams)) if upgrade is not None else hparams


def _family(cls: type) -> str:
    """A module class with its model class and task kind, for messages."""
    kind = getattr(cls, "task_kind", None)
    return f"{cls.__name__} ({getattr(cls, 'model_class', '?')} model class" + (f", {kind} task)" if kind else ")")


def type_dict_overrides(config, argv: list[str]) -> None:
    """Command-line values of keys inside dict-typed settings (``--model.init_args.backbone_config.hidden_size 768``,
    ``tasks``) are read as YAML scalars (int, float, bool, null, lists), as jsonargparse reads typed keys; jsonargparse
    itself leaves them strings.  Only values given on the command line change: a YAML file's quoted strings stay."""
    import yaml
    from jsonargparse import Namespace

    subcommand = argv[0] if argv and argv[0] in LIGHTNING_COMMANDS else None
    root = config.get(subcommand) if subcommand else config
    for i, token in enumerate(argv):
        if not token.startswith("--") or token == "--":
            continue
        key, eq, raw = token[2:].partition("=")
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                continue
            raw = argv[i + 1]
        parent, node = None, root
        for part in key.split("."):
            parent = node
            if isinstance(node, Namespace):
                node = node.get(part) if part in node else node.get("init_args", Namespace()).get(part)
            elif isinstance(node, dict):
                node = node.get(part)
            else:
                node = None
                break
        last = key.rsplit(".", 1)[-1]
        if isinstance(parent, dict) and isinstance(node, str) and node == raw:
            try:
                parent[last] = yaml.safe_load(raw)
            except yaml.YAMLError:
                pass  # not YAML: the string it was


def count_validation_in_global_steps(config, argv: list[str]) -> None:
    """A step-based run (``max_steps``) with an integer ``val_check_interval`` validates every that many training
    batches counted over the whole run, across epochs: ``check_val_every_n_epoch: None`` (Lightning then allows an
    interval longer than an epoch; with its default of 1 the interval counts within each epoch and must fit in one,
    so a recipe would depend on the corpus size and the number of ranks).  Not if the user set
    ``check_val_every_n_epoch`` (command line or a ``--config`` file)."""
    subcommand = argv[0] if argv and argv[0] in LIGHTNING_COMMANDS else None
    trainer = (config.get(subcommand) if subcommand else config).get("trainer")
    if trainer is None or _trainer_key_given(argv, "check_val_every_n_epoch", subcommand):
        return
    max_steps, interval = trainer.get("max_steps"), trainer.get("val_check_interval")
    if isinstance(max_steps, int) and max_steps > 0 and isinstance(interval, int) and not isinstance(interval, bool):
        trainer.check_val_every_n_epoch = None


def _trainer_key_given(argv: list[str], key: str, subcommand: Optional[str]) -> bool:
    """Does ``--trainer.KEY`` appear in ``argv``, or ``trainer: {KEY: ...}`` in one of its ``--config`` files?"""
    import yaml

    for i, token in enumerate(argv):
        name, eq, value = token.partition("=")
        if name == f"--trainer.{key}":
            return True
        if name != "--config":
            continue
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        try:
            text = Path(value).read_text() if Path(value).is_file() else value
            loaded = yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError):
            continue
        if isinstance(loaded, dict) and subcommand in loaded and isinstance(loaded[subcommand], dict):
            loaded = loaded[subcommand]
        trainer = loaded.get("trainer") if isinstance(loaded, dict) else None
        if isinstance(trainer, dict) and key in trainer:
            return True
    return False


def run_lightning(argv: list[str]) -> int:
    """One LightningCLI run, in a copy of the current ``contextvars`` context: jsonargparse sets context variables
    it never resets (``subclass_arg_parser`` holds the last parser, whose instantiators hold the CLI, its trainer,
    model and optimizer), so without the copy every run in one process (a sweep, a notebook, the test suite) would
    keep the previous run's model alive."""
    return contextvars.copy_context().run(_run_lightning, argv)


def _run_lightning(argv: list[str]) -> int:
    lock = RunLock()  # taken on the run directory once the config names it
    quiet_third_party()
    try:
        PtmCLI(args=None if argv == sys.argv[1:] else argv, run_lock=lock, console_log=True)
    finally:
        close_console_log()
        lock.release()
    return 0
