"""``PtmTrainer``: Lightning's ``Trainer`` that connects data and model before every run; precision and accelerator
default to ``auto``."""
from __future__ import annotations

from typing import Literal, Optional, Union

from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT
from lightning.pytorch import LightningDataModule, Trainer
from lightning.pytorch.accelerators import Accelerator, CUDAAccelerator

from ptm_app.data.contract import connect
from ptm_app.training.precision import check_hardware, choose_precision, warn_emulated_bf16
from ptm_app.training.throughput import TrainingFlops


class PtmTrainer(Trainer):
    """Lightning's ``Trainer``, plus:

    - ``precision: auto`` and ``accelerator: auto`` (the defaults): a GPU when one is present, and the fastest
      precision the hardware runs natively (``training.precision``); ``precision_reason`` says why, and what the
      hardware cannot run (fp16 on a CPU, a GPU or devices that are not there) is one line;
    - ``fit`` / ``validate`` / ``test`` / ``predict`` first ``connect`` the module and the DataModule
      (``data.contract``): the data's facts to the module, the module's collators to the data;
    - ``max_flops``: stop at the first optimizer step at or past this many training FLOPs (``TrainingFlops``, which
      every run carries as ``training_flops``: its totals go to ``summary.json``).  The LR schedule still spans
      ``max_steps``: set both, or a ``constant`` schedule.
    """

    def __init__(self, *args, precision: Optional[Union[_PRECISION_INPUT, Literal["auto"]]] = "auto",
                 accelerator: Union[str, Accelerator] = "auto", max_flops: Optional[float] = None, **kwargs):
        name = accelerator if isinstance(accelerator, str) else ("gpu" if isinstance(accelerator, CUDAAccelerator)
                                                                 else "cpu")
        check_hardware(name, kwargs.get("devices", "auto"), precision)
        if precision in ("auto", None):
            choice = choose_precision(name)
            precision, self.precision_reason = choice.value, choice.reason
        else:
            self.precision_reason = "set by the config"
            warn_emulated_bf16(name, precision)
        self.training_flops = TrainingFlops(max_flops)
        given = kwargs.get("callbacks") or []  # (set in kwargs: jsonargparse reads this signature through the call)
        kwargs["callbacks"] = [self.training_flops, *(given if isinstance(given, list) else [given])]
        super().__init__(*args, precision=precision, accelerator=accelerator, **kwargs)

    def fit(self, model, train_dataloaders=None, val_dataloaders=None, datamodule=None, **kwargs):
        connect(model, _datamodule(datamodule, train_dataloaders))
        return super().fit(model, train_dataloaders, val_dataloaders, datamodule, **kwargs)

    def validate(self, model=None, dataloaders=None, ckpt_path=None, verbose=True, datamodule=None, **kwargs):
        connect(model, _datamodule(datamodule, dataloaders))
        return super().validate(model, dataloaders, ckpt_path, verbose, datamodule, **kwargs)

    def test(self, model=None, dataloaders=None, ckpt_path=None, verbose=True, datamodule=None, **kwargs):
        connect(model, _datamodule(datamodule, dataloaders))
        return super().test(model, dataloaders, ckpt_path, verbose, datamodule, **kwargs)

    def predict(self, model=None, dataloaders=None, datamodule=None, return_predictions=None, ckpt_path=None,
                **kwargs):
        connect(model, _datamodule(datamodule, dataloaders))
        return super().predict(model, dataloaders, datamodule, return_predictions, ckpt_path, **kwargs)


def _datamodule(datamodule, dataloaders) -> Optional[LightningDataModule]:
    """The DataModule of a run: Lightning also takes one in the dataloaders' place."""
    return datamodule if datamodule is not None else (dataloaders if isinstance(dataloaders, LightningDataModule)
                                                      else None)
