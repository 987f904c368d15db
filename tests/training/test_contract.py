"""Data and model meet through one explicit contract (``data.contract.connect``), not through the trainer."""
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest

from ptm_app.data.contract import DataFacts, connect
from ptm_app.training.trainer import PtmTrainer
from tests.conftest import TINY_BERT

PKG = Path(__file__).resolve().parents[2] / "ptm_app"
pytestmark = pytest.mark.usefixtures("one_thread")


def _sources(*folders: str):
    for folder in folders:
        yield from (PKG / folder).rglob("*.py")


def test_modules_never_reach_the_data_through_the_trainer_nor_the_data_the_module():
    reaching = [f"{p.relative_to(PKG)}:{i}" for p in _sources("objectives", "adaptation", "tasks")
                for i, line in enumerate(p.read_text().splitlines(), 1)
                if re.search(r"trainer\.datamodule|_datamodule\(", line)]
    back = [f"{p.relative_to(PKG)}:{i}" for p in _sources("data")
            for i, line in enumerate(p.read_text().splitlines(), 1) if "lightning_module" in line]
    assert reaching == [] and back == []


def _pair(tiny_corpus):
    from ptm_app.adaptation import SequenceClassificationModule
    from ptm_app.data.datamodules import TaskDataModule
    from ptm_app.data.tokenizer import TokenizerSpec

    data = TaskDataModule(source=str(tiny_corpus), batch_size=8, max_length=32,
                          tokenizer=TokenizerSpec(train="wordpiece", vocab_size=100, min_frequency=1))
    return SequenceClassificationModule(backbone_config=TINY_BERT), data


def _trainer(cls):
    return cls(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, limit_val_batches=1)


def test_ptm_trainer_connects_facts_and_hooks_before_the_run(tiny_corpus):
    model, data = _pair(tiny_corpus)
    assert model.backbone is None and model.data_facts is None  # nothing known before the run: no labels yet
    _trainer(PtmTrainer).fit(model, datamodule=data)
    assert isinstance(model.data_facts, DataFacts)
    assert model.hparams.labels == data.label_set() == ["neg", "pos"]  # the label set came from the data's facts
    assert model.backbone.config.num_labels == 2 and model.tokenizer is data.tokenizer  # one tokenizer, built once
    assert data.model_hooks.collator == model.make_collator  # the module's collator went to the data
    assert model.trainer.global_step == 2


def test_a_plain_lightning_trainer_works_after_an_explicit_connect(tiny_corpus):
    model, data = _pair(tiny_corpus)
    connect(model, data)
    _trainer(pl.Trainer).fit(model, datamodule=data)
    assert model.hparams.labels == ["neg", "pos"] and model.trainer.global_step == 2
