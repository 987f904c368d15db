"""The one place that reads checkpoints: their keys, safe loading, integrity checks and ``last`` with a fallback.

Loading never executes code from a file (docs/design.md principle 11):
- every pickle is read by torch's weights-only unpickler (``torch.load(weights_only=True)``), which builds only
  tensors, containers, primitives and the few types registered in ``SAFE_GLOBALS``;
- a sharded checkpoint directory (FSDP's ``torch.distributed.checkpoint`` ``.metadata`` and ``meta.pt``,
  DeepSpeed's ``*.pt``) is checked file by file the same way *before* the library that owns the format reads it
  (``torch.distributed.checkpoint`` unpickles ``.metadata`` with plain ``pickle``, DeepSpeed loads with
  ``weights_only=False``), so what they later unpickle is known to be plain data;
- a file that needs more is refused in one line; ``trust=True`` (``--trust_checkpoint``) reads files you made
  yourself with the full unpickler.  A command's ``--trust_checkpoint`` holds for every checkpoint it reads
  (``trusting``): the one named, and the teachers, ``init_from`` and ``backbone`` checkpoints its model loads.

What is read stays data (``check_record``): tokenizer files are restored by a fixed list of names into the target
directory only (``write_tokenizer_files``); module classes are looked up among ptm_app's own
(``ptm_app.checkpoint_io.module_classes``), never imported by a stored name unless trusted; a sharded directory holds no
symlinks, and DeepSpeed's ``latest`` must name a directory inside it.

Integrity: ``.ckpt`` files are zip archives with a CRC-32 per record, so truncation and flipped bytes anywhere
are found (``zipfile.testzip``) before a run starts; ``last`` falls back to ``last-1.ckpt`` (the previous last
checkpoint, kept by every save) when the newest is unreadable.
"""
from __future__ import annotations

import contextlib
import contextvars
import io
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from ptm_app.errors import TRUST_HINT, CheckpointUnsafe, PtmError  # noqa: F401  (CheckpointUnsafe, TRUST_HINT: re-exported)
from ptm_app.errors import require_deepspeed
from ptm_app.paths import restore_replaced

CKPT_KEY = "ptm_app"  # ptm_app's own section of a checkpoint: model class, module class, tokenizer files, delta_only
BACKBONE_PREFIX = "backbone."  # the transformers model's keys in a module's state_dict
LAST, PREVIOUS = "last.ckpt", "last-1.ckpt"
# keys of ptm_app's records renamed since (old -> new), in checkpoints (``CKPT_KEY``) and in the JSON beside an
# export (``export.EXPORT_INFO``, ``compression.quantization.QUANT_CONFIG``): ``head`` named the model class
# (``backbones.model_classes``) before "head" kept only its other meanings.  Read through ``upgrade_record``.
RENAMED_RECORD_KEYS = {"head": "model_class"}


def upgrade_record(record: dict) -> dict:
    """``record`` (a checkpoint's ptm_app record, an export's JSON) with keys written before a rename under their
    names today (``RENAMED_RECORD_KEYS``), in place; returns it."""
    for old, new in RENAMED_RECORD_KEYS.items():
        if old in record and new not in record:
            record[new] = record.pop(old)
    return record


def read_record(path: str | Path) -> dict:
    """A ptm_app JSON record beside an export (``export.EXPORT_INFO``, ``QUANT_CONFIG``), under today's keys."""
    import json

    return upgrade_record(json.loads(Path(path).read_text()))


class CheckpointCorrupt(PtmError):
    """A checkpoint that cannot be read: truncated, damaged or not a checkpoint at all."""


_TRUST: contextvars.ContextVar[bool] = contextvars.ContextVar("ptm_app_trust_checkpoint", default=False)


def trusted(trust: Optional[bool] = None) -> bool:
    """``trust`` when given, else the running command's ``--trust_checkpoint`` (``trusting``)."""
    return _TRUST.get() if trust is None else bool(trust)


