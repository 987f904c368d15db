"""Corpus preparation side by side (issue 13): ptm_app (litdata ``optimize`` over pieces, ``data.litcorpus``), HF
``datasets`` ``map(batched, num_proc)`` + ``group_texts`` (transformers' ``run_mlm.py``) and plain litdata
``optimize`` into token chunks (``TokensLoader``, litgpt's way), at the same worker count, each in its own
subprocess, at every corpus size asked for.

``python -m benchmarks --only data`` builds corpora of 100 MB and 1 GB from the prepared real texts (bbc and brown
training documents, repeated and shuffled with a fixed seed) and runs them; ``python -m benchmarks.data_prep
--sizes 100`` one size; ``--corpus FILE.jsonl`` any JSONL.  Per candidate: tokens, seconds, tokens/s, the peak RSS
of all its processes (the sum over the process tree, sampled every 0.2 s), the size on disk, then, in a fresh
process reading the prepared data with a seeded shuffle, the time to the first batch of 32 blocks of 128 tokens and
the RSS after 300 batches.  The table goes into ``benchmarks/data.md``, ``data.json`` and between the data markers
of ``benchmarks/README.md`` (generated, never typed in).  Peers run only when installed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
BLOCK, BATCH, READ_BATCHES = 128, 32, 300

PREPARE = r"""
import json, os, sys, time
from pathlib import Path
candidate, corpus, workers, work = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
os.environ["PTM_CACHE_DIR"] = str(work / "cache")
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer
tok = load_tokenizer(TokenizerSpec(pretrained="minilm"), None, "")
started = time.perf_counter()
if candidate == "ptm_app":
    from ptm_app.data.litcorpus import open_corpus, prepare_corpus
    out = prepare_corpus([corpus], "text", tok, workers=workers, target=work / "out", progress=False)
    tokens = open_corpus(out).num_tokens
elif candidate == "litdata optimize":
    from functools import partial
    from litdata import StreamingDataset, TokensLoader, optimize
    from ptm_app.data.pieces import plan_pieces
    out = work / "out"
    optimize(fn=partial(tokens_of_piece, tokenizer=tok), inputs=plan_pieces([corpus], 8 << 20), output_dir=str(out),
             num_workers=workers, chunk_bytes="64MB", item_loader=TokensLoader(), verbose=False)
    tokens = len(StreamingDataset(str(out), item_loader=TokensLoader(block_size=1)))
elif candidate == "datasets map+group_texts":
    import datasets
    datasets.disable_progress_bars()
    ds = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(work / "hf"))
    def tokenize(batch):
        return {"input_ids": [[t for ids in tok([l for l in x.split("\n") if l.strip()], add_special_tokens=False)["input_ids"]
                               for t in ids] for x in batch["text"]]}
    def group_texts(batch, block=BLOCK):  # transformers' run_mlm.py
        ids = [t for x in batch["input_ids"] for t in x]
        return {"input_ids": [ids[i: i + block] for i in range(0, len(ids) - block + 1, block)]}
    ds = ds.map(tokenize, batched=True, num_proc=workers, remove_columns=ds.column_names)
    tokens = sum(int(len(c.values)) for c in ds.data.column("input_ids").chunks)
    ds = ds.map(group_texts, batched=True, num_proc=workers)
    ds.save_to_disk(str(work / "out"))
    out = work / "out"
seconds = time.perf_counter() - started
disk = sum(f.stat().st_size for f in Path(out).rglob("*") if f.is_file())
print(json.dumps({"tokens": tokens, "seconds": seconds, "disk_mb": disk / 1e6}))
"""

READ = r"""
import json, os, sys, time
from pathlib import Path
candidate, work = sys.argv[1], Path(sys.argv[2])
started = time.perf_counter()
import numpy as np, torch
from torch.utils.data import DataLoader
def rss_mb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
if candidate == "ptm_app":
    from ptm_app.data.blocks import BlockView, LazyBlocks
    from ptm_app.data.datasets import BlockDataset
    from ptm_app.data.litcorpus import open_corpus
    from ptm_app.data.loader import ResumableLoader
    blocks = LazyBlocks(open_corpus(work / "out"), BLOCK, [101], [102], [102])
    loader = ResumableLoader(BlockDataset(BlockView(blocks, 0)), batch_size=BATCH, shuffle=True, seed=1,
                             collate_fn=lambda items: [it["input_ids"] for it in items])
elif candidate == "litdata optimize":
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
    loader = StreamingDataLoader(StreamingDataset(str(work / "out"), item_loader=TokensLoader(block_size=BLOCK),
                                                  shuffle=True, seed=1), batch_size=BATCH)
