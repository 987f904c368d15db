"""The fused AdamW: used where Lightning allows it, never where it would refuse to clip gradients."""
import lightning.pytorch as pl
import pytest
import torch

from ptm_app.errors import PtmError
from ptm_app.training.module import PtmModule
from ptm_app.training.optim import OptimConfig, build_optimizer, fused_if_possible
from ptm_app.training.trainer import PtmTrainer


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return build_optimizer(self, OptimConfig(), 3)


@pytest.mark.parametrize("precision, clip, fused", [("bf16-mixed", 1.0, False), ("bf16-mixed", None, True),
                                                    ("32-true", 1.0, True)])
def test_fused_unless_mixed_precision_clips(precision, clip, fused):
    trainer = PtmTrainer(max_steps=2, precision=precision, gradient_clip_val=clip, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
    trainer.fit(Tiny(), data)  # Lightning raises if a fused optimizer meets mixed-precision clipping
    assert bool(trainer.optimizers[0].defaults.get("fused")) is fused


def test_not_fused_for_non_float_or_meta_parameters():
    meta = torch.nn.Linear(2, 2, device="meta")
    assert fused_if_possible(meta, [{"params": list(meta.parameters())}]) == {}
    plain = torch.nn.Linear(2, 2)
    assert fused_if_possible(plain, [{"params": list(plain.parameters())}]) == {"fused": True}


class ClipsItself(Tiny):
    """A module with ``PtmModule``'s clipping (bf16-mixed: clipped as in full precision, the fused step kept)."""

    clips_without_unscaling = True
    configure_gradient_clipping = PtmModule.configure_gradient_clipping

    def __init__(self, fused=None):
        super().__init__()
        self.fused = fused
        self.norms_after_clipping = []

    def training_step(self, batch, batch_idx):
        return 1000 * self.layer(batch[0]).pow(2).mean()  # gradients far above the clipping norm

    def configure_optimizers(self):
        return build_optimizer(self, OptimConfig(fused=self.fused), 3)

    def on_before_zero_grad(self, optimizer):  # the gradients the last optimizer step used
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:  # (none before the first step)
            self.norms_after_clipping.append(float(torch.nn.utils.get_total_norm(grads)))


def fit(module, precision="bf16-mixed", clip=1.0):
    trainer = PtmTrainer(max_steps=2, precision=precision, gradient_clip_val=clip, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=2)
    trainer.fit(module, data)
    return trainer


def test_a_ptm_module_keeps_the_fused_step_and_clips_under_bf16():
    module = ClipsItself()
    trainer = fit(module)
    assert trainer.optimizers[0].defaults.get("fused") is True
    assert module.norms_after_clipping and all(n <= 1.0 + 1e-3 for n in module.norms_after_clipping)
    unclipped = ClipsItself()
    fit(unclipped, clip=None)
    assert unclipped.norms_after_clipping and all(n > 10 for n in unclipped.norms_after_clipping)


def test_fused_setting_off_on_or_refused_in_one_line():
    assert fit(ClipsItself(fused=False)).optimizers[0].defaults.get("fused") in (None, False)
    assert fit(ClipsItself(fused=True)).optimizers[0].defaults.get("fused") is True
    meta = torch.nn.Linear(2, 2, device="meta")
    with pytest.raises(PtmError, match="optim.fused: true, but a parameter is torch.float32 on meta"):
        fused_if_possible(meta, [{"params": list(meta.parameters())}], wanted=True)
    with pytest.raises(PtmError, match="optim.fused: true, but Lightning cannot clip"):
        fit(FusedTiny())  # Lightning's own clipping rule for a module without PtmModule's


class FusedTiny(Tiny):
    def configure_optimizers(self):
        return build_optimizer(self, OptimConfig(fused=True), 3)
