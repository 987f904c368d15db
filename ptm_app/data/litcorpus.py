"""Corpora larger than memory, prepared and stored by litdata: parallel, restartable, read by random access.

Preparation (``prepare_corpus``) plans the input as pieces of about ``piece_bytes`` of text (``data.pieces``) and
hands them to ``litdata.optimize`` (Lightning's data engine; the approach of litgpt's data preparation), whose
worker processes tokenize one piece into one record::

    ids           uint16 (int32 when the vocabulary does not fit) token ids of the piece's lines, in order
    doc_tokens    int32   tokens per document
    doc_lines     int32   lines (sentences) per document
    line_lengths  int32   tokens per line
    counts        int64   [tokens, documents, lines]

litdata writes the records into ``chunk-*.bin`` files and ``index.json`` last (a complete set).  With
``use_checkpoint`` it notes every finished chunk, so an interrupted preparation restarts past them and writes
byte-identical chunks (the restart unit is one chunk).  ``checksums.json`` holds each chunk's sha256, written once
the set is complete; opening always checks the chunk sizes, and with ``verify`` also the checksums (it reads
the whole corpus once: a bit flip keeps the size).  ``key.json`` (``data.corpus_key``) ties the directory to
its inputs, text field and tokenizer, so a second run or another rank reuses it.

Reading (``LitCorpus``) uses ``StreamingDataset.read_window`` (a window of one field of one record, without
decoding the rest) under ptm_app's own seeded, exactly resumable sampler (``data.loader``), not litdata's
``StreamingDataLoader`` (its order depends on the worker count and its saved position is one prefetched batch
ahead: docs/data_engine_plan.md).  Setup reads the per-document arrays only (O(documents), never the tokens).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ptm_app.data.corpus_key import check_key, corpus_dir_for, corpus_key
from ptm_app.data.pieces import plan_pieces, piece_documents
from ptm_app.errors import PtmError
from ptm_app.paths import sha256_file, write_json

FORMAT_VERSION = 1
PIECE_BYTES = 8 << 20  # input text per record (UTF-8 bytes)
CHUNK_BYTES = "64MB"  # litdata chunk files
CHECKSUMS = "checksums.json"  # {"sha256": {chunk file: hex digest}}, written when the chunk set is complete
LINE_BATCH = 1000  # lines per tokenizer call (as corpus.tokenize_corpus)


def _litdata():
    os.environ.setdefault("LITDATA_CHECK_UPDATES", "0")  # never ask PyPI for a newer version (offline by default)
    try:
        import litdata
    except ImportError:
        raise PtmError("streaming corpora need litdata, which is not installed; run: make setup, or pip install "
                       "-c constraints-cpu.txt --no-deps litdata==0.2.76 boto3") from None
    return litdata


def tokenize_piece(piece: str, text_field: str, tokenizer, dtype: str) -> dict[str, np.ndarray]:
    """One ``optimize`` record: the piece's documents tokenized line by line (no special tokens)."""
    docs = list(piece_documents(piece, text_field))
    lines = [ln for d in docs for ln in d]
    id_parts, length_parts = [], []
    for start in range(0, len(lines), LINE_BATCH):  # each batch to NumPy at once: no Python ints for the piece
        ids = tokenizer(lines[start: start + LINE_BATCH], add_special_tokens=False, verbose=False,
                        return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        length_parts.append(lengths)
        id_parts.append(np.fromiter(chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum(dtype=np.int64))))
    line_lengths = np.concatenate(length_parts) if length_parts else np.zeros(0, np.int32)
    doc_lines = np.asarray([len(d) for d in docs], np.int32)
    ends = np.cumsum(doc_lines, dtype=np.int64)
    line_ends = np.concatenate([[0], np.cumsum(line_lengths, dtype=np.int64)])
    doc_tokens = (line_ends[ends] - line_ends[ends - doc_lines]).astype(np.int32)
    ids = np.concatenate(id_parts) if id_parts else np.zeros(0, dtype)
    counts = np.asarray([ids.size, len(docs), len(lines)], np.int64)
    return {"ids": ids, "doc_tokens": doc_tokens, "doc_lines": doc_lines, "line_lengths": line_lengths,
            "counts": counts}