elif candidate == "datasets map+group_texts":
    import datasets
    ds = datasets.load_from_disk(str(work / "out")).with_format("numpy")
    loader = DataLoader(ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(1))
first = None
for i, batch in enumerate(loader):
    if first is None:
        first = time.perf_counter() - started
    if i + 1 == READ_BATCHES:
        break
print(json.dumps({"first_batch_s": first, "read_rss_mb": rss_mb()}))
"""

HELPERS = r"""
BLOCK, BATCH, READ_BATCHES = %d, %d, %d

def tokens_of_piece(piece, tokenizer=None):
    import numpy as np
    from ptm_app.data.pieces import piece_documents
    lines = [l for doc in piece_documents(piece, "text") for l in doc]
    ids = [t for start in range(0, len(lines), 1000)
           for p in tokenizer(lines[start: start + 1000], add_special_tokens=False)["input_ids"] for t in p]
    return np.asarray(ids, np.uint16)
""" % (BLOCK, BATCH, READ_BATCHES)

CANDIDATES = ("ptm_app", "datasets map+group_texts", "litdata optimize")
NEEDS = {"litdata optimize": "litdata", "ptm_app": "litdata", "datasets map+group_texts": "datasets"}
LABELS = {"ptm_app": "ptm_app (`streaming`: litdata pieces, documents and lines kept)",
          "datasets map+group_texts": "HF datasets `map(num_proc)` + `group_texts`",
          "litdata optimize": "litdata `optimize` + `TokensLoader` (flat tokens)"}


def build_corpus(path: Path, megabytes: int, seed: int = 0) -> Path:
    """A JSONL of about ``megabytes`` MB: the bbc and brown training texts, repeated, shuffled each round."""
    if path.exists() and path.stat().st_size >= megabytes * 1e6:
        return path
    texts = [json.loads(line)["text"] for name in ("bbc", "brown")
             for line in open(ROOT / "data" / name / "train.jsonl", encoding="utf-8")]
    rng, size = random.Random(seed), 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        while size < megabytes * 1e6:
            rng.shuffle(texts)
            for text in texts:
                line = json.dumps({"text": text}) + "\n"
                fh.write(line)
                size += len(line.encode("utf-8"))
                if size >= megabytes * 1e6:
                    break
    os.replace(tmp, path)
    return path


def tree_rss_mb(pid: int) -> float:
    """The RSS of ``pid`` and all its descendants (Linux ``/proc``)."""
    parents, rss = {}, {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            parents[int(status.parent.name)] = int(text.split("PPid:")[1].split()[0])
            rss[int(status.parent.name)] = int(text.split("VmRSS:")[1].split()[0]) if "VmRSS:" in text else 0
        except (OSError, ValueError, IndexError):
            continue
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(rss.get(p, 0) for p in tree) / 1024


def run_probe(script: Path, args: list[str]) -> tuple[dict, float]:
    """Run a probe; its last stdout line (JSON) and the peak RSS of its process tree."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "LITDATA_CHECK_UPDATES": "0"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, str(script), *args], stdout=out, stderr=err, cwd=ROOT, env=env)
        peak = 0.0
        while proc.poll() is None:
            peak = max(peak, tree_rss_mb(proc.pid))
            time.sleep(0.2)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        lines = stderr.strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit {proc.returncode}")
    return json.loads(stdout.strip().splitlines()[-1]), peak


