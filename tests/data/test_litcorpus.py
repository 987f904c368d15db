"""Streaming corpora prepared by litdata (data.litcorpus, data.pieces, data.blocks): the same ids, offsets and blocks
as the in-memory path, reuse and restart, exact resume, rank splits, bad input, HF datasets directories, and memory
that does not grow with the corpus."""
import gzip
import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("litdata")

from ptm_app.data import litcorpus  # noqa: E402
from ptm_app.data.blocks import LazyBlocks  # noqa: E402
from ptm_app.data.corpus import load_corpus, pack_blocks, read_texts, tokenize_corpus  # noqa: E402
from ptm_app.data.datamodules import PretrainDataModule, holdout_split  # noqa: E402
from ptm_app.data.formats import read_records  # noqa: E402
from ptm_app.data.litcorpus import open_corpus, prepare_corpus  # noqa: E402
from ptm_app.data.loader import ResumableLoader  # noqa: E402
from ptm_app.data.pieces import piece_documents, plan_pieces  # noqa: E402
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer  # noqa: E402
from ptm_app.errors import PtmError  # noqa: E402
from tests.conftest import make_docs, write_jsonl  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data"
SMALL = {"piece_bytes": 20_000, "chunk_bytes": "40KB", "progress": False}  # several pieces and chunks


@pytest.fixture(scope="module")
def minilm():
    return load_tokenizer(TokenizerSpec(pretrained="minilm"), None, "")


