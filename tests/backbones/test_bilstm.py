"""ELMo-style biLM (Peters et al. 2018 §3.1–3.2): direction isolation, padding, loss, layers, tying, save/load."""
import importlib.util

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file

from ptm_app.backbones import bilstm
from ptm_app.backbones.bilstm import (
    BiLSTMConfig,
    BiLSTMForLanguageModeling,
    BiLSTMModel,
    BILSTM_CLASSES,
)
from ptm_app.backbones.build import build_backbone, max_positions

V, PAD = 23, 0
TINY = {"vocab_size": V, "embedding_dim": 8, "hidden_size": 12, "num_layers": 2, "dropout": 0.0, "pad_token_id": PAD}


pytestmark = pytest.mark.usefixtures("one_thread")


def make_lm(seed: int = 0, trained_like: bool = True, **overrides) -> BiLSTMForLanguageModeling:
    """``trained_like`` redraws every weight (biases, the padding row, a peaked softmax): at the fresh init the
    zero biases and zero padding embedding keep padding states at exactly 0 and the tied logits near uniform,
    which would hide padding leaks and loss-masking mistakes."""
    torch.manual_seed(seed)
    model = BiLSTMForLanguageModeling(BiLSTMConfig(**{**TINY, **overrides})).eval()
    if trained_like:
        with torch.no_grad():
            for param in model.parameters():
                param.uniform_(-0.6, 0.6)
    return model


def random_ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def padded(seqs: list[torch.Tensor], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(seqs), length), PAD)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    return ids, mask


def test_config_defaults_aliases_and_auto_config():
    cfg = transformers.AutoConfig.for_model("ptm_bilstm_lm", vocab_size=50, bos_token_id=1, eos_token_id=2)
    assert isinstance(cfg, BiLSTMConfig)
    assert (cfg.embedding_dim, cfg.hidden_size, cfg.num_layers, cfg.projection_dim) == (256, 256, 2, 256)
    assert cfg.tie_embeddings and cfg.tie_word_embeddings and cfg.residual and cfg.num_hidden_layers == 2
    assert getattr(cfg, "max_position_embeddings", None) is None and cfg.output_dim == 512
    assert not BiLSTMConfig(vocab_size=5, tie_word_embeddings=False, projection_dim=4).tie_embeddings
    with pytest.raises(ValueError, match="projection_dim == embedding_dim"):
        BiLSTMConfig(vocab_size=5, embedding_dim=8, projection_dim=4)
    # a checkpoint's config.to_dict() rebuilds the same config (ptm_app's export path)
    saved = BiLSTMConfig(**TINY).to_dict()
    rebuilt = transformers.AutoConfig.for_model(saved.pop("model_type"), **saved).to_dict()
    assert rebuilt == BiLSTMConfig(**TINY).to_dict()


def test_registration_survives_a_second_import():
    spec = importlib.util.spec_from_file_location("ptm_bilstm_second_copy", bilstm.__file__)
    second = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(second)  # runs the registrations again: must not raise
        assert type(transformers.AutoConfig.for_model("ptm_bilstm_lm", vocab_size=3)) is second.BiLSTMConfig
    finally:  # point the Auto classes back at this module's classes
        transformers.AutoConfig.register("ptm_bilstm_lm", BiLSTMConfig, exist_ok=True)
        transformers.AutoModel.register(BiLSTMConfig, BiLSTMModel, exist_ok=True)
    assert type(transformers.AutoConfig.for_model("ptm_bilstm_lm", vocab_size=3)) is BiLSTMConfig


def test_ptm_app_builds_the_base_model_without_a_position_limit():
    model = build_backbone("base", None, {"model_type": "ptm_bilstm_lm", **TINY})
    assert type(model) is BiLSTMModel and max_positions(model) is None
    assert BILSTM_CLASSES == {"bilm": BiLSTMForLanguageModeling, "base": BiLSTMModel}


