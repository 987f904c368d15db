"""Tiny trained runs for the inference commands: a GPT-2 causal LM and a BERT classifier on the fixture corpus."""
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY_BERT, TINY_GPT2, run_main

QUIET = {"accelerator": "cpu", "devices": 1, "log_every_n_steps": 1, "enable_progress_bar": False,
         "enable_model_summary": False}


def fit(tmp: Path, name: str, model: dict, data: dict, steps: int, val_every: int) -> Path:
    cfg = {"seed_everything": 5, "trainer": {"max_steps": steps, "val_check_interval": val_every, **QUIET},
           "model": model, "data": data}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp / "runs"
    assert run_main(["fit", "--config", str(path), "--run_name", name], runs) == 0
    return runs / name


@pytest.fixture(scope="session")
def clm_run(tiny_corpus, tmp_path_factory) -> Path:
    """A 10-step GPT-2 causal LM with its own byte-level BPE tokenizer."""
    model = {"class_path": "CausalLMModule",
             "init_args": {"backbone_config": TINY_GPT2, "optim": {"lr": 3e-3, "warmup": 0}}}
    data = {"class_path": "PretrainDataModule",
            "init_args": {"source": str(tiny_corpus), "max_length": 32, "batch_size": 4, "limit_documents": 20,
                          "tokenizer": {"train": "bpe", "vocab_size": 300, "min_frequency": 1}}}
    return fit(tmp_path_factory.mktemp("clm"), "clm", model, data, steps=10, val_every=10)


@pytest.fixture(scope="session")
def classifier_run(tiny_corpus, tmp_path_factory) -> Path:
    """A 6-step BERT classifier (labels pos / neg) with a WordPiece tokenizer, tested on the fixture's test split."""
    model = {"class_path": "SequenceClassificationModule",
             "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 1e-2, "warmup": 0}}}
    data = {"class_path": "TaskDataModule",
            "init_args": {"source": str(tiny_corpus), "max_length": 32, "batch_size": 8,
                          "tokenizer": {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}}}
    return fit(tmp_path_factory.mktemp("classifier"), "classifier", model, data, steps=6, val_every=6)


@pytest.fixture(scope="session")
def adapter_run(tiny_corpus, tmp_path_factory) -> Path:
    """The classifier above with Houlsby adapters (only adapters + head train): a delta that cannot be merged."""
    model = {"class_path": "SequenceClassificationModule",
             "init_args": {"backbone_config": TINY_BERT, "optim": {"lr": 1e-2, "warmup": 0},
                           "delta": {"method": "houlsby", "bottleneck": 8}}}
    data = {"class_path": "TaskDataModule",
            "init_args": {"source": str(tiny_corpus), "max_length": 32, "batch_size": 8,
                          "tokenizer": {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}}}
    return fit(tmp_path_factory.mktemp("adapter"), "adapter", model, data, steps=6, val_every=6)


@pytest.fixture(scope="session")
def features_run(tiny_corpus, tmp_path_factory) -> Path:
    """A frozen-features classifier with a trained scalar mix (its export keeps the mix in module weights)."""
    model = {"class_path": "FeatureExtractionModule",
             "init_args": {"backbone_config": TINY_BERT, "representation": "scalar_mix",
                           "optim": {"lr": 5e-2, "warmup": 0}}}
    data = {"class_path": "TaskDataModule",
            "init_args": {"source": str(tiny_corpus), "max_length": 32, "batch_size": 8,
                          "tokenizer": {"train": "wordpiece", "vocab_size": 200, "min_frequency": 1}}}
    return fit(tmp_path_factory.mktemp("features"), "features", model, data, steps=6, val_every=6)