@contextlib.contextmanager
def trusting(trust: Optional[bool]) -> Iterator[None]:
    """Within the block, every checkpoint read without an explicit ``trust`` takes this one: a command's
    ``--trust_checkpoint`` then covers the teachers, ``init_from`` and ``backbone`` checkpoints its model loads."""
    token = _TRUST.set(trusted(trust))
    try:
        yield
    finally:
        _TRUST.reset(token)


def _safe_types() -> list:
    """Types inside checkpoints that torch's weights-only unpickler does not know by default but are plain data:
    the metadata dataclasses and enum of ``torch.distributed.checkpoint`` (FSDP's sharded format) and paths."""
    import pathlib

    from torch.distributed.checkpoint import filesystem, metadata

    names = ("Metadata", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
             "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING")
    types = [getattr(metadata, n) for n in names if hasattr(metadata, n)]
    if hasattr(filesystem, "_StorageInfo"):
        types.append(filesystem._StorageInfo)
    return types + [pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePosixPath]


SAFE_GLOBALS: list = []


def _register_safe_globals() -> None:
    if not SAFE_GLOBALS:
        SAFE_GLOBALS.extend(_safe_types())
        torch.serialization.add_safe_globals(SAFE_GLOBALS)


def _register_deepspeed_globals() -> None:
    """DeepSpeed's own plain-data types in its checkpoints: the loss scaler's settings, the ZeRO stage enum and
    the fragment addresses of flattened parameters (attribute bags and an enum, no code on construction)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    torch.serialization.add_safe_globals([LossScaler, ZeroStageEnum, fragment_address])


def _unsafe(path: Path, exc: BaseException) -> CheckpointUnsafe:
    import re

    found = re.search(r"GLOBAL ([\w.]+)", str(exc)) or re.search(r"Unsupported [^.:]*: ?([\w.]*)", str(exc))
    detail = f" (it calls or builds {found.group(1)})" if found and found.group(1) else ""
    return CheckpointUnsafe(f"{path}: refusing to load it: unpickling it would build objects other than plain data, "
                            f"which can run code{detail}; {TRUST_HINT}")


def _corrupt(path: Path, exc: BaseException) -> CheckpointCorrupt:
    reason = " ".join(str(exc).split())[:160] or type(exc).__name__
    return CheckpointCorrupt(f"{path}: the checkpoint is unreadable (truncated or damaged: {reason}); "
                             f"use another checkpoint (e.g. --ckpt_path last falls back to {PREVIOUS}) or re-run")


def load_file(path: str | Path, map_location: Any = "cpu", trust: Optional[bool] = None, mmap: bool = False) -> Any:
    """``torch.load`` of one file, weights-only unless ``trust``; bad files raise one-line errors."""
    _register_safe_globals()
    path, trust = Path(path), trusted(trust)
    try:
        return torch.load(path, map_location=map_location, weights_only=not trust, mmap=mmap)
    except pickle.UnpicklingError as exc:
        if "weights_only" in str(exc) or "Weights only load failed" in str(exc):
            raise _unsafe(path, exc) from None
        raise _corrupt(path, exc) from None
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile, KeyError, IndexError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise PtmError(f"checkpoint {path} not found; pass a .ckpt file, a run directory, 'last' or 'best'") from None
        raise _corrupt(path, exc) from None


def _check_zip(path: Path) -> None:
    """Every record's CRC-32 (a ``.ckpt`` is a zip archive): finds truncation and flipped bytes anywhere."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise _corrupt(path, exc) from None
    if bad is not None:
        raise _corrupt(path, ValueError(f"record {bad} fails its CRC check"))


