"""gradient_checkpointing: true gives the same loss and gradients as off, really recomputes the blocks (each runs
twice per step and far fewer activations are kept), and works under LoRA / adapters with frozen embeddings."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.errors import PtmError
from ptm_app.objectives import BiLMModule, CausalLMModule, MaskedLMModule
from ptm_app.training.compile import compile_units
from tests.conftest import TINY_BERT, TINY_GPT2, run_main, tiny_mlm_config

LOW_MEMORY = str(Path(__file__).resolve().parents[2] / "configs" / "memory" / "low_memory.yaml")

NO_DROPOUT = {"bert": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
              "gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}}


def twins(cls, config: dict, **kwargs):
    """The same module built with checkpointing off and on, with identical weights, in train mode."""
    config = {**config, "vocab_size": 100, **NO_DROPOUT[config["model_type"]]}
    torch.manual_seed(0)
    plain = cls(backbone_config=config, **kwargs).build()
    checkpointed = cls(backbone_config=config, gradient_checkpointing=True, **kwargs).build()
    checkpointed.load_state_dict(plain.state_dict())
    return plain.train(), checkpointed.train()


def batch():
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 100, (4, 24), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0  # one padded row
    return ids, mask


def step(module, loss_fn):
    """One forward + backward; returns the loss, the gradients by name, the block calls and the saved bytes."""
    calls = []
    # on each block's first sub-module: transformers checkpoints the block's forward, inside the block's own hooks
    hooks = [next(b.children()).register_forward_pre_hook(lambda *_: calls.append(1)) for b in compile_units(module)]
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(module)
    forward_calls = len(calls)
    loss.backward()
    for h in hooks:
        h.remove()
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    return loss.detach(), grads, forward_calls, len(calls), sum(saved)


def lm_loss(module):
    ids, mask = batch()
    return module.backbone(input_ids=ids, attention_mask=mask, labels=ids).loss


def cls_loss(module):
    ids, mask = batch()
    return torch.nn.functional.cross_entropy(module({"input_ids": ids, "attention_mask": mask}),
                                             torch.tensor([0, 1, 1, 0]))


@pytest.mark.parametrize("cls,config", [(MaskedLMModule, TINY_BERT), (CausalLMModule, TINY_GPT2)],
                         ids=["bert", "gpt2"])
def test_same_loss_and_gradients_and_the_blocks_are_recomputed(cls, config):
    plain, checkpointed = twins(cls, config)
    loss, grads, forward, total, saved = step(plain, lm_loss)
    loss_c, grads_c, forward_c, total_c, saved_c = step(checkpointed, lm_loss)
    assert loss_c == pytest.approx(loss.item(), abs=1e-6)
    assert grads_c.keys() == grads.keys() and len(grads) > 10
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    blocks = len(compile_units(plain))
    assert blocks == 2
    assert (forward, total) == (blocks, blocks)  # off: each block runs once
    assert (forward_c, total_c) == (blocks, 2 * blocks)  # on: once more in the backward pass (the recompute)
    assert saved_c < 0.6 * saved, (saved_c, saved)  # the blocks' internal activations are not kept


@pytest.mark.parametrize("delta", [{"method": "lora", "r": 4}, {"method": "houlsby", "bottleneck": 8}],
                         ids=["lora", "houlsby"])
def test_delta_tuning_with_frozen_embeddings(delta):
    plain, checkpointed = twins(SequenceClassificationModule, TINY_BERT, labels=["a", "b"], delta=delta)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():  # LoRA's B and an adapter's up-projection start at zero: the other half would get no gradient
        for p in plain.parameters():
            if p.requires_grad and not p.any():
                p.normal_(0, 0.1, generator=gen)
    checkpointed.load_state_dict(plain.state_dict())
    embeddings = [p for n, p in checkpointed.named_parameters() if "embeddings" in n]
    assert embeddings and not any(p.requires_grad for p in embeddings)  # the block inputs need no grad
    loss, grads, _, _, _ = step(plain, cls_loss)
    loss_c, grads_c, _, total_c, _ = step(checkpointed, cls_loss)
    assert total_c == 4  # two blocks, each recomputed
    assert loss_c == pytest.approx(loss.item(), abs=1e-6)
    assert grads_c.keys() == grads.keys()
    delta_grads = [n for n in grads if "lora_" in n or "adapter" in n]
    assert delta_grads  # the delta inside the checkpointed blocks gets gradients ...
    for name in delta_grads:
        assert grads_c[name].abs().sum() > 0, name
        torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-5, atol=1e-7, msg=name)  # ... the same ones


def test_unsupported_backbone_is_refused_in_one_line():
    config = {"model_type": "ptm_bilstm_lm", "vocab_size": 50, "embedding_dim": 16, "hidden_size": 16, "num_layers": 1}
    with pytest.raises(PtmError, match="gradient_checkpointing: BiLSTMForLanguageModeling does not support it") as err:
        BiLMModule(backbone_config=config, gradient_checkpointing=True).build()
    assert "\n" not in str(err.value)


def test_low_memory_preset_runs_through_main(tiny_corpus, tmp_path):
    runs = tmp_path / "runs"
    cfg = str(tiny_mlm_config(tiny_corpus, tmp_path, max_steps=2, limit_val_batches=0))
    assert run_main(["fit", "--config", cfg, "--config", LOW_MEMORY, "--run_name", "low"], runs) == 0
    saved = yaml.safe_load((runs / "low" / "config.yaml").read_text())
    assert saved["model"]["init_args"]["gradient_checkpointing"] is True
    assert saved["trainer"]["accumulate_grad_batches"] == 2
    ckpt = torch.load(runs / "low" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2  # two optimizer steps ...
    assert ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["consumed"] == 4  # ... of two micro-batches
