"""Child process for the ptm_app candidates: a ``fit`` through ptm_app's own CLI, as a user runs it, with a step clock.

``python -m benchmarks.ptm_runs SPEC.json``: the spec holds the run's config (a dict, written out as YAML),
extra command-line arguments, the run name and where to write the clock's record.  Nothing else differs from
``python main.py fit --config ...``: ptm_app's own callbacks (throughput monitor, last checkpoint, loggers ...)
all run.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import Callback

from benchmarks.clock import StepClock

MAIN_START = [0.0]  # wall time at which main() began: after Python, Lightning and the harness were imported


class ClockCallback(Callback):
    """Feeds a ``StepClock``: one tick per training batch end, marks at fit start and the first batch start."""

    def __init__(self, path: str):
        self.path = path
        self.clock = StepClock()

    def on_fit_start(self, trainer, pl_module) -> None:
        self.clock.cuda = pl_module.device.type == "cuda"  # GPU: event-timed steps, counts read back at the end
        self.clock.marks["main"] = MAIN_START[0]
        self.clock.mark("fit_start")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if "first_step_start" not in self.clock.marks:
            self.clock.mark("first_step_start")
            self.clock.extra["first_global_step"] = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        self.clock.tick(ids.shape[0], mask.sum() if mask is not None else ids.numel(), ids.numel())

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.clock.extra["val"] = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}

    def on_fit_end(self, trainer, pl_module) -> None:
        backbone = pl_module.backbone
        self.clock.extra.update(precision=str(trainer.precision), global_step=trainer.global_step,
                                epoch_batches=trainer.num_training_batches,
                                model=type(backbone).__name__, params=sum(p.numel() for p in backbone.parameters()),
                                attn=backbone.config._attn_implementation)
        self.clock.write(self.path)


def main(spec_path: str) -> int:
    MAIN_START[0] = time.time()
    spec = json.loads(Path(spec_path).read_text())
    config = spec["config"]
    trainer = config.setdefault("trainer", {})
    trainer["callbacks"] = [*(trainer.get("callbacks") or []),  # the run's own (TorchCompile ...), then the clock
                            {"class_path": "benchmarks.ptm_runs.ClockCallback", "init_args": {"path": spec["out"]}}]
    config_path = Path(spec["out"]).with_suffix(".yaml")
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    from ptm_app.main import main as ptm_main

    return ptm_main(["fit", "--config", str(config_path), "--run_name", spec["run_name"], *spec.get("args", [])])


if __name__ == "__main__":
    from benchmarks.ptm_runs import main as run  # the module the config's class_path names, not __main__

    sys.exit(run(sys.argv[1]))
