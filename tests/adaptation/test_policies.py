"""Behaviours on the backbone are composed policies, not stacked mixins (docs/design.md principle 10): each module
derives its policies from its settings, in the order they apply, and no adaptation module inherits a mixin."""
import inspect

import pytest

import ptm_app.adaptation as adaptation
from ptm_app.adaptation.policies import L2SP, Delta, FrozenFeatures, InitFrom
from ptm_app.errors import PtmError
from tests.conftest import TINY_BERT

MODULES = [getattr(adaptation, name) for name in adaptation.__all__]


@pytest.mark.parametrize("cls", MODULES, ids=lambda c: c.__name__)
def test_no_adaptation_module_stacks_mixins(cls):
    ours = [base for base in cls.__mro__ if base.__module__.startswith("ptm_app.")]
    assert not [base.__name__ for base in ours if base.__name__.endswith("Mixin")]
    overrides = [base.__name__ for base in cls.__mro__ if "configure_model" in vars(base)]
    assert len(overrides) <= 4, overrides  # e.g. TokenClassificationModule -> TaskModule -> PtmModule


def test_settings_become_policies_in_the_order_they_apply(tmp_path):
    cls = adaptation.SequenceClassificationModule
    config = {**TINY_BERT, "vocab_size": 50}
    module = cls(backbone_config=config, labels=["a", "b"], delta={"method": "bitfit"}, l2_sp=0.1,
                 init_from={"path": str(tmp_path), "freeze": None})
    assert [type(p) for p in module.policies] == [Delta, InitFrom, L2SP]
    assert module.style() == "bitfit" and module.delta.method == "bitfit"
    plain = cls(backbone_config=config, labels=["a", "b"])
    assert plain.policies == [] and plain.style() == "full fine-tuning"
    features = adaptation.FeatureExtractionModule(backbone_config=config, labels=["a", "b"], representation="top")
    assert [type(p) for p in features.policies] == [FrozenFeatures]
    assert features.backbone is None  # construction builds nothing: a fit's configure_model, or build()
    features.build()
    assert not any(p.requires_grad for p in features.backbone.parameters()) and features.mix is None
    assert features.style() == "frozen features: top"


def test_an_unknown_representation_is_one_line():
    with pytest.raises(PtmError, match="representation 'middle' is unknown"):
        adaptation.FeatureExtractionModule(backbone_config=TINY_BERT, labels=["a"], representation="middle").build()


def test_policies_are_not_a_config_key():
    for cls in MODULES:
        assert "policies" not in inspect.signature(cls.__init__).parameters
