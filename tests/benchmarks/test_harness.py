"""The benchmark harness: its arithmetic on made-up step records (fast), and a smoke run of every part (slow).

No speed targets here: the harness reports whether they are met, the tests only check it measures."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.clock import StepClock, peak_rss_mb, steady_state
from benchmarks.harness import FINETUNE, PRETRAIN, markdown, summarise, targets

ROOT = Path(__file__).resolve().parents[2]


def record(ends, tokens=100, samples=4, **extra):
    return {"ends": ends, "tokens": [tokens] * len(ends), "padded": [4 * tokens // 3] * len(ends),
            "samples": [samples] * len(ends), "s_per_step": 1.0, "peak_rss_mb": 500.0, **extra}


def test_steady_state_leaves_out_the_warm_up_steps():
    rate = steady_state(record([0.0, 5.0, 6.0, 7.0, 11.0]), warmup=2)  # steps 3-5 take 1, 1 and 4 s
    assert rate["steps"] == 3 and rate["seconds"] == pytest.approx(6.0)
    assert rate["s_per_step"] == pytest.approx(1.0)  # the median step: one slow step does not move it
    assert rate["tokens_per_s"] == pytest.approx(100.0) and rate["samples_per_s"] == pytest.approx(4.0)
    assert rate["tokens_per_s_mean"] == pytest.approx(50.0) and rate["samples_per_s_mean"] == pytest.approx(2.0)
    assert rate["padding_fraction"] == pytest.approx(1 - 100 / 133)
    with pytest.raises(ValueError):
        steady_state(record([0.0, 1.0]), warmup=2)


def test_step_clock_records_ticks_marks_and_its_own_peak_rss(tmp_path):
    clock = StepClock()
    clock.mark("fit_start")
    clock.mark("fit_start")  # the first mark wins
    for _ in range(3):
        clock.tick(4, torch.tensor(120), 128)  # a tensor count (a GPU batch's mask.sum()) is read back at the end
    clock.write(tmp_path / "r.json")
    out = json.loads((tmp_path / "r.json").read_text())
    assert len(out["ends"]) == 3 and out["tokens"] == [120] * 3 and set(out["marks"]) == {"fit_start", "first_step_end"}
    assert out["timed_on"] == "host clock" and out["ends"] == sorted(out["ends"])
    assert out["peak_rss_mb"] == pytest.approx(peak_rss_mb(), rel=0.5) and out["peak_rss_mb"] > 10


def test_summary_ratios_and_targets():
    def rows(rate, **extra):
        return [{"tokens_per_s": rate * f, "s_per_step": 1 / f, "peak_rss_mb": 100.0, "mfu": 0.1, **extra}
                for f in (0.9, 1.0, 1.2)]

    pre = summarise({"a": rows(96), "b": rows(300), "c32": rows(90), "c16": rows(150), "d": rows(100)},
                    "tokens_per_s", ("c32", "c16", "d"))
    assert pre["a"]["tokens_per_s"] == pytest.approx(96) and pre["a"]["tokens_per_s_max"] == pytest.approx(115.2)
    assert pre["a"]["ratio"]["d"] == pytest.approx(0.96) and pre["b"]["ratio"]["c16"] == pytest.approx(2.0)
    ft = summarise({"ptm": [{"samples_per_s": 10.0, "s_per_step": 1.0, "peak_rss_mb": 1.0, "val_acc": 0.70}],
                    "hf": [{"samples_per_s": 10.0, "s_per_step": 1.0, "peak_rss_mb": 1.0, "val_acc": 0.72}]},
                   "samples_per_s", ("hf",))
    resume = {"10": {"start_to_first_step_s": 9.0}, "1000": {"start_to_first_step_s": 9.5}}
    met = {name: ok for name, _, ok in targets({"pretrain": pre, "finetune": ft, "resume": resume})}
    assert met["(a) within 5% of (d)"] and met["(a) >= (c) fp32"] and met["(b) >= 1.5x (c) bf16"]
    label = FINETUNE["ptm"][0]
    assert not met[f"fine-tuning >= 1.2x Trainer: {label}"]
    assert not met[f"no loss in accuracy (within 1 point): {label}"]
    assert any(name.startswith("resume cost flat") and ok for name, ok in met.items())


@pytest.mark.slow
def test_smoke_run_measures_every_candidate(tmp_path):
    """``python -m benchmarks --smoke``: every row of every part, with positive numbers (about 3 minutes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--quiet", "--work", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["pretrain"]) == set(PRETRAIN) and set(results["finetune"]) == set(FINETUNE)
    for row in results["pretrain"].values():
        assert row["tokens_per_s"] > 0 and row["mfu"] > 0 and row["peak_rss_mb"] > 0 and row["s_per_step"] > 0
    for row in results["finetune"].values():
        assert row["samples_per_s"] > 0 and row["peak_rss_mb"] > 0 and 0 <= row["val_acc"] <= 1
        assert 0 <= row["padding_fraction"] < 1
    assert len(results["resume"]) == 2
    for row in results["resume"].values():
        assert 0 < row["main_to_first_step_s"] < row["start_to_first_step_s"]
    table = (tmp_path / "results.md").read_text()
    pretraining = table.split("### Fine-tuning")[0]  # one row per candidate; the targets below also cite "(a)"
    assert pretraining.count("\n| (") == len(PRETRAIN) and "### Targets" in table
    assert markdown(results).count("\n|") > 10
