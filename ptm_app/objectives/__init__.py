"""One LightningModule per pre-training family (DESIGN principle 2)."""
from ptm_app.objectives.clm import CausalLMModule
from ptm_app.objectives.mlm import MaskedLMModule

__all__ = ["CausalLMModule", "MaskedLMModule"]
