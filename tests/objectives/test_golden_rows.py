"""Golden rows: for each pre-training family, the surveys' canonical example "I am happy to join with you today"
through the family's collator with a fixed seed and key, and the exact inputs, labels and attention masks it must
give.  Any change to how a family corrupts its input shows up here as a changed row, to be checked against the
paper before the expected values are rewritten."""
import torch

from ptm_app.data.collators import CLMCollator, MLMCollator, TLMCollator
from ptm_app.data.parallel import tlm_example
from ptm_app.objectives.plm import PLMCollator
from ptm_app.objectives.seq2seq import Seq2SeqCollator
from ptm_app.objectives.unilm import UniLMCollator

PAD, UNK, CLS, SEP, MASK, FULL_STOP, EOS = 0, 1, 2, 3, 4, 18, 19
SPECIAL = (PAD, UNK, CLS, SEP, MASK)
V = 40
NAMES = {PAD: "[PAD]", UNK: "[UNK]", CLS: "[CLS]", SEP: "[SEP]", MASK: "[MASK]", FULL_STOP: ".", EOS: "</s>",
         **dict(zip(range(10, 18), "I am happy to join with you today".split())),
         **dict(zip(range(20, 31), ["i", "am", "hap", "##py", "to", "jo", "##in", "with", "you", "to", "##day"])),
         **dict(zip(range(31, 36), "estoy feliz de unirme hoy".split())),
         **{36 + i: f"<X{i}>" for i in range(4)}}
SENTENCE = [CLS, *range(10, 18), SEP]  # [CLS] I am happy to join with you today [SEP]
PIECES = [CLS, *range(20, 31), SEP]  # [CLS] i am hap ##py to jo ##in with you to ##day [SEP]
WORD_START = torch.tensor([not NAMES.get(i, "").startswith("##") for i in range(V)])


def words(ids) -> str:
    return " ".join("-" if int(i) == -100 else NAMES.get(int(i), str(int(i))) for i in ids)


def rows(tensor: torch.Tensor) -> list[str]:
    return [words(r) for r in tensor]


def bits(mask: torch.Tensor) -> list[str]:
    return ["".join(str(int(x)) for x in row) for row in mask]


def example(ids, key, **fields) -> dict:
    return {"input_ids": torch.tensor(ids), "key": key, **fields}


def mlm(**kw) -> MLMCollator:
    return MLMCollator(pad_token_id=PAD, mask_token_id=MASK, special_ids=SPECIAL, vocab_size=V, **kw)


def test_token_mlm_golden():
    """BERT §3.1: 15 % of the non-special tokens; [MASK] / random / unchanged; padding and specials untouched."""
    b = mlm(seed=5)([example(SENTENCE, (0, 0)), example([CLS, 10, 11, 12, SEP], (0, 10))])
    assert rows(b["input_ids"]) == ["[CLS] I am happy today join with [MASK] today [SEP]",
                                    "[CLS] I am [MASK] [SEP] [PAD] [PAD] [PAD] [PAD] [PAD]"]
    assert rows(b["labels"]) == ["- - - - to - - you - -", "- - - happy - - - - - -"]
    assert b["attention_mask"].tolist() == [[1] * 10, [1] * 5 + [0] * 5]


def test_whole_word_mlm_golden():
    """BERT-wwm: both pieces of "jo ##in" are chosen together."""
    b = mlm(seed=5, masking="whole_word", word_start=WORD_START)([example(PIECES, (0, 0))])
    assert rows(b["input_ids"]) == ["[CLS] i am hap ##py to [MASK] [MASK] with you to ##day [SEP]"]
    assert rows(b["labels"]) == ["- - - - - - jo ##in - - - - -"]
    assert b["attention_mask"].tolist() == [[1] * 13]