def subset(tmp_path: Path, name: str, n: int) -> Path:
    with open(DATA / name / "train.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(next(fh)) for _ in range(n)]
    return write_jsonl(tmp_path / f"{name}.jsonl", [{"text": r["text"]} for r in rows])


def assert_same_corpus(prepared, memory) -> None:
    """Token ids, document spans and every document's lines equal the in-memory corpus's."""
    docs = np.arange(memory.num_documents)
    assert prepared.num_documents == memory.num_documents
    assert np.array_equal(prepared.tokens(0, prepared.num_tokens), memory.ids)
    for mine, theirs in zip(prepared.doc_spans(docs), memory.doc_spans(docs)):
        assert np.array_equal(mine, theirs)
    assert np.array_equal(prepared.sentence_counts(docs), memory.sentence_counts(docs))
    for d in (0, len(docs) // 2, len(docs) - 1):
        assert [x.tolist() for x in prepared.lines(d)] == [x.tolist() for x in memory.lines(d)]


@pytest.mark.parametrize("name,n", [("bbc", 120), ("brown", 25)])
def test_prepared_corpus_reproduces_the_in_memory_ids_offsets_and_blocks(tmp_path, minilm, name, n):
    path = subset(tmp_path, name, n)
    memory = load_corpus(tokenize_corpus(path, "text", minilm, progress=False))
    target = prepare_corpus([path], "text", minilm, workers=1, target=tmp_path / "c", **SMALL)
    prepared = open_corpus(target)
    assert len(json.loads((target / "index.json").read_text())["chunks"]) >= 3  # several chunks, stitched
    assert prepared.num_documents == n
    assert_same_corpus(prepared, memory)
    cls, sep = minilm.cls_token_id, minilm.sep_token_id
    train, _ = holdout_split(n, 0.1, 7)
    for mode in ("pack", "split_documents"):
        blocks, owners = pack_blocks(memory, 64, [cls], [sep], [sep], mode, train, with_documents=True)
        lazy = LazyBlocks(prepared, 64, [cls], [sep], [sep], mode, np.asarray(train))
        assert len(lazy) == len(blocks) > 10
        for i in range(len(blocks)):
            ids, own = lazy[i]
            assert np.array_equal(ids, blocks[i]) and np.array_equal(own, owners[i]), (mode, i)
            assert np.array_equal(lazy.ids(i), blocks[i])


def test_pieces_cover_every_record_once(tmp_path):
    rows = make_docs(60, 3)
    jsonl = write_jsonl(tmp_path / "a.jsonl", rows)
    txt = tmp_path / "b.txt"
    txt.write_text("\n\n".join(r["text"] for r in rows) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet, row_group_size=5)  # 12 row groups
    for path, piece_bytes in ((jsonl, jsonl.stat().st_size // 12), (txt, txt.stat().st_size // 12), (parquet, 1)):
        pieces = plan_pieces([path], piece_bytes)
        assert len(pieces) >= 10
        got = [lines for piece in pieces for lines in piece_documents(piece, "text")]
        assert got == [[ln for ln in t.split("\n") if ln.strip()] for t in read_texts(path, "text")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows[:40]) + "{oops\n")
    last = plan_pieces([bad], 500)[-1]
    with pytest.raises(PtmError, match=r"bad.jsonl:41: malformed JSON"):  # the file's own line number
        list(piece_documents(last, "text"))
    assert [r for _, r in read_records(jsonl, byte_range=(0, 0))] == []


def crash_after(monkeypatch, log: Path, after: int, error: BaseException):
    """Make every worker log the pieces it tokenizes to ``log`` and raise ``error`` on its ``after+1``-th one
    (the workers are forked, so the patched module is theirs)."""
    real, done = litcorpus.tokenize_piece, []

    def logged(piece, *args, **kwargs):
        if after is not None and len(done) == after:
            raise error
        done.append(piece)
        with open(log, "a") as fh:
            fh.write(piece + "\n")
        return real(piece, *args, **kwargs)

    monkeypatch.setattr(litcorpus, "tokenize_piece", logged)


def chunk_files(target: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(target.glob("chunk-*.bin"))}


@pytest.mark.parametrize("error", [PtmError("interrupted"), OSError(28, "No space left on device")])
def test_interrupted_preparation_restarts_past_finished_chunks_identically(tmp_path, minilm, monkeypatch, error):
    path = subset(tmp_path, "bbc", 60)
    small = {**SMALL, "piece_bytes": 5_000, "chunk_bytes": "10KB"}
    clean = prepare_corpus([path], "text", minilm, workers=1, target=tmp_path / "clean", **small)
    pieces = plan_pieces([path], small["piece_bytes"])
    assert len(pieces) > 15 and len(list(clean.glob("chunk-*.bin"))) > 4
    crash_after(monkeypatch, tmp_path / "first.log", 10, error)
    with pytest.raises(PtmError, match="interrupted" if isinstance(error, PtmError) else
                       r"disk full while preparing .*again: the finished chunks are kept and the partial one removed"):
        prepare_corpus([path], "text", minilm, workers=1, target=tmp_path / "again", **small)
    again = tmp_path / "again"
    assert not (again / "index.json").exists()
    finished = json.loads((again / ".checkpoints" / "checkpoint-0.json").read_text())
    kept = {p.name: p.stat().st_mtime_ns for p in again.glob("chunk-*.bin")}
    assert sorted(kept) == sorted(c["filename"] for c in finished["chunks"]) and kept  # no partial chunk left
    crash_after(monkeypatch, tmp_path / "second.log", None, error)
    prepare_corpus([path], "text", minilm, workers=2, target=again, **small)  # restarts with the 1 worker it began with
    redone = (tmp_path / "second.log").read_text().split("\n")[:-1]
    assert redone == pieces[finished["inputs_done"]:] and len(redone) < len(pieces)  # finished chunks not redone
    assert all(again.joinpath(name).stat().st_mtime_ns == ns for name, ns in kept.items())
    assert chunk_files(clean) == chunk_files(again)
    chunks = [json.loads((d / "index.json").read_text())["chunks"] for d in (clean, again)]
    assert chunks[0] == chunks[1]
    (tmp_path / "second.log").unlink()  # complete: a third run (or another rank) only reads
    assert prepare_corpus([path], "text", minilm, workers=1, target=again, **small) == again
    assert not (tmp_path / "second.log").exists()


def test_worker_processes_write_the_same_corpus(tmp_path, minilm):
    path = subset(tmp_path, "bbc", 40)
    one = open_corpus(prepare_corpus([path], "text", minilm, workers=1, target=tmp_path / "one", **SMALL))
    two = open_corpus(prepare_corpus([path], "text", minilm, workers=2, target=tmp_path / "two", **SMALL))
    docs = np.arange(one.num_documents)
    assert np.array_equal(one.tokens(0, one.num_tokens), two.tokens(0, two.num_tokens))
    assert np.array_equal(one.doc_spans(docs)[0], two.doc_spans(docs)[0])
    assert one.lines(docs[-1])[0].tolist() == two.lines(docs[-1])[0].tolist()


def test_compressed_inputs_and_a_glob_give_one_corpus(tmp_path, minilm):
    import zstandard

    rows = make_docs(30, 5)
    plain = write_jsonl(tmp_path / "all.jsonl", rows)
    write_jsonl(tmp_path / "parts" / "a.jsonl", rows[:10])
    (tmp_path / "parts" / "b.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows[10:20]).encode()))
    (tmp_path / "parts" / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress("".join(json.dumps(r) + "\n" for r in rows[20:]).encode()))
    memory = load_corpus(tokenize_corpus(plain, "text", minilm, progress=False))
    dm = PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(tmp_path / "parts" / "*"),
                            prepare_workers=1, shard_dir=str(tmp_path / "s"))
    assert_same_corpus(dm._tokenized("train", dm.files["train"], progress=False), memory)


def test_a_hf_datasets_directory_is_an_input_covered_by_the_key(tmp_path, minilm):
    datasets = pytest.importorskip("datasets")
    rows = make_docs(40, 6)
    memory = load_corpus(tokenize_corpus(write_jsonl(tmp_path / "all.jsonl", rows), "text", minilm, progress=False))
    saved = tmp_path / "hf"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved), num_shards=3)
    dm = PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(saved), prepare_workers=2,
                            shard_dir=str(tmp_path / "s"))
    assert [p.suffix for p in dm.files["train"]] == [".arrow"] * 3 and dm.use_streaming()
    assert_same_corpus(dm._tokenized("train", dm.files["train"], progress=False), memory)
    datasets.Dataset.from_list(rows[:20]).save_to_disk(str(tmp_path / "hf2"))  # other contents, same shard_dir
    other = PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(tmp_path / "hf2"),
                               prepare_workers=1, shard_dir=str(tmp_path / "s"))
    with pytest.raises(PtmError, match=r"written with another input files \(other contents\)"):
        other._tokenized("train", other.files["train"], progress=False)
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:30]),
                                   "validation": datasets.Dataset.from_list(rows[30:])})
    splits.save_to_disk(str(tmp_path / "dd"))
    dd = PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(tmp_path / "dd"),
                            max_length=32, prepare_workers=1, shard_dir=str(tmp_path / "dd_s"))
    dd.setup("fit")
    assert sorted(dd.files) == ["train", "validation"] and len(dd.datasets["validation"]) > 0


