"""Checkpoints written before SenseBERT's target and LIBERT moved under ``knowledge/`` (issue 27 item 3) still load
without ``--trust_checkpoint``: tiny 2-step runs of the shipped ``configs/knowledge`` recipes for ERNIE, SenseBERT and
LIBERT, saved by main's code at 3e8cfda (``tests/fixtures/checkpoints/*_3e8cfda.*``, with the losses that code computed
on a fixed batch), resolve under the module names they record and give the same losses."""
import json
from pathlib import Path

import pytest
import torch

from ptm_app.checkpoint_io.reading import check_record
from ptm_app.knowledge.libert import LexicalRelationMLMModule
from ptm_app.knowledge.sensebert import Supersense
from ptm_app.checkpoint_io.module_classes import module_class
from ptm_app.objectives import MaskedLMModule
from ptm_app.objectives.targets import MaskedLM, as_target, known_record

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints"
OLD = {"ernie": MaskedLMModule, "sensebert": MaskedLMModule, "libert": LexicalRelationMLMModule}


def fixture(name: str) -> tuple[Path, dict]:
    return FIXTURES / f"{name}_3e8cfda.ckpt", json.loads((FIXTURES / f"{name}_3e8cfda.json").read_text())


def tensors(rows: dict) -> dict:
    return {k: torch.tensor(v) for k, v in rows.items()}


@pytest.mark.parametrize("name", OLD)
def test_an_old_knowledge_checkpoint_loads_untrusted_with_the_same_losses(name):
    path, record = fixture(name)
    raw = torch.load(path, weights_only=True, map_location="cpu")
    assert (raw["ptm_app"]["module"], raw["hyper_parameters"]["_class_path"]) == (record["module"], record["class_path"])
    check_record(raw, path, trust=False)  # the recorded names are ptm_app's: no CheckpointUnsafe
    assert module_class(record["module"], path) is OLD[name] and module_class(record["class_path"], path) is OLD[name]
    module = OLD[name].load_from_checkpoint(path).eval()
    with torch.no_grad():
        losses = module._losses(tensors(record["batch"]))
        assert set(losses) == set(record["losses"])
        for key, value in record["losses"].items():
            assert losses[key].item() == pytest.approx(value, rel=0, abs=1e-6), key
        if name == "libert":
            loss, acc = module._lexrel(tensors(record["pairs"]))
            assert [loss.item(), acc.item()] == pytest.approx(record["lexrel"], rel=0, abs=1e-6)


def test_the_old_sensebert_and_ernie_recipes_come_back_as_their_targets():
    sense = MaskedLMModule.load_from_checkpoint(fixture("sensebert")[0])
    assert [type(t) for t in sense.targets] == [MaskedLM, Supersense] and sense.supersense_input
    assert sense.word_senses.any()  # M came with the checkpoint
    ernie = MaskedLMModule.load_from_checkpoint(fixture("ernie")[0])
    assert [type(t) for t in ernie.targets] == [MaskedLM] and ernie.mlm.masking == "knowledge"
    assert ernie.example_format == {"knowledge_spans"}


def test_a_target_named_by_its_old_dotted_path_still_resolves():
    """Runs' config.yaml wrote ``ptm_app.objectives.targets.Supersense``; records are read back through the registry."""
    assert known_record("ptm_app.objectives.targets.Supersense")["class_path"] == "Supersense"
    assert type(as_target({"class_path": "ptm_app.knowledge.sensebert.Supersense"})) is Supersense
    with pytest.raises(Exception, match="unknown target"):
        known_record("somewhere.else.Supersense")


@pytest.mark.parametrize("name", ["libert", "sensebert"])
def test_an_old_knowledge_checkpoint_exports_through_main_untrusted(name, tmp_path):
    from transformers import AutoModelForMaskedLM

    from ptm_app.main import main

    assert main(["export", "--ckpt_path", str(fixture(name)[0]), "--output_dir", str(tmp_path)]) == 0
    assert AutoModelForMaskedLM.from_pretrained(tmp_path).config.hidden_size == 16
