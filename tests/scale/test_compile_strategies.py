"""TorchCompile under DDP and FSDP2 on CPU (2 processes, gloo): the compiled blocks give DDP's eager losses.

Slow: each rank compiles its blocks cold (~1-2 min on 2 shared cores)."""
from __future__ import annotations

import pytest

from tests.scale.conftest import ROOT, launch, strategy_config, train_losses

COMPILE = str(ROOT / "configs" / "memory" / "compile.yaml")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_compiled_blocks_give_the_eager_ddp_losses(strategy, mlm_config, ddp_reference, tmp_path):
    runs = tmp_path / "runs"
    launch(["fit", "--config", str(mlm_config), "--config", strategy_config(strategy), "--config", COMPILE,
            "--run_name", strategy, "--trainer.callbacks.init_args.cache_dir", str(tmp_path / "inductor")], runs,
           timeout=900)
    ours, eager = train_losses(runs / strategy), train_losses(ddp_reference)
    assert sorted(ours) == sorted(eager) == list(range(8))
    for step, loss in eager.items():
        assert ours[step] == pytest.approx(loss, rel=1e-4), (strategy, step)
    assert [p for p in (tmp_path / "inductor" / "fxgraph").rglob("*") if p.is_file()]  # it compiled, into cache_dir
