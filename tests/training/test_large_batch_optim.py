"""LAMB (You et al. 2020, Algorithm 2) and Adafactor (Shazeer & Stern 2018, Algorithm 4) as ``optim.name``: each
update checked against the paper's equations on hand-computed steps, and the settings that do not apply refused."""
import math

import pytest
import torch
from torch import nn

from ptm_app.errors import PtmError
from ptm_app.training.lamb import Lamb
from ptm_app.training.optim import OptimConfig, build_optimizer


def one_step(optimizer_cls, x, g, **kwargs):
    p = nn.Parameter(torch.tensor(x, dtype=torch.float32))
    opt = optimizer_cls([p], **kwargs)
    p.grad = torch.tensor(g, dtype=torch.float32)
    opt.step()
    return p.detach(), opt, p


def test_lamb_first_step_by_hand():
    # x = [3, 4] (norm 5), g = [1, 2]: m̂ = g, v̂ = g², r = g/|g| = [1, 1]; u = r + 0.01·x = [1.03, 1.04],
    # ‖u‖ = √2.1425 = 1.463728; trust ratio 5 / 1.463728 = 3.415920; x - 0.1·3.415920·u
    x, _, _ = one_step(Lamb, [[3.0, 4.0]], [[1.0, 2.0]], lr=0.1, weight_decay=0.01, eps=1e-12)
    assert x.flatten().tolist() == pytest.approx([3 - 0.351840, 4 - 0.355256], abs=1e-5)


