"""CPU inference latency of one classifier three ways: PyTorch fp32, PyTorch bf16 and ONNX Runtime (the graph
``export --format onnx`` writes), at batch 1 and batch 32, in one run.

``python -m benchmarks --only inference`` (part of ``make bench``) or ``python -m benchmarks.inference_latency``.
The model is MiniLM (``data/minilm``) with a 3-label sequence classification head (the tweets task's shape; the
head's weights do not change the time), exported by ``ptm_app.inference.onnx_export.write_onnx`` as a user's run
is.  Inputs are the first tweets of the prepared validation split, tokenized as ``predict`` does (cut at 128,
padded to the batch's longest).  Every repeat times each candidate once per batch size, rotating the order, after
warm-up calls; the table holds the medians, the ratio to PyTorch fp32 (above 1 = faster) and each candidate's
largest difference from fp32 logits.  One process, one thread count for all (ONNX Runtime's intra-op threads set
to torch's; ``--threads N`` sets both).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
CANDIDATES = ("PyTorch fp32", "PyTorch bf16", "ONNX Runtime fp32")


def texts(n: int) -> list[str]:
    from ptm_app.data.formats import read_records
    from ptm_app.data.sources import prepared_dir

    found = [r["text"] for _, r in read_records(prepared_dir("tweets") / "validation.jsonl", ("text",))]
    return (found * (n // max(len(found), 1) + 1))[:n]


def build(work: Path):
    """The classifier, its bf16 copy, and an ONNX Runtime session over its exported graph."""
    import torch
    import transformers

    from ptm_app.backbones.build import quiet_transformers
    from ptm_app.data.sources import prepared_dir
    from ptm_app.inference.loading import LoadedModel
    from ptm_app.inference.onnx_export import ONNX_FILE, onnxruntime, write_onnx

    where = prepared_dir("minilm")
    with quiet_transformers():
        torch.manual_seed(0)
        model = transformers.AutoModelForSequenceClassification.from_pretrained(where, num_labels=3).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(where)
    loaded = LoadedModel("minilm", model, tokenizer, "sequence_classification", None, where)
    info = write_onnx(loaded, work)
    options = onnxruntime().SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3
    session = onnxruntime().InferenceSession(str(work / ONNX_FILE), options, providers=["CPUExecutionProvider"])
    return loaded, copy.deepcopy(model).to(torch.bfloat16), session, info


def run(batch_sizes: tuple[int, ...], repeats: int, warmup: int, max_length: int = 128) -> dict:
    import torch

    from ptm_app.inference.loading import plain_inputs, session_outputs

    with tempfile.TemporaryDirectory() as work:
        loaded, bf16, session, info = build(Path(work))
        tok = loaded.tokenizer
        calls, reference, worst, tokens = {}, {}, {}, {}
        for size in batch_sizes:
            batch = dict(tok(texts(size), truncation=True, max_length=max_length, padding=True, return_tensors="pt"))
            inputs = plain_inputs(batch)
            tokens[size] = int(batch["input_ids"].numel())
            calls[size] = {"PyTorch fp32": lambda i=inputs: loaded.model(**i).logits,
                           "PyTorch bf16": lambda i=inputs: bf16(**i).logits.float(),
                           "ONNX Runtime fp32": lambda i=inputs: session_outputs(session, i)}
            with torch.no_grad():
                reference[size] = calls[size]["PyTorch fp32"]()
                for name, call in calls[size].items():
                    worst[(name, size)] = float((call().float() - reference[size]).abs().max())
                    for _ in range(warmup):
                        call()
        times: dict = {(name, size): [] for name in CANDIDATES for size in batch_sizes}
        with torch.no_grad():
            for r in range(repeats):
                order = CANDIDATES[r % len(CANDIDATES):] + CANDIDATES[:r % len(CANDIDATES)]  # rotate
                for size in batch_sizes:
                    for name in order:
                        start = time.perf_counter()
                        calls[size][name]()
                        times[(name, size)].append(time.perf_counter() - start)
        rows = []
        for size in batch_sizes:
            base = median(times[("PyTorch fp32", size)])
            for name in CANDIDATES:
                ms = median(times[(name, size)])
                rows.append({"candidate": name, "batch": size, "median_ms": 1000 * ms,
                             "min_ms": 1000 * min(times[(name, size)]), "max_ms": 1000 * max(times[(name, size)]),
                             "x_fp32": base / ms, "max_abs_diff": worst[(name, size)], "tokens": tokens[size]})
    return {"rows": rows, "repeats": repeats, "warmup": warmup, "threads": torch.get_num_threads(),
            "onnx": info, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_name()}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def markdown(result: dict) -> str:
    threads = f"{result['threads']} thread{'' if result['threads'] == 1 else 's'}"
    lines = [f"One run, {result['date']}, {result['cpu']}, {threads}, load average "
             f"{result['load_before']:.2f} before / {result['load_after']:.2f} after; {result['repeats']} repeats "
             f"(after {result['warmup']} warm-up calls), medians. ONNX check at export: max |ORT - PyTorch| "
             f"{result['onnx']['check']['max_abs_diff']:.1e} (tolerance {result['onnx']['check']['tolerance_abs']}).",
             "", "| candidate | batch | tokens | median ms | range ms | x PyTorch fp32 | max abs diff vs fp32 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['candidate']} | {r['batch']} | {r['tokens']:,} | {r['median_ms']:.1f} | "
                     f"{r['min_ms']:.1f}-{r['max_ms']:.1f} | {r['x_fp32']:.2f} | {r['max_abs_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def update_readme(table: str, readme: Path = HERE / "README.md") -> None:
    """Put the table between the inference markers of ``benchmarks/README.md`` (generated, never typed in)."""
    from ptm_app.paths import write_between_markers

    write_between_markers(readme, "inference", table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.inference_latency", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--threads", type=int, help="intra-op threads for torch and ONNX Runtime (default: torch's)")
    parser.add_argument("--out", type=Path, help="write inference.json / inference.md here (default benchmarks/, "
                                                 "and the table into benchmarks/README.md)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    result = run(tuple(args.batch_sizes), args.repeats, args.warmup)
    result.update(load_before=load_before, load_after=os.getloadavg()[0])
    table = markdown(result)
    out = (args.out or HERE).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "inference.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "inference.md").write_text(f"# Inference latency\n\n{table}")
    if args.out is None:
        update_readme(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
