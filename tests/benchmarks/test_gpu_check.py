"""``make gpu-check`` (benchmarks/gpu_check.py) on the CPU: one line per check with its precision, a failure as one
FAIL line with its reason and a non-zero exit, and one line (nothing run) when a GPU is asked for and absent."""
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[2]


def run(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path / "out"), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # ~45 s: a pre-training, export, fine-tuning and predict (the failure test runs one check quickly)
def test_the_chain_on_the_cpu_is_one_ok_line_with_the_precision_chosen(tmp_path):
    """The chain: pre-training recipe (bert_mlm_bbc) -> export -> fine-tune -> predict --text, one step each (four
    processes, about 40 s on 2 quiet cores); the failing test below runs a pre-training recipe alone."""
    out = run(["--accelerator", "cpu", "--only", "chain", "--steps", "1"], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("gpu-check: 1 checks, accelerator cpu, precision auto, 1 steps each")
    row = lines[1].split()  # name, ok, seconds, "s", "precision", what auto chose
    assert row[:2] == ["chain", "ok"] and float(row[2]) > 0 and row[3:5] == ["s", "precision"]
    assert row[5] in ("bf16-mixed", "32-true") and len(row) == 6
    assert lines[2] == f"gpu-check: 1 of 1 ok, 0 failed; precision chosen: {row[5]}; " + lines[2].rsplit("; ", 1)[1]
    assert len(lines) == 3
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    chain = report["results"][0]
    assert chain["ok"] and chain["precision"] == row[5]
    assert [c.split()[2] for c in chain["commands"]] == ["fit", "export", "fit", "predict"]
    log = Path(chain["log"]).read_text()
    prediction = json.loads(next(line for line in log.splitlines() if line.startswith('{"text"')))
    assert prediction["label"] in {"business", "entertainment", "politics", "sports", "tech"}
    assert not (tmp_path / "out" / "runs").exists()  # the runs went to a temporary directory, removed


def test_a_failing_recipe_is_one_fail_line_with_its_reason_and_a_nonzero_exit(tmp_path):
    out = run(["--accelerator", "cpu", "--precision", "16-mixed", "--only", "pretrain/unilm_unified_mlm_brown"], tmp_path)
    assert out.returncode == 1
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3 and "Traceback" not in out.stdout
    name, status, *_ = lines[1].split()
    assert (name, status) == ("pretrain/unilm_unified_mlm_brown", "FAIL")
    reason = lines[1].split("precision ?  ", 1)[1]
    assert reason.startswith("error: ") and "16" in reason and re.search(r"\(exit [12], fit\)$", reason)
    assert lines[2].startswith("gpu-check: 0 of 1 ok, 1 failed (pretrain/unilm_unified_mlm_brown)")
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["results"][0]["reason"] == reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_no_gpu_is_one_line_and_nothing_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "run_check", lambda *a: pytest.fail("a check ran"))
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("gpu-check: no CUDA GPU here")


def test_checks_cover_every_recipe_strategy_and_memory_overlay(capsys):
    assert gpu_check.main(["--list"]) == 0
    names = capsys.readouterr().out.split()
    configs = ROOT / "configs"
    expected = [f"{kind}/{p.stem}" for kind in ("pretrain", "strategy", "memory")
                for p in sorted((configs / kind).glob("*.yaml"))] + ["chain"]
    assert names == expected and "memory/compile" in names and len(names) > 20
    with pytest.raises(SystemExit, match="--only pretrain/nope matches no check"):
        gpu_check.main(["--list", "--only", "pretrain/nope"])


def test_the_reason_is_the_error_line_or_the_exception_line():
    assert gpu_check.error_line("run directory: x\nerror: data source 'y' not found; fix it\n") == \
        "error: data source 'y' not found; fix it"
    traceback = ("Traceback (most recent call last):\n  File \"a.py\", line 1\n"
                 "RuntimeError: Expected a 'cuda' device type for generator but found 'cpu'\n")
    assert gpu_check.error_line(traceback) == "RuntimeError: Expected a 'cuda' device type for generator but found 'cpu'"
    assert gpu_check.failure("x\nlast words\n", -9, "fit").startswith("killed by SIGKILL (out of memory?) during fit")
    assert gpu_check.failure("", 2, "export") == "no output (exit 2, export)"


