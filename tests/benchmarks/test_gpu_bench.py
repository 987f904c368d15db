"""``python -m benchmarks --device cuda`` (benchmarks/gpu_bench.py): its CPU smoke run, its targets, and one line
without a GPU.  No speed targets here: the benchmark reports whether they are met."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~30 s: three candidates in subprocesses
def test_smoke_on_the_cpu_measures_every_candidate(tmp_path):
    """``--device cpu --smoke`` at one batch size: ptm_app, the Trainer and the bare loop, each in its own process
    (about a minute on 2 cores)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--device", "cpu", "--smoke", "--batch_sizes", "4",
                          "--steps", "3", "--quiet", "--work", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "gpu.json").read_text())
    rows = results["batches"]["4"]
    assert set(rows) == {"ptm", "hf", "bare"}
    for key, row in rows.items():
        assert row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1 and row["s_per_step"] > 0, key
        assert row["runs"][0]["steps_run"] == 3 and row["runs"][0]["timed_on"] == "host clock"
        assert row["ratio"]["hf"] == pytest.approx(row["tokens_per_s"] / rows["hf"]["tokens_per_s"])
    assert rows["ptm"]["precision"] == results["shared"]["precision"]  # what precision: auto chose here
    assert results["shared"]["flops_per_token"] > 0 and results["shared"]["peak"] > 0
    table = (tmp_path / "gpu.md").read_text()
    assert table.count("\n| 4 x 32 |") == 3 and "| target (issue 24) |" in table


def test_targets_at_the_filling_batch():
    def row(rate, mfu, hf):
        return {"tokens_per_s": rate, "mfu": mfu, "ratio": {"hf": rate / hf}}

    results = {"settings": {"seq_len": 128}, "batches": {
        "32": {"ptm": row(100, 0.1, 100), "hf": row(100, 0.1, 100)},
        "256": {"ptm": row(330, 0.42, 200), "hf": row(200, 0.25, 200)}}}
    met = {name: ok for name, _, ok in gpu_bench.targets(results)}
    assert met == {"ptm_app MFU >= 40% at 256 x 128": True, "ptm_app >= 1.5x the Trainer (its best flags) at 256 x 128": True}
    results["batches"]["256"]["ptm"] = row(290, 0.38, 200)
    assert not any(ok for _, _, ok in gpu_bench.targets(results))
    assert gpu_bench.peer_dtype("bf16-mixed") == "bf16" and gpu_bench.peer_dtype("16-mixed") == "fp16"
    assert gpu_bench.peer_dtype("32-true") == "fp32"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_no_gpu_is_one_line(capsys):
    from benchmarks.__main__ import main

    assert main(["--device", "cuda"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no CUDA GPU here" in out[0]


def test_a_result_made_elsewhere_goes_into_the_readme_section(tmp_path, monkeypatch):
    """``--readme gpu.json``: the table of a run on a lent GPU, with the device named, between the gpu markers."""
    settings = dict(gpu_bench.asdict(gpu_bench.FULL), repeats=1, batch_sizes=[256])
    row = {"tokens_per_s": 4.0e5, "tokens_per_s_min": 4.0e5, "tokens_per_s_max": 4.0e5, "s_per_step": 0.082,
           "mfu": 0.41, "precision": "bf16-mixed", "peak_gpu_mb": 30000.0}
    results = {"command": "python -m benchmarks --device cuda", "date": "2026-11-27 05:00", "device": "cuda",
               "settings": settings, "machine": {"torch": "2.11.0", "lightning": "2.6.6", "transformers": "5.23.0",
                                                 "cores": 16},
               "shared": {"device_name": "NVIDIA H200", "params": 110e6, "backbone": {"vocab_size": 30522},
                          "precision": "bf16-mixed", "dtype": "bfloat16", "peak": 7.9e14, "flops_per_token": 5.3e8},
               "batches": {"256": {"ptm": {**row, "ratio": {"hf": 1.6, "bare": 1.2}},
                                   "hf": {**row, "tokens_per_s": 2.5e5, "mfu": 0.26, "ratio": {"hf": 1.0, "bare": 0.75}},
                                   "bare": {**row, "tokens_per_s": 3.3e5, "mfu": 0.34, "ratio": {"hf": 1.33,
                                                                                                   "bare": 1.0}}}}}
    readme = tmp_path / "README.md"
    readme.write_text("<!-- gpu:start -->\nNot run on a GPU yet.\n<!-- gpu:end -->\n")
    (tmp_path / "gpu.json").write_text(json.dumps(results))
    from benchmarks.__main__ import main

    assert gpu_bench.write_readme(json.loads((tmp_path / "gpu.json").read_text()), readme) == 0
    text = readme.read_text()
    assert "**NVIDIA H200**" in text and "790 TFLOP/s" in text and text.count("\n| 256 x 128 |") == 3
    assert "| ptm_app MFU >= 40% at 256 x 128 | 41.0% | yes |" in text
    assert "| ptm_app >= 1.5x the Trainer (its best flags) at 256 x 128 | 1.60x | yes |" in text
    written = []
    monkeypatch.setattr(gpu_bench, "write_readme", lambda r: written.append(r) or 0)
    assert main(["--device", "cuda", "--readme", str(tmp_path / "gpu.json")]) == 0  # no GPU needed for this
    assert written == [json.loads(json.dumps(results))]