def test_bad_input_is_one_line(tmp_path, minilm):
    path = subset(tmp_path, "bbc", 20)
    target = prepare_corpus([path], "text", minilm, workers=1, target=tmp_path / "s", **{**SMALL, "chunk_bytes": "8KB"})
    other = load_tokenizer(TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1), lambda: [d["text"] for d in make_docs(50, 1)], "x")
    with pytest.raises(PtmError, match=r"written with another tokenizer .* \(this run: ") as err:
        prepare_corpus([path], "text", other, workers=1, target=target, **SMALL)
    assert "\n" not in str(err.value)
    key = json.loads((target / "key.json").read_text())
    (target / "key.json").write_text(json.dumps({**key, "format_version": 0}))
    with pytest.raises(PtmError, match=r"another format_version 0 \(this run: 1\)"):
        open_corpus(target, key)
    (target / "key.json").write_text(json.dumps(key))
    chunk = sorted(target.glob("chunk-*.bin"))[1]
    chunk.write_bytes(chunk.read_bytes()[:200])
    with pytest.raises(PtmError, match=rf"chunk .*{chunk.name} is 200 bytes but index.json says \d+: it is truncated "
                                       r"or corrupt; delete .* and prepare again"):
        open_corpus(target)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(path.read_bytes())[:500])
    with pytest.raises(PtmError, match=r"bad.jsonl.gz does not decompress") as err:
        prepare_corpus([bad], "text", minilm, workers=1, target=tmp_path / "b", progress=False)
    assert "\n" not in str(err.value) and "Traceback" not in str(err.value)
    with pytest.raises(PtmError, match=r"glob .*nothing-\*.jsonl' matches no file"):
        PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(tmp_path / "nothing-*.jsonl")).files
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(PtmError, match=r"busy is not empty and holds no prepared corpus"):
        prepare_corpus([path], "text", minilm, workers=1, target=tmp_path / "busy", progress=False)


