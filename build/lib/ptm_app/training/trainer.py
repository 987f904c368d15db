"""``PtmTrainer``: Lightning's ``Trainer`` that connects data and model before every run and takes ``precision: auto``."""
from __future__ import annotations

from typing import Literal, Optional, Union

from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT
from lightning.pytorch import LightningDataModule, Trainer

from ptm_app.data.contract import connect
from ptm_app.training.precision import auto_precision


class PtmTrainer(Trainer):
    """Lightning's ``Trainer``, plus:

    - ``precision: auto``: the fastest precision the hardware runs natively (``training.precision``);
    - ``fit`` / ``validate`` / ``test`` / ``predict`` first ``connect`` the module and the DataModule
      (``data.contract``): the data's facts to the module, the module's collators to the data.
    """

    def __init__(self, *args, precision: Optional[Union[_PRECISION_INPUT, Literal["auto"]]] = None, **kwargs):
        if precision == "auto":
            precision = auto_precision(kwargs.get("accelerator"))
        super().__init__(*args, precision=precision, **kwargs)

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
