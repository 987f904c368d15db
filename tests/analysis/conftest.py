"""Tiny backbones for the analysis tests: random BERT and ELMo BiLSTM models saved with the prepared MiniLM's
tokenizer (the real word-piece alignment, at a few thousand parameters per layer)."""
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_BERT


def _tokenizer():
    from transformers import AutoTokenizer

    from ptm_app.data.sources import prepared_dir

    return AutoTokenizer.from_pretrained(prepared_dir("minilm"))


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    import transformers

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**{**TINY_BERT, "vocab_size": tokenizer.vocab_size,
                                                  "max_position_embeddings": 128})
    where = tmp_path_factory.mktemp("tiny_bert")
    transformers.AutoModel.from_config(config).save_pretrained(where)
    tokenizer.save_pretrained(where)
    return where


@pytest.fixture(scope="session")
def tiny_bilstm_dir(tmp_path_factory) -> Path:
    from ptm_app.backbones.bilstm import BiLSTMConfig, BiLSTMForLanguageModeling

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    model = BiLSTMForLanguageModeling(BiLSTMConfig(vocab_size=tokenizer.vocab_size, embedding_dim=16, hidden_size=16,
                                                   num_layers=2, dropout=0.0, pad_token_id=tokenizer.pad_token_id))
    where = tmp_path_factory.mktemp("tiny_bilstm")
    model.save_pretrained(where)
    tokenizer.save_pretrained(where)
    return where
