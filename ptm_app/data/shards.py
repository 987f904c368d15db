"""Corpora larger than memory: streaming, parallel tokenization into binary shards, read memory-mapped.

Preparation streams the input files (``formats.read_records``: JSONL, CSV/TSV, text, Parquet; gzip or zstd),
cuts it into chunks of about ``shard_bytes`` of text (so shard boundaries depend on the data only, never on
the worker count), and tokenizes the chunks in ``workers`` processes, at most ``2 × workers`` chunks in flight.
Each shard is a directory written atomically (``paths.atomic_dir``)::

    shard-00007/ids.npy          token ids (uint16 when the vocabulary fits, else int32)
                 line_lengths.npy  tokens per line (sentence)
                 doc_lines.npy     lines per document

An interrupted preparation restarts and skips the shards already on disk.  Once all are written, the
global ``line_offsets.npy`` / ``doc_offsets.npy`` (the ``corpus.TokenizedCorpus`` layout, filled through a
memory map, so never whole in RAM) and ``index.json`` (written last: its presence marks a complete set) follow.

The directory is keyed like ``corpus.tokenize_corpus``'s cache (content hash of every file, text field,
tokenizer fingerprint, format version, shard size), so a second run or another rank reuses it.  Reading
(``load_shards``) memory-maps every shard: setup costs one ``np.load`` per shard, whatever the corpus size.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from itertools import chain
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

from ptm_app.data.corpus import TokenizedCorpus
from ptm_app.data.formats import read_records
from ptm_app.data.tokenizer import tokenizer_fingerprint
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, atomic_file, cache_root, sha256_file, write_json

SHARD_FORMAT_VERSION = 1
SHARD_BYTES = 32 << 20  # text per shard (UTF-8 bytes) before tokenization
LINE_BATCH = 1000  # lines per tokenizer call (as corpus.tokenize_corpus)


def file_digest(path: Path) -> str:
    """``sha256_file(path)``, remembered per (path, size, mtime) so that setup on a prepared corpus does not
    re-read every input file (time to first batch stays independent of the corpus size)."""
    stat = path.stat()
    memo_key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    memo = cache_root() / "digests" / memo_key
    if memo.exists():
        return memo.read_text().strip()
    digest = sha256_file(path)
    with atomic_file(memo, "w") as fh:
        fh.write(digest)
    return digest


def shard_key(files: Sequence[Path], text_field: str, tokenizer, shard_bytes: int = SHARD_BYTES) -> dict:
    return {"format_version": SHARD_FORMAT_VERSION, "files": [file_digest(f) for f in files],
            "text_field": text_field, "tokenizer": tokenizer_fingerprint(tokenizer), "shard_bytes": shard_bytes}


def shard_dir_for(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_root() / "shards" / digest


def document_lines(text: str) -> list[str]:
    """A document's non-blank lines (its sentences), as ``corpus.tokenize_corpus`` splits them."""
    return [ln for ln in text.split("\n") if ln.strip()]


def _chunks(files: Sequence[Path], text_field: str, shard_bytes: int) -> Iterator[list[str]]:
    """The input's non-empty documents, streamed, in chunks of about ``shard_bytes`` of text."""
    chunk, size = [], 0
    for path in files:
        for _, record in read_records(path, (text_field,)):
            text = str(record[text_field])
            if not document_lines(text):
                continue
            chunk.append(text)
            size += len(text.encode("utf-8"))
            if size >= shard_bytes:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


_WORKER_TOKENIZER = None


def _init_worker(tokenizer) -> None:
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _WORKER_TOKENIZER = tokenizer