def test_a_flipped_bit_keeps_the_size_and_is_caught_by_verify_chunks(tmp_path):
    """Preparation records every chunk's sha256; ``verify_chunks: true`` finds a same-size corruption that the
    size check cannot, in one line, and a corpus without checksums cannot be verified (one line, not a pass)."""
    path = subset(tmp_path, "bbc", 20)
    spec = dict(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(path), max_length=32, streaming=True,
                prepare_workers=1, shard_dir=str(tmp_path / "s"))
    PretrainDataModule(**spec, verify_chunks=True).setup("fit")  # a sound corpus verifies
    target = tmp_path / "s" / "train"
    sums = json.loads((target / "checksums.json").read_text())["sha256"]
    chunks = sorted(target.glob("chunk-*.bin"))
    assert sorted(sums) == [c.name for c in chunks] and all(len(v) == 64 for v in sums.values())
    data = bytearray(chunks[0].read_bytes())
    data[len(data) // 2] ^= 0x01
    chunks[0].write_bytes(bytes(data))
    PretrainDataModule(**spec).setup("fit")  # the size check alone passes it
    with pytest.raises(PtmError, match=rf"chunk .*{chunks[0].name} does not match its sha256 in checksums.json: it "
                                       r"is corrupt; delete .* and prepare again") as err:
        PretrainDataModule(**spec, verify_chunks=True).setup("fit")
    assert "\n" not in str(err.value)
    (target / "checksums.json").unlink()
    with pytest.raises(PtmError, match=r"has no checksums.json .* set data.init_args.verify_chunks: false"):
        open_corpus(target, verify=True)


def test_import_keeps_torchvision_out_and_transformers_working():
    code = ("import sys, litdata; from transformers import AutoTokenizer; import ptm_app.data.litcorpus; "
            "print('torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def streaming_module(path: Path, shard_dir: Path, **kw) -> PretrainDataModule:
    dm = PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(path), max_length=32,
                            batch_size=4, streaming=True, prepare_workers=1, shard_dir=str(shard_dir), **kw)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def batches(loader, n=None):
    out = []
    for batch in loader:
        out.append([k[1] for k in batch["key"]] if isinstance(batch["key"], list) else batch["key"][1].tolist())
        if n is not None and len(out) == n:
            break
    return out


def test_streaming_module_resumes_mid_epoch_and_splits_ranks(tmp_path, minilm):
    path = subset(tmp_path, "bbc", 30)
    dm = streaming_module(path, tmp_path / "sh", document_attention=True)
    memory = PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(path), max_length=32,
                                batch_size=4, streaming=False, document_attention=True)
    memory.setup("fit")
    train, ref = dm.datasets["train"], memory.datasets["train"]
    assert len(train) == len(ref) > 40
    for i in (0, 7, len(ref) - 1):
        assert np.array_equal(train[i]["input_ids"], ref[i]["input_ids"])
        assert np.array_equal(train[i]["document_ids"], ref[i]["document_ids"])
    collate = lambda items: {"key": [it["key"] for it in items]}  # noqa: E731
    whole = ResumableLoader(train, batch_size=4, shuffle=True, seed=3, collate_fn=collate)
    whole.epoch_sampler.set_epoch(1)
    full = batches(whole)
    part = ResumableLoader(train, batch_size=4, shuffle=True, seed=3, collate_fn=collate)
    part.load_state_dict({"epoch": 1, "consumed": 5, "batch_size": 4})
    assert batches(part) == full[5:]
    ranks = [batches(ResumableLoader(train, batch_size=4, shuffle=True, seed=3, rank=r, world_size=2,
                                     collate_fn=collate)) for r in (0, 1)]
    seen = [[i for b in r for i in b] for r in ranks]
    assert set(seen[0]) | set(seen[1]) == set(range(len(train)))  # together they cover the epoch
    assert len(set(seen[0]) & set(seen[1])) == len(train) % 2  # disjoint, but for the one padding index
    assert len(seen[0]) == len(seen[1]) == -(-len(train) // 2)


MEMORY_PROBE = """
import json, resource, sys
from pathlib import Path
from ptm_app.data.litcorpus import open_corpus, prepare_corpus
from ptm_app.data.blocks import LazyBlocks
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer
tok = load_tokenizer(TokenizerSpec(pretrained="minilm"), None, "")
path, n = Path(sys.argv[1]), int(sys.argv[2])
with open(path, "w") as fh:
    line = json.dumps({"text": "\\n".join(["the quick brown fox jumps over the lazy dog near the river bank"] * 20)})
    for _ in range(n):
        fh.write(line + "\\n")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
corpus = open_corpus(prepare_corpus([path], "text", tok, workers=1, target=path.with_suffix(""),
                                    piece_bytes=1 << 20, chunk_bytes="4MB", progress=False))
blocks = LazyBlocks(corpus, 128, [1], [2], [2])
total = sum(int(blocks[i][0][5]) for i in range(0, len(blocks), 97))
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, corpus.num_tokens, children)
"""


def test_memory_does_not_grow_with_the_corpus(tmp_path):  # ~15 s: in the default suite, as issue 13 asks
    """Peak RSS growth while preparing and reading 2,000 vs 16,000 documents (0.6 M vs 5 M tokens), and the
    tokenizer workers' peak RSS."""
    grow = []
    for n in (2_000, 16_000):
        out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(tmp_path / f"c{n}.jsonl"), str(n)],
                             capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
        grow.append([int(x) for x in out.stdout.split()])
    (small_kb, small_tokens, small_workers), (large_kb, large_tokens, large_workers) = grow
    assert large_tokens >= 7 * small_tokens
    assert large_kb - small_kb < 20_000, grow  # < 20 MB more for 8x the corpus
    assert large_workers - small_workers < 40_000, grow


