"""Fixtures of the red-team suite (issue 25): the victim runs, made once per session with ``main.py fit``, and the
attacker's marker module on ``sys.path`` (``attacks``)."""
from __future__ import annotations

import sys

import pytest

from tests.conftest import TINY_BERT, TINY_GPT2, run_main
from tests.security.attacks import MARKER_MODULE, Marker, Victim, classifier_data, config_file


@pytest.fixture(scope="session")
def victim(tiny_corpus, tmp_path_factory) -> Victim:
    tmp = tmp_path_factory.mktemp("victim")
    runs = tmp / "runs"
    config = config_file(tmp, "cls", {"class_path": "SequenceClassificationModule",
                                      "init_args": {"backbone_config": TINY_BERT}}, classifier_data(tiny_corpus))
    assert run_main(["fit", "--config", str(config), "--run_name", "cls"], runs) == 0
    clm_data = {"class_path": "PretrainDataModule",
                "init_args": {"source": str(tiny_corpus), "max_length": 32, "batch_size": 4, "limit_documents": 20,
                              "tokenizer": {"train": "bpe", "vocab_size": 300, "min_frequency": 1}}}
    clm = config_file(tmp, "clm", {"class_path": "CausalLMModule", "init_args": {"backbone_config": TINY_GPT2}},
                      clm_data)
    assert run_main(["fit", "--config", str(clm), "--run_name", "clm"], runs) == 0
    return Victim(config, runs / "cls", clm, runs / "clm")


@pytest.fixture(scope="session")
def marker(tmp_path_factory) -> Marker:
    where = tmp_path_factory.mktemp("attacker")
    file = where / "MARKER_IMPORTED"
    (where / f"{MARKER_MODULE}.py").write_text(
        f"open({str(file)!r}, 'w').write('the marker module was imported')\n"
        f"from ptm_app.adaptation import SequenceClassificationModule as Evil  # a class that passes type checks\n")
    sys.path.insert(0, str(where))
    yield Marker(MARKER_MODULE, file)
    sys.path.remove(str(where))


