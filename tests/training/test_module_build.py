"""Construction builds nothing (issue 12: ``__init__`` calls no overridable hook): Lightning calls ``configure_model``
in every fit / validate / test / predict and in ``load_from_checkpoint``; other code calls ``build()``.  A backbone
built from a run directory gives the same fresh head on every build: the first build (which exports the run once)
draws from the global RNG what every later one draws."""
import pytest
import torch
from torch import nn

from ptm_app.adaptation import SequenceClassificationModule
from ptm_app.errors import PtmError
from ptm_app.objectives import MaskedLMModule
from tests.conftest import TINY_BERT, run_main, tiny_mlm_config

CONFIG = {**TINY_BERT, "vocab_size": 60}


class WithExtraLayer(MaskedLMModule):
    """Sets its own state after ``super().__init__`` and reads it when the model is built."""

    def __init__(self, width: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        self.extra = None

    def configure_model(self) -> None:
        super().configure_model()
        if self.extra is None:
            self.extra = nn.Linear(self.backbone.config.hidden_size, self.width)


def test_construction_builds_nothing_and_build_is_idempotent():
    module = WithExtraLayer(width=5, backbone_config=CONFIG)
    assert module.backbone is None and module.extra is None
    assert module.build() is module
    backbone, extra = module.backbone, module.extra
    assert extra.out_features == 5 and backbone.config.vocab_size == 60
    module.build()
    assert module.backbone is backbone and module.extra is extra  # a second call builds nothing new


def test_a_module_that_needs_its_data_refuses_build_in_one_line():
    with pytest.raises(PtmError, match="cannot be built without its data") as err:
        SequenceClassificationModule(backbone_config=CONFIG).build()  # no label set, no data connected
    assert "\n" not in str(err.value)


def test_two_fresh_builds_from_a_run_directory_draw_the_same_head(tiny_corpus, tmp_path):
    runs = tmp_path / "runs"
    assert run_main(["fit", "--config", str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2)),
                     "--run_name", "src"], runs) == 0

    def fresh_build():
        torch.manual_seed(11)
        module = SequenceClassificationModule(backbone=str(runs / "src"), labels=["a", "b"]).build()
        return module.backbone.classifier.weight.detach().clone(), torch.rand(3)

    first_head, first_after = fresh_build()  # exports the run into the cache
    second_head, second_after = fresh_build()  # from the cache
    assert torch.equal(first_head, second_head)
    assert torch.equal(first_after, second_after)
    assert first_head.std() > 0  # a drawn initialisation, not zeros
