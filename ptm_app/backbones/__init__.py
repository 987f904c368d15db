"""Backbones: plain transformers models, plus the parts transformers lacks (BiLSTM LM, attention masks)."""
from ptm_app.backbones import bilstm  # noqa: F401  (registers ptm_bilstm_lm with transformers' Auto classes)
from ptm_app.backbones import cnn  # noqa: F401  (registers ptm_cnn, the Kim 2014 CNN classifier)
