"""Multi-process runs of ``main.py``: each launch is a subprocess (Lightning re-runs the script per rank)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cli.test_resume_export import train_losses  # noqa: F401  (shared by the scale tests)
from tests.conftest import TINY_BERT, tiny_mlm_config

ROOT = Path(__file__).resolve().parents[2]
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def launch(args: list[str], runs: Path, env: dict | None = None, timeout: int = 600,
           fails: bool = False, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python main.py ARGS`` in a fresh process (working directory ``cwd``) with its run directory root at
    ``runs``; it must succeed (or, with ``fails``, exit with an error)."""
    env = {**os.environ, "PTM_RUNS_DIR": str(runs), "PYTHONPATH": str(ROOT), **(env or {})}
    out = subprocess.run([sys.executable, str(ROOT / "main.py"), *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert (out.returncode != 0) == fails, f"main.py {' '.join(args)} exited {out.returncode}:\n{out.stderr[-3000:]}"
    return out


def strategy_config(name: str) -> str:
    return str(ROOT / "configs" / "strategy" / f"{name}.yaml")


@pytest.fixture(scope="session")
def mlm_config(tiny_corpus, tmp_path_factory) -> Path:
    """The tiny BERT MLM run (8 steps, batch 4 per rank) without dropout: every strategy must give DDP's losses."""
    tmp = tmp_path_factory.mktemp("scale_cfg")
    path = tiny_mlm_config(tiny_corpus, tmp, max_steps=8)
    cfg = yaml.safe_load(path.read_text())
    cfg["model"]["init_args"]["backbone_config"] = {**copy.deepcopy(TINY_BERT), **NO_DROPOUT}
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="session")
def ddp_reference(mlm_config, tmp_path_factory) -> Path:
    """One uninterrupted DDP run: the reference every other strategy is compared with.  Each rank also writes
    its throughput monitor's last window to ``<run>/throughput/`` (``probe.ThroughputProbe``)."""
    runs = tmp_path_factory.mktemp("ddp_runs")
    launch(["fit", "--config", str(mlm_config), "--config", strategy_config("ddp"), "--run_name", "ddp",
            "--trainer.callbacks+=tests.scale.probe.ThroughputProbe",
            "--trainer.callbacks.directory", str(runs / "ddp" / "throughput")], runs)
    return runs / "ddp"
