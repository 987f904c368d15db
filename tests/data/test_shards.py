"""Sharded, streaming corpora (data.shards, data.blocks): the same ids, offsets and blocks as the in-memory path,
reuse and restart, exact resume, rank splits, bad input, and memory that does not grow with the corpus."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ptm_app.data import shards as shards_mod
from ptm_app.data.blocks import LazyBlocks
from ptm_app.data.corpus import load_corpus, pack_blocks, tokenize_corpus
from ptm_app.data.datamodules import PretrainDataModule, holdout_split
from ptm_app.data.loader import ResumableLoader
from ptm_app.data.shards import load_shards, prepare_shards
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer
from ptm_app.errors import PtmError
from tests.conftest import make_docs, write_jsonl

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture(scope="module")
def minilm():
    return load_tokenizer(TokenizerSpec(pretrained="minilm"), None, "")


def subset(tmp_path: Path, name: str, n: int) -> Path:
    with open(DATA / name / "train.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(next(fh)) for _ in range(n)]
    return write_jsonl(tmp_path / f"{name}.jsonl", [{"text": r["text"]} for r in rows])


@pytest.mark.parametrize("name,n", [("bbc", 120), ("brown", 25)])
def test_shards_reproduce_the_in_memory_ids_offsets_and_blocks(tmp_path, minilm, name, n):
    path = subset(tmp_path, name, n)
    memory = load_corpus(tokenize_corpus(path, "text", minilm, progress=False))
    target = prepare_shards([path], "text", minilm, workers=1, shard_bytes=20_000, progress=False)
    sharded = load_shards(target)
    assert len(json.loads((target / "index.json").read_text())["shards"]) >= 3  # several shards, stitched
    assert np.array_equal(sharded.ids[0: len(sharded.ids)], memory.ids)
    assert np.array_equal(sharded.line_offsets, memory.line_offsets)
    assert np.array_equal(sharded.doc_offsets, memory.doc_offsets)
    assert sharded.num_documents == n
    cls, sep = minilm.cls_token_id, minilm.sep_token_id
    train, _ = holdout_split(n, 0.1, 7)
    for mode in ("pack", "split_documents"):
        blocks, owners = pack_blocks(memory, 64, [cls], [sep], [sep], mode, train, with_documents=True)
        lazy = LazyBlocks(sharded, 64, [cls], [sep], [sep], mode, np.asarray(train))
        assert len(lazy) == len(blocks) > 10
        for i in range(len(blocks)):
            ids, own = lazy[i]
            assert np.array_equal(ids, blocks[i]) and np.array_equal(own, owners[i]), (mode, i)
            assert np.array_equal(lazy.ids(i), blocks[i])


def test_second_run_reuses_and_interrupted_preparation_restarts_identically(tmp_path, minilm, monkeypatch):
    path = subset(tmp_path, "bbc", 60)
    clean = prepare_shards([path], "text", minilm, workers=1, target=tmp_path / "clean", shard_bytes=20_000,
                           progress=False)
    real, calls = shards_mod._write_shard, []

    def crash_after_two(texts, shard, dtype, tokenizer=None):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(shard.name)
        return real(texts, shard, dtype, tokenizer)

    monkeypatch.setattr(shards_mod, "_write_shard", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        prepare_shards([path], "text", minilm, workers=1, target=tmp_path / "again", shard_bytes=20_000, progress=False)
    assert not (tmp_path / "again" / "index.json").exists()
    calls.clear()
    monkeypatch.setattr(shards_mod, "_write_shard", lambda *a, **k: (calls.append(a[1].name), real(*a, **k))[1])
    again = prepare_shards([path], "text", minilm, workers=1, target=tmp_path / "again", shard_bytes=20_000,
                           progress=False)
    names = json.loads((clean / "index.json").read_text())["shards"]
    assert calls == names[2:]  # the two finished shards were not redone
    for name in names:
        for part in ("ids", "line_lengths", "doc_lines"):
            assert (clean / name / f"{part}.npy").read_bytes() == (again / name / f"{part}.npy").read_bytes()
    for part in ("line_offsets", "doc_offsets"):
        assert (clean / f"{part}.npy").read_bytes() == (again / f"{part}.npy").read_bytes()
    calls.clear()  # complete: a second run (or another rank) only reads
    assert prepare_shards([path], "text", minilm, workers=1, target=tmp_path / "again", shard_bytes=20_000,
                          progress=False) == again and calls == []


def test_worker_processes_write_the_same_shards(tmp_path, minilm):
    path = subset(tmp_path, "bbc", 40)
    one = prepare_shards([path], "text", minilm, workers=1, target=tmp_path / "one", shard_bytes=20_000, progress=False)
    two = prepare_shards([path], "text", minilm, workers=2, target=tmp_path / "two", shard_bytes=20_000, progress=False)
    a, b = load_shards(one), load_shards(two)
    assert np.array_equal(a.ids[0: len(a.ids)], b.ids[0: len(b.ids)]) and np.array_equal(a.line_offsets, b.line_offsets)


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
                            prepare_workers=1)
    corpus = dm._tokenized("train", dm.files["train"], progress=False)
    assert np.array_equal(corpus.ids[0: len(corpus.ids)], memory.ids)
    assert np.array_equal(corpus.doc_offsets, memory.doc_offsets)


def test_bad_input_is_one_line(tmp_path, minilm):
    path = subset(tmp_path, "bbc", 20)
    target = prepare_shards([path], "text", minilm, workers=1, target=tmp_path / "s", shard_bytes=20_000, progress=False)
    other = load_tokenizer(TokenizerSpec(train="wordpiece", vocab_size=200, min_frequency=1), lambda: [d["text"] for d in make_docs(50, 1)], "x")
    with pytest.raises(PtmError, match=r"written with another tokenizer .* \(this run: ") as err:
        prepare_shards([path], "text", other, workers=1, target=target, shard_bytes=20_000, progress=False)
    assert "\n" not in str(err.value)
    key = json.loads((target / "key.json").read_text())
    index = json.loads((target / "index.json").read_text())
    index["key"]["format_version"] = 0
    (target / "index.json").write_text(json.dumps(index))
    with pytest.raises(PtmError, match=r"another format_version 0 \(this run: 1\)"):
        load_shards(target, key)
    index["key"]["format_version"] = key["format_version"]
    (target / "index.json").write_text(json.dumps(index))
    ids = target / "shard-00001" / "ids.npy"
    ids.write_bytes(ids.read_bytes()[:200])
    with pytest.raises(PtmError, match=r"shard .*shard-00001 is missing, truncated or corrupt.*only that shard is rebuilt"):
        load_shards(target)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(path.read_bytes())[:500])
    with pytest.raises(PtmError, match=r"bad.jsonl.gz does not decompress"):
        prepare_shards([bad], "text", minilm, workers=1, target=tmp_path / "b", progress=False)
    with pytest.raises(PtmError, match=r"glob .*nothing-\*.jsonl' matches no file"):
        PretrainDataModule(tokenizer=TokenizerSpec(pretrained="minilm"), source=str(tmp_path / "nothing-*.jsonl")).files


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
from ptm_app.data.shards import load_shards, prepare_shards
from ptm_app.data.blocks import LazyBlocks
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer
tok = load_tokenizer(TokenizerSpec(pretrained="minilm"), None, "")
path, n = Path(sys.argv[1]), int(sys.argv[2])
with open(path, "w") as fh:
    line = json.dumps({"text": "\\n".join(["the quick brown fox jumps over the lazy dog near the river bank"] * 20)})
    for _ in range(n):
        fh.write(line + "\\n")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
corpus = load_shards(prepare_shards([path], "text", tok, workers=1, shard_bytes=1 << 20, progress=False))
blocks = LazyBlocks(corpus, 128, [1], [2], [2])
total = sum(int(blocks[i][0][5]) for i in range(0, len(blocks), 97))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, len(corpus.ids))
"""


