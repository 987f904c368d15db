"""Corpus preparation side by side: ptm_app's shards, its in-memory cache, litdata ``optimize`` and HF
``datasets`` map + ``group_texts``, at the same worker count, each in its own subprocess.

``python -m benchmarks --only data`` runs it on the prepared ``bbc`` training file;
``python -m benchmarks.data_prep CORPUS.jsonl [--workers 2] [--tokenizer minilm]`` on any JSONL.  Each prints, per candidate, tokens,
seconds, tokens/s, peak RSS (the process and its largest worker) and the size on disk.  The peers run only when
installed (``litdata``, ``datasets``); their input is the same JSONL, ``text`` field, no special tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, os, resource, sys, time
from pathlib import Path
candidate, corpus, workers, tokenizer_name, work = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
os.environ["PTM_CACHE_DIR"] = str(work / "cache")
from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer
tok = load_tokenizer(TokenizerSpec(pretrained=tokenizer_name), None, "")
started = time.perf_counter()

def lines_of(text):
    return [l for l in text.split("\n") if l.strip()]

if candidate == "ptm_app shards":
    from ptm_app.data.shards import load_shards, prepare_shards
    out = prepare_shards([corpus], "text", tok, workers=workers, target=work / "shards", progress=False)
    tokens = len(load_shards(out).ids)
elif candidate == "ptm_app in-memory":
    from ptm_app.data.corpus import load_corpus, tokenize_corpus
    out = tokenize_corpus(corpus, "text", tok, progress=False)
    tokens = len(load_corpus(out).ids)
elif candidate == "litdata optimize":
    from functools import partial
    import numpy as np, torch
    from litdata import TokensLoader, optimize
    parts = work / "parts"
    parts.mkdir()
    handles = [open(parts / f"p{i}.jsonl", "w") for i in range(4 * workers)]
    with open(corpus) as fh:
        for i, line in enumerate(fh):
            handles[i % len(handles)].write(line)
    [h.close() for h in handles]
    started = time.perf_counter()  # splitting the input is not counted
    out = work / "litdata"
    optimize(fn=partial(_litdata_fn, tokenizer=tok), inputs=sorted(map(str, parts.iterdir())), output_dir=str(out),
             num_workers=workers, chunk_bytes="64MB", item_loader=TokensLoader())
    from litdata import StreamingDataset
    tokens = len(StreamingDataset(str(out), item_loader=TokensLoader(block_size=1)))
elif candidate == "datasets map+group_texts":
    import datasets
    ds = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(work / "hf"))
    def tokenize(batch):
        return {"input_ids": [[t for ids in tok(lines_of(x), add_special_tokens=False)["input_ids"] for t in ids]
                              for x in batch["text"]]}
    def group_texts(batch, block=128):  # transformers' run_mlm.py
        ids = [t for x in batch["input_ids"] for t in x]
        return {"input_ids": [ids[i: i + block] for i in range(0, len(ids) - block + 1, block)]}
    ds = ds.map(tokenize, batched=True, num_proc=workers, remove_columns=ds.column_names)
    tokens = sum(len(x) for x in ds["input_ids"])
    ds = ds.map(group_texts, batched=True, num_proc=workers)
    out = work / "hf"
seconds = time.perf_counter() - started
disk = sum(f.stat().st_size for f in Path(out).rglob("*") if f.is_file())
print(json.dumps({"candidate": candidate, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "disk_mb": disk / 1e6}))
"""

LITDATA_FN = r"""
def _litdata_fn(path, tokenizer=None):
    import json, torch
    with open(path) as fh:
        for line in fh:
            lines = [l for l in json.loads(line)["text"].split("\n") if l.strip()]
            yield torch.tensor([t for p in tokenizer(lines, add_special_tokens=False)["input_ids"] for t in p], dtype=torch.int32)
"""

CANDIDATES = ("ptm_app shards", "ptm_app in-memory", "litdata optimize", "datasets map+group_texts")
NEEDS = {"litdata optimize": "litdata", "datasets map+group_texts": "datasets"}


def available(candidate: str) -> bool:
    module = NEEDS.get(candidate)
    if module is None:
        return True
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_prep", description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="a JSONL file with a 'text' field")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokenizer", default="minilm")
    parser.add_argument("--only", nargs="+", choices=CANDIDATES, default=list(CANDIDATES))
    args = parser.parse_args(argv)
    rows = []
    for candidate in args.only:
        if not available(candidate):
            print(f"{candidate}: skipped ({NEEDS[candidate]} is not installed)")
            continue
        with tempfile.TemporaryDirectory() as work:
            script = Path(work) / "probe.py"
            script.write_text(LITDATA_FN + "\nif __name__ == '__main__':\n" +
                              "\n".join("    " + line for line in PROBE.strip().splitlines()))
            done = subprocess.run([sys.executable, str(script), candidate, str(args.corpus.resolve()), str(args.workers),
                                   args.tokenizer, work], capture_output=True, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
        if done.returncode:
            print(f"{candidate}: failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{r['candidate']:<26} {r['tokens']:>12,} tokens {r['seconds']:7.1f} s {r['tokens_per_s']:>10,.0f} tokens/s "
              f"peak RSS {r['peak_rss_mb']:6.0f} MB (worker {r['worker_peak_rss_mb']:5.0f} MB) disk {r['disk_mb']:6.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
