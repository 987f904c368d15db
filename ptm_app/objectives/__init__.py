"""One LightningModule per pre-training family (DESIGN principle 2); representative models are YAML recipes."""
from ptm_app.objectives.clm import CausalLMModule
from ptm_app.objectives.mlm import MaskedLMModule
from ptm_app.objectives.rtd import ReplacedTokenDetectionModule

__all__ = ["CausalLMModule", "MaskedLMModule", "ReplacedTokenDetectionModule"]