class _PlainDataUnpickler(pickle.Unpickler):
    """The standard library's unpickler restricted to the globals torch's weights-only unpickler allows (plus
    ``SAFE_GLOBALS``): the documented way to read a pickle safely ("Restricting globals", ``pickle`` docs).  Used
    for bare pickles in pickle protocol 4/5, whose framing torch's own unpickler does not read."""

    def find_class(self, module: str, name: str):
        from torch import _weights_only_unpickler as wo

        allowed = {**wo._get_allowed_globals(), **wo._get_user_allowed_globals()}
        full = f"{module}.{name}"
        if full not in allowed:
            raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {full} is not plain data")
        return allowed[full]


def _check_raw_pickle(path: Path, trust: bool) -> None:
    """A bare pickle (``torch.distributed.checkpoint``'s ``.metadata``) read with only plain-data globals."""
    if trust:
        return
    _register_safe_globals()
    try:
        with open(path, "rb") as fh:
            _PlainDataUnpickler(fh).load()
    except pickle.UnpicklingError as exc:
        raise _unsafe(path, exc) from None
    except (EOFError, ValueError, OSError, RuntimeError, IndexError, TypeError, AttributeError) as exc:
        raise _corrupt(path, exc) from None


_VERIFIED: set[tuple] = set()  # (path, trust, size, mtime) checked in this process: a resume reads shards once


def _stamp(path: Path, trust: bool) -> tuple:
    """What ``verify`` remembers of a file or a directory's entries (a symlink inside stays in: it is refused)."""
    stats = [path.stat()] if path.is_file() else [p.lstat() for p in sorted(path.rglob("*"))
                                                  if p.is_file() or p.is_symlink()]
    return (str(path.resolve()), trust, *((s.st_size, s.st_mtime_ns) for s in stats))


def verify(path: str | Path, trust: Optional[bool] = None) -> Path:
    """Check a checkpoint file or sharded directory before anything loads it: intact, and plain data unless
    ``trust``.  Returns the path."""
    path, trust = Path(path), trusted(trust)
    stamp = _stamp(path, trust) if path.exists() else None
    if stamp in _VERIFIED:
        return path
    _check(path, trust)
    _VERIFIED.add(stamp)
    return path


def mark_verified(path: str | Path) -> None:
    """Record a checkpoint this process has just written and flushed to disk as checked (``verify`` then does
    not read it again: the next save keeps it as the fallback without re-reading it)."""
    _VERIFIED.add(_stamp(Path(path), trusted()))


def _sharded_files(path: Path) -> list[Path]:
    """Every file of a sharded checkpoint directory; a symlink anywhere inside is refused (``rglob`` would not
    follow a linked directory, but the library that reads the format would)."""
    files = []
    for folder, dirs, names in os.walk(path):
        for name in [*dirs, *names]:
            entry = Path(folder) / name
            if entry.is_symlink():
                raise CheckpointUnsafe(f"{path}: refusing the sharded checkpoint: {entry.relative_to(path)} is a "
                                       f"symlink (to {os.readlink(entry)}), and a checkpoint directory holds only "
                                       f"its own files; copy the real files in instead")
        files += [Path(folder) / name for name in names]
    return sorted(files)


def deepspeed_tag(path: Path) -> str:
    """The checkpoint tag DeepSpeed's ``latest`` names, refused unless it is a directory inside ``path`` (DeepSpeed
    would follow an absolute path or ``..`` and unpickle what is there with ``weights_only=False``)."""
    try:
        tag = (path / "latest").read_bytes()[:256].decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise _corrupt(path / "latest", exc) from None
    target = path / tag
    inside = (tag not in ("", ".", "..") and "/" not in tag and "\\" not in tag and "\0" not in tag
              and target.is_dir() and target.resolve().parent == path.resolve())
    if not inside:
        raise CheckpointUnsafe(f"{path / 'latest'} names {tag[:300]!r}, not a directory inside {path}; refusing the "
                               f"DeepSpeed checkpoint (DeepSpeed would load files from there)")
    return tag