def _write_shard(texts: list[str], shard: Path, dtype: str, tokenizer=None) -> int:
    """Tokenize one chunk of documents into the shard directory ``shard``; returns its token count."""
    tokenizer = tokenizer or _WORKER_TOKENIZER
    docs = [document_lines(t) for t in texts]
    lines = [ln for d in docs for ln in d]
    id_parts, length_parts = [], []
    for start in range(0, len(lines), LINE_BATCH):  # each batch to NumPy at once: no Python ints for the shard
        pieces = tokenizer(lines[start: start + LINE_BATCH], add_special_tokens=False, verbose=False,
                           return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        lengths = np.fromiter(map(len, pieces), dtype=np.int32, count=len(pieces))
        length_parts.append(lengths)
        id_parts.append(np.fromiter(chain.from_iterable(pieces), dtype=dtype, count=int(lengths.sum(dtype=np.int64))))
    line_lengths = np.concatenate(length_parts) if length_parts else np.zeros(0, np.int32)
    ids = np.concatenate(id_parts) if id_parts else np.zeros(0, dtype)
    with atomic_dir(shard) as tmp:
        np.save(tmp / "ids.npy", ids)
        np.save(tmp / "line_lengths.npy", line_lengths)
        np.save(tmp / "doc_lines.npy", np.asarray([len(d) for d in docs], np.int32))
    return int(ids.size)


def _shard_name(i: int) -> str:
    return f"shard-{i:05d}"


def _check_key(target: Path, key: dict) -> None:
    """Refuse a shard directory written for other inputs, another tokenizer or another format version."""
    key_file = target / "key.json"
    if not key_file.exists():
        return
    found = json.loads(key_file.read_text())
    if found != key:
        _check_key_index(target, found, key)


def prepare_shards(files: Sequence[Path], text_field: str, tokenizer, workers: Optional[int] = None,
                   target: Optional[Path] = None, shard_bytes: int = SHARD_BYTES, progress: bool = True) -> Path:
    """Tokenize ``files`` (in order) into shards once; return the shard directory (reused when complete)."""
    files = [Path(f) for f in files]
    key = shard_key(files, text_field, tokenizer, shard_bytes)
    target = Path(target) if target is not None else shard_dir_for(key)
    _check_key(target, key)
    if (target / "index.json").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    write_json(target / "key.json", key)
    dtype = "uint16" if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else "int32"
    workers = workers or os.cpu_count() or 1
    pool = None
    if workers > 1:
        import multiprocessing

        # fork (as HF datasets' map(num_proc)): no re-import of the entry script, nothing to pickle; each worker
        # turns the tokenizer's own threads off (the processes are the parallelism)
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                                   initializer=_init_worker, initargs=(tokenizer,))
    names: list[str] = []
    with _TokenProgress(f"tokenizing {files[0].name}" + (f" (+{len(files) - 1} files)" if len(files) > 1 else ""),
                        progress) as bar:
        pending: set = set()
        try:
            for i, texts in enumerate(_chunks(files, text_field, shard_bytes)):
                shard = target / _shard_name(i)
                names.append(shard.name)
                if shard.is_dir():  # finished by an earlier, interrupted run
                    continue
                if pool is None:
                    bar.advance(_write_shard(texts, shard, dtype, tokenizer))
                    continue
                pending.add(pool.submit(_write_shard, texts, shard, dtype))
                if len(pending) >= 2 * workers:  # bounded memory: never more than 2 chunks per worker in flight
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        bar.advance(future.result())
            for future in pending:
                bar.advance(future.result())
        except BrokenProcessPool:
            raise PtmError(f"a tokenizer worker died while preparing {target} (out of memory?); lower "
                           f"data.init_args.prepare_workers and run again: finished shards are kept") from None
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
    if not names:
        raise PtmError(f"corpus {files[0]} is empty: no text in field '{text_field}'; check the file or data.text_field")
    _write_index(target, names, key, dtype)
    return target


def _write_index(target: Path, names: list[str], key: dict, dtype: str) -> None:
    """The global offsets (filled shard by shard through memory maps) and ``index.json``, written last."""
    shards = [_open_shard(target, name) for name in names]
    n_lines = sum(len(s["line_lengths"]) for s in shards)
    n_docs = sum(len(s["doc_lines"]) for s in shards)
    tokens = [int(s["line_lengths"].sum(dtype=np.int64)) for s in shards]
    if sum(tokens) == 0:
        raise PtmError(f"corpus in {target} tokenizes to zero tokens; check the text field '{key['text_field']}'")
    for name, arrays, count in [("line_offsets", "line_lengths", n_lines), ("doc_offsets", "doc_lines", n_docs)]:
        tmp = target / f".{name}.tmp.npy"
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(count + 1,))
        out[0], at, total = 0, 1, 0
        for s in shards:
            part = np.cumsum(s[arrays], dtype=np.int64) + total
            out[at: at + len(part)] = part
            at, total = at + len(part), (int(part[-1]) if len(part) else total)
        out.flush()
        del out
        os.replace(tmp, target / f"{name}.npy")
    write_json(target / "index.json", {"key": key, "dtype": dtype, "shards": names, "tokens": tokens,
                                       "documents": n_docs, "lines": n_lines})