def test_span_mlm_and_sbo_golden():
    """SpanBERT §3.1–3.2 on a pair row: the span stays inside segment A, its boundaries are [CLS] and the inner
    [SEP], the SBO offsets count from the left boundary."""
    pair = [CLS, 20, 21, 22, 23, 24, SEP, 25, 26, 27, 28, 29, 30, SEP]
    b = mlm(seed=3, masking="span", word_start=WORD_START, mlm_probability=0.3)(
        [example(pair, (0, 0), token_type_ids=torch.tensor([0] * 7 + [1] * 7))])
    assert rows(b["input_ids"]) == ["[CLS] [MASK] [MASK] [MASK] [MASK] [MASK] [SEP] jo ##in with you to ##day [SEP]"]
    assert rows(b["labels"]) == ["- i am hap ##py to - - - - - - - -"]
    assert {k: v.tolist() for k, v in b["sbo"].items()} == {
        "rows": [0] * 5, "left": [0] * 5, "right": [6] * 5, "offset": [0, 1, 2, 3, 4], "pos": [1, 2, 3, 4, 5]}
    assert b["attention_mask"].tolist() == [[1] * 14] and b["token_type_ids"].tolist() == [[0] * 7 + [1] * 7]


def test_causal_lm_golden():
    """GPT: the labels are the inputs (the model shifts them); padding and a packed document's first token are
    not targets."""
    b = CLMCollator(pad_token_id=PAD)([example([10, 11, 12, 13, EOS], (0, 0), document_ids=torch.tensor([0, 0, 0, 1, 1])),
                                       example([14, 15], (0, 1), document_ids=torch.tensor([0, 0]))])
    assert rows(b["input_ids"]) == ["I am happy to </s>", "join with [PAD] [PAD] [PAD]"]
    assert rows(b["labels"]) == ["I am happy - </s>", "join with - - -"]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]


def test_permutation_lm_golden():
    """XLNet §2.2–2.3, both streams: the order puts the context first and the targets (I am happy to) in the order
    I, happy, am, to; perm_mask[i, j] = 1 hides j from i in the query stream: a target sees the context and the
    targets before it, never itself, the context sees no target; in the content stream a token also sees itself."""
    xlnet_row = [*range(10, 18), SEP, CLS]  # XLNet puts <sep> <cls> at the end
    b = PLMCollator(pad_token_id=PAD, special_ids=SPECIAL, seed=3)([example(xlnet_row, (0, 0))])
    assert rows(b["input_ids"]) == ["I am happy to join with you today [SEP] [CLS]"]  # inputs untouched
    assert rows(b["labels"]) == ["I am happy to"]
    assert bits(b["target_mapping"][0]) == ["1000000000", "0100000000", "0010000000", "0001000000"]
    assert bits(b["perm_mask"][0]) == ["1111000000", "0101000000", "0111000000", "0001000000"] + ["1111000000"] * 6
    # the content stream is the query stream's mask with each token's own column opened (as XLNetModel builds it)
    content = (b["perm_mask"][0] + (1 - b["attention_mask"][0])[None, :] - torch.eye(10)) > 0
    assert bits(content) == ["0111000000", "0001000000", "0101000000", "0000000000"] + ["1111000000"] * 6
    assert b["attention_mask"].tolist() == [[1] * 10]


def seq2seq(noise: str, seed: int, **kw) -> Seq2SeqCollator:
    return Seq2SeqCollator(pad_token_id=PAD, eos_token_id=EOS, mask_token_id=MASK, special_ids=SPECIAL, noise=noise,
                           seed=seed, **kw)


def test_mass_golden():
    """MASS §2.2: half the sentence as one fragment, one [MASK] per token in the encoder; the decoder gets [MASK]
    then the fragment (teacher forcing) at the fragment's original positions and predicts the fragment + EOS."""
    b = seq2seq("mass", 0)([example(SENTENCE, (0, 0)), example([CLS, 10, 11, 12, SEP], (0, 1))])
    assert rows(b["input_ids"]) == ["I [MASK] [MASK] [MASK] [MASK] with you today </s>",
                                    "I [MASK] [MASK] </s> [PAD] [PAD] [PAD] [PAD] [PAD]"]
    assert rows(b["decoder_input_ids"]) == ["[MASK] am happy to join", "[MASK] am happy [PAD] [PAD]"]
    assert b["decoder_position_ids"].tolist() == [[1, 2, 3, 4, 5], [1, 2, 3, 0, 0]]
    assert rows(b["labels"]) == ["am happy to join </s>", "am happy </s> - -"]
    assert b["attention_mask"].tolist() == [[1] * 9, [1] * 4 + [0] * 5]


def test_t5_golden():
    """T5 §3.1.4: 15 % noise, each span one sentinel; the target lists each sentinel with its span, then a final
    sentinel."""
    b = seq2seq("t5_span", 2, sentinel_ids=(36, 37, 38, 39))([example(SENTENCE, (0, 0))])
    assert rows(b["input_ids"]) == ["I am happy to join with you <X0> </s>"]
    assert rows(b["labels"]) == ["<X0> today <X1> </s>"]
    assert "decoder_input_ids" not in b and b["attention_mask"].tolist() == [[1] * 9]


