"""Tokenizers: a pretrained one from a local directory, or one trained on the corpus.

Training uses the ``tokenizers`` library: WordPiece for BERT-style models (Devlin et al. 2019 §3),
byte-level BPE for GPT-style ones (Radford et al. 2019 §2.2).  A trained tokenizer is cached
under ``<data>/.cache/tokenizers/<key>`` (key = corpus + settings) and saved with every run.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Literal, Optional

from ptm_app.data.sources.references import load_error, resolve_pretrained
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, cache_root

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
GPT_SPECIALS = ["<|endoftext|>", "<|pad|>"]


@dataclass
class TokenizerSpec:
    """Which tokenizer to use.

    Args:
        pretrained: a prepared model name (e.g. ``minilm``), a local directory, or a hub id.
        train: train a new one on the training corpus: ``wordpiece`` (BERT) or ``bpe`` (byte-level, GPT).
        vocab_size: target vocabulary size when training.
        lowercase: lowercase text before WordPiece training (ignored for byte-level BPE).
        min_frequency: minimum pair/word frequency when training.
        model_max_length: the longest sequence the tokenizer reports for trained tokenizers.
        sentinels: add N sentinel tokens ``[X0]`` … (T5 span corruption) to a trained tokenizer.
        special_tokens: more special tokens for a trained tokenizer, kept whole and never split (mBART's language
            tokens ``[en]``, ``[es]``: ``MultilingualDenoisingDataModule`` adds one per corpus language itself).
    """

    pretrained: Optional[str] = None
    train: Optional[Literal["wordpiece", "bpe"]] = None
    vocab_size: int = 8000
    lowercase: bool = True
    min_frequency: int = 2
    model_max_length: int = 512
    sentinels: int = 0
    special_tokens: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if (self.pretrained is None) == (self.train is None):
            raise PtmError("tokenizer: set exactly one of 'pretrained' (a name or directory) or 'train' (wordpiece|bpe)")


def load_tokenizer(spec: TokenizerSpec, corpus: Callable[[], Iterable[str]] | None = None, corpus_key: str = ""):
    """Return a ``PreTrainedTokenizerFast`` for ``spec``; trains (once, cached) when asked to."""
    from transformers import AutoTokenizer

    if spec.pretrained is not None:
        where = resolve_pretrained(spec.pretrained)
        try:
            return AutoTokenizer.from_pretrained(where, trust_remote_code=False)
        except (OSError, ValueError) as exc:
            raise load_error(spec.pretrained, exc) from None
    if corpus is None:
        raise PtmError("tokenizer: 'train' needs a training corpus; use it with a data module that has one")
    settings = {k: v for k, v in asdict(spec).items() if k != "special_tokens" or v}  # keys from before it stay
    key = hashlib.sha256(json.dumps([settings, corpus_key], sort_keys=True).encode()).hexdigest()[:16]
    target = cache_root() / "tokenizers" / f"{spec.train}-{key}"
    if not (target / "tokenizer.json").exists():
        tok = _train(spec, corpus())
        with atomic_dir(target) as tmp:
            tok.save_pretrained(tmp)
    return AutoTokenizer.from_pretrained(str(target), trust_remote_code=False)


def _train(spec: TokenizerSpec, texts: Iterable[str]):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    extra = [f"[X{i}]" for i in range(spec.sentinels)]
    extra += [t for t in dict.fromkeys(spec.special_tokens) if t not in extra + BERT_SPECIALS + GPT_SPECIALS]
    if spec.train == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=spec.lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=spec.vocab_size, min_frequency=spec.min_frequency, special_tokens=BERT_SPECIALS + extra,
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
        )
        names = dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                     model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=spec.vocab_size,
            min_frequency=spec.min_frequency,
            special_tokens=GPT_SPECIALS + extra,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        names = dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>", pad_token="<|pad|>")
    if tok.get_vocab_size() < len(BERT_SPECIALS) + 10:
        raise PtmError("tokenizer training produced an almost empty vocabulary; the training corpus is too small")
    if extra:
        names["additional_special_tokens"] = extra
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=spec.model_max_length, **names)


def is_bert_style(tokenizer) -> bool:
    """BERT-style tokenizers wrap sequences in [CLS] ... [SEP]; GPT-style ones separate documents with EOS."""
    return tokenizer.cls_token_id is not None and tokenizer.sep_token_id is not None


def tokenizer_fingerprint(tokenizer) -> str:
    """A stable hash of the tokenizer's vocabulary and rules (for cache keys)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # drop per-call state (truncation/padding) so the key is the tokenizer itself
        state = json.loads(backend.to_str())
        state.pop("truncation", None), state.pop("padding", None)
        payload = json.dumps(state, sort_keys=True)
    else:
        payload = json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def fast_tokenizer_fingerprint(tokenizer) -> str:
    """``tokenizer_fingerprint`` of a fast tokenizer; token-level tasks need its word ids and character offsets."""
    if not getattr(tokenizer, "is_fast", False):
        raise PtmError("token tasks need a fast (Rust) tokenizer for word ids and character offsets; "
                       "use a tokenizer with a tokenizer.json")
    return tokenizer_fingerprint(tokenizer)
