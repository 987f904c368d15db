"""Backbones: plain transformers models, plus the parts transformers lacks (BiLSTM LM, attention masks)."""
from ptm_app.backbones import bilstm  # noqa: F401  (registers ptm_bilstm_lm with transformers' Auto classes)
