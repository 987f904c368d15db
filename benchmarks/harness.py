"""Side-by-side benchmarks: ptm_app against the transformers ``Trainer`` and a bare PyTorch loop.

``python -m benchmarks`` (``make bench``) runs, each candidate in its own subprocess (so its peak RSS is its
own), alternating the candidates' order in every repeat:

1. MLM pre-training of one BERT config on the same blocks of the prepared ``bbc`` corpus:
   (a) ptm_app at the peer's settings (fp32, dense vocabulary heads), (b) ptm_app defaults (``precision: auto``,
   packing, sparse heads), (c) the ``Trainer`` as ``run_mlm`` sets it up, fp32 and ``--bf16``, (d) a bare loop.
2. Fine-tuning MiniLM on the tweets: ptm_app's recipe against the ``Trainer`` (bf16), the same steps, then
   the validation accuracy.
3. Resume cost: process start → first training step after ``--ckpt_path last``, at step 10 and step 1000.

Medians over the repeats, ratios, a table on stdout, ``results.json`` + ``results.md``, and the table in
``benchmarks/README.md`` (full mode).  ``--smoke`` runs a tiny version of everything (for the tests).
FLOPs and MFU use ptm_app's formula and measured peak (``ptm_app.training.throughput``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

from benchmarks.clock import steady_state

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
COMMAND = "make bench (python -m benchmarks)"


@dataclass
class Settings:
    repeats: int = 3
    backbone: dict = field(default_factory=lambda: {"model_type": "bert", "hidden_size": 256, "num_hidden_layers": 4,
                                                    "num_attention_heads": 4, "intermediate_size": 1024,
                                                    "max_position_embeddings": 512})
    seq_len: int = 128
    batch_size: int = 16
    pretrain_steps: int = 25
    pretrain_warmup: int = 5  # steps left out of the steady state
    lr: float = 5e-4
    weight_decay: float = 0.01
    warmup_fraction: float = 0.06
    clip: float = 1.0  # the Trainer's default max_grad_norm; set for every candidate
    finetune_steps: int = 60
    finetune_warmup: int = 10
    finetune_batch_size: int = 32
    finetune_repeats: int = 2
    val_examples: int = 1000  # a seeded sample of the validation split (0: all of it), the same for every candidate
    resume_config: dict = field(default_factory=lambda: {"model_type": "bert", "hidden_size": 64,
                                                         "num_hidden_layers": 2, "num_attention_heads": 2,
                                                         "intermediate_size": 128, "max_position_embeddings": 64})
    resume_at: tuple = (10, 1000)
    resume_batch_size: int = 2
    resume_seq_len: int = 32
    seed: int = 1234


FULL = Settings()
SMOKE = Settings(repeats=1, backbone={"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2,
                                      "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64},
                 seq_len=32, batch_size=4, pretrain_steps=3, pretrain_warmup=1, finetune_steps=3, finetune_warmup=1,
                 finetune_batch_size=4, finetune_repeats=1, val_examples=16, resume_at=(2, 6))

PRETRAIN = {  # key: (label, child module, kind, precision)
    "a": ("(a) ptm_app, peer settings (fp32, dense heads)", "ptm", "ptm", "32-true"),
    "b": ("(b) ptm_app defaults (auto precision, sparse heads)", "ptm", "ptm", "auto"),
    "c32": ("(c) Trainer run_mlm fp32", "peer", "hf_pretrain", "fp32"),
    "c16": ("(c) Trainer run_mlm --bf16", "peer", "hf_pretrain", "bf16"),
    "d": ("(d) bare PyTorch loop fp32", "peer", "bare_pretrain", "fp32"),
}
FINETUNE = {  # key: (label, child module); the targets compare the ptm_app rows with "hf"
    "ptm": ("ptm_app recipe (minilm_full_tweets.yaml, defaults: length-grouped)", "ptm"),
    "ptm_shuffled": ("ptm_app recipe, group_by_length: false", "ptm"),
    "hf": ("Trainer --bf16, dynamic padding", "peer"),
    "hf_grouped": ("Trainer --bf16 --group_by_length", "peer"),
}
MODULES = {"ptm": "benchmarks.ptm_runs", "peer": "benchmarks.peer_runs"}


class BenchError(RuntimeError):
    pass


class Harness:
    def __init__(self, settings: Settings, work: Path, quiet: bool = False):
        self.s, self.work, self.quiet = settings, work, quiet
        self.env = {**os.environ, "PTM_RUNS_DIR": str(work / "runs"), "HF_HUB_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false",  # the repo first, then whatever the caller's path holds
                    "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    # -- one candidate, one subprocess ----------------------------------------------------------
    def run(self, module: str, name: str, spec: dict) -> dict:
        spec_path, out, log = (self.work / f"{name}{ext}" for ext in (".spec.json", ".out.json", ".log"))
        out.unlink(missing_ok=True)
        spec_path.write_text(json.dumps({**spec, "out": str(out)}, indent=1))
        start = time.time()
        with open(log, "w") as fh:
            proc = subprocess.Popen([sys.executable, "-m", MODULES[module], str(spec_path)], cwd=ROOT, env=self.env,
                                    stdout=fh, stderr=subprocess.STDOUT)
            proc.wait()
        wall = time.time() - start
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            raise BenchError(f"{name} failed (exit {proc.returncode}); log {log}:\n{tail}")
        record = json.loads(out.read_text())
        record.update(name=name, spawn=start, wall_s=wall)  # peak_rss_mb: the child's own (clock.peak_rss_mb)
        self.say(f"  {name:<24} {wall:6.1f} s wall, peak RSS {record['peak_rss_mb']:.0f} MB")
        return record

    # -- shared inputs ----------------------------------------------------------------------------
    def prepare(self) -> dict:
        """Tokenize once, cut the blocks every pre-training candidate trains on, and describe the model."""
        import torch

        from ptm_app.backbones.build import build_backbone
        from ptm_app.training.throughput import peak_flops, training_flops_per_token

        s = self.s
        data = mlm_blocks(self.work, s.seq_len, s.batch_size, s.seed)
        self.tweets_sample()
        backbone = {**s.backbone, "vocab_size": data.pop("vocab_size"), "pad_token_id": data.pop("pad_token_id")}
        model = build_backbone("masked_lm", None, backbone)
        return {
            "backbone": backbone, **data,
            "params": sum(p.numel() for p in model.parameters()),
            "flops_per_token": training_flops_per_token(model, s.seq_len),
            "peak": {"fp32": peak_flops(torch.device("cpu"), torch.float32),
                     "bf16": peak_flops(torch.device("cpu"), torch.bfloat16)},
        }

    def tweets_sample(self) -> Path:
        """``<work>/tweets``: the prepared training split and a seeded sample of the validation split."""
        from ptm_app.data.datamodules import resolve_source, seeded_subset

        files, target = resolve_source("tweets"), self.work / "tweets"
        target.mkdir(exist_ok=True)
        (target / "train.jsonl").unlink(missing_ok=True)
        (target / "train.jsonl").symlink_to(files["train"])
        lines = files["validation"].read_text(encoding="utf-8").splitlines(keepends=True)
        keep = seeded_subset(list(range(len(lines))), self.s.val_examples or len(lines), self.s.seed)
        (target / "validation.jsonl").write_text("".join(lines[i] for i in keep), encoding="utf-8")
        return target

    # -- 1. pre-training ------------------------------------------------------------------------
    def pretrain_spec(self, key: str, shared: dict) -> tuple[str, dict]:
        s = self.s
        _, module, kind, precision = PRETRAIN[key]
        if kind == "ptm":
            config = {
                "seed_everything": s.seed,
                "trainer": {"accelerator": "cpu", "devices": 1, "precision": precision, "max_steps": s.pretrain_steps,
                            "limit_val_batches": 0, "gradient_clip_val": s.clip},
                "model": {"class_path": "MaskedLMModule", "init_args": {
                    "backbone_config": shared["backbone"],
                    "optim": {"lr": s.lr, "weight_decay": s.weight_decay, "warmup": s.warmup_fraction,
                              "schedule": "linear"},
                    **({"targets": [{"class_path": "MaskedLM", "init_args": {"sparse_prediction": False}}]}
                       if key == "a" else {})}},
                "data": {"class_path": "PretrainDataModule", "init_args": {
                    "source": "bbc", "tokenizer": {"pretrained": "minilm"}, "max_length": s.seq_len,
                    "packing": "pack", "batch_size": s.batch_size, "seed": s.seed}},
            }
            return module, {"config": config, "run_name": f"bench_{key}"}
        return module, {"kind": kind, "precision": precision, "backbone_config": shared["backbone"],
                        "blocks": shared["blocks"], "tokenizer": shared["tokenizer"],
                        "mask_token_id": shared["mask_token_id"], "special_ids": shared["special_ids"],
                        "steps": s.pretrain_steps, "batch_size": s.batch_size, "lr": s.lr,
                        "weight_decay": s.weight_decay, "warmup": s.warmup_fraction, "clip": s.clip, "seed": s.seed}

    def pretrain(self, shared: dict) -> dict:
        keys = list(PRETRAIN)
        runs: dict[str, list] = {k: [] for k in keys}
        for rep in range(self.s.repeats):
            order = keys[rep % len(keys):] + keys[:rep % len(keys)]
            self.say(f"pre-training, repeat {rep + 1}/{self.s.repeats}: {' '.join(order)}")
            for key in order:
                module, spec = self.pretrain_spec(key, shared)
                record = self.run(module, f"pretrain_{key}_r{rep}", spec)
                dtype = "bf16" if "bf16" in str(record.get("precision")) else "fp32"
                rate = steady_state(record, self.s.pretrain_warmup)
                record.update(rate, dtype=dtype,
                              mfu=rate["tokens_per_s"] * shared["flops_per_token"] / shared["peak"][dtype])
                runs[key].append(record)
        return summarise(runs, "tokens_per_s", ("c32", "c16", "d"))

    # -- 2. fine-tuning ---------------------------------------------------------------------------
    def finetune_spec(self, key: str) -> tuple[str, dict]:
        import yaml

        from ptm_app.paths import data_root

        s = self.s
        recipe = yaml.safe_load((ROOT / "configs/adapt/minilm_full_tweets.yaml").read_text())
        init = recipe["data"]["init_args"]
        tweets = self.work / "tweets"
        if key.startswith("ptm"):
            recipe["trainer"].update(max_steps=s.finetune_steps, val_check_interval=s.finetune_steps,
                                     num_sanity_val_steps=0)
            init.update(source=str(tweets), batch_size=s.finetune_batch_size)
            if key == "ptm_shuffled":
                init["group_by_length"] = False
            return "ptm", {"config": recipe, "run_name": f"bench_{key}"}
        optim = recipe["model"]["init_args"]["optim"]
        return "peer", {"kind": "hf_finetune", "precision": "bf16", "backbone": str(data_root() / "minilm"),
                        "train": str(tweets / "train.jsonl"), "validation": str(tweets / "validation.jsonl"),
                        "max_length": init["max_length"], "steps": s.finetune_steps,
                        "batch_size": s.finetune_batch_size, "lr": optim["lr"], "weight_decay": s.weight_decay,
                        "warmup": optim["warmup"], "seed": recipe["seed_everything"],
                        "group_by_length": key == "hf_grouped"}

    def finetune(self) -> dict:
        keys = list(FINETUNE)
        runs: dict[str, list] = {k: [] for k in keys}
        for rep in range(self.s.finetune_repeats):
            order = keys[rep % len(keys):] + keys[:rep % len(keys)]
            self.say(f"fine-tuning, repeat {rep + 1}/{self.s.finetune_repeats}: {' '.join(order)}")
            for key in order:
                module, spec = self.finetune_spec(key)
                record = self.run(module, f"finetune_{key}_r{rep}", spec)
                record.update(steady_state(record, self.s.finetune_warmup),
                              val_acc=(record.get("val") or {}).get("val/acc"))
                runs[key].append(record)
        return summarise(runs, "samples_per_s", ("hf", "hf_grouped"))

    # -- 3. resume cost ---------------------------------------------------------------------------
    def resume_spec(self, at: int, resume: bool) -> dict:
        s = self.s
        config = {
            "seed_everything": s.seed,
            "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 100_000, "limit_val_batches": 0},
            "model": {"class_path": "MaskedLMModule", "init_args": {"backbone_config": s.resume_config}},
            "data": {"class_path": "PretrainDataModule", "init_args": {
                "source": "bbc", "tokenizer": {"pretrained": "minilm"}, "max_length": s.resume_seq_len,
                "batch_size": s.resume_batch_size, "seed": s.seed}},
        }
        args = ["--ckpt_path", "last", "--stop_at_step", str(at + 1)] if resume else ["--stop_at_step", str(at)]
        return {"config": config, "run_name": f"bench_resume_{at}", "args": args}

    def resume(self) -> dict:
        ckpts = {}
        for at in self.s.resume_at:  # real checkpoints, written by runs paused at that step
            shutil.rmtree(self.work / "runs" / f"bench_resume_{at}", ignore_errors=True)
            self.say(f"resume: training to step {at}")
            made = self.run("ptm", f"resume_make_{at}", self.resume_spec(at, resume=False))
            ckpt = self.work / "runs" / f"bench_resume_{at}" / "checkpoints" / "last.ckpt"
            shutil.copy2(ckpt, ckpt.with_suffix(".orig"))
            ckpts[at] = {"ckpt": ckpt, "ckpt_mb": ckpt.stat().st_size / 2 ** 20,
                         "epoch_batches": made.get("epoch_batches"), "make_wall_s": made["wall_s"]}
        runs: dict[int, list] = {at: [] for at in self.s.resume_at}
        for rep in range(self.s.repeats):
            order = list(self.s.resume_at)[::(-1 if rep % 2 else 1)]
            self.say(f"resume, repeat {rep + 1}/{self.s.repeats}: steps {' '.join(map(str, order))}")
            for at in order:
                shutil.copy2(ckpts[at]["ckpt"].with_suffix(".orig"), ckpts[at]["ckpt"])
                record = self.run("ptm", f"resume_{at}_r{rep}", self.resume_spec(at, resume=True))
                marks = record["marks"]
                if record.get("first_global_step") != at:
                    raise BenchError(f"resume at {at} started training at step {record.get('first_global_step')}")
                record.update(start_to_first_step_s=marks["first_step_start"] - record["spawn"],
                              main_to_first_step_s=marks["first_step_start"] - marks["main"])
                runs[at].append(record)
        rows = {}
        for at, recs in runs.items():
            rows[str(at)] = {"step": at, "ckpt_mb": ckpts[at]["ckpt_mb"], "epoch_batches": ckpts[at]["epoch_batches"],
                             **{k: median(r[k] for r in recs) for k in ("start_to_first_step_s",
                                                                        "main_to_first_step_s", "peak_rss_mb")},
                             "runs": recs}
        return rows


def mlm_blocks(work: Path, seq_len: int, batch_size: int, seed: int) -> dict:
    """The blocks every MLM pre-training candidate trains on: the prepared ``bbc`` training split tokenized with
    MiniLM's tokenizer and packed by ptm_app (``PretrainDataModule(packing: pack)``, the tokenization cached), saved
    to ``<work>/blocks.npy``; with the tokenizer facts the peers need."""
    import numpy as np

    from ptm_app.data.datamodules import PretrainDataModule
    from ptm_app.data.tokenizer import TokenizerSpec

    dm = PretrainDataModule(TokenizerSpec(pretrained="minilm"), source="bbc", max_length=seq_len,
                            packing="pack", batch_size=batch_size, seed=seed)
    dm.prepare_data()
    dm.setup("fit")
    blocks = np.stack(dm.datasets["train"].blocks).astype(np.int64)
    if blocks.shape[1] != seq_len:
        raise BenchError(f"packed blocks are {blocks.shape[1]} long, expected {seq_len}")
    np.save(work / "blocks.npy", blocks)
    tok = dm.tokenizer
    return {"blocks": str(work / "blocks.npy"), "num_blocks": len(blocks), "tokenizer": tok.name_or_path,
            "mask_token_id": tok.mask_token_id, "special_ids": [i for i in tok.all_special_ids if i < len(tok)],
            "vocab_size": len(tok), "pad_token_id": tok.pad_token_id}


def summarise(runs: dict[str, list], rate: str, against: tuple[str, ...]) -> dict:
    """Medians per candidate (with the range) and the ratio of medians against each reference candidate."""
    rows = {}
    for key, recs in runs.items():
        values = [r[rate] for r in recs]
        row = {rate: median(values), f"{rate}_min": min(values), f"{rate}_max": max(values),
               f"{rate}_mean": median(r.get(f"{rate}_mean", r[rate]) for r in recs),
               "s_per_step": median(r["s_per_step"] for r in recs),
               "peak_rss_mb": median(r["peak_rss_mb"] for r in recs),
               "precision": recs[0].get("precision"), "params": recs[0].get("params"), "attn": recs[0].get("attn"),
               "runs": recs}
        for name in ("mfu", "val_acc", "padding_fraction"):
            if any(r.get(name) is not None for r in recs):
                row[name] = median(r[name] for r in recs if r.get(name) is not None)
        rows[key] = row
    for key, row in rows.items():
        row["ratio"] = {ref: row[rate] / rows[ref][rate] for ref in against if ref in rows}
    return rows


# -- report ------------------------------------------------------------------------------------------
def machine() -> dict:
    import lightning
    import torch
    import transformers

    from ptm_app.training.precision import cpu_has_native_bf16
    from ptm_app.training.throughput import device_name

    return {"cpu": device_name(torch.device("cpu")), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cpu_bf16": cpu_has_native_bf16(), "python": platform.python_version(), "torch": torch.__version__,
            "lightning": lightning.__version__, "transformers": transformers.__version__}


def targets(results: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each of issue 5's targets that this run measured."""
    out = []
    pre, ft = results.get("pretrain"), results.get("finetune")
    if pre:
        a_d, a_c, b_c = pre["a"]["ratio"]["d"], pre["a"]["ratio"]["c32"], pre["b"]["ratio"]["c16"]
        out += [("(a) within 5% of (d)", f"(a)/(d) = {a_d:.3f}", a_d >= 0.95),
                ("(a) >= (c) fp32", f"(a)/(c fp32) = {a_c:.2f}", a_c >= 1.0),
                ("(b) >= 1.5x (c) bf16", f"(b)/(c bf16) = {b_c:.2f}", b_c >= 1.5)]
    if ft:
        acc_h = ft["hf"].get("val_acc")
        for key in (k for k in FINETUNE if k in ft and k.startswith("ptm")):
            speed, acc_p, label = ft[key]["ratio"]["hf"], ft[key].get("val_acc"), FINETUNE[key][0]
            out.append((f"fine-tuning >= 1.2x Trainer: {label}", f"{speed:.2f}x", speed >= 1.2))
            if acc_p is not None and acc_h is not None:
                out.append((f"no loss in accuracy (within 1 point): {label}", f"{acc_p:.3f} vs {acc_h:.3f}",
                            acc_p >= acc_h - 0.01))
    res = results.get("resume")
    if res:
        first, last = (res[k]["start_to_first_step_s"] for k in (min(res, key=int), max(res, key=int)))
        out.append((f"resume cost flat (step {max(res, key=int)} vs {min(res, key=int)}, within 20%)",
                    f"{last:.1f} s vs {first:.1f} s", last <= first * 1.2))
    return out