def prepare_corpus(files: Sequence[Path], text_field: str, tokenizer, workers: Optional[int] = None,
                   target: Optional[Path] = None, piece_bytes: int = PIECE_BYTES, chunk_bytes: str = CHUNK_BYTES,
                   progress: bool = True) -> Path:
    """Tokenize ``files`` (in order) once with ``litdata.optimize``; return the directory (reused when complete,
    continued when an earlier preparation was interrupted)."""
    files = [Path(f) for f in files]
    key = corpus_key(files, text_field, tokenizer, FORMAT_VERSION, piece_bytes)
    target = Path(target) if target is not None else corpus_dir_for(key)
    key_file = target / "key.json"
    if key_file.exists():
        check_key(target, json.loads(key_file.read_text()), key)
        if (target / "index.json").exists():
            if not (target / CHECKSUMS).exists():  # stopped between litdata's index and the checksums
                _write_checksums(target)
            return target
    elif target.is_dir() and any(target.iterdir()):
        raise PtmError(f"{target} is not empty and holds no prepared corpus (no key.json); point "
                       f"data.init_args.shard_dir at an empty or new directory")
    litdata = _litdata()
    target.mkdir(parents=True, exist_ok=True)
    write_json(key_file, key)
    scratch = target / ".plain"  # decompressed copies of large compressed files, removed once complete
    pieces = plan_pieces(files, piece_bytes, scratch)
    saved = target / ".checkpoints" / "config.json"
    if saved.exists():  # a restart must use the worker count of the interrupted run (litdata splits by it)
        workers = int(json.loads(saved.read_text())["num_workers"])
        _remove_partial_chunks(target)  # a killed run had no chance to
    workers = max(1, min(workers or os.cpu_count() or 1, len(pieces)))
    dtype = "uint16" if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else "int32"
    fn = partial(tokenize_piece, text_field=text_field, tokenizer=tokenizer, dtype=dtype)
    before = set(multiprocessing.active_children())
    name = files[0].name + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # forked workers: the processes are the parallelism
    try:
        with _Progress(f"tokenizing {name}", target, len(pieces), np.dtype(dtype).itemsize, progress), \
                _rng_kept():  # optimize reseeds the process: the run's seeded draws must not depend on preparing
            litdata.optimize(fn=fn, inputs=pieces, output_dir=str(target), chunk_bytes=chunk_bytes,
                             num_workers=workers, use_checkpoint=True, reorder_files=False,
                             start_method="fork", verbose=False)
    except BaseException as exc:
        _stop_workers(set(multiprocessing.active_children()) - before)
        _remove_partial_chunks(target)
        if isinstance(exc, Exception):
            raise _one_line(exc, target) from None
        raise
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous
    shutil.rmtree(scratch, ignore_errors=True)
    _write_checksums(target)
    corpus = open_corpus(target, key)
    if corpus.num_documents == 0 or corpus.num_tokens == 0:
        raise PtmError(f"corpus {files[0]} is empty: no text in field '{text_field}'; check the file or "
                       f"data.text_field")
    return target


def _chunks(target: Path) -> list[dict]:
    return json.loads((target / "index.json").read_text())["chunks"]


def _write_checksums(target: Path) -> None:
    write_json(target / CHECKSUMS, {"sha256": {c["filename"]: sha256_file(target / c["filename"])
                                               for c in _chunks(target)}})


@contextmanager
def _rng_kept():
    """Restore Python's, NumPy's and torch's global random state afterwards."""
    import random

    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _stop_workers(workers: set) -> None:
    """End the workers of a failed ``optimize`` and the helper processes they forked (litdata leaves both running
    when one worker fails or the run is interrupted)."""
    pids = {w.pid for w in workers}
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):  # Linux; elsewhere only the workers themselves are ended
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found = set(pids)
    while True:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        if not more:
            break
        found |= more
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)  # their SIGTERM handler may keep them waiting on each other
        except OSError:
            pass
    for worker in workers:
        worker.join(5)


