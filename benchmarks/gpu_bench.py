"""GPU throughput (issue 24): MLM pre-training at BERT-base shape, ptm_app against the transformers ``Trainer`` and a
bare PyTorch loop, with model FLOPs utilisation against the GPU's measured bf16 matmul peak.

``python -m benchmarks --device cuda`` (this module's ``main``) trains BERT-base (hidden 768, 12 layers, 12 heads,
FFN 3072, MiniLM's 30,522-token vocabulary) on the packed ``bbc`` blocks at 128 tokens, at two batch sizes:
32 x 128 and one that fills the GPU (256 x 128 by default, ``--batch_sizes``).  Each candidate runs in its own
subprocess (``Harness.run``), their order rotating every repeat; medians over the repeats:

- ``ptm``: ``main.py fit`` with ptm_app's defaults (``MaskedLMModule``: sparse prediction heads, SDPA;
  ``precision: auto``; the fused AdamW) plus what a GPU run adds: ``configs/memory/compile.yaml``'s
  ``TorchCompile`` callback and 4 loader workers (``data.init_args.num_workers``; batches are page-locked on a GPU);
- ``hf``: the ``Trainer`` with its fastest flags (bf16, ``optim="adamw_torch_fused"``, ``torch_compile=True``, the
  same loader workers, pinned memory, no per-step NaN check: ``benchmarks/peer_runs.py``);
- ``bare``: a plain loop, bf16 autocast, the fused AdamW, ``torch.compile`` of the model.

Everyone clips gradients at 1.0 (the ``Trainer``'s default), uses AdamW (lr 1e-4, weight decay 0.01, 6 % warm-up)
and trains on the same blocks, within one epoch (a partial last batch would recompile a compiled model).  Steps are
timed on the GPU's timeline (``StepClock(cuda=True)``: CUDA events); the first ``warmup`` steps (compilation) are
left out.  MFU = model FLOPs per second (``training_flops_per_token``: 6N + 12LdT, the vocabulary projection not
counted, the same figure for every candidate) over ``peak_flops`` of the run's dtype on this GPU.

Targets for the filling batch: ptm_app at least 40 % MFU and at least 1.5x the ``Trainer``.  ``--smoke`` runs the
same on the CPU with a tiny model, few steps and no compilation (``--device cpu --smoke``: a check, not a
measurement).  Writes ``gpu.json`` and ``gpu.md`` (``benchmarks/``; with ``--smoke``, ``--work``) after every run,
and in full mode on a GPU the table between the ``gpu`` markers of ``benchmarks/README.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from benchmarks.clock import steady_state
from benchmarks.harness import HERE, ROOT, BenchError, Harness, _strip, machine, mlm_blocks, summarise

BERT_BASE = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "max_position_embeddings": 512}
TARGET_MFU = 0.40
TARGET_X_TRAINER = 1.5
CANDIDATES = ("ptm", "hf", "bare")


def label(key: str, settings: dict) -> str:
    """A candidate's row label, naming what it runs with (``settings``: ``asdict(GpuSettings)``)."""
    compiled, workers = settings["compile"], settings["num_workers"]
    return {"ptm": f"ptm_app defaults{' + TorchCompile' if compiled else ''}, {workers} loader workers",
            "hf": f"Trainer: bf16/fp16 flag, adamw_torch_fused{', torch_compile' if compiled else ''}",
            "bare": f"bare loop: autocast, fused AdamW{', torch.compile' if compiled else ''}"}[key]


@dataclass
class GpuSettings:
    backbone: dict = field(default_factory=lambda: dict(BERT_BASE))
    seq_len: int = 128
    batch_sizes: tuple = (32, 256)
    steps: int = 60  # at most; fewer where one epoch of the blocks holds fewer full batches
    warmup: int = 10  # steps left out of the steady state (the first compiles)
    repeats: int = 2
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_fraction: float = 0.06
    clip: float = 1.0
    num_workers: int = 4
    compile: bool = True
    peak_sizes: tuple = ()  # the peak probe's matmul sizes (empty: ptm_app's default for the device)
    seed: int = 1234


