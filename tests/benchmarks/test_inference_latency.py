"""The inference latency benchmark: one tiny run of it (slow: it exports MiniLM to ONNX)."""
import json

import pytest


@pytest.mark.slow
def test_inference_latency_times_every_candidate_at_every_batch_size(tmp_path):
    from benchmarks.inference_latency import CANDIDATES, main

    assert main(["--repeats", "2", "--warmup", "0", "--batch_sizes", "1", "4", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "inference.json").read_text())
    rows = {(r["candidate"], r["batch"]): r for r in result["rows"]}
    assert set(rows) == {(c, b) for c in CANDIDATES for b in (1, 4)}
    for (name, batch), row in rows.items():
        assert row["median_ms"] > 0 and row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        base = rows[("PyTorch fp32", batch)]["median_ms"]
        assert row["x_fp32"] == pytest.approx(base / row["median_ms"])
    assert rows[("PyTorch fp32", 4)]["max_abs_diff"] == 0.0
    assert rows[("ONNX Runtime fp32", 4)]["max_abs_diff"] <= result["onnx"]["check"]["tolerance_abs"]
    assert rows[("PyTorch bf16", 4)]["max_abs_diff"] > rows[("ONNX Runtime fp32", 4)]["max_abs_diff"]
    assert "| ONNX Runtime fp32 | 4 |" in (tmp_path / "inference.md").read_text()