def test_resume_on_another_rank_count_continues_the_same_order_or_is_refused(tmp_path):
    from ptm_app.data.datasets import BlockDataset

    data = BlockDataset([np.arange(3) + i for i in range(50)])
    collate = lambda items: {"key": [it["key"] for it in items]}  # noqa: E731
    full = batches(ResumableLoader(data, batch_size=4, shuffle=True, seed=9, collate_fn=collate))
    two = [ResumableLoader(data, batch_size=4, shuffle=True, seed=9, rank=r, world_size=2, collate_fn=collate)
           for r in (0, 1)]
    state = {"epoch": 0, "consumed": 3, "batch_size": 4, "world_size": 2}  # 3 batches on each of 2 ranks
    assert sorted(i for r in two for b in batches(r, 3) for i in b) == sorted(i for b in full[:6] for i in b)
    one = ResumableLoader(data, batch_size=4, shuffle=True, seed=9, collate_fn=collate)
    one.load_state_dict(state)
    assert batches(one) == full[6:]  # 2 ranks -> 1 continues exactly
    three = ResumableLoader(data, batch_size=4, shuffle=True, seed=9, rank=0, world_size=3, collate_fn=collate)
    with pytest.raises(PtmError, match="written by 2 ranks after 4 batches each.*resume with 2 ranks"):
        three.load_state_dict({**state, "consumed": 4})


def test_fit_on_a_prepared_corpus_resumes_exactly_with_ckpt_path_last(tmp_path, tiny_corpus, one_thread):
    """``streaming: true`` end to end: MLM on the litdata corpus, paused at step 4 and resumed with ``--ckpt_path last``,
    logs the same losses as the uninterrupted run (the 10 steps cross an epoch)."""
    from tests.conftest import assert_resumes_exactly, tiny_mlm_config

    cfg = tiny_mlm_config(tiny_corpus / "train.jsonl", tmp_path, max_steps=10, val_check_interval=5)
    argv = ["fit", "--config", str(cfg), "--data.init_args.streaming", "true",
            "--data.init_args.prepare_workers", "1", "--data.init_args.shard_dir", str(tmp_path / "shards")]
    assert_resumes_exactly(argv, tmp_path / "runs", stop=4, steps=10)
    assert (tmp_path / "shards" / "train" / "index.json").exists()