def _remove_partial_chunks(target: Path) -> None:
    """Delete chunk files no checkpoint lists (the one being written when preparation stopped)."""
    finished = set()
    for checkpoint in (target / ".checkpoints").glob("checkpoint-*.json"):
        try:
            finished.update(c["filename"] for c in json.loads(checkpoint.read_text())["chunks"])
        except (ValueError, KeyError):
            continue
    for chunk in target.glob("chunk-*.bin"):
        if chunk.name not in finished:
            chunk.unlink(missing_ok=True)


def _one_line(exc: Exception, target: Path) -> Exception:
    """litdata's error (a worker's traceback as text) as the one line the worker raised, or a line of our own."""
    text = str(exc)
    if isinstance(exc, PtmError):
        return exc
    raised = re.findall(r"(?:PtmError|DataFormatError): (.+)", text)
    if raised:
        return PtmError(raised[-1])
    if "No space left on device" in text or (isinstance(exc, OSError) and exc.errno == 28):
        return PtmError(f"disk full while preparing {target}: the finished chunks are kept and the partial one "
                        f"removed; free some space and run again to continue")
    if "checkpoints" in text and ("compatible" in text or "workers" in text):
        return PtmError(f"the interrupted preparation in {target} does not match this run ({text.splitlines()[0]});"
                        f" delete {target} and run again")
    return exc


class _Progress:
    """A transient rich progress bar over the pieces, with tokens and tokens/s (from the chunks written so far)
    and an ETA, polled from the output directory while ``optimize`` runs."""

    def __init__(self, description: str, target: Path, total: int, itemsize: int, enabled: bool):
        self.description, self.target, self.total, self.itemsize = description, target, total, itemsize
        self.enabled, self.stop = enabled, threading.Event()

    def _poll(self) -> None:
        started = time.perf_counter()
        while not self.stop.wait(0.5):
            done = 0
            for checkpoint in (self.target / ".checkpoints").glob("checkpoint-*.json"):
                try:
                    done += int(json.loads(checkpoint.read_text())["inputs_done"])
                except (OSError, ValueError, KeyError):
                    pass
            tokens = sum(f.stat().st_size for f in self.target.glob("chunk-*.bin")) // self.itemsize
            rate = tokens / max(time.perf_counter() - started, 1e-9)
            self.progress.update(self.task, completed=done, tokens=tokens, rate=rate)

    def __enter__(self) -> "_Progress":
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                     TextColumn("{task.fields[tokens]:,} tokens  {task.fields[rate]:,.0f} tokens/s"),
                                     TimeRemainingColumn(), transient=True)
            self.progress.__enter__()
            self.task = self.progress.add_task(self.description, total=self.total, tokens=0, rate=0.0)
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.stop.set()
            self.thread.join()
            self.progress.__exit__(*exc)


