"""The strategy presets in-process: what FSDP shards, what is refused on a CPU, which strategies skip CheckpointIO."""
from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from ptm_app.errors import PtmError
from ptm_app.training.strategies import FSDP, DeepSpeed, is_sharded, transformer_blocks
from tests.conftest import TINY_BERT


def test_fsdp_units_are_the_blocks_without_tied_weights():
    cfg = {k: v for k, v in TINY_BERT.items() if k != "model_type"}
    model = BertForMaskedLM(BertConfig(vocab_size=100, **cfg))
    blocks = transformer_blocks(torch.nn.ModuleDict({"backbone": model}))
    assert [type(b).__name__ for b in blocks] == ["BertLayer", "BertLayer"]  # embeddings share the decoder weight
    assert blocks[0] is model.bert.encoder.layer[1]  # innermost / last first: fully_shard goes bottom-up


@pytest.mark.parametrize("model_type,expected", [
    ("albert", ["AlbertLayerGroup"]),  # one shared group serves every layer
    ("electra", ["ElectraLayer", "ElectraLayer"]),
    ("xlnet", ["XLNetLayer", "XLNetLayer"]),
    ("xlm", ["LayerNorm", "TransformerFFN", "LayerNorm", "MultiHeadAttention"] * 2),  # XLM's four per-layer lists
])
def test_fsdp_finds_blocks_of_models_that_declare_none(model_type, expected):
    """transformers 5 declares no _no_split_modules for ALBERT, ELECTRA, XLM, XLNet: FSDP refused them."""
    from ptm_app.backbones.build import build_backbone

    sizes = {"albert": dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, embedding_size=16),
             "electra": dict(hidden_size=32, num_attention_heads=2, intermediate_size=64),
             "xlnet": dict(d_model=32, n_head=2, d_inner=64), "xlm": dict(emb_dim=32, n_heads=2)}[model_type]
    layers = {"xlnet": "n_layer", "xlm": "n_layers"}.get(model_type, "num_hidden_layers")
    model = build_backbone("masked_lm" if model_type in ("albert", "electra") else "causal_lm", None,
                           {"model_type": model_type, "vocab_size": 100, layers: 2, **sizes})
    blocks = transformer_blocks(torch.nn.ModuleDict({"backbone": model}))
    assert sorted(type(b).__name__ for b in blocks) == sorted(expected)


def test_sharded_strategies_are_recognised():
    assert is_sharded(FSDP()) and is_sharded("fsdp") and is_sharded("deepspeed_stage_2")
    assert not is_sharded("ddp") and not is_sharded(None) and not is_sharded("auto")


def test_bad_sharding_refused_with_one_line_and_offload_accepted_on_cpu():
    with pytest.raises(PtmError, match="sharding 'zero' is unknown"):
        FSDP(sharding="zero")
    strategy = DeepSpeed(stage=3)
    assert strategy.config["zero_optimization"]["stage"] == 3
    offload = DeepSpeed(stage=3, offload_optimizer=True, offload_parameters=True)  # runs on CPU: test_strategies
    zero = offload.config["zero_optimization"]
    assert zero["offload_optimizer"]["device"] == zero["offload_param"]["device"] == "cpu"
    assert offload.config["zero_force_ds_cpu_optimizer"] is False  # our torch AdamW steps the offloaded states