def available(candidate: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {NEEDS[candidate]}"], capture_output=True).returncode == 0


def measure(corpus: Path, candidates, workers: int) -> list[dict]:
    rows = []
    for candidate in candidates:
        if not available(candidate):
            print(f"{candidate}: skipped ({NEEDS[candidate]} is not installed)")
            continue
        with tempfile.TemporaryDirectory(dir=corpus.parent) as work:
            prepare, read = Path(work) / "prepare.py", Path(work) / "read.py"
            for script, body in ((prepare, PREPARE), (read, READ)):
                script.write_text(HELPERS + "\nif __name__ == '__main__':\n" +
                                  "\n".join("    " + line for line in body.strip().splitlines()))
            try:
                made, peak = run_probe(prepare, [candidate, str(corpus), str(workers), work])
                got, read_peak = run_probe(read, [candidate, work])
            except RuntimeError as exc:
                print(f"{candidate}: failed: {exc}")
                continue
        row = {"candidate": candidate, "corpus_mb": round(corpus.stat().st_size / 1e6), "workers": workers, **made,
               "tokens_per_s": made["tokens"] / made["seconds"], "peak_rss_mb": peak, **got,
               "read_peak_rss_mb": read_peak}
        rows.append(row)
        print(f"{corpus.stat().st_size / 1e6:6.0f} MB {candidate:<26} {row['tokens']:>13,} tokens {row['seconds']:7.1f} s "
              f"{row['tokens_per_s']:>10,.0f} tokens/s peak RSS {peak:6.0f} MB disk {row['disk_mb']:7.1f} MB "
              f"first batch {row['first_batch_s']:5.2f} s RSS reading {row['read_rss_mb']:5.0f} MB")
    return rows


def table(rows: list[dict], note: str) -> str:
    lines = [note, "", "| corpus | candidate | tokens | seconds | tokens/s | peak RSS, all processes | disk | "
             "first batch | RSS reading |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['corpus_mb']:,} MB | {LABELS[r['candidate']]}, {r['workers']} workers | {r['tokens']:,} | "
                     f"{r['seconds']:.1f} | {r['tokens_per_s']:,.0f} | {r['peak_rss_mb']:,.0f} MB | "
                     f"{r['disk_mb']:,.1f} MB | {r['first_batch_s']:.2f} s | {r['read_rss_mb']:,.0f} MB |")
    return "\n".join(lines) + "\n"


def targets(rows: list[dict]) -> str:
    """Issue 13's targets, judged on ptm_app's rows against the peers' at the same sizes (empty when a size or a
    peer is missing): peak RSS at the largest corpus within 1.2x of that at the smallest and under 1.5 GB, tokens/s
    >= the better peer at every size, first batch under 10 s at the largest."""
    mine = {r["corpus_mb"]: r for r in rows if r["candidate"] == "ptm_app"}
    if len(mine) < 2:
        return ""
    small, large = mine[min(mine)], mine[max(mine)]
    checks = [(f"peak RSS at {large['corpus_mb']:,} MB within 1.2x of {small['corpus_mb']:,} MB",
               f"{large['peak_rss_mb']:,.0f} / {small['peak_rss_mb']:,.0f} MB = "
               f"{large['peak_rss_mb'] / small['peak_rss_mb']:.2f}x", large["peak_rss_mb"] <= 1.2 * small["peak_rss_mb"]),
              (f"peak RSS at {large['corpus_mb']:,} MB under 1,500 MB", f"{large['peak_rss_mb']:,.0f} MB",
               large["peak_rss_mb"] < 1500)]
    for size, row in sorted(mine.items()):
        peers = [r for r in rows if r["corpus_mb"] == size and r["candidate"] != "ptm_app"]
        if peers:
            best = max(peers, key=lambda r: r["tokens_per_s"])
            ratio = row["tokens_per_s"] / best["tokens_per_s"]
            checks.append((f"tokens/s at {size:,} MB >= the better peer ({LABELS[best['candidate']].split(' (')[0]})",
                           f"{ratio:.2f}x", ratio >= 1.0))
    checks.append((f"first batch at {large['corpus_mb']:,} MB under 10 s", f"{large['first_batch_s']:.2f} s",
                   large["first_batch_s"] < 10))
    lines = ["", "| target (issue 13) | measured | met |", "|---|---|---|"]
    lines += [f"| {name} | {measured} | {'yes' if met else '**no**'} |" for name, measured, met in checks]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_prep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000], help="corpus sizes in MB")
    parser.add_argument("--corpus", type=Path, help="a JSONL with a 'text' field instead of the built corpora")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=CANDIDATES, default=list(CANDIDATES))
    parser.add_argument("--work", type=Path, default=ROOT / "checkpoints" / "bench_data")
    parser.add_argument("--out", type=Path, help="write data.json / data.md here (default benchmarks/, and the "
                                                 "table into benchmarks/README.md)")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    corpora = [args.corpus.resolve()] if args.corpus else [build_corpus(args.work / f"corpus_{mb}mb.jsonl", mb)
                                                           for mb in args.sizes]
    before = os.getloadavg()[0]
    rows = [row for corpus in corpora for row in measure(corpus, args.only, args.workers)]
    after = os.getloadavg()[0]
    busy = max(before, after) > 1.5 * args.workers
    note = (f"One run, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average "
            f"(1 min) {before:.1f} before, {after:.1f} after"
            f"{' (a shared machine: the numbers are noisy)' if busy else ''}; MiniLM tokenizer, `text` field.")
    text_table = table(rows, note) + targets(rows)
    out = args.out or HERE
    out.mkdir(parents=True, exist_ok=True)
    (out / "data.json").write_text(json.dumps({"note": note, "rows": rows}, indent=2))
    (out / "data.md").write_text(text_table)
    if args.out is None and not args.corpus:
        from ptm_app.paths import write_between_markers

        write_between_markers(HERE / "README.md", "data", text_table)
    print(text_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
