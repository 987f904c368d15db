"""Sparse prediction heads: vocabulary logits only at the masked positions, with the dense loss and gradients."""
import pytest
import torch
import transformers

from ptm_app.backbones.build import build_backbone
from ptm_app.objectives import MaskedLMModule, ReplacedTokenDetectionModule
from ptm_app.objectives.heads import masked_lm_forward, prediction_head, selected_positions
from ptm_app.objectives.targets import MaskedLM
from tests.conftest import TINY_BERT

V = 300
SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
         "max_position_embeddings": 64, "vocab_size": V}
# the output-layer shapes of configs/pretrain: BERT, RoBERTa, ALBERT (factorised E=16 < H), ELECTRA's generator
CONFIGS = {
    "bert": {"model_type": "bert", **SMALL},
    "roberta": {"model_type": "roberta", **SMALL, "max_position_embeddings": 66},
    "albert": {"model_type": "albert", **SMALL, "embedding_size": 16, "num_hidden_groups": 1},
    "electra": {"model_type": "electra", **SMALL, "embedding_size": 16},
    "distilbert": {"model_type": "distilbert", "dim": 32, "n_layers": 2, "n_heads": 2, "hidden_dim": 64,
                   "max_position_embeddings": 64, "vocab_size": V},
    "xlm": {"model_type": "xlm", "emb_dim": 32, "n_layers": 2, "n_heads": 2, "max_position_embeddings": 64,
            "vocab_size": V, "n_langs": 2, "use_lang_emb": True},
}


def masked_batch(seed=0, rows=6, length=24):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (rows, length), generator=gen)
    attention = torch.ones_like(ids)
    attention[0, 18:] = 0  # one padded row
    labels = torch.where(torch.rand(ids.shape, generator=gen) < 0.15, ids, -100).masked_fill(attention == 0, -100)
    labels[1, 3] = ids[1, 3]  # at least one target
    return {"input_ids": ids.masked_fill(labels != -100, 4), "attention_mask": attention}, labels


def model_for(name):
    torch.manual_seed(0)
    return build_backbone("masked_lm", None, CONFIGS[name]).eval()  # no dropout: both paths see the same net


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sparse_loss_logits_and_gradients_equal_the_dense_ones(name):
    model = model_for(name)
    assert prediction_head(model) is not None, type(model).__name__
    inputs, labels = masked_batch()
    if name == "xlm":
        inputs["langs"] = torch.zeros_like(inputs["input_ids"])
    results = {}
    for sparse in (True, False):
        model.zero_grad()
        out = masked_lm_forward(model, inputs, labels, sparse=sparse, hidden=True)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[sparse] = (out, grads)
    (s, s_grads), (d, d_grads) = results[True], results[False]
    n_targets = int((labels != -100).sum())
    assert s.logits.shape == d.logits.shape == (n_targets, V)
    assert abs(s.loss.item() - d.loss.item()) < 1e-6
    torch.testing.assert_close(s.logits, d.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s.hidden, d.hidden, atol=1e-6, rtol=1e-6)
    # the dense loss is transformers' own (its forward with labels), so this also pins the recipe
    assert abs(d.loss.item() - model(**inputs, labels=labels).loss.item()) < 1e-6
    assert s_grads.keys() == d_grads.keys()
    for key in d_grads:
        torch.testing.assert_close(s_grads[key], d_grads[key], atol=1e-6, rtol=1e-4, msg=key)


def test_sparse_path_projects_only_the_masked_rows():
    model = model_for("bert")
    inputs, labels = masked_batch()
    seen = []
    model.cls.predictions.decoder.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[:-1].numel()))
    masked_lm_forward(model, inputs, labels)
    masked_lm_forward(model, inputs, labels, sparse=False)
    assert seen == [int((labels != -100).sum()), labels.numel()]
    assert seen[0] < 0.25 * seen[1]