@pytest.mark.parametrize("num_layers,residual", [(2, True), (3, False)])
def test_forward_states_never_see_the_right_and_backward_states_never_see_the_left(num_layers, residual):
    model = make_lm(num_layers=num_layers, residual=residual)
    lengths = [7, 4]
    ids, mask = padded([random_ids(1, n, seed=n)[0] for n in lengths], 7)
    captured = {}
    model.bilm.embed_tokens.register_forward_hook(lambda mod, inp, out: captured.update(emb=out))
    out = model(ids, attention_mask=mask, output_hidden_states=True)
    P = model.config.projection_dim
    for b, n in enumerate(lengths):
        for j in range(1, num_layers + 1):
            for t in range(n):
                fwd_grad, = torch.autograd.grad(out.hidden_states[j][b, t, :P].sum(), captured["emb"], retain_graph=True)
                bwd_grad, = torch.autograd.grad(out.hidden_states[j][b, t, P:].sum(), captured["emb"], retain_graph=True)
                per_position_fwd, per_position_bwd = fwd_grad[b].abs().sum(-1), bwd_grad[b].abs().sum(-1)
                assert torch.all(per_position_fwd[t + 1:] == 0), (b, j, t)  # right context and padding
                assert torch.all(per_position_fwd[:t + 1] > 0), (b, j, t)
                assert torch.all(per_position_bwd[:t] == 0) and torch.all(per_position_bwd[n:] == 0), (b, j, t)
                assert torch.all(per_position_bwd[t:n] > 0), (b, j, t)
                other = 1 - b  # no leak across the batch either
                assert fwd_grad[other].abs().sum() == 0 and bwd_grad[other].abs().sum() == 0


def test_changing_a_token_only_moves_states_and_logits_on_the_expected_side():
    model = make_lm()
    ids = random_ids(1, 9)
    changed = ids.clone()
    changed[0, 4] = changed[0, 4] % (V - 1) + 1  # another non-pad token
    P = model.config.projection_dim
    with torch.no_grad():
        a, b = (model(x, output_hidden_states=True) for x in (ids, changed))
    top_a, top_b = a.hidden_states[-1][0], b.hidden_states[-1][0]
    assert torch.equal(top_a[:4, :P], top_b[:4, :P]) and torch.equal(top_a[5:, P:], top_b[5:, P:])
    assert not torch.allclose(top_a[4:, :P], top_b[4:, :P]) and not torch.allclose(top_a[:5, P:], top_b[:5, P:])
    # `logits` is the forward LM (left context only), `backward_logits` the backward LM
    assert torch.equal(a.logits[0, :4], b.logits[0, :4]) and not torch.allclose(a.logits[0, 4], b.logits[0, 4])
    assert torch.equal(a.backward_logits[0, 5:], b.backward_logits[0, 5:])
    assert not torch.allclose(a.backward_logits[0, 4], b.backward_logits[0, 4])


def test_padding_does_not_change_real_token_states_and_is_zeroed():
    model = make_lm()
    seq = random_ids(1, 5)[0]
    with torch.no_grad():
        alone = model(seq[None], output_hidden_states=True)
        ids, mask = padded([seq], 9)
        with_pad = model(ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids), output_hidden_states=True)
    for h_alone, h_pad in zip(alone.hidden_states, with_pad.hidden_states):
        torch.testing.assert_close(h_pad[:, :5], h_alone)
        assert torch.all(h_pad[:, 5:] == 0)
    torch.testing.assert_close(with_pad.logits[:, :5], alone.logits)
    torch.testing.assert_close(with_pad.backward_logits[:, :5], alone.backward_logits)
    torch.testing.assert_close(with_pad.loss, alone.loss)


def test_mixed_length_batch_equals_each_sequence_alone():
    model = make_lm(num_layers=3)
    seqs = [random_ids(1, n, seed=n)[0] for n in (6, 3, 1)]
    ids, mask = padded(seqs, 6)
    with torch.no_grad():
        batch = model.bilm(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        for i, s in enumerate(seqs):
            single = model.bilm(s[None], output_hidden_states=True).hidden_states
            for h_batch, h_single in zip(batch, single):
                torch.testing.assert_close(h_batch[i, :len(s)], h_single[0])


def test_left_padding_is_refused():
    model = make_lm()
    with pytest.raises(ValueError, match="right-padded"):
        model(random_ids(1, 4), attention_mask=torch.tensor([[0, 1, 1, 1]]))


def test_loss_is_the_mean_of_forward_and_backward_token_cross_entropies():
    model = make_lm()
    ids, mask = padded([random_ids(1, 6, seed=2)[0], random_ids(1, 4, seed=3)[0]], 6)
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, 2] = -100  # ignored as a target in both directions
    with torch.no_grad():
        out = model(ids, attention_mask=mask, labels=labels)
    fwd_terms, bwd_terms = [], []
    for b, n in enumerate(mask.sum(1).tolist()):
        for t in range(n):
            if t + 1 < n and labels[b, t + 1] != -100:  # forward: state t predicts t+1
                fwd_terms.append(-F.log_softmax(out.logits[b, t], -1)[labels[b, t + 1]])
            if t - 1 >= 0 and labels[b, t - 1] != -100:  # backward: state t predicts t-1
                bwd_terms.append(-F.log_softmax(out.backward_logits[b, t], -1)[labels[b, t - 1]])
    assert len(fwd_terms) == len(bwd_terms) == 5 + 3 - 1
    fwd, bwd = torch.stack(fwd_terms).mean(), torch.stack(bwd_terms).mean()
    torch.testing.assert_close(out.forward_loss, fwd)
    torch.testing.assert_close(out.backward_loss, bwd)
    torch.testing.assert_close(out.loss, (fwd + bwd) / 2)
    with torch.no_grad():  # labels default to input_ids, padding ignored
        default = model(ids, attention_mask=mask).loss
        explicit = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    torch.testing.assert_close(default, explicit)
    assert out.logits.shape == out.backward_logits.shape == (2, 6, V)


