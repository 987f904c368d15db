"""Under DDP the throughput monitor logs global numbers: the ranks' counts summed (one all_reduce per logging
step), over their mean window time; MFU per device.  Checked on the shared DDP reference run (2 ranks, batches of
up to 4 blocks of 32 tokens each, a logging window per step), whose ranks each dump their own last window
(``probe.ThroughputProbe``)."""
from __future__ import annotations

import csv
import json

import pytest


def test_ddp_logs_tokens_and_samples_per_second_summed_over_ranks(ddp_reference):
    probes = [json.loads((ddp_reference / "throughput" / f"throughput{r}.json").read_text()) for r in (0, 1)]
    assert [(p["world_size"], p["step"]) for p in probes] == [(2, 8), (2, 8)]
    windows = [p["window"] for p in probes]
    assert all(0 < w["samples"] <= 4 and w["padded_tokens"] == 32 * w["samples"] for w in windows)  # its own batch
    seconds = (windows[0]["seconds"] + windows[1]["seconds"]) / 2
    samples, tokens, padded = (windows[0][k] + windows[1][k] for k in ("samples", "tokens", "padded_tokens"))
    rows = [r for r in csv.DictReader(open(ddp_reference / "logs" / "metrics.csv")) if r.get("throughput/samples_per_s")]
    logged = {k: float(v) for k, v in max(rows, key=lambda r: int(r["step"])).items() if k.startswith(("throughput", "train/p"))}
    assert logged["throughput/samples_per_s"] == pytest.approx(samples / seconds, rel=1e-6)
    assert logged["throughput/padded_tokens_per_s"] == pytest.approx(padded / seconds, rel=1e-6)
    assert logged["throughput/tokens_per_s"] == pytest.approx(tokens / seconds, rel=1e-6)
    assert logged["train/padding_fraction"] == pytest.approx(1 - tokens / padded, abs=1e-6)
    # the sum of the ranks' own rates: they step in lockstep (the gradient all-reduce), so their windows agree
    per_rank = [w["tokens"] / w["seconds"] for w in windows]
    assert logged["throughput/tokens_per_s"] == pytest.approx(sum(per_rank), rel=0.3)
    # MFU per device: the global model FLOP/s over two devices' peak (measured on rank 0)
    flops = windows[0]["flops"] + windows[1]["flops"]
    assert logged["throughput/mfu"] == pytest.approx(flops / seconds / 2 / probes[0]["peak"], rel=1e-5)
    assert 0 < logged["throughput/mfu"] < 1
    same = ("throughput/samples_per_s", "throughput/tokens_per_s", "train/padding_fraction")
    assert [probes[1]["metrics"][k] for k in same] == [probes[0]["metrics"][k] for k in same]  # every rank: global
