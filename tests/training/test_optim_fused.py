"""The fused AdamW: used where Lightning allows it, never where it would refuse to clip gradients."""
import lightning.pytorch as pl
import pytest
import torch

from ptm_app.training.trainer import PtmTrainer
from ptm_app.training.optim import OptimConfig, build_optimizer, fused_if_possible


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
