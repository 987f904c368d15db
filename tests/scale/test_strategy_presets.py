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