def test_bart_golden():
    """BART §2.2 (its best pair, §5.1): the two sentences permuted, then text infilling: a Poisson span
    ("you today .") replaced by one [MASK]; the target is the clean text."""
    two_sentences = [CLS, 10, 11, 12, FULL_STOP, 13, 14, 15, 16, 17, FULL_STOP, SEP]
    b = seq2seq("bart", 8, full_stop_ids=(FULL_STOP,))([example(two_sentences, (0, 0))])
    assert rows(b["input_ids"]) == ["to join with [MASK] I am happy . </s>"]
    assert rows(b["labels"]) == ["I am happy . to join with you today . </s>"]
    assert b["attention_mask"].tolist() == [[1] * 9]


def unilm(mode: str) -> dict:
    collate = UniLMCollator(pad_token_id=PAD, mask_token_id=MASK, special_ids=SPECIAL, vocab_size=V, seed=2,
                            mode_weights={mode: 1.0})
    return collate([example(SENTENCE, (0, 0)), example([CLS, 10, 11, 12, SEP], (0, 1))])


UNILM_INPUTS = ["[CLS] I am happy to join with you today [SEP]", "[CLS] I am [MASK] [SEP] [PAD] [PAD] [PAD] [PAD] [PAD]"]
UNILM_LABELS = ["- - - happy - - - - - -", "- - - happy - - - - - -"]
PADDED_ROWS = ["0000010000", "0000001000", "0000000100", "0000000010", "0000000001"]  # padding sees only itself


def test_unilm_bidirectional_golden():
    """UniLM §2.2: every token sees every real token."""
    b = unilm("bidirectional")
    assert rows(b["input_ids"]) == UNILM_INPUTS and rows(b["labels"]) == UNILM_LABELS
    assert bits(b["attention_3d"][0]) == ["1111111111"] * 10
    assert bits(b["attention_3d"][1]) == ["1111100000"] * 5 + PADDED_ROWS


def test_unilm_left_to_right_golden():
    """UniLM §2.2: each token sees itself and the tokens on its left."""
    b = unilm("left_to_right")
    assert rows(b["input_ids"]) == UNILM_INPUTS and rows(b["labels"]) == UNILM_LABELS
    assert bits(b["attention_3d"][0]) == ["1" * (i + 1) + "0" * (9 - i) for i in range(10)]
    assert bits(b["attention_3d"][1]) == ["1" * (i + 1) + "0" * (9 - i) for i in range(5)] + PADDED_ROWS


def test_unilm_seq2seq_golden():
    """UniLM §2.2: the source ([CLS] I am) sees the source; the target sees the source and its own left context."""
    b = unilm("seq2seq")
    assert rows(b["input_ids"]) == UNILM_INPUTS and rows(b["labels"]) == UNILM_LABELS
    assert b["token_type_ids"].tolist() == [[0, 0, 0] + [1] * 7, [0, 0, 0, 1, 1, 0, 0, 0, 0, 0]]
    assert bits(b["attention_3d"][0]) == ["1110000000"] * 3 + ["1" * (i + 1) + "0" * (9 - i) for i in range(3, 10)]
    assert bits(b["attention_3d"][1]) == ["1110000000"] * 3 + ["1111000000", "1111100000"] + PADDED_ROWS


def test_tlm_golden():
    """XLM §3.3: BERT masking over both sentences of a translation pair ("I" and "feliz"), language ids per
    sentence, positions restarting at the second sentence."""
    pair = {**tlm_example([10, 11, 12], [31, 32], (0, 1), cls_id=CLS, sep_id=SEP, max_length=32), "key": (0, 0)}
    b = TLMCollator(pad_token_id=PAD, mask_token_id=MASK, special_ids=SPECIAL, vocab_size=V, seed=5)([pair])
    assert rows(b["input_ids"]) == ["[CLS] [MASK] am happy [SEP] estoy [MASK] [SEP]"]
    assert rows(b["labels"]) == ["- I - - - - feliz -"]
    assert b["langs"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 1]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert b["attention_mask"].tolist() == [[1] * 8]