def test_hidden_states_are_embedding_plus_one_entry_per_layer():
    model = make_lm(num_layers=3)
    ids = random_ids(2, 5)
    out = model.bilm(ids, output_hidden_states=True)
    assert len(out.hidden_states) == 4
    assert all(h.shape == (2, 5, 16) for h in out.hidden_states)
    emb = model.bilm.embed_tokens(ids)
    assert torch.equal(out.hidden_states[0], torch.cat([emb, emb], -1))
    assert torch.equal(out.last_hidden_state, out.hidden_states[-1])
    assert model.bilm(ids).hidden_states is None
    as_tuple = model(ids, output_hidden_states=True, return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple[-1]) == 4


@pytest.mark.parametrize("residual", [True, False])
def test_residual_connection_skips_every_layer_but_the_first(residual):
    model = make_lm(num_layers=3, residual=residual)
    stack, P = model.bilm.forward_stack, model.config.projection_dim
    with torch.no_grad():
        states = model.bilm(random_ids(1, 6), output_hidden_states=True).hidden_states
        for j in (1, 2):  # layers 2 and 3 (0-based module index j)
            below = states[j][..., :P]
            expected = stack.projections[j](stack.lstms[j](below)[0]) + (below if residual else 0)
            torch.testing.assert_close(states[j + 1][..., :P], expected)


def test_softmax_is_tied_to_the_embedding_unless_disabled():
    tied = make_lm()
    assert tied.lm_head.weight is tied.bilm.embed_tokens.weight
    assert tied.lm_head.weight.data_ptr() == tied.bilm.embed_tokens.weight.data_ptr()
    assert tied.get_output_embeddings() is tied.lm_head
    untied = make_lm(tie_embeddings=False, projection_dim=6)
    assert untied.lm_head.weight.shape == (V, 6)
    assert untied.lm_head.weight.data_ptr() != untied.bilm.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("tie", [True, False])
def test_save_and_from_pretrained_round_trip(tmp_path, tie):
    model = make_lm(num_layers=3, tie_embeddings=tie)
    model.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert ("lm_head.weight" in stored) is not tie  # a tied softmax is saved once
    loaded = BiLSTMForLanguageModeling.from_pretrained(tmp_path).eval()
    assert (loaded.lm_head.weight is loaded.bilm.embed_tokens.weight) is tie
    ids, mask = padded([random_ids(1, 5)[0], random_ids(1, 3)[0]], 5)
    with torch.no_grad():
        a = model(ids, attention_mask=mask, output_hidden_states=True)
        b = loaded(ids, attention_mask=mask, output_hidden_states=True)
        base = transformers.AutoModel.from_pretrained(tmp_path).eval()
        c = base(ids, attention_mask=mask, output_hidden_states=True)
    for name in ("loss", "forward_loss", "backward_loss", "logits", "backward_logits"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert type(base) is BiLSTMModel
    assert all(torch.equal(x, y) and torch.equal(x, z) for x, y, z in zip(a.hidden_states, b.hidden_states,
                                                                         c.hidden_states))
    assert type(transformers.AutoConfig.from_pretrained(tmp_path)) is BiLSTMConfig


def test_a_few_steps_overfit_a_repeated_sequence():
    model = make_lm(seed=3, trained_like=False, embedding_dim=16, hidden_size=32).train()
    seq = torch.tensor([[3, 7, 1, 9, 4, 12, 5, 18, 2, 11, 6, 15]]).repeat(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(60):
        out = model(seq)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        losses.append(out.loss.item())
    assert losses[0] > 3.0  # ≈ ln(23) at initialisation
    with torch.no_grad():
        final = model.eval()(seq)
    assert final.loss < 0.2, losses[::10]  # seeds 0-7 end at 0.014-0.047
    assert final.forward_loss < 0.3 and final.backward_loss < 0.3