@pytest.mark.slow
def test_memory_does_not_grow_with_the_corpus(tmp_path):
    """Peak RSS growth while preparing and reading 2,000 vs 16,000 documents (0.6 M vs 5 M tokens)."""
    grow = []
    for n in (2_000, 16_000):
        out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(tmp_path / f"c{n}.jsonl"), str(n)],
                             capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
        grow.append([int(x) for x in out.stdout.split()])
    (small_kb, small_tokens), (large_kb, large_tokens) = grow
    assert large_tokens >= 7 * small_tokens
    assert large_kb - small_kb < 20_000, grow  # < 20 MB more for 8x the corpus


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


def test_fit_on_shards_resumes_exactly_with_ckpt_path_last(tmp_path, tiny_corpus, one_thread):
    """``streaming: true`` end to end: MLM on the shards, paused at step 4 and resumed with ``--ckpt_path last``,
    logs the same losses as the uninterrupted run (the 10 steps cross an epoch)."""
    from tests.conftest import assert_resumes_exactly, tiny_mlm_config

    cfg = tiny_mlm_config(tiny_corpus / "train.jsonl", tmp_path, max_steps=10, val_check_interval=5)
    argv = ["fit", "--config", str(cfg), "--data.init_args.streaming", "true",
            "--data.init_args.prepare_workers", "1", "--data.init_args.shard_dir", str(tmp_path / "shards")]
    assert_resumes_exactly(argv, tmp_path / "runs", stop=4, steps=10)
    assert (tmp_path / "shards" / "train" / "index.json").exists()


@pytest.mark.parametrize("kind", ["nsp", "sop"])
def test_sentence_pairs_from_shards_equal_the_in_memory_ones(tmp_path, kind):
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