@pytest.mark.parametrize("kind", ["nsp", "sop"])
def test_sentence_pairs_from_a_prepared_corpus_equal_the_in_memory_ones(tmp_path, kind):
    path = subset(tmp_path, "brown", 12)
    dms = [PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(path), max_length=48,
                              examples=kind, streaming=streaming, prepare_workers=1, shard_dir=str(tmp_path / "s"))
           for streaming in (True, False)]
    for dm in dms:
        dm.prepare_data()
        dm.setup("fit")
    sharded, memory = dms[0].datasets["train"], dms[1].datasets["train"]
    assert len(sharded) == len(memory) > 500  # one anchor per sentence with a successor
    for key in [(0, 0), (1, 5), (2, 117), (3, len(memory) - 1)]:
        a, b = sharded[key], memory[key]
        assert torch_equal(a["input_ids"], b["input_ids"]) and a["sentence_label"] == b["sentence_label"]
    assert sharded.anchor(len(sharded) - 1)[0] == len(dms[0].datasets["train"].documents) - 1


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_a_directory_of_compressed_splits_reads_on_both_paths(tmp_path):
    rows = make_docs(20, 8)
    for split, part in (("train", rows[:16]), ("validation", rows[16:])):
        (tmp_path / "d").mkdir(exist_ok=True)
        (tmp_path / "d" / f"{split}.jsonl.gz").write_bytes(
            gzip.compress("".join(json.dumps(r) + "\n" for r in part).encode()))
    sizes = []
    for streaming in (False, True):
        dm = PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(tmp_path / "d"),
                                max_length=16, streaming=streaming, prepare_workers=1, shard_dir=str(tmp_path / "s"))
        assert sorted(dm.files) == ["train", "validation"] and dm.files["train"].name == "train.jsonl.gz"
        dm.setup("fit")
        sizes.append({split: len(ds) for split, ds in dm.datasets.items()})
    assert sizes[0] == sizes[1] and sizes[0]["validation"] > 0


def test_tokenizer_training_on_a_glob_streams_the_texts(tmp_path, monkeypatch):
    """The tokenizer trains from a generator over the files (``corpus.iter_texts``), never a list of every text."""
    import inspect

    from ptm_app.data import tokenizer as tokenizer_mod

    rows = make_docs(80, 4)
    write_jsonl(tmp_path / "p" / "a.jsonl", rows[:50])
    write_jsonl(tmp_path / "p" / "b.jsonl", rows[50:])
    real, given, pulled = tokenizer_mod._train, [], []

    def spy(spec, texts, *rest):
        given.append(texts)
        return real(spec, (pulled.append(t) or t for t in texts), *rest)

    monkeypatch.setattr(tokenizer_mod, "_train", spy)
    spec = TokenizerSpec(train="wordpiece", vocab_size=300, min_frequency=1)
    tok = PretrainDataModule(tokenizer=spec, source=str(tmp_path / "p" / "*.jsonl")).load_tokenizer()
    assert len(given) == 1 and inspect.isgenerator(given[0])
    assert pulled == [r["text"] for r in rows]  # every text of both files, in order, once
    assert tok.unk_token_id not in tok("the cat sat on a mat")["input_ids"] and len(tok) > 100


def first_ids(items):
    return [int(it["input_ids"][1]) for it in items]


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: ~20 s of imports
def test_loader_worker_processes_read_the_same_batches(tmp_path, minilm, context):
    """Data-loader workers open their own ``StreamingDataset`` (forked: a new pid; spawned: unpickled without it)
    and serve the batches of the single-process loader."""
    from ptm_app.data.blocks import BlockView
    from ptm_app.data.datasets import BlockDataset

    path = subset(tmp_path, "bbc", 30)
    corpus = open_corpus(prepare_corpus([path], "text", minilm, workers=1, target=tmp_path / "c", **SMALL))
    data = BlockDataset(BlockView(LazyBlocks(corpus, 32, [101], [102], [102]), 0))
    loaders = [ResumableLoader(data, batch_size=8, shuffle=True, seed=4, collate_fn=first_ids, **kw)
               for kw in ({}, {"num_workers": 2, "multiprocessing_context": context})]
    single, workers = (list(loader) for loader in loaders)
    assert len(single) > 20 and single == workers