def _open_shard(target: Path, name: str) -> dict:
    shard = target / name
    try:
        return {part: np.load(shard / f"{part}.npy", mmap_mode="r") for part in ("ids", "line_lengths", "doc_lines")}
    except (OSError, ValueError, EOFError) as exc:
        raise PtmError(f"shard {shard} is missing, truncated or corrupt ({type(exc).__name__}: {exc}); delete "
                       f"{shard} and {target / 'index.json'} and run again: only that shard is rebuilt") from None


class ShardedIds:
    """The token ids of all shards as one read-only sequence: slicing maps a global range onto the shards."""

    def __init__(self, shards: list[np.ndarray]):
        self.shards = shards
        self.starts = np.concatenate([[0], np.cumsum([len(s) for s in shards], dtype=np.int64)])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, item) -> np.ndarray:
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError("ShardedIds supports contiguous slices only")
        start, stop, _ = item.indices(len(self))
        if stop <= start:
            return np.zeros(0, np.int32)
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        parts = []
        while start < stop:
            base = int(self.starts[first])
            end = min(stop, int(self.starts[first + 1]))
            parts.append(self.shards[first][start - base: end - base])
            start, first = end, first + 1
        return np.concatenate(parts).astype(np.int32, copy=False) if len(parts) > 1 else parts[0].astype(np.int32)


def load_shards(target: Path, expected_key: Optional[dict] = None) -> TokenizedCorpus:
    """The prepared shards as a ``TokenizedCorpus`` whose arrays are memory maps; every shard is checked against
    ``index.json`` (a missing, truncated or resized shard is one error naming it)."""
    target = Path(target)
    index_file = target / "index.json"
    if not index_file.exists():
        raise PtmError(f"shard directory {target} is incomplete (no index.json); run again to finish preparing it")
    index = json.loads(index_file.read_text())
    if expected_key is not None and index.get("key") != expected_key:
        _check_key_index(target, index.get("key", {}), expected_key)
    shards = []
    for name, tokens in zip(index["shards"], index["tokens"]):
        ids = _open_shard(target, name)["ids"]
        if len(ids) != tokens:
            raise PtmError(f"shard {target / name} holds {len(ids)} tokens, index.json says {tokens}: it is corrupt; "
                           f"delete it and {index_file} and run again: only that shard is rebuilt")
        shards.append(ids)
    try:
        line_offsets = np.load(target / "line_offsets.npy", mmap_mode="r")
        doc_offsets = np.load(target / "doc_offsets.npy", mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise PtmError(f"the offsets in {target} are truncated or corrupt ({exc}); delete {index_file} "
                       f"and run again to rewrite them") from None
    if len(line_offsets) != index["lines"] + 1 or len(doc_offsets) != index["documents"] + 1:
        raise PtmError(f"the offsets in {target} do not match index.json; delete {index_file} and run again")
    return TokenizedCorpus(ids=ShardedIds(shards), line_offsets=line_offsets, doc_offsets=doc_offsets)


def _check_key_index(target: Path, found: dict, key: dict) -> None:
    what = [k for k in key if found.get(k) != key[k]]
    said = [f"{k} {found.get(k)!r} (this run: {key[k]!r})" if k != "files" else "input files (other contents)"
            for k in what]
    raise PtmError(f"shard directory {target} was written with another {'; '.join(said)}; point "
                   f"data.init_args.shard_dir elsewhere or delete {target} to rebuild it")


class _TokenProgress:
    """A transient rich progress line: tokens so far and tokens/s."""

    def __init__(self, description: str, enabled: bool):
        self.description, self.enabled = description, enabled
        self.tokens, self.started = 0, time.perf_counter()

    def __enter__(self) -> "_TokenProgress":
        if self.enabled:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                     TextColumn("{task.fields[tokens]:,} tokens  {task.fields[rate]:,.0f} tokens/s"),
                                     TimeElapsedColumn(), transient=True)
            self.progress.__enter__()
            self.task = self.progress.add_task(self.description, total=None, tokens=0, rate=0.0)
        return self

    def advance(self, tokens: int) -> None:
        self.tokens += tokens
        if self.enabled:
            rate = self.tokens / max(time.perf_counter() - self.started, 1e-9)
            self.progress.update(self.task, tokens=self.tokens, rate=rate)

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.progress.__exit__(*exc)


def expand_inputs(patterns: Iterable[str | Path]) -> list[Path]:
    """Files named by paths or globs, sorted within each glob; a glob that matches nothing is an error."""
    import glob

    files: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise PtmError(f"data source glob '{pattern}' matches no file; check the pattern and the directory")
            files.extend(Path(m).resolve() for m in matches)
        else:
            files.append(Path(pattern).resolve())
    return files
