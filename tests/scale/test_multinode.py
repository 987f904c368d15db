"""A 2-"node" DDP job on one machine, launched the way torchrun or SLURM would launch it on two hosts.

Each node is one ``main.py fit`` process with ``--trainer.num_nodes 2 --trainer.devices 1`` and the cluster
variables (MASTER_ADDR, MASTER_PORT, NODE_RANK, WORLD_SIZE, LOCAL_RANK): Lightning's ``LightningEnvironment``
sees LOCAL_RANK, so it joins the process group instead of spawning.  Observed per rank (``probe.ShardProbe``):
the dataset indices each rank trained on, which must be disjoint halves of the training set; and
``probe.CountingPretrainData`` leaves a marker whenever ``prepare_data`` (tokenization) runs: only node 0's.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.scale.conftest import ROOT


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("streaming", [pytest.param(False, marks=pytest.mark.slow), True])  # in-memory: make test-slow  # in memory; litdata chunks (data.litcorpus)
def test_two_nodes_see_disjoint_shards_and_tokenize_once(mlm_config, tmp_path, streaming):
    probe, markers = tmp_path / "probe", tmp_path / "markers"
    args = [sys.executable, "main.py", "fit", "--config", str(mlm_config), "--run_name", "two_nodes",
            "--data.init_args.streaming", str(streaming).lower(), "--data.init_args.prepare_workers", "1",
            "--trainer.strategy", "ddp", "--trainer.num_nodes", "2", "--trainer.devices", "1",
            "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
            "--data.class_path", "tests.scale.probe.CountingPretrainData",
            "--data.init_args.marker_dir", str(markers),
            "--trainer.callbacks+=tests.scale.probe.ShardProbe", "--trainer.callbacks.directory", str(probe)]
    port = str(free_port())
    procs = []
    for node in (0, 1):
        env = {**os.environ, "PTM_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NODE_RANK": str(node), "WORLD_SIZE": "2",
               "LOCAL_RANK": "0", "PTM_CACHE_DIR": str(tmp_path / "shared_cache")}  # a fresh cache: real tokenizing
        procs.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = [p.communicate(timeout=600) for p in procs]
    for proc, (_, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-3000:]

    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["node_rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    seen = [set(r["seen"]) for r in ranks]
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) == 3 * 4  # 3 steps of batch 4 on each rank
    assert not seen[0] & seen[1]  # disjoint shards
    size = ranks[0]["train_size"]
    assert size >= 24 and len(seen[0] | seen[1]) == 24 and seen[0] | seen[1] <= set(range(size))
    assert sorted(p.name for p in markers.iterdir()) == ["prepare_data.node0"]  # tokenized once, on global rank 0