def test_module_default_is_sparse_and_the_switch_keeps_loss_and_weight_names():
    torch.manual_seed(0)
    sparse = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V}).build().eval()
    dense = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V},
                           targets=[MaskedLM(sparse_prediction=False)]).build().eval()
    dense.load_state_dict(sparse.state_dict())
    inputs, labels = masked_batch(1)
    batch = {**inputs, "labels": labels}
    assert sparse.mlm.sparse_prediction and not dense.mlm.sparse_prediction
    assert abs(sparse._losses(batch)["mlm"].item() - dense._losses(batch)["mlm"].item()) < 1e-6
    # the exported model is the plain transformers one: same weight names as BertForMaskedLM's
    reference = transformers.BertForMaskedLM(sparse.backbone.config)
    assert set(sparse.backbone.state_dict()) == set(reference.state_dict())


def test_positions_from_the_cpu_give_the_boolean_selection():
    """``positions`` (flat indices computed before the batch goes to the GPU, so no host sync) select the same rows in
    the same order as the boolean mask: the same loss, logits and gradients."""
    model = model_for("bert")
    inputs, labels = masked_batch(3)
    positions = selected_positions(labels)
    assert positions.tolist() == [r * labels.shape[1] + c for r, c in (labels != -100).nonzero().tolist()]
    outs = {}
    for name, pos in (("mask", None), ("positions", positions)):
        model.zero_grad()
        out = masked_lm_forward(model, inputs, labels, positions=pos)
        out.loss.backward()
        outs[name] = (out, model.cls.predictions.transform.dense.weight.grad.clone())
    (m, m_grad), (p, p_grad) = outs["mask"], outs["positions"]
    assert p.loss.item() == m.loss.item()
    torch.testing.assert_close(p.logits, m.logits, atol=0, rtol=0)
    torch.testing.assert_close(p_grad, m_grad, atol=0, rtol=0)


def test_module_reads_positions_and_an_all_ones_mask_on_the_cpu_before_the_transfer():
    torch.manual_seed(0)
    module = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V}).build().eval()
    inputs, labels = masked_batch(4)
    padded = {**inputs, "labels": labels}
    full = {"input_ids": inputs["input_ids"][1:], "attention_mask": inputs["attention_mask"][1:],
            "labels": labels[1:]}  # row 0 is the padded one
    before = {name: module._losses(dict(b))["mlm"].item() for name, b in (("padded", padded), ("full", full))}
    for name, b in (("padded", padded), ("full", full)):
        moved = module.on_before_batch_transfer(dict(b), 0)
        assert torch.equal(moved["mlm_positions"], selected_positions(b["labels"]))
        assert moved["attention_all_ones"] is (name == "full")
        assert ("attention_mask" in module.model_inputs(moved)) is (name == "padded")
        assert abs(module._losses(moved)["mlm"].item() - before[name]) < 1e-6, name
    staged = module.on_before_batch_transfer({**full, "knowledge_views": {}}, 0)  # labels change with the stage
    assert "mlm_positions" not in staged and "attention_all_ones" not in staged
    dense = MaskedLMModule(backbone_config={**TINY_BERT, "vocab_size": V}, targets=[MaskedLM(sparse_prediction=False)])
    assert "mlm_positions" not in dense.on_before_batch_transfer(dict(full), 0)


def test_electra_generator_loss_is_the_same_sparse_or_dense():
    electra = {"model_type": "electra", "embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 2,
               "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64, "vocab_size": V}
    torch.manual_seed(0)
    m = ReplacedTokenDetectionModule(backbone_config=electra).build().eval()
    inputs, labels = masked_batch(2)
    batch = {**inputs, "labels": labels, "keys": [(0, i) for i in range(len(labels))]}
    sparse = m._losses(batch)
    m.hparams.sparse_prediction = False
    dense = m._losses(batch)
    for name in ("gen_loss", "disc_loss", "replaced"):  # the same samples, so the same discriminator loss
        assert abs(sparse[name].item() - dense[name].item()) < 1e-6, name
