"""AdamW parameter groups and the warm-up/decay schedule match their formulas."""
import math

import pytest
import torch

from ptm_app.training.optim import OptimConfig, build_optimizer, lr_factor


def test_linear_warmup_then_linear_and_cosine_decay():
    assert [lr_factor(s, 10, 4, "linear") for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 10, 4, "linear") == 1.0 and lr_factor(7, 10, 4, "linear") == pytest.approx(0.5)
    assert lr_factor(10, 10, 4, "linear") == 0.0
    assert lr_factor(7, 10, 4, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(9, 10, 4, "constant") == 1.0


def test_no_weight_decay_on_biases_and_layernorm():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, OptimConfig(lr=0.1, weight_decay=0.3, warmup=0.5), total_steps=10)
    groups = opt["optimizer"].param_groups
    decayed = {id(p) for g in groups if g["weight_decay"] == 0.3 for p in g["params"]}
    assert decayed == {id(model[0].weight)}
    sched = opt["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(10):
        lrs.append(opt["optimizer"].param_groups[0]["lr"])
        opt["optimizer"].step()
        sched.step()
    assert lrs[:5] == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.1])
    assert lrs[5:] == pytest.approx([0.1, 0.08, 0.06, 0.04, 0.02])