def markdown(results: dict) -> str:
    m, s = results["machine"], results["settings"]
    lines = [f"Measured by `{results['command']}` on {results['date']}: {m['cpu']}, {m['cores']} cores, "
             f"torch {m['torch']} with {m['torch_threads']} threads (bf16 instructions: {m['cpu_bf16']}), "
             f"lightning {m['lightning']}, transformers {m['transformers']}.  Load average (1 min) "
             f"{results['load_before']:.2f} before, {results['load_after']:.2f} after"
             + (" (**the machine was busy: read the numbers as a range**)."
                if max(results['load_before'], results['load_after']) > 1.5 else ".")]
    pre = results.get("pretrain")
    if pre:
        sh = results["shared"]
        lines += ["", f"### MLM pre-training: BERT {s['backbone']['num_hidden_layers']}x{s['backbone']['hidden_size']}, "
                      f"vocab {sh['backbone']['vocab_size']} (MiniLM's), {sh['params'] / 1e6:.1f}M parameters, "
                      f"{s['batch_size']}x{s['seq_len']} tokens a step, {s['pretrain_steps']} steps "
                      f"(first {s['pretrain_warmup']} left out), {s['repeats']} repeats, same {sh['num_blocks']} blocks",
                  "", "| candidate | precision | tokens/s | range | window mean | s/step | MFU | peak RSS MB "
                      "| x (c) fp32 | x (c) bf16 | x (d) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, row in pre.items():
            r = row["ratio"]
            lines.append(f"| {PRETRAIN[key][0]} | {row['precision']} | {row['tokens_per_s']:,.0f} | "
                         f"{row['tokens_per_s_min']:,.0f}-{row['tokens_per_s_max']:,.0f} | "
                         f"{row['tokens_per_s_mean']:,.0f} | {row['s_per_step']:.3f} | "
                         f"{100 * row['mfu']:.1f}% | {row['peak_rss_mb']:,.0f} | {r['c32']:.2f} | {r['c16']:.2f} | "
                         f"{r['d']:.2f} |")
        lines.append(f"\nMFU = model FLOPs/s (ptm_app's 6N + 12LdT: {sh['flops_per_token'] / 1e6:.1f} MFLOP a token) "
                     f"over the measured matmul peak of the run's dtype ({sh['peak']['fp32'] / 1e9:.0f} GFLOP/s fp32, "
                     f"{sh['peak']['bf16'] / 1e9:.0f} GFLOP/s bf16).")
    ft = results.get("finetune")
    if ft:
        examples = next(((r.get("val") or {}).get("val/examples") for row in ft.values() for r in row["runs"]
                         if (r.get("val") or {}).get("val/examples")), "?")
        lines += ["", f"### Fine-tuning MiniLM on the tweets: {s['finetune_steps']} steps of {s['finetune_batch_size']} "
                      f"(first {s['finetune_warmup']} left out of the rate), {s['finetune_repeats']} repeats, "
                      f"then the accuracy on {examples} validation tweets",
                  "", "| candidate | precision | samples/s | range | window mean | padding | peak RSS MB "
                      "| validation accuracy | x Trainer | x Trainer grouped |", "|---|---|---|---|---|---|---|---|---|---|"]
        for key, row in ft.items():
            lines.append(f"| {FINETUNE[key][0]} | {row['precision']} | {row['samples_per_s']:.1f} | "
                         f"{row['samples_per_s_min']:.1f}-{row['samples_per_s_max']:.1f} | "
                         f"{row['samples_per_s_mean']:.1f} | {100 * row['padding_fraction']:.0f}% | "
                         f"{row['peak_rss_mb']:,.0f} | "
                         f"{row.get('val_acc', float('nan')):.3f} | "
                         f"{row['ratio']['hf']:.2f} | {row['ratio'].get('hf_grouped', float('nan')):.2f} |")
    res = results.get("resume")
    if res:
        lines += ["", "### Resume cost: `fit --ckpt_path last`, process start to the first training step",
                  "", "| resumed at step | batches in the epoch | checkpoint MB | process start -> first step s "
                      "| of which CLI, data, model and checkpoint restore s | peak RSS MB |",
                  "|---|---|---|---|---|---|"]
        for row in res.values():
            lines.append(f"| {row['step']} | {row['epoch_batches']} | {row['ckpt_mb']:.1f} | "
                         f"{row['start_to_first_step_s']:.2f} | {row['main_to_first_step_s']:.2f} | "
                         f"{row['peak_rss_mb']:,.0f} |")
    lines += ["", "### Targets (issue 5)", "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {v} | {'yes' if ok else '**no**'} |" for t, v, ok in targets(results)]
    return "\n".join(lines) + "\n"


def update_readme(table: str, readme: Path = HERE / "README.md") -> None:
    """Put the table between the results markers of ``benchmarks/README.md`` (generated, never typed in)."""
    from ptm_app.paths import write_between_markers

    write_between_markers(readme, "results", table)


def _strip(value):
    """Results without the per-step time lists (they stay in the work directory's .out.json files)."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in ("ends", "samples", "tokens")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
                                     epilog="python -m benchmarks --device cuda: the GPU benchmark "
                                            "(benchmarks/gpu_bench.py; --device cpu --smoke: its CPU check)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, 3 steps, 1 repeat (a check, not a measurement)")
    parser.add_argument("--only", nargs="+", choices=("pretrain", "finetune", "resume", "data", "inference"),
                        default=["pretrain", "finetune", "resume"])
    parser.add_argument("--repeats", type=int, help="repeats of every part (default 3; fine-tuning 2)")
    parser.add_argument("--work", type=Path, default=ROOT / "checkpoints" / "bench",
                        help="run directories, logs and per-step records")
    parser.add_argument("--out", type=Path, help="where results.json/.md go (default benchmarks/; with --smoke, --work)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.only == ["data"]:  # corpus preparation side by side (benchmarks/data_prep.py), 100 MB and 1 GB corpora
        from benchmarks.data_prep import main as data_main

        return data_main([])
    if args.only == ["inference"]:  # CPU latency: PyTorch fp32 / bf16 against ONNX Runtime (inference_latency.py)
        from benchmarks.inference_latency import main as inference_main

        return inference_main([] if args.repeats is None else ["--repeats", str(args.repeats)])
    settings = SMOKE if args.smoke else FULL
    if args.repeats:
        settings = Settings(**{**asdict(settings), "repeats": args.repeats, "finetune_repeats": args.repeats})
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = (args.out or (work if args.smoke else HERE)).resolve()
    harness = Harness(settings, work, quiet=args.quiet)
    command = " ".join(["python -m benchmarks", *argv])
    results = {"command": COMMAND if command == "python -m benchmarks" else command,
               "date": time.strftime("%Y-%m-%d %H:%M"),
               "load_before": os.getloadavg()[0], "settings": asdict(settings), "machine": machine()}
    started = time.time()
    try:
        results["shared"] = shared = harness.prepare()
        for part in ("pretrain", "finetune", "resume"):
            if part in args.only:
                results[part] = harness.pretrain(shared) if part == "pretrain" else getattr(harness, part)()
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    results.update(load_after=os.getloadavg()[0], total_s=time.time() - started)
    table = markdown(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(_strip(results), indent=1, default=str))
    (out / "results.md").write_text(f"# Benchmark results\n\n{table}")
    if out == HERE and set(args.only) == {"pretrain", "finetune", "resume"}:
        update_readme(table)
    harness.say(f"\n{table}\n{time.time() - started:.0f} s in all; wrote {out / 'results.md'} and results.json")
    return 0