def _check(path: Path, trust: bool) -> None:
    if path.is_dir():
        files = _sharded_files(path)
        if not files:
            raise CheckpointCorrupt(f"{path}: the sharded checkpoint directory is empty; use another checkpoint")
        if (path / "latest").is_file():  # DeepSpeed's layout: it unpickles the *.pt files of the tag's directory
            deepspeed_tag(path)
            require_deepspeed("a DeepSpeed checkpoint")
            _register_deepspeed_globals()
        for file in files:
            # .distcp shards hold raw tensor bytes, which torch.distributed.checkpoint reads weights-only itself
            if file.suffix in (".pt", ".ckpt", ".bin"):  # torch.save: meta.pt, DeepSpeed's model and optimizer states
                zipped = zipfile.is_zipfile(file)
                if zipped:
                    _check_zip(file)
                load_file(file, trust=trust, mmap=zipped)
            elif file.name.endswith(".metadata"):  # torch.distributed.checkpoint: a bare pickle
                _check_raw_pickle(file, trust)
        return
    if not path.is_file():
        raise PtmError(f"checkpoint {path} not found; pass a .ckpt file, a run directory, 'last' or 'best'")
    if not zipfile.is_zipfile(path):
        raise _corrupt(path, ValueError("not a zip archive: truncated, or not a torch checkpoint"))
    _check_zip(path)
    load_file(path, trust=trust, mmap=True)  # the pickle only: storages are mapped, not read


def resolve_last(ckpt_dir: Path, trust: Optional[bool] = None) -> Path:
    """``last.ckpt`` in ``ckpt_dir`` if it is readable, else the previous one (``last-1.ckpt``), said in one line."""
    newest, previous = restore_replaced(ckpt_dir / LAST), restore_replaced(ckpt_dir / PREVIOUS)
    if not newest.exists() and not previous.exists():
        raise PtmError(f"--ckpt_path last: no checkpoint at {newest}; run 'fit' first (without --ckpt_path) "
                       f"or pass a checkpoint file")
    try:
        return verify(newest, trust)
    except CheckpointCorrupt as exc:
        if not previous.exists():
            raise
        problem = str(exc) if newest.exists() else f"{newest} is missing (a save was interrupted)"
    verify(previous, trust)
    step = _global_step(previous)
    print(f"warning: {problem.split(';')[0]}; resuming from the previous checkpoint {previous}"
          + (f" (step {step})" if step is not None else ""), flush=True)
    return previous


def _global_step(path: Path) -> int | None:
    if path.is_dir():
        return None
    try:
        return int(load_file(path, mmap=True).get("global_step"))
    except (PtmError, TypeError, ValueError):
        return None


def checkpoint_path(ckpt_path: str | Path, trust: Optional[bool] = None) -> Path:
    """A checked checkpoint file or sharded directory; a run directory stands for its ``checkpoints/last.ckpt``
    (or ``last-1.ckpt`` when the newest is unreadable)."""
    path = restore_replaced(ckpt_path)  # a sharded save that crashed swapping directories: its previous one
    run_ckpts = path / "checkpoints"
    if path.is_dir() and (restore_replaced(run_ckpts / LAST).exists() or restore_replaced(run_ckpts / PREVIOUS).exists()):
        return resolve_last(run_ckpts, trust)
    if not path.exists():
        raise PtmError(f"checkpoint {ckpt_path} not found; pass a .ckpt file or a run directory")
    return verify(path, trust)