class LitCorpus:
    """A prepared corpus read by index arithmetic: documents' token spans, token ranges and lines, each read with
    ``read_window``; one ``StreamingDataset`` per process (data-loader workers open their own)."""

    def __init__(self, target: Path):
        self.target, self._dataset, self._pid = Path(target), None, None
        # all records (len(StreamingDataset) is this rank's share under torch.distributed; read_window is not)
        records = sum(c["chunk_size"] for c in _chunks(self.target))
        counts = np.stack([self._window(r, 0, 3, "counts") for r in range(records)]).astype(np.int64)
        doc_tokens = [self._window(r, 0, int(n), "doc_tokens") for r, n in enumerate(counts[:, 1])]
        doc_lines = [self._window(r, 0, int(n), "doc_lines") for r, n in enumerate(counts[:, 1])]
        self.record_tokens = np.concatenate([[0], np.cumsum(counts[:, 0])])
        record_lines = np.concatenate([[0], np.cumsum(counts[:, 2])])
        self.doc_len = np.concatenate(doc_tokens).astype(np.int64)
        self.doc_lines = np.concatenate(doc_lines).astype(np.int64)
        self.doc_start = np.concatenate([[0], np.cumsum(self.doc_len)[:-1]]).astype(np.int64)
        self.doc_record = np.repeat(np.arange(len(counts)), counts[:, 1])
        line_start = np.concatenate([[0], np.cumsum(self.doc_lines)[:-1]]).astype(np.int64)
        self.doc_first_line = line_start - record_lines[self.doc_record]  # within its record

    @property
    def dataset(self):
        if self._dataset is None or self._pid != os.getpid():
            self._dataset, self._pid = _litdata().StreamingDataset(str(self.target)), os.getpid()
        return self._dataset

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_dataset": None, "_pid": None}

    def _window(self, record: int, start: int, frames: int, field: str) -> np.ndarray:
        if frames == 0:
            return np.zeros(0, np.int64)
        return self.dataset.read_window(int(record), int(start), int(frames), [field])[field]

    @property
    def num_documents(self) -> int:
        return len(self.doc_len)

    @property
    def num_tokens(self) -> int:
        return int(self.record_tokens[-1])

    def doc_spans(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each chosen document's global token start and length."""
        return self.doc_start[docs], self.doc_len[docs]

    def sentence_counts(self, docs: np.ndarray) -> np.ndarray:
        return self.doc_lines[np.asarray(docs, np.int64)]

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Token ids ``[start, stop)`` of the whole corpus (a range may cross records)."""
        record = int(np.searchsorted(self.record_tokens, start, side="right")) - 1
        parts = []
        while start < stop:
            base, end = int(self.record_tokens[record]), min(stop, int(self.record_tokens[record + 1]))
            if end > start:
                parts.append(self._window(record, start - base, end - start, "ids"))
            start, record = max(start, end), record + 1
        if not parts:
            return np.zeros(0, np.int32)
        return (np.concatenate(parts) if len(parts) > 1 else parts[0]).astype(np.int32)

    def document(self, d: int) -> np.ndarray:
        start = int(self.doc_start[d])
        return self.tokens(start, start + int(self.doc_len[d]))

    def lines(self, d: int) -> list[np.ndarray]:
        record = int(self.doc_record[d])
        lengths = self._window(record, self.doc_first_line[d], self.doc_lines[d], "line_lengths")
        ids = self._window(record, self.doc_start[d] - self.record_tokens[record], self.doc_len[d], "ids")
        return np.split(ids.astype(np.int32), np.cumsum(lengths)[:-1])


def open_corpus(target: Path, expected_key: Optional[dict] = None, verify: bool = False) -> LitCorpus:
    """The prepared corpus in ``target``; an incomplete directory, another key or format version, or a chunk file
    whose size differs from ``index.json`` (with ``verify``: whose sha256 differs from ``checksums.json``) is one
    error naming it."""
    target = Path(target)
    index_file = target / "index.json"
    if not index_file.exists():
        raise PtmError(f"corpus directory {target} is incomplete (no index.json); run again to finish preparing it")
    if expected_key is not None:
        key_file = target / "key.json"
        check_key(target, json.loads(key_file.read_text()) if key_file.exists() else {}, expected_key)
    chunks = _chunks(target)
    for chunk in chunks:
        path = target / chunk["filename"]
        size = path.stat().st_size if path.exists() else None
        if size != chunk["chunk_bytes"]:
            raise PtmError(f"chunk {path} is {'missing' if size is None else f'{size} bytes'} but index.json says "
                           f"{chunk['chunk_bytes']}: it is truncated or corrupt; delete {target} and prepare again")
    if verify:
        if not (target / CHECKSUMS).exists():
            raise PtmError(f"corpus directory {target} has no {CHECKSUMS} (prepared by an older ptm_app), so it "
                           f"cannot be verified; delete it and prepare again, or set "
                           f"data.init_args.verify_chunks: false")
        sums = json.loads((target / CHECKSUMS).read_text())["sha256"]
        for chunk in chunks:
            path = target / chunk["filename"]
            if sums.get(chunk["filename"]) != sha256_file(path):
                raise PtmError(f"chunk {path} does not match its sha256 in {CHECKSUMS}: it is corrupt; delete "
                               f"{target} and prepare again")
    return LitCorpus(target)