FULL = GpuSettings()
SMOKE = GpuSettings(backbone={"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                              "intermediate_size": 64, "max_position_embeddings": 64},
                    seq_len=32, batch_sizes=(4, 8), steps=4, warmup=1, repeats=1, num_workers=0, compile=False,
                    peak_sizes=(384,))  # a size of its own: the peak tests count what the session cache holds


def peer_dtype(precision: str) -> str:
    """The peers' flag for a Lightning precision (what ``precision: auto`` chose for ptm_app on this device)."""
    return "bf16" if "bf16" in precision else "fp16" if "16" in precision else "fp32"


class GpuBench:
    def __init__(self, settings: GpuSettings, device: str, work: Path, quiet: bool = False):
        self.s, self.device, self.work = settings, device, work
        self.harness = Harness(settings, work, quiet=quiet)  # its subprocess runner and environment
        self.say = self.harness.say

    def prepare(self) -> dict:
        """The blocks, the model's size and FLOPs per token, the precision ``auto`` picks here and its peak."""
        import torch

        from ptm_app.backbones.build import build_backbone
        from ptm_app.training.precision import auto_precision
        from ptm_app.training.throughput import device_name, peak_flops, precision_dtype, training_flops_per_token

        s = self.s
        data = mlm_blocks(self.work, s.seq_len, max(s.batch_sizes), s.seed)
        backbone = {**s.backbone, "vocab_size": data.pop("vocab_size"), "pad_token_id": data.pop("pad_token_id")}
        model = build_backbone("masked_lm", None, backbone)
        precision = auto_precision("gpu" if self.device == "cuda" else "cpu")
        device = torch.device(self.device)
        dtype = precision_dtype(precision)
        self.say(f"measuring the {dtype} matmul peak of {device_name(device)}")
        peak = peak_flops(device, dtype, tuple(s.peak_sizes) or None)
        if self.device == "cuda":
            torch.cuda.empty_cache()
        return {"backbone": backbone, **data, "params": sum(p.numel() for p in model.parameters()),
                "flops_per_token": training_flops_per_token(model, s.seq_len), "precision": precision,
                "dtype": str(dtype).removeprefix("torch."), "peak": peak, "device_name": device_name(device)}

    def steps_for(self, batch_size: int, shared: dict) -> int:
        full_batches = shared["num_blocks"] // batch_size
        steps = min(self.s.steps, full_batches)
        if steps <= self.s.warmup + 1:
            raise BenchError(f"only {full_batches} full batches of {batch_size} in the blocks: too few for "
                             f"{self.s.warmup} warm-up steps and a measurement; lower --batch_sizes")
        return steps

    def spec(self, key: str, batch_size: int, steps: int, shared: dict) -> tuple[str, dict]:
        s = self.s
        if key == "ptm":
            import yaml

            callbacks = []
            if s.compile:  # the mechanism of configs/memory/compile.yaml: its callbacks, appended
                callbacks = yaml.safe_load((ROOT / "configs/memory/compile.yaml").read_text())["trainer"]["callbacks+"]
            config = {
                "seed_everything": s.seed,
                "trainer": {"accelerator": "gpu" if self.device == "cuda" else "cpu", "devices": 1,
                            "precision": "auto", "max_steps": steps, "limit_val_batches": 0,
                            "gradient_clip_val": s.clip, "callbacks": callbacks},
                "model": {"class_path": "MaskedLMModule", "init_args": {
                    "backbone_config": shared["backbone"],
                    "optim": {"lr": s.lr, "weight_decay": s.weight_decay, "warmup": s.warmup_fraction,
                              "schedule": "linear"}}},
                "data": {"class_path": "PretrainDataModule", "init_args": {
                    "source": "bbc", "tokenizer": {"pretrained": "minilm"}, "max_length": s.seq_len,
                    "packing": "pack", "batch_size": batch_size, "seed": s.seed, "num_workers": s.num_workers}},
            }
            return "ptm", {"config": config, "run_name": f"gpu_bench_{batch_size}"}
        return "peer", {"kind": "hf_pretrain" if key == "hf" else "bare_pretrain", "device": self.device,
                        "best_flags": True, "compile": s.compile, "num_workers": s.num_workers,
                        "precision": peer_dtype(shared["precision"]), "backbone_config": shared["backbone"],
                        "blocks": shared["blocks"], "tokenizer": shared["tokenizer"],
                        "mask_token_id": shared["mask_token_id"], "special_ids": shared["special_ids"],
                        "steps": steps, "batch_size": batch_size, "lr": s.lr, "weight_decay": s.weight_decay,
                        "warmup": s.warmup_fraction, "clip": s.clip, "seed": s.seed}

    def batch_size(self, batch_size: int, shared: dict, done) -> dict:
        """Every candidate at ``batch_size``, ``repeats`` times in rotating order; ``done`` after each run."""
        keys, steps = list(CANDIDATES), self.steps_for(batch_size, shared)
        runs: dict[str, list] = {k: [] for k in keys}
        for rep in range(self.s.repeats):
            order = keys[rep % len(keys):] + keys[:rep % len(keys)]
            self.say(f"batch {batch_size} x {self.s.seq_len}, {steps} steps, repeat {rep + 1}/{self.s.repeats}: "
                     f"{' '.join(order)}")
            for key in order:
                module, spec = self.spec(key, batch_size, steps, shared)
                record = self.harness.run(module, f"gpu_{key}_b{batch_size}_r{rep}", spec)
                rate = steady_state(record, self.s.warmup)
                record.update(rate, steps_run=steps, mfu=rate["tokens_per_s"] * shared["flops_per_token"] / shared["peak"])
                runs[key].append(record)
                done({k: v for k, v in runs.items() if v})
        return _summaries(runs)


def targets(results: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, met) at the largest batch size measured (the one that fills the GPU)."""
    rows = results.get("batches") or {}
    if not rows:
        return []
    largest = max(rows, key=int)
    ptm = rows[largest].get("ptm")
    if not ptm:
        return []
    out = [(f"ptm_app MFU >= {TARGET_MFU:.0%} at {largest} x {results['settings']['seq_len']}",
            f"{ptm['mfu']:.1%}", ptm["mfu"] >= TARGET_MFU)]
    if "hf" in ptm["ratio"]:
        x = ptm["ratio"]["hf"]
        out.append((f"ptm_app >= {TARGET_X_TRAINER}x the Trainer (its best flags) at {largest} x "
                    f"{results['settings']['seq_len']}", f"{x:.2f}x", x >= TARGET_X_TRAINER))
    return out


def markdown(results: dict) -> str:
    m, s, sh = results["machine"], results["settings"], results["shared"]
    lines = [f"Measured by `{results['command']}` on {results['date']}: **{sh['device_name']}**, torch {m['torch']}, "
             f"lightning {m['lightning']}, transformers {m['transformers']}; {m['cores']} CPU cores.  BERT "
             f"{s['backbone']['num_hidden_layers']}x{s['backbone']['hidden_size']} ({sh['params'] / 1e6:.1f}M "
             f"parameters, MiniLM's {sh['backbone']['vocab_size']:,}-token vocabulary), {s['seq_len']} tokens a block, "
             f"{s['repeats']} repeat(s), the first {s['warmup']} steps left out; `precision: auto` chose "
             f"{sh['precision']}; the {sh['dtype']} matmul peak measured here: {_flops(sh['peak'])}.",
             "", "| batch | candidate | precision | tokens/s | range | s/step | MFU | peak GPU MB | x Trainer | x bare |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for batch, rows in sorted(results.get("batches", {}).items(), key=lambda kv: int(kv[0])):
        for key, row in rows.items():
            r = row["ratio"]
            gpu_mb = row.get("peak_gpu_mb")
            lines.append(f"| {batch} x {s['seq_len']} | {label(key, s)} | {row['precision']} | "
                         f"{row['tokens_per_s']:,.0f} | {row['tokens_per_s_min']:,.0f}-{row['tokens_per_s_max']:,.0f} | "
                         f"{row['s_per_step']:.4f} | {100 * row['mfu']:.1f}% | "
                         f"{f'{gpu_mb:,.0f}' if gpu_mb else '-'} | {r.get('hf', float('nan')):.2f} | "
                         f"{r.get('bare', float('nan')):.2f} |")
    lines.append(f"\nMFU = model FLOPs/s ({sh['flops_per_token'] / 1e6:.0f} MFLOP a token: 6N + 12LdT) over the "
                 f"measured peak.  Steps timed with CUDA events on the GPU's timeline." if results["device"] == "cuda"
                 else f"\nMFU = model FLOPs/s ({sh['flops_per_token'] / 1e6:.1f} MFLOP a token) over the measured "
                      f"peak.  A CPU smoke run: the numbers check the pipeline, they measure nothing.")
    found = targets(results)
    if found:
        lines += ["", "| target (issue 24) | measured | met |", "|---|---|---|"]
        lines += [f"| {t} | {v} | {'yes' if ok else '**no**'} |" for t, v, ok in found]
    return "\n".join(lines) + "\n"


def _flops(value: float) -> str:
    return f"{value / 1e12:,.0f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:,.0f} GFLOP/s"


def _summaries(runs_by_key: dict) -> dict:
    """Per-candidate rows of the runs so far (``summarise``, with the GPU's peak memory)."""
    rows = summarise(runs_by_key, "tokens_per_s", tuple(k for k in ("hf", "bare") if k in runs_by_key))
    for key, row in rows.items():
        peaks = [r["peak_gpu_mb"] for r in runs_by_key[key] if r.get("peak_gpu_mb")]
        row["peak_gpu_mb"] = max(peaks) if peaks else None
    return rows


def write_readme(results: dict, readme: Path = HERE / "README.md") -> int:
    """The table between the ``gpu`` markers of ``benchmarks/README.md`` (generated, never typed in)."""
    from ptm_app.paths import write_between_markers

    if not write_between_markers(readme, "gpu", markdown(results)):
        print(f"error: {readme} has no <!-- gpu:start --> / <!-- gpu:end --> markers", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks --device cuda", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny model, few steps, no compilation: a check")
    parser.add_argument("--batch_sizes", type=int, nargs="+", help="default 32 256 (smoke: 4 8)")
    parser.add_argument("--repeats", type=int, help="repeats of every candidate (default 2)")
    parser.add_argument("--steps", type=int, help="steps a run, at most (default 60)")
    parser.add_argument("--work", type=Path, default=ROOT / "checkpoints" / "gpu_bench",
                        help="run directories, logs and per-step records")
    parser.add_argument("--out", type=Path, help="where gpu.json/.md go (default benchmarks/; with --smoke, --work)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--readme", type=Path, metavar="GPU.JSON",
                        help="only write that result (e.g. one made on a lent GPU machine) into the gpu section of "
                             "benchmarks/README.md")
    args = parser.parse_args(argv)
    if args.readme:
        return write_readme(json.loads(args.readme.read_text()))
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            from benchmarks.gpu_check import no_cuda_reason

            print(f"python -m benchmarks --device cuda: no CUDA GPU here ({no_cuda_reason()}); run it on a machine "
                  f"with one, or --device cpu --smoke for a CPU check", flush=True)
            return 1
    settings = SMOKE if args.smoke else FULL
    overrides = {k: v for k, v in (("batch_sizes", tuple(args.batch_sizes or ())), ("repeats", args.repeats),
                                   ("steps", args.steps)) if v}
    settings = replace(settings, **overrides)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = (args.out or (work if args.smoke else HERE)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    bench = GpuBench(settings, args.device, work, quiet=args.quiet)
    command = " ".join(["python -m benchmarks", *(sys.argv[1:] if argv is None else argv)])
    results = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "device": args.device,
               "settings": asdict(settings), "machine": machine(), "batches": {}}
    started = time.time()

    def write() -> str:
        table = markdown(results)
        (out / "gpu.json").write_text(json.dumps(_strip(results), indent=1, default=str))
        (out / "gpu.md").write_text(f"# GPU benchmark (issue 24)\n\n{table}")
        return table

    try:
        results["shared"] = shared = bench.prepare()
        for batch_size in settings.batch_sizes:
            def done(runs, batch=batch_size):
                results["batches"][str(batch)] = _summaries(runs)
                write()  # after every run: a run cut short still leaves what it measured

            results["batches"][str(batch_size)] = bench.batch_size(batch_size, shared, done)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    results["total_s"] = time.time() - started
    table = write()
    if not args.smoke and args.device == "cuda" and args.out is None:
        write_readme(results)
    for name, value, ok in targets(results):
        bench.say(f"target {'met' if ok else 'NOT met'}: {name}: {value}")
    bench.say(f"\n{table}\n{time.time() - started:.0f} s in all; wrote {out / 'gpu.md'} and gpu.json")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