def consolidate_sharded(path: Path, trust: Optional[bool] = None) -> dict:
    """One full, ordinary checkpoint dict from a sharded ``.ckpt`` directory, in this process, on the CPU.

    FSDP (``torch.distributed.checkpoint``): Lightning's ``_load_distributed_checkpoint`` reads every shard into
    full tensors and adds the trainer state from ``meta.pt``.  DeepSpeed: DeepSpeed's ``zero_to_fp32`` merges the
    ZeRO partitions (any stage) into fp32 weights, through Lightning's ``convert_zero_checkpoint_to_fp32_state_dict``
    (which also keeps the client state: hyper-parameters, loops, ``ptm_app``).  Both unpickle with their own
    loaders, so the directory is ``verify``'d first.
    """
    verify(path, trust)
    if (path / "latest").is_file():
        import tempfile

        require_deepspeed("a DeepSpeed checkpoint")
        from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

        tag = deepspeed_tag(path)  # the checked tag, passed on: DeepSpeed does not read ``latest`` again
        with tempfile.TemporaryDirectory() as tmp:
            return convert_zero_checkpoint_to_fp32_state_dict(path, Path(tmp) / "full.ckpt", tag=tag)
    if (path / ".metadata").is_file():
        from lightning.fabric.utilities.load import _load_distributed_checkpoint

        return _load_distributed_checkpoint(path)
    raise PtmError(f"{path} is a directory but not a sharded checkpoint (FSDP or DeepSpeed); pass a .ckpt or run dir")


def read_checkpoint(ckpt_path: str | Path, trust: Optional[bool] = None) -> dict:
    """The whole checkpoint dict of a ptm_app run (file, sharded directory or run directory), loaded safely, its
    ptm_app record checked (``check_record``) and under today's keys (``upgrade_record``)."""
    trust = trusted(trust)
    path = checkpoint_path(ckpt_path, trust)
    ckpt = consolidate_sharded(path, trust) if path.is_dir() else load_file(path, trust=trust)
    if not isinstance(ckpt, dict) or CKPT_KEY not in ckpt or "state_dict" not in ckpt:
        raise PtmError(f"{path} is not a ptm_app checkpoint (no backbone config inside)")
    check_record(ckpt, path, trust)
    upgrade_record(ckpt[CKPT_KEY])
    return ckpt


# the names ``save_pretrained`` gives a tokenizer's text files (transformers 4 and 5, fast and slow tokenizers)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.txt", "vocab.json", "merges.txt")


def check_tokenizer_files(files: Any, source: Any) -> dict[str, str]:
    """The tokenizer files a checkpoint keeps (name -> text), refused in one line naming the entry unless every
    name is one of ``TOKENIZER_FILES`` (a name is never a path: no directory, no ``..``) and the tokenizer names no
    code of its own (``auto_map``: transformers would offer to run a ``.py`` shipped with it)."""
    if not isinstance(files, dict):
        raise CheckpointUnsafe(f"{source}: its tokenizer record is a {type(files).__name__}, not file name -> text; "
                               f"refusing the checkpoint (it was altered or is not ptm_app's)")
    for name, text in files.items():
        if not isinstance(name, str) or name not in TOKENIZER_FILES:
            raise CheckpointUnsafe(f"{source}: its tokenizer entry {repr(name)[:200]} is not a tokenizer file name "
                                   f"({', '.join(TOKENIZER_FILES)}); refusing the checkpoint (it was altered or is "
                                   f"not ptm_app's): nothing is written outside the tokenizer's directory")
        if not isinstance(text, str):
            raise CheckpointUnsafe(f"{source}: its tokenizer entry {name!r} holds a {type(text).__name__}, not "
                                   f"text; refusing the checkpoint (it was altered or is not ptm_app's)")
    config = files.get("tokenizer_config.json")
    if config is not None:
        from ptm_app.data.sources.references import config_json, refuse_remote_code

        refuse_remote_code(config_json(config), f"{source}: its tokenizer_config.json")
    return files


