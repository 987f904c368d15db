"""One LightningModule per pre-training family (docs/design.md principle 2); representative models are YAML recipes."""
from ptm_app.objectives.bilm import BiLMModule
from ptm_app.objectives.clip import DualEncoderModule
from ptm_app.objectives.clm import CausalLMModule
from ptm_app.objectives.contrastive import ContrastiveModule
from ptm_app.objectives.mlm import MaskedLMModule
from ptm_app.objectives.plm import PermutationLMModule
from ptm_app.objectives.rtd import ReplacedTokenDetectionModule
from ptm_app.objectives.seq2seq import Seq2SeqDenoisingModule
from ptm_app.objectives.targets import MaskedLM, NextSentence, SentenceOrder, SpanBoundary
from ptm_app.objectives.tlm import TranslationLMModule
from ptm_app.objectives.unilm import UnifiedLMModule
from ptm_app.objectives.visualbert import SingleStreamModule

__all__ = ["BiLMModule", "CausalLMModule", "ContrastiveModule", "DualEncoderModule", "MaskedLMModule", "PermutationLMModule", "ReplacedTokenDetectionModule",
           "Seq2SeqDenoisingModule", "SingleStreamModule", "MaskedLM", "NextSentence", "SentenceOrder", "SpanBoundary", "TranslationLMModule", "UnifiedLMModule"]