def test_a_report_made_elsewhere_goes_into_the_readme_section(tmp_path):
    """A report from a lent GPU machine (gpu_check.json) becomes the gpu-check section: the device and one row each."""
    report = {"date": "2026-11-27 05:00", "device": "NVIDIA H200", "torch": "2.11.0+cu130", "accelerator": "gpu",
              "precision": "auto", "steps": 3, "summary": "gpu-check: 1 of 3 ok, 1 failed (pretrain/electra_rtd_brown), 1 skipped",
              "results": [
                  {"name": "pretrain/bert_mlm_nsp_brown", "ok": True, "seconds": 12.5, "precision": "bf16-mixed"},
                  {"name": "pretrain/electra_rtd_brown", "ok": False, "seconds": 9.0, "precision": "bf16-mixed",
                   "reason": "RuntimeError: Expected a 'cuda' device type for generator but found 'cpu' (exit 1, fit)"},
                  {"name": "strategy/deepspeed_stage_1", "ok": True, "seconds": 0.0, "skipped": True,
                   "reason": "deepspeed is not installed"}]}
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- gpu-check:start -->\nNot run on a GPU yet.\n<!-- gpu-check:end -->\ntail\n")
    gpu_check.write_readme(report, readme)
    text = readme.read_text()
    assert "**NVIDIA H200**" in text and "1 of 3 ok, 1 failed (pretrain/electra_rtd_brown), 1 skipped." in text
    assert "| pretrain/bert_mlm_nsp_brown | ok | 12.5 | bf16-mixed |  |" in text
    assert "| pretrain/electra_rtd_brown | FAIL | 9.0 | bf16-mixed | RuntimeError: Expected a 'cuda' device type" in text
    assert "| strategy/deepspeed_stage_1 | skip | 0.0 | - | deepspeed is not installed |" in text
    assert "Not run on a GPU yet" not in text and text.endswith("<!-- gpu-check:end -->\ntail\n")
    (tmp_path / "plain.md").write_text("no markers\n")
    with pytest.raises(SystemExit, match="has no <!-- gpu-check:start -->"):
        gpu_check.write_readme(report, tmp_path / "plain.md")


def test_a_check_whose_extra_is_missing_is_skipped_not_failed(tmp_path):
    check = gpu_check.Check("strategy/imaginary", [["fit", "--never-run"]], needs="ptm_app_no_such_extra")
    result = gpu_check.run_check(check, tmp_path, tmp_path, {}, 10)
    assert result.skipped and result.ok and result.status == "skip" and not result.commands
    assert "ptm_app_no_such_extra is not installed" in result.line()
    deepspeed = [c for c in gpu_check.all_checks(gpu_check_args()) if c.needs]
    assert {c.name for c in deepspeed} == {f"strategy/{p.stem}" for p in (ROOT / "configs" / "strategy").glob("deep*")}


def gpu_check_args(**kw):
    from types import SimpleNamespace

    return SimpleNamespace(**{"accelerator": "gpu", "precision": "auto", "steps": 3, **kw})


def test_sigterm_ends_the_running_command_and_reports_it_stopped(tmp_path):
    """``timeout`` around gpu-check (the device script) must not leave a training run behind on the GPU."""
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_check", "--accelerator", "cpu", "--only",
                             "pretrain/unilm_unified_mlm_brown", "pretrain/xlm_tlm_bible", "--out", str(tmp_path / "out")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    log = tmp_path / "out" / "logs" / "pretrain_unilm_unified_mlm_brown.log"
    deadline = time.time() + 120
    while not (log.exists() and log.read_text().startswith("$ python main.py fit")) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    children = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                   text=True).stdout.split()]
    assert children  # the fit is running
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    lines = out.strip().splitlines()
    assert [line.split()[:2] for line in lines[1:3]] == [["pretrain/unilm_unified_mlm_brown", "FAIL"], ["pretrain/xlm_tlm_bible", "FAIL"]]
    assert lines[1].endswith("stopped (gpu-check was cut short) during fit")
    assert lines[2].endswith("stopped (gpu-check was cut short)") and "STOPPED by a signal" in lines[3]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert [r["reason"].split(" (")[0] for r in report["results"]] == ["stopped", "stopped"]
    for pid in children:  # gone, not left running in its own process group
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