def write_tokenizer_files(files: Any, directory: str | Path, source: Any) -> Path:
    """Restore a checkpoint's tokenizer files into ``directory`` only (``check_tokenizer_files`` first)."""
    directory = Path(directory)
    for name, text in check_tokenizer_files(files, source).items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def check_record(ckpt: dict, source: Any, trust: Optional[bool] = None, own: Optional[type] = None) -> None:
    """A checkpoint's ptm_app record is data: its tokenizer files by allowed names only, no code named by its
    tokenizer or backbone config (``auto_map``), and its module class (``ptm_app.module`` and Lightning's
    ``_class_path``) one of ptm_app's (``module_classes``) or ``own`` (the class the caller chose), unless ``trust``.
    Refused in one line naming the entry."""
    from ptm_app.data.sources.references import refuse_remote_code
    from ptm_app.checkpoint_io.module_classes import check_module_name

    record = ckpt.get(CKPT_KEY) if isinstance(ckpt, dict) else None
    if record is None:
        return
    if not isinstance(record, dict):
        raise CheckpointUnsafe(f"{source}: its {CKPT_KEY} record is a {type(record).__name__}, not a dict; "
                               f"refusing the checkpoint (it was altered or is not ptm_app's)")
    check_tokenizer_files(record.get("tokenizer") or {}, source)
    hparams = ckpt.get("hyper_parameters")
    hparams = hparams if isinstance(hparams, dict) else {}
    refuse_remote_code(hparams.get("backbone_config"), f"{source}: its backbone_config")
    for name in (record.get("module"), hparams.get("_class_path")):
        if name is not None:
            check_module_name(name, source, trusted(trust), own)


def backbone_state(ckpt: dict) -> dict[str, torch.Tensor]:
    """The transformers model's weights in a checkpoint, without the module's ``backbone.`` prefix."""
    return {k[len(BACKBONE_PREFIX):]: v for k, v in ckpt["state_dict"].items() if k.startswith(BACKBONE_PREFIX)}


def moved_class_path(hparams: Any) -> dict:
    """``{"_class_path": today's name}`` when a checkpoint's hyper-parameters name a module class that moved since
    (``module_classes.RENAMED_MODULE_CLASSES``), else ``{}``: Lightning's loader resolves ``_class_path`` among the
    classes already imported and would refuse the old name."""
    from ptm_app.checkpoint_io.module_classes import current_name

    stored = hparams.get("_class_path") if isinstance(hparams, dict) else None
    return {"_class_path": current_name(stored)} if current_name(stored) != stored else {}


def as_file(ckpt: dict) -> io.BytesIO:
    """An in-memory ``.ckpt`` of a dict already loaded safely (e.g. consolidated shards), for Lightning's loaders
    (a moved module class under today's name: ``moved_class_path``)."""
    moved = moved_class_path(ckpt.get("hyper_parameters"))
    if moved:
        ckpt = {**ckpt, "hyper_parameters": {**ckpt["hyper_parameters"], **moved}}
    buffer = io.BytesIO()
    torch.save(ckpt, buffer)
    buffer.seek(0)
    return buffer


def strip_frozen_base(checkpoint: dict, kept: dict[str, torch.Tensor], source: str, source_config) -> None:
    """Save a run without its frozen base (``delta_only``): the module's own weights plus ``kept`` backbone
    tensors (a delta; none for frozen features); the base is rebuilt from ``source`` when the checkpoint loads."""
    rest = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith(BACKBONE_PREFIX)}
    checkpoint["state_dict"] = {**rest, **{BACKBONE_PREFIX + k: v for k, v in kept.items()}}
    hp = checkpoint["hyper_parameters"]
    hp["backbone"], hp["backbone_config"] = source, source_config
    checkpoint[CKPT_KEY]["delta_only"] = True  # read by export and by sharded loading


def restore_frozen_base(checkpoint: dict, backbone) -> None:
    """Complete a ``delta_only`` checkpoint with the rebuilt base's weights before Lightning loads it (sharded
    strategies load the weights themselves: there is no ``state_dict`` to complete then)."""
    if checkpoint.get(CKPT_KEY, {}).get("delta_only") and "state_dict" in checkpoint and backbone is not None:
        base = {BACKBONE_PREFIX + k: v for k, v in backbone.state_dict().items()}
        checkpoint["state_dict"] = {**base, **checkpoint["state_dict"]}
