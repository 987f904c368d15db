"""Every strategy preset on CPU with 2 processes (gloo): fit, pause, resume exactly, export.

All runs are the same tiny BERT MLM job at fp32 with the same seed, so each strategy must log DDP's losses step
for step (only the summation order of the gradient reduction differs), also across a pause and resume.  FSDP and
DeepSpeed write sharded ``last.ckpt/`` directories, and ``export`` consolidates them into a transformers model
that must give the same outputs as the DDP run's.  Each launch costs ~10-25 s (two processes importing torch,
Lightning and transformers), so the default suite runs DDP, FSDP and ZeRO-2; the other presets are slow tests.
The ZeRO-2 run is paused by a crash instead: rank 1 dies in the middle of a save, which must leave the previous
``last.ckpt/`` loadable (sharded saves are atomic: ``strategies.AtomicShardedSave``).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import run_main
from tests.scale.conftest import launch, strategy_config, train_losses

STEPS = 8


def paused_and_resumed(config: Path, strategy: str, runs: Path) -> Path:
    """Fit to step 4 (writes last.ckpt and stops), then ``--ckpt_path last`` to step 8, in two launches."""
    base = ["fit", "--config", str(config), "--config", strategy_config(strategy), "--run_name", strategy]
    launch([*base, "--stop_at_step", "4"], runs)
    assert max(train_losses(runs / strategy)) == 3  # it really paused
    launch([*base, "--ckpt_path", "last"], runs)
    return runs / strategy


def crashed_and_resumed(config: Path, strategy: str, runs: Path) -> tuple[Path, dict]:
    """Fit with ``last.ckpt`` every 2 steps until rank 1 dies having written its shards of the step-6 save
    (``probe.CrashInSave``), then ``--ckpt_path last`` to step 8.  Also returns what the crash left on disk."""
    from ptm_app.checkpoint_io.reading import read_checkpoint

    base = ["fit", "--config", str(config), "--config", strategy_config(strategy), "--run_name", strategy]
    launch([*base, "--checkpoint_every", "2", "--trainer.callbacks+=tests.scale.probe.CrashInSave",
            "--trainer.callbacks.step", "6"], runs, fails=True)
    ckpts = runs / strategy / "checkpoints"
    crash = {"uncommitted": sorted(p.name for p in (ckpts / ".last.ckpt.tmp-6").rglob("*")),
             "last_step": read_checkpoint(ckpts / "last.ckpt")["global_step"]}
    launch([*base, "--ckpt_path", "last"], runs)
    crash["left_over"] = sorted(p.name for p in ckpts.iterdir())
    return runs / strategy, crash


@pytest.fixture(scope="module")
def sharded_runs(mlm_config, tmp_path_factory) -> dict[str, Path]:
    runs = tmp_path_factory.mktemp("sharded_runs")
    deepspeed, crash = crashed_and_resumed(mlm_config, "deepspeed_stage_2", runs)
    return {"fsdp": paused_and_resumed(mlm_config, "fsdp", runs), "deepspeed_stage_2": deepspeed, "crash": crash}


def test_a_crash_mid_save_leaves_the_previous_sharded_checkpoint(sharded_runs):
    crash = sharded_runs["crash"]
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in crash["uncommitted"]  # rank 1's part of step 6 ...
    assert crash["last_step"] == 4  # ... is not in last.ckpt, which is still the complete step-4 save
    # the resumed run's saves cleaned the temp dir; the save before the newest is kept as last-1.ckpt
    assert crash["left_over"] == ["best.ckpt", "last-1.ckpt", "last.ckpt"]


def assert_same_losses(run: Path, reference: Path) -> None:
    ours, theirs = train_losses(run), train_losses(reference)
    assert sorted(ours) == list(range(STEPS)) and sorted(theirs) == list(range(STEPS))
    assert theirs[STEPS - 1] < theirs[0] - 0.1  # it learns
    for step in range(STEPS):
        assert ours[step] == pytest.approx(theirs[step], abs=1e-5), (run.name, step)


def exported_logits(run: Path, out: Path) -> torch.Tensor:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    assert run_main(["export", "--ckpt_path", str(run), "--output_dir", str(out)], run.parent) == 0
    model = AutoModelForMaskedLM.from_pretrained(out).eval()
    batch = AutoTokenizer.from_pretrained(out)(["the cat sat on the mat", "markets rose"], padding=True,
                                              return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2"])
def test_sharded_run_resumes_to_ddp_losses(strategy, sharded_runs, ddp_reference):
    run = sharded_runs[strategy]
    assert_same_losses(run, ddp_reference)
    last = run / "checkpoints" / "last.ckpt"
    assert last.is_dir()  # a sharded checkpoint, written by both ranks
    shards = list(last.glob("*.distcp")) if strategy == "fsdp" else list(last.glob("checkpoint/zero_pp_rank_*"))
    assert len(shards) == 2


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2"])
def test_sharded_checkpoint_exports_the_trained_model(strategy, sharded_runs, ddp_reference, tmp_path):
    import json

    ours = exported_logits(sharded_runs[strategy], tmp_path / strategy)
    reference = exported_logits(ddp_reference, tmp_path / "ddp")  # DDP's file checkpoint: tests/cli/test_resume_export
    assert ours.shape == reference.shape
    assert torch.allclose(ours, reference, atol=1e-4)
    assert not torch.allclose(ours, torch.zeros_like(ours))
    assert json.loads((tmp_path / strategy / "ptm_app_export.json").read_text())["global_step"] == STEPS


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp_hybrid", "deepspeed_stage_1", "deepspeed_stage_3"])
def test_other_presets_give_ddp_losses_and_export(strategy, mlm_config, ddp_reference, tmp_path):
    run = paused_and_resumed(mlm_config, strategy, tmp_path / "runs")
    assert_same_losses(run, ddp_reference)
    assert torch.allclose(exported_logits(run, tmp_path / "export"),
                          exported_logits(ddp_reference, tmp_path / "ddp_export"), atol=1e-4)


@pytest.mark.slow
def test_zero3_offload_runs_on_cpu_and_resumes_exactly(mlm_config, ddp_reference, tmp_path):
    """ZeRO-3 with optimizer states and parameters offloaded to host memory (``deepspeed_stage_3_offload``).

    The offloaded fp32 partitions are stepped by our torch AdamW (``zero_force_ds_cpu_optimizer: false``), the
    same arithmetic as every other strategy, so the losses match DDP's at the 1e-5 of the other presets (seen:
    at most 5e-7, the reduction order); DeepSpeedCPUAdam would differ by ~2e-6 per weight after 8 steps.  A
    pause and resume must give the uninterrupted offload run's losses exactly."""
    import json

    runs = tmp_path / "runs"
    base = ["fit", "--config", str(mlm_config), "--config", strategy_config("deepspeed_stage_3_offload")]
    launch([*base, "--run_name", "whole", "--trainer.callbacks+=tests.scale.probe.ZeROProbe",
            "--trainer.callbacks.directory", str(runs / "whole")], runs)
    assert json.loads((runs / "whole" / "zero.json").read_text()) == {
        "zero": "DeepSpeedZeroOptimizer_Stage3", "offload_optimizer": True, "offload_param": True,
        "optimizer": "AdamW"}
    paused = paused_and_resumed(mlm_config, "deepspeed_stage_3_offload", runs)
    assert train_losses(paused) == train_losses(runs / "whole")  # exact resume
    assert_same_losses(paused, ddp_reference)
    assert torch.allclose(exported_logits(paused, tmp_path / "export"),
                          exported_logits(ddp_reference, tmp_path / "ddp_export"), atol=1e-4)
