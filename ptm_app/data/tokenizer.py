"""Tokenizers: a pretrained one from a local directory, or one trained on the corpus.

Training uses the ``tokenizers`` library: WordPiece for BERT-style models (Devlin et al. 2019 §3),
byte-level BPE for GPT-style ones (Radford et al. 2019 §2.2), and a SentencePiece Unigram LM (Kudo 2018; Kudo &
Richardson 2018) with BERT-style special tokens, as XLM-R uses (Conneau et al. 2020 §2), trained by the ``tokenizers``
Unigram trainer.  A multilingual corpus (a mapping language -> texts, ``data.multilingual``) is sampled per language
with XLM's exponent (Lample & Conneau 2019 §3.1: q_i = p_i^a / sum_j p_j^a, ``alpha``); the languages are recorded in
the tokenizer's config (``LANGUAGES_KEY``) and the sampling beside it (``LANGUAGES_FILE``).  A trained tokenizer is cached under ``<data>/.cache/tokenizers/<key>``
(key = corpus + settings) and saved with every run.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Literal, Mapping, Optional, Union

from ptm_app.data.language_sampling import balanced_texts
from ptm_app.data.sources.references import load_error, resolve_pretrained
from ptm_app.errors import PtmError
from ptm_app.paths import atomic_dir, cache_root

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
GPT_SPECIALS = ["<|endoftext|>", "<|pad|>"]
LANGUAGES_FILE = "ptm_languages.json"  # beside a tokenizer trained on a multilingual corpus: the sampling record
LANGUAGES_KEY = "ptm_languages"  # its languages, in tokenizer_config.json (kept by every save_pretrained: runs, exports)
UNKNOWN_SHARE_LIMIT = 0.5  # a text whose pieces are more than half [UNK] is in a script the tokenizer cannot write
Corpus = Union[Iterable[str], Mapping[str, Iterable[str]]]  # texts, or texts per language


@dataclass
class TokenizerSpec:
    """Which tokenizer to use.

    Args:
        pretrained: a prepared model name (e.g. ``minilm``), a local directory, or a hub id.
        train: train a new one on the training corpus: ``wordpiece`` (BERT), ``bpe`` (byte-level, GPT) or ``unigram``
            (SentencePiece's Unigram LM, Metaspace word boundaries, NFKC, BERT-style special tokens; XLM-R).
        vocab_size: target vocabulary size when training.
        lowercase: lowercase text before WordPiece training (ignored for byte-level BPE).
        min_frequency: minimum pair/word frequency when training.
        model_max_length: the longest sequence the tokenizer reports for trained tokenizers.
        sentinels: add N sentinel tokens ``[X0]`` … (T5 span corruption) to a trained tokenizer.
        alpha: on a multilingual corpus, train on sentences sampled per language with probability
            q_i = p_i^alpha / sum_j p_j^alpha (XLM §3.1; p_i = language i's share of the sentences): 1 keeps the
            corpus's proportions, lower values up-sample the low-resource languages (XLM: 0.5, XLM-R: 0.3).
        special_tokens: more special tokens for a trained tokenizer, kept whole and never split (mBART's language
            tokens ``[en]``, ``[es]``: ``MultilingualDenoisingDataModule`` adds one per corpus language itself).
    """

    pretrained: Optional[str] = None
    train: Optional[Literal["wordpiece", "bpe", "unigram"]] = None
    vocab_size: int = 8000
    lowercase: bool = True
    min_frequency: int = 2
    model_max_length: int = 512
    sentinels: int = 0
    alpha: float = 1.0
    special_tokens: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if (self.pretrained is None) == (self.train is None):
            raise PtmError("tokenizer: set exactly one of 'pretrained' (a name or directory) or 'train' "
                           "(wordpiece|bpe|unigram)")
        if not 0.0 < self.alpha <= 1.0:
            raise PtmError(f"tokenizer.alpha={self.alpha}: the sampling exponent is in (0, 1] (XLM uses 0.5, "
                           f"XLM-R 0.3; 1 keeps the corpus's proportions)")


def load_tokenizer(spec: TokenizerSpec, corpus: Callable[[], Corpus] | None = None, corpus_key: str = ""):
    """Return a ``PreTrainedTokenizerFast`` for ``spec``; trains (once, cached) when asked to.  ``corpus`` gives the
    texts, or a mapping language -> texts (then sampled with ``spec.alpha``, and the languages recorded)."""
    from transformers import AutoTokenizer

    if spec.pretrained is not None:
        where = resolve_pretrained(spec.pretrained)
        try:
            return AutoTokenizer.from_pretrained(where, trust_remote_code=False)
        except (OSError, ValueError) as exc:
            raise load_error(spec.pretrained, exc) from None
    if corpus is None:
        raise PtmError("tokenizer: 'train' needs a training corpus; use it with a data module that has one")
    settings = asdict(spec)
    if settings["alpha"] == 1.0:
        del settings["alpha"]  # the cache keys of tokenizers trained before alpha existed
    if not settings["special_tokens"]:
        del settings["special_tokens"]  # ... and before special_tokens existed
    key = hashlib.sha256(json.dumps([settings, corpus_key], sort_keys=True).encode()).hexdigest()[:16]
    target = cache_root() / "tokenizers" / f"{spec.train}-{key}"
    if not (target / "tokenizer.json").exists():
        texts, record = corpus(), None
        if isinstance(texts, Mapping):
            texts, record = balanced_texts(texts, spec.alpha)
        tok = _train(spec, texts, record["languages"] if record else None)
        with atomic_dir(target) as tmp:
            tok.save_pretrained(tmp)
            if record is not None:
                (tmp / LANGUAGES_FILE).write_text(json.dumps(record, indent=2, sort_keys=True), encoding="utf-8")
    return AutoTokenizer.from_pretrained(str(target), trust_remote_code=False)


def tokenizer_languages(tokenizer) -> Optional[list[str]]:
    """The languages a tokenizer was trained on (``LANGUAGES_KEY`` of its config), or None when it does not say."""
    languages = (getattr(tokenizer, "init_kwargs", None) or {}).get(LANGUAGES_KEY)
    return list(languages) if languages else None


def check_languages(tokenizer, languages: Iterable[str]) -> None:
    """Refuse languages a tokenizer was not trained on (when it records its languages)."""
    known = tokenizer_languages(tokenizer)
    missing = [lang for lang in languages if known is not None and lang not in known]
    if missing:
        raise PtmError(f"the tokenizer {tokenizer.name_or_path} was trained without {', '.join(missing)} (it knows "
                       f"{', '.join(known)}); train one on those languages (tokenizer: {{train: unigram}}) or drop them")


def unknown_share(tokenizer, text: str) -> tuple[float, int, int]:
    """How much of ``text`` the tokenizer cannot write: the share of its non-space characters inside pieces that are
    the unknown token (a Unigram tokenizer makes a whole unseen word one unknown piece), and the counts of unknown
    and all pieces.  (0, 0, n) for a tokenizer without an unknown token (byte-level BPE)."""
    unk = tokenizer.unk_token_id
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, spans = enc["input_ids"], enc["offset_mapping"]
    if unk is None or not ids or unk in (tokenizer.eos_token_id, tokenizer.pad_token_id):
        return 0.0, 0, len(ids)
    covered = {i for (a, b), t in zip(spans, ids) if t == unk for i in range(a, b) if not text[i].isspace()}
    chars = sum(not c.isspace() for c in text)
    return len(covered) / max(chars, 1), sum(t == unk for t in ids), len(ids)


def check_representable(tokenizer, texts: Iterable[str], what: str = "--text") -> None:
    """Refuse a text in a script the tokenizer cannot write: more than ``UNKNOWN_SHARE_LIMIT`` of its characters in
    unknown pieces."""
    for text in texts:
        share, unknown, pieces = unknown_share(tokenizer, text)
        if share > UNKNOWN_SHARE_LIMIT:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise PtmError(f"{what} {shown!r}: {unknown} of its {pieces} pieces are the unknown token "
                           f"{tokenizer.unk_token} ({share:.0%} of its characters): the tokenizer cannot represent "
                           f"its script; use a model whose tokenizer was trained on that language")


def _train(spec: TokenizerSpec, texts: Iterable[str], languages: Optional[list[str]] = None):
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
    elif spec.train == "unigram":  # SentencePiece's Unigram LM (XLM-R): words marked by U+2581, not pre-split
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), *([normalizers.Lowercase()] if spec.lowercase else [])])
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=spec.vocab_size, special_tokens=BERT_SPECIALS + extra,
                                          unk_token="[UNK]", show_progress=False)
        texts = list(texts)
        try:
            tok.train_from_iterator(texts, trainer=trainer)
        except Exception as exc:  # the Rust trainer's own message, e.g. fewer pieces than characters
            chars = len({c for t in texts for c in t})
            raise PtmError(f"tokenizer: Unigram training failed ({exc}); the corpus has {chars} distinct characters: "
                           f"set tokenizer.vocab_size well above that (now {spec.vocab_size})") from None
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
    if languages:
        names[LANGUAGES_KEY] = list(languages)
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