def test_progress_reports_pieces_tokens_and_rate_from_the_output_directory(tmp_path):
    """The bar polls what ``optimize`` has written: pieces done from its checkpoints, tokens from the chunk bytes."""
    import time

    (tmp_path / ".checkpoints").mkdir()
    (tmp_path / ".checkpoints" / "checkpoint-0.json").write_text(json.dumps({"inputs_done": 3, "chunks": []}))
    (tmp_path / ".checkpoints" / "checkpoint-1.json").write_text(json.dumps({"inputs_done": 4, "chunks": []}))
    (tmp_path / "chunk-0-0.bin").write_bytes(b"\0" * 2000)  # 1,000 uint16 tokens
    with litcorpus._Progress("tokenizing x", tmp_path, 10, 2, enabled=True) as bar:
        time.sleep(1.2)
        task = bar.progress.tasks[0]
        assert task.completed == 7 and task.total == 10 and task.fields["tokens"] == 1000
        assert 0 < task.fields["rate"] < 1000 / 0.4  # tokens per second since the start


KILLED = """
import sys
from pathlib import Path
from ptm_app.data.litcorpus import prepare_corpus
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer
prepare_corpus([Path(sys.argv[1])], "text", load_tokenizer(TokenizerSpec(pretrained="minilm"), None, ""), workers=1,
               target=Path(sys.argv[2]), piece_bytes=5_000, chunk_bytes="10KB", progress=False)
"""


def test_a_killed_preparation_restarts_identically(tmp_path, minilm):
    """The whole process group killed (SIGKILL: no clean-up) once the first chunk is checkpointed; the next run
    continues and writes the chunks of an uninterrupted run."""
    import os
    import signal
    import time

    path = subset(tmp_path, "bbc", 300)
    clean = prepare_corpus([path], "text", minilm, workers=1, target=tmp_path / "clean", piece_bytes=5_000,
                           chunk_bytes="10KB", progress=False)
    target = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(path), str(target)], start_new_session=True,
                            cwd=Path(__file__).resolve().parents[2])
    checkpoint = target / ".checkpoints" / "checkpoint-0.json"
    while not checkpoint.exists() and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (target / "index.json").exists() and checkpoint.exists()
    prepare_corpus([path], "text", minilm, workers=1, target=target, piece_bytes=5_000, chunk_bytes="10KB",
                   progress=False)
    assert chunk_files(clean) == chunk_files(target)
    chunks = [json.loads((d / "index.json").read_text())["chunks"] for d in (clean, target)]
    assert chunks[0] == chunks[1]


def test_a_large_compressed_file_is_prepared_in_parallel_pieces(tmp_path, minilm):
    """One big ``.jsonl.gz`` is decompressed once into the work directory and cut into pieces (so several workers
    share it); the corpus equals the in-memory one, the copy is removed, and errors name the original file."""
    path = subset(tmp_path, "bbc", 80)
    memory = load_corpus(tokenize_corpus(path, "text", minilm, progress=False))
    packed = tmp_path / "big.jsonl.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert packed.stat().st_size > SMALL["piece_bytes"] // 2
    pieces = plan_pieces([packed], SMALL["piece_bytes"], tmp_path / "plain")
    assert len(pieces) >= 5 and all(json.loads(p)[-1] == str(packed) for p in pieces)
    target = prepare_corpus([packed], "text", minilm, workers=2, target=tmp_path / "c", **SMALL)
    assert_same_corpus(open_corpus(target), memory)
    assert not (target / ".plain").exists()
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(path.read_bytes() + b"{oops\n"))
    with pytest.raises(PtmError, match=r"^\S*broken.jsonl.gz:81: malformed JSON"):
        prepare_corpus([broken], "text", minilm, workers=2, target=tmp_path / "b", **SMALL)
    assert multiprocessing.active_children() == []  # the failed run's workers (and their helpers) are gone
