"""ELECTRA: discriminator labels, joint loss, the two-stage recipe freezes G, export keeps D."""
import pytest
import torch

from ptm_app.data.collators import MLMCollator
from ptm_app.objectives import ReplacedTokenDetectionModule

TINY_ELECTRA = {"model_type": "electra", "embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64, "vocab_size": 60}


def batch(seed=0):
    col = MLMCollator(pad_token_id=0, mask_token_id=4, special_ids=(0, 1, 2, 3, 4), vocab_size=60, seed=seed,
                      mlm_probability=0.3)
    gen = torch.Generator().manual_seed(seed)
    examples = [{"input_ids": torch.cat([torch.tensor([2]), torch.randint(5, 60, (14,), generator=gen),
                                         torch.tensor([3])]), "key": (0, i)} for i in range(8)]
    return col(examples)


def forced_generator(module, choose):
    """Make G's prediction at every position a point mass on ``choose(original)`` (through the dense path,
    which calls ``generator.forward``)."""
    module.hparams.sparse_prediction = False
    def forward(input_ids, attention_mask=None, token_type_ids=None, labels=None):
        original = torch.where(labels != -100, labels, input_ids)
        logits = torch.full((*input_ids.shape, 60), -1e4)
        logits.scatter_(-1, choose(original).unsqueeze(-1), 1e4)
        return type("Out", (), {"loss": torch.tensor(0.0, requires_grad=True), "logits": logits})()
    module.generator.forward = forward


def disc_labels_seen(module, b):
    seen = {}
    original_forward = module.backbone.forward

    def spy(input_ids, **kw):
        seen["corrupted"] = input_ids.clone()
        return original_forward(input_ids=input_ids, **kw)
    module.backbone.forward = spy
    module._losses(b)
    return seen["corrupted"]


def test_sample_equal_to_original_is_labelled_original():
    torch.manual_seed(0)
    m = ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA).build()
    b = batch()
    forced_generator(m, lambda orig: orig)  # a perfect generator: every sample equals the original
    corrupted = disc_labels_seen(m, b)
    original = torch.where(b["labels"] != -100, b["labels"], b["input_ids"])
    assert torch.equal(corrupted, original)
    losses = m._losses(b)
    assert losses["replaced"] == 0.0


def test_replaced_positions_are_exactly_the_changed_ones():
    m = ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA).build()
    b = batch(1)
    forced_generator(m, lambda orig: 5 + (orig - 5 + 1) % 55)  # always a different token
    corrupted = disc_labels_seen(m, b)
    selected = b["labels"] != -100
    original = torch.where(selected, b["labels"], b["input_ids"])
    assert torch.equal(corrupted != original, selected)
    losses = m._losses(b)
    assert losses["replaced"] == pytest.approx(selected.sum().item() / b["attention_mask"].sum().item())


def test_joint_loss_weights_the_discriminator_and_shares_embeddings():
    m = ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA, discriminator_weight=50.0).build()
    assert m.generator.config.hidden_size == 8  # a quarter of the discriminator
    assert m.generator.electra.embeddings is m.backbone.electra.embeddings
    losses = m._losses(batch())
    assert torch.allclose(m._total(losses), losses["gen_loss"] + 50.0 * losses["disc_loss"])


def test_two_stage_initialises_d_from_g_then_freezes_g():
    m = ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA, mode="two_stage", generator_size=1.0,
                                     generator_steps=2).build()
    b = batch()
    assert set(m._losses(b)) == {"gen_loss"}  # stage 0: G alone
    m.start_discriminator_stage()
    g_state = {k: v.clone() for k, v in m.generator.electra.state_dict().items()}
    for k, v in m.backbone.electra.state_dict().items():
        assert torch.equal(v, g_state[k]), k  # D starts from G
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        m._total(m._losses(b)).backward()
        opt.step()
    shared = {f"embeddings.{k}" for k in m.backbone.electra.embeddings.state_dict()}
    for k, v in m.generator.electra.state_dict().items():
        if k not in shared:
            assert torch.equal(v, g_state[k]), k  # G is frozen
    assert not torch.equal(m.backbone.electra.encoder.layer[0].attention.self.query.weight,
                           g_state["encoder.layer.0.attention.self.query.weight"])  # D trains


def test_two_stage_needs_equal_sizes():
    from ptm_app.errors import PtmError

    with pytest.raises(PtmError, match="same size"):
        ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA, mode="two_stage", generator_steps=5).build()
