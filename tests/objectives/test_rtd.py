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


def replaced(module, b) -> torch.Tensor:
    """The discriminator's input: the batch with G's samples at the masked positions."""
    return disc_labels_seen(module, b)


def test_replacements_follow_the_run_seed(monkeypatch):
    """Clark et al. §2 samples the replacements; the draw is seeded by the run seed (seed_everything) and the
    batch keys: one seed gives the same replacements (exact resume), another seed others."""
    from lightning.pytorch import seed_everything

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # restored after the test
    torch.manual_seed(0)
    m = ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA).build().eval()  # no dropout: G's logits fixed
    b = batch()
    selected = b["labels"] != -100
    draws = {}
    for seed in (1, 2, 1):
        seed_everything(seed)
        draws.setdefault(seed, []).append(replaced(m, b)[selected])
    assert torch.equal(draws[1][0], draws[1][1])  # the same seed: the same replacements
    differ = (draws[1][0] != draws[2][0]).float().mean()
    assert differ > 0.5, differ  # G is near uniform over 55 tokens: another seed changes almost every sample


def stage_two(generator_steps=2):
    torch.manual_seed(0)
    m = ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA, mode="two_stage", generator_size=1.0,
                                     generator_steps=generator_steps).build()
    # the optimiser Lightning builds at the start of the fit: every parameter, the real recipe (AdamW, decay)
    from ptm_app.training.optim import build_optimizer

    return m, build_optimizer(m, m.optim, total_steps=20)["optimizer"]


def step(m, opt, b) -> None:
    opt.zero_grad()
    m._total(m._losses(b)).backward()
    opt.step()


def test_two_stage_initialises_d_from_g_then_freezes_every_parameter_of_g():
    """Clark et al. 2020 §3.2: train G alone, initialise D with G's weights, then train D keeping G's weights
    frozen: after stage-2 steps every tensor of G (its embeddings and the LM head tied to them included) is
    bit-identical, and so are its predictions; D trains its own copy of the embeddings."""
    m, opt = stage_two()
    b = batch()
    assert set(m._losses(b)) == {"gen_loss"}  # stage 0: G alone
    for _ in range(2):
        step(m, opt, b)
    m.start_discriminator_stage()
    assert int(m.stage) == 2 and not any(p.requires_grad for p in m.generator.parameters())
    g_state = {k: v.clone() for k, v in m.generator.state_dict().items()}
    assert "generator_lm_head.weight" in g_state and "electra.embeddings.word_embeddings.weight" in g_state
    for k, v in m.backbone.electra.state_dict().items():
        assert torch.equal(v, g_state[f"electra.{k}"]), k  # D starts from all of G, embeddings included
    m.eval()
    with torch.no_grad():
        before = m.generator(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    m.train()
    for i in range(3):
        m.on_train_batch_start(b, i)
        step(m, opt, b)
    changed = [k for k, v in m.generator.state_dict().items() if not torch.equal(v, g_state[k])]
    assert changed == []  # G is frozen, every parameter
    m.eval()
    with torch.no_grad():
        after = m.generator(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    assert torch.equal(before, after)
    for name in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"):
        assert not torch.equal(m.backbone.electra.state_dict()[name], g_state[f"electra.{name}"]), name  # D trains


def test_two_stage_refuses_shared_embeddings():
    from ptm_app.errors import PtmError

    with pytest.raises(PtmError, match="cannot share embeddings"):
        ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA, mode="two_stage", generator_size=1.0,
                                     generator_steps=2, share_embeddings=True)


def test_two_stage_resumes_exactly_across_the_switch(tmp_path):
    """configs/pretrain/electra_rtd_brown.yaml in two_stage mode through main.py, paused after the switch (step 4 of 6, the
    switch at 2) and resumed with --ckpt_path last: the same losses, bit for bit, as the uninterrupted run, and G
    unchanged from the pause to the end."""
    from ptm_app.checkpoint_io.reading import read_checkpoint
    from tests.cli.test_recipes import ROOT, losses, tiny_args
    from tests.conftest import run_main

    runs = tmp_path / "runs"
    args = [*tiny_args(ROOT / "configs" / "pretrain" / "electra_rtd_brown.yaml", steps=6), "--model.init_args.mode",
            "two_stage", "--model.init_args.generator_size", "1.0", "--model.init_args.generator_steps", "2"]
    assert run_main(["fit", *args, "--run_name", "full"], runs) == 0
    assert run_main(["fit", *args, "--run_name", "part", "--stop_at_step", "4"], runs) == 0
    paused = read_checkpoint(runs / "part")["state_dict"]
    assert run_main(["fit", *args, "--run_name", "part", "--ckpt_path", "last"], runs) == 0
    full, part = losses(runs / "full"), losses(runs / "part")
    assert sorted(full) == sorted(part) == list(range(6))
    assert [part[s] for s in range(6)] == [full[s] for s in range(6)]  # bit-identical
    ends = [read_checkpoint(runs / name)["state_dict"] for name in ("full", "part")]
    for key in (k for k in paused if k.startswith("generator.")):
        assert torch.equal(ends[0][key], paused[key]) and torch.equal(ends[1][key], paused[key]), key
    assert int(ends[1]["stage"]) == 2


def test_two_stage_needs_equal_sizes():
    from ptm_app.errors import PtmError

    with pytest.raises(PtmError, match="same size"):
        ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA, mode="two_stage", generator_steps=5).build()


def test_rtd_and_dae_cite_qius_sections():
    """Qiu et al. 2020 file RTD under §3.1.5 (contrastive learning) and DAE under §3.1.4; there is no §3.1.7."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "ptm_app"
    for path in ("objectives/rtd.py", "data/corruption/rtd.py"):
        text = (src / path).read_text()
        assert "Qiu et al. 2020 §3.1.5" in text and "3.1.7" not in text, path
    assert "Qiu et al. 2020 §3.1.4, DAE" in (src / "data/corruption/denoising.py").read_text()
    assert "§3.1.4 (DAE: BART)" in (src / "objectives/seq2seq.py").read_text()