def test_lamb_second_step_follows_the_bias_corrected_moments():
    b1, b2, lr, wd, eps = 0.9, 0.999, 0.05, 0.0, 1e-6
    x0, g1, g2 = torch.tensor([[1.0, -2.0], [0.5, 3.0]]), torch.tensor([[0.1, 0.2], [-0.3, 0.4]]), \
        torch.tensor([[-0.2, 0.1], [0.3, 0.0]])
    p = nn.Parameter(x0.clone())
    opt = Lamb([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    expected, m, v = x0.clone(), torch.zeros(2, 2), torch.zeros(2, 2)
    for t, g in ((1, g1), (2, g2)):
        p.grad = g.clone()
        opt.step()
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps) + wd * expected
        expected = expected - lr * (expected.norm() / u.norm()) * u
    assert torch.allclose(p.detach(), expected, atol=1e-6)
    assert not torch.allclose(p.detach(), x0 - lr * 2 * torch.sign(g1 + g2), atol=1e-3)  # not plain Adam's step


def test_lamb_skips_the_trust_ratio_for_biases_and_zero_weights():
    x, _, _ = one_step(Lamb, [0.0, 0.0], [1.0, -1.0], lr=0.1, eps=1e-12)  # ‖x‖ = 0: ratio 1, an Adam-like step
    assert x.tolist() == pytest.approx([-0.1, 0.1], abs=1e-6)
    model = nn.Linear(2, 2)
    opt = build_optimizer(model, OptimConfig(name="lamb", lr=0.1), total_steps=10)["optimizer"]
    adapt = {tuple(p.shape): g["adapt"] for g in opt.param_groups for p in g["params"]}
    assert adapt == {(2, 2): True, (2,): False}  # the matrix is adapted, the bias (1-D) takes a plain step


def test_adafactor_step_is_the_papers_factored_update():
    # x = [[1, 2], [3, 4]] (RMS √7.5), g = x: row sums of g² R = [5, 25], column sums C = [10, 20],
    # V̂ = R·C / ΣR; U = g / √V̂; RMS(U) = 0.9798 < d = 1 (no clipping); α = max(1e-3, RMS(x))·min(0.01, 1/√1)
    model = nn.Linear(2, 2, bias=False)
    model.weight.data = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    opt = build_optimizer(model, OptimConfig(name="adafactor", lr=0.01, weight_decay=0.0, warmup=0,
                                             schedule="constant"), total_steps=10)["optimizer"]
    assert isinstance(opt, torch.optim.Adafactor)
    model.weight.grad = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    opt.step()
    assert model.weight.detach().flatten().tolist() == pytest.approx([0.978787, 1.97, 2.971540, 3.973167], abs=1e-5)


def test_adafactor_clips_the_update_at_its_threshold():
    """Step 1 with g = 0.01: V̂ = 1e-4, U = 1, x = 1 - 0.01.  Step 2 with g = 1: β̂2 = 1 - 2^-0.8 = 0.425651,
    V̂ = 0.425651e-4 + 0.574349 = 0.574392, U = 1/√V̂ = 1.319458 > d = 1, so Û = U / RMS(U) = 1 and
    x = 0.99 - max(1e-3, RMS(0.99))·min(0.01, 1/√2) = 0.9801 (unclipped it would be 0.976937)."""
    p = nn.Parameter(torch.ones(4))
    opt = build_optimizer(nn.ParameterList([p]), OptimConfig(name="adafactor", lr=0.01, weight_decay=0.0, warmup=0,
                                                             schedule="constant"), total_steps=10)["optimizer"]
    for g in (0.01, 1.0):
        p.grad = torch.full((4,), g)
        opt.step()
    assert p.detach().tolist() == pytest.approx([0.9801] * 4, abs=1e-6)


def test_adafactor_relative_step_decays_as_one_over_root_t():
    """ρ_t = min(lr, 1/√t): with lr = 1 the second step's size is 1/√2 of the first's for the same gradient
    direction statistics (T5's inverse square root schedule comes from this cap)."""
    p = nn.Parameter(torch.full((4,), 1.0))
    opt = torch.optim.Adafactor([p], lr=1.0)
    sizes = []
    for _ in range(2):
        before = p.detach().clone()
        p.grad = torch.ones(4)
        opt.step()
        sizes.append((before - p.detach()).abs().mean().item() / max(1e-3, before.pow(2).mean().sqrt().item()))
    assert sizes[1] / sizes[0] == pytest.approx(1 / math.sqrt(2), rel=1e-4)


@pytest.mark.parametrize("settings, words", [
    (dict(name="sgd"), "adamw, lamb or adafactor"),
    (dict(name="lamb", fused=True), "fused applies to adamw"),
    (dict(name="adamw", clip_threshold=0.5), "Adafactor's"),
    (dict(name="adafactor", beta2_decay=0.5), "beta2_decay must be <= 0"),
    (dict(name="adafactor", clip_threshold=0.5), "clip_threshold >= 1"),
])
def test_settings_that_do_not_apply_are_one_line(settings, words):
    with pytest.raises(PtmError, match=words):
        OptimConfig(**settings)


def test_lamb_trains_a_model_down():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    data, target = torch.randn(64, 8), torch.randn(64, 1)
    opt = build_optimizer(model, OptimConfig(name="lamb", lr=0.02, warmup=0, schedule="constant"), 50)["optimizer"]
    first = None
    for _ in range(50):
        loss = nn.functional.mse_loss(model(data), target)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.7 * first


@pytest.mark.parametrize("overlay, state_key", [pytest.param("lamb_8x_batch", "exp_avg", marks=pytest.mark.slow),
                                               ("adafactor_t5", "row_var")])  # lamb: 16 batches of bert, ~30 s
def test_the_shipped_overlays_train_with_their_optimiser(overlay, state_key, tmp_path, monkeypatch):
    """``configs/optim/`` as shipped on its recipe: the checkpoint's optimiser state is LAMB's (its groups carry the
    trust-ratio flag, 8 batches accumulate per step) or Adafactor's (factored row/column second moments)."""
    from ptm_app.checkpoint_io.reading import read_checkpoint
    from tests.cli.test_configs import ROOT, run_as_shipped

    monkeypatch.chdir(tmp_path)
    ckpt = read_checkpoint(run_as_shipped(ROOT / "configs" / "optim" / f"{overlay}.yaml", tmp_path)
                           / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 2
    optimizer = ckpt["optimizer_states"][0]
    assert any(state_key in state for state in optimizer["state"].values())
    if overlay.startswith("lamb"):
        assert {g["adapt"] for g in optimizer["param_groups"]} == {True, False}
        assert all("exp_avg" in state for state in optimizer["state"].values())
        assert ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["ready"] == 16  # 2 steps x 8 batches
    else:
        assert not any("exp_avg" in state for state in optimizer["state"].values())
