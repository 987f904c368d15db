"""WordNet-derived task proxies from Debian's ``wordnet-base`` package (WordNet 3.0).

Three labelled sets, all clearly *proxies* derived from WordNet (they are not GLUE, not SQuAD):

- ``wordnet_qa``: SQuAD-format extractive QA. Question = a synset's definition, context = one of its example
  sentences that contains one of its lemmas, answer = that lemma's span in the example.
- ``wordnet_pairs``: pair classification, definition <-> lemma: ``match`` (a lemma of the synset) or
  ``mismatch`` (a lemma of another synset of the same part of speech), 1:1.
- ``wordnet_supersense``: single-sentence classification, definition -> lexicographer file (supersense) of
  the noun and verb synsets (41 classes), subsampled to 20,000 records.

The .deb is fetched with ``apt-get download wordnet-base=1:3.0-37`` (nothing is installed) and read with
Python (ar archive -> data.tar.xz -> usr/share/wordnet/data.* and *.exc); its sha256 is pinned below. The
value observed on the first download equals the SHA256 field of Debian bookworm's package index
(``apt-cache show wordnet-base=1:3.0-37``).

Reading a data line (wndb(5WN)): ``offset lex_filenum ss_type w_cnt word lex_id [word lex_id...] p_cnt
[ptr...] [frames...] | gloss``; w_cnt is hexadecimal, words use '_' for spaces, adjectives may carry a syntactic
marker ``(a)``, ``(p)`` or ``(ip)`` (dropped). The gloss is split at ';' into the definition (the parts that do
not start with '"') and the example sentences (the parts that do; a quoted example containing ';' is kept
whole, the text after the closing quote, e.g. an attribution "- Shakespeare", is dropped).
"""
from __future__ import annotations

import functools
import random
import re
from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ptm_app.data.sources.fetch import Artifact, deb_files, progress


# Pinned on the first download (2024 bookworm mirror); equals the SHA256 in Debian's package index.
DEB_SHA256 = "61060d960f9ada8fa120872312eccd3ecebfbab8c4579e4f5a74e1cf67620752"
ARTIFACT = Artifact("apt", "wordnet-base", "1:3.0-37", "wordnet-base_1%3a3.0-37_all.deb", DEB_SHA256)
SEED = 1234
SUPERSENSE_MAX = 20_000
CHOICE_MAX, CHOICES = 20_000, 4
LICENCE = ("WordNet 3.0 licence (Princeton University; permissive, BSD-like: use, copy, modify and distribute "
           "with the copyright notice); Debian packaging GPL-2+")
_DERIVED = "wordnet-base 1:3.0-37 (Debian bookworm .deb): usr/share/wordnet/data.{noun,verb,adj,adv}"
POS = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
_ROOT = "usr/share/wordnet/"

# lexnames(5WN): lexicographer file number -> name (the supersense). The noun.* and verb.* files
# (03-43, 41 classes) are the labels of wordnet_supersense.
LEXNAMES: dict[int, str] = {
    0: "adj.all", 1: "adj.pert", 2: "adv.all", 3: "noun.Tops", 4: "noun.act", 5: "noun.animal",
    6: "noun.artifact", 7: "noun.attribute", 8: "noun.body", 9: "noun.cognition", 10: "noun.communication",
    11: "noun.event", 12: "noun.feeling", 13: "noun.food", 14: "noun.group", 15: "noun.location",
    16: "noun.motive", 17: "noun.object", 18: "noun.person", 19: "noun.phenomenon", 20: "noun.plant",
    21: "noun.possession", 22: "noun.process", 23: "noun.quantity", 24: "noun.relation", 25: "noun.shape",
    26: "noun.state", 27: "noun.substance", 28: "noun.time", 29: "verb.body", 30: "verb.change",
    31: "verb.cognition", 32: "verb.communication", 33: "verb.competition", 34: "verb.consumption",
    35: "verb.contact", 36: "verb.creation", 37: "verb.emotion", 38: "verb.motion", 39: "verb.perception",
    40: "verb.possession", 41: "verb.social", 42: "verb.stative", 43: "verb.weather", 44: "adj.ppl",
}
SUPERSENSES = tuple(name for name in LEXNAMES.values() if name.startswith(("noun.", "verb.")))


@dataclass(frozen=True)
class Synset:
    id: str  # "<8-digit offset>-<n|v|a|r>", e.g. 00001740-n (offsets are unique within a part of speech)
    pos: str  # the word class: noun | verb | adj | adv (adjective satellites count as adj)
    lexfile: int
    lemmas: tuple[str, ...]  # '_' -> ' ', adjective markers dropped, in WordNet's order
    definition: str
    examples: tuple[str, ...]
    # wndb(5WN) pointers: (symbol, target synset id, source word number, target word number); 0/0 = the synsets
    pointers: tuple[tuple[str, str, int, int], ...] = ()


# ---------------------------------------------------------------------------------------------- reading
def _split_gloss(gloss: str) -> tuple[str, tuple[str, ...]]:
    """(definition, example sentences) of a gloss."""
    parts = gloss.split(";")
    definition, examples, i = [], [], 0
    while i < len(parts):
        part = parts[i].strip()
        i += 1
        if not part.startswith('"'):
            if part:
                definition.append(part)
            continue
        # an example with ';' inside its quotes: join the following parts up to the closing quote
        while part.count('"') % 2 and i < len(parts) and '"' in parts[i] and not parts[i].strip().startswith('"'):
            part += ";" + parts[i]
            i += 1
        body = part[1:part.rindex('"')] if part.count('"') >= 2 else part[1:]
        if body.strip():
            examples.append(body.strip())
    return "; ".join(definition), tuple(examples)


def _parse(pos: str, text: str) -> list[Synset]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("  "):  # licence header
            continue
        head, sep, gloss = line.partition(" | ")
        f = head.split()
        n_words = int(f[3], 16)
        lemmas = tuple(dict.fromkeys(re.sub(r"\((a|p|ip)\)$", "", f[4 + 2 * i]).replace("_", " ")
                                     for i in range(n_words)))
        definition, examples = _split_gloss(gloss.strip()) if sep else ("", ())
        at = 4 + 2 * n_words  # p_cnt, then per pointer: symbol offset pos source/target (2 + 2 hex digits)
        pointers = tuple((f[i], f"{f[i + 1]}-{f[i + 2] if f[i + 2] != 's' else 'a'}", int(f[i + 3][:2], 16),
                          int(f[i + 3][2:], 16)) for i in range(at + 1, at + 1 + 4 * int(f[at]), 4))
        out.append(Synset(f"{f[0]}-{f[2] if f[2] != 's' else 'a'}", pos, int(f[1]), lemmas, definition, examples,
                          pointers))
    return out


def _exceptions(text: str) -> dict[str, list[str]]:
    """base form -> irregular inflected forms, from a ``*.exc`` file (``inflected base [base...]``)."""
    out: dict[str, list[str]] = defaultdict(list)
    for line in text.splitlines():
        words = line.split()
        for base in words[1:]:
            out[base.replace("_", " ")].append(words[0].replace("_", " "))
    return dict(out)


@functools.lru_cache(maxsize=2)
def _load(path: str, size: int, mtime_ns: int) -> tuple[tuple[Synset, ...], dict[str, dict[str, list[str]]]]:
    names = [f"{_ROOT}data.{p}" for p in POS.values()] + [f"{_ROOT}{p}.exc" for p in POS.values()]
    files = deb_files(Path(path), names)
    synsets = []
    for p in progress(list(POS.values()), "wordnet: reading synsets"):
        synsets += _parse(p, files[f"{_ROOT}data.{p}"].decode("utf-8", "replace"))
    exceptions = {p: _exceptions(files[f"{_ROOT}{p}.exc"].decode("utf-8", "replace")) for p in POS.values()}
    return tuple(sorted(synsets, key=lambda s: s.id)), exceptions


def load(deb: Path) -> tuple[tuple[Synset, ...], dict[str, dict[str, list[str]]]]:
    """All synsets sorted by id and the irregular forms per part of speech (cached per file version)."""
    st = deb.stat()
    return _load(str(deb), st.st_size, st.st_mtime_ns)


def _base_stats(synsets: tuple[Synset, ...]) -> dict:
    return {"synsets": len(synsets), "synsets_by_word_class": dict(sorted(Counter(s.pos for s in synsets).items())),
            "examples": sum(len(s.examples) for s in synsets),
            "synsets_without_definition": sum(not s.definition for s in synsets)}


# ---------------------------------------------------------------------------------------------- QA proxy
_CONS_Y = re.compile(r"[^aeiou]y$")
_CVC = re.compile(r"(?:^|[^aeiou])[aeiou][^aeiouwxy]$")


def _regular(word: str, pos: str) -> list[str]:
    """Regular inflections of one (lower-case) word: noun plurals; verb -s, -ed, -ing forms."""
    if pos == "noun":
        forms = [word + "s", word + "es"]
        if _CONS_Y.search(word):
            forms.append(word[:-1] + "ies")
        return forms
    if pos == "verb":
        forms = [word + "s", word + "es", word + "ed", word + "ing"]
        if word.endswith("e"):
            forms += [word + "d", word[:-1] + "ing"]
        if _CONS_Y.search(word):
            forms += [word[:-1] + "ies", word[:-1] + "ied"]
        if _CVC.search(word):
            forms += [word + word[-1] + "ed", word + word[-1] + "ing"]
        return forms
    return []


def surface_forms(lemma: str, pos: str, exceptions: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(lower-case form, kind) pairs that count as an occurrence of ``lemma``; kind = exact|irregular|regular.

    Irregular forms come from WordNet's own exception list of that part of speech (ran -> run, geese -> goose,
    better -> good). Regular inflections (see ``_regular``) apply to nouns and verbs only, to the head word of
    a multi-word lemma: the last word of a noun (attorney generals), the first word of a verb (took off).
    """
    lem = lemma.lower()
    out = [(lem, "exact")] + [(f.lower(), "irregular") for f in exceptions.get(lem, ())]
    words = lem.split(" ")
    head = len(words) - 1 if pos == "noun" else 0
    if pos in ("noun", "verb"):
        if len(words) > 1:  # irregular forms of a multi-word lemma's head word (took off, attorneys general)
            for form in exceptions.get(words[head], ()):
                out.append((" ".join(words[:head] + [form.lower()] + words[head + 1:]), "irregular"))
        for form in _regular(words[head], pos):
            out.append((" ".join(words[:head] + [form] + words[head + 1:]), "regular"))
    return out


def _forms(syn: Synset, exceptions: dict[str, list[str]]) -> dict[str, tuple[str, str]]:
    """lower-case form -> (lemma, kind); earlier lemmas, then exact forms, win a shared form."""
    forms: dict[str, tuple[str, str]] = {}
    for lemma in syn.lemmas:
        for form, kind in surface_forms(lemma, syn.pos, exceptions):
            forms.setdefault(form, (lemma, kind))
    return forms


def _is_word(ch: str) -> bool:  # the regex \w class: letters, digits, underscore
    return ch.isalnum() or ch == "_"


def find_answer(text: str, forms: Collection[str]) -> tuple[int, str] | None:
    """(start, form) of the leftmost whole-word, case-insensitive occurrence of a form (longest at a tie)."""
    low = text.lower()
    if len(low) != len(text):  # lower() changed the length (rare non-ASCII): fall back to a regex
        alts = "|".join(re.escape(f) for f in sorted(forms, key=lambda f: (-len(f), f)))
        m = re.search(rf"(?<!\w)(?:{alts})(?!\w)", text, re.IGNORECASE)
        return (m.start(), m.group(0).lower()) if m else None
    best: tuple[int, int, str] | None = None
    for form in forms:
        start = low.find(form)
        while start != -1 and (best is None or start <= best[0]):
            end = start + len(form)
            if (start == 0 or not _is_word(low[start - 1])) and (end == len(low) or not _is_word(low[end])):
                if best is None or (start, -len(form)) < (best[0], -best[1]):
                    best = (start, len(form), form)
                break
            start = low.find(form, start + 1)
    return (best[0], best[2]) if best else None


def read_qa(deb: Path) -> tuple[list[dict], dict]:
    synsets, exceptions = load(deb)
    records: list[dict] = []
    kinds: Counter = Counter()
    stats = _base_stats(synsets)
    no_def = 0
    for syn in progress(synsets, "wordnet_qa: matching lemmas in examples"):
        if not syn.examples:
            continue
        if not syn.definition:
            no_def += len(syn.examples)
            continue
        forms = _forms(syn, exceptions[syn.pos])
        for k, example in enumerate(syn.examples, start=1):
            found = find_answer(example, forms)
            if found is None:
                kinds["unmatched"] += 1
                continue
            start, form = found
            lemma, kind = forms[form]
            kinds[kind] += 1
            span = example[start:start + len(form)]
            records.append({"id": f"{syn.id}:{k}", "question": syn.definition, "context": example,
                            "answers": {"text": [span], "answer_start": [start]},
                            "lemma": lemma, "synset": syn.id, "word_class": syn.pos})
    stats.update({
        "examples_skipped_no_definition": no_def,
        "examples_unmatched": kinds["unmatched"],
        "answers_exact_lemma": kinds["exact"], "answers_irregular_form": kinds["irregular"],
        "answers_regular_inflection": kinds["regular"],
        "records": len(records), "synsets_with_records": len({r["synset"] for r in records}),
        "records_by_word_class": dict(sorted(Counter(r["word_class"] for r in records).items())),
    })
    return records, stats


# ---------------------------------------------------------------------------------------------- pairs
def read_pairs(deb: Path) -> tuple[list[dict], dict]:
    synsets, _ = load(deb)
    usable = [s for s in synsets if s.definition and s.lemmas]
    by_pos: dict[str, list[Synset]] = defaultdict(list)
    same_definition: dict[tuple[str, str], set[str]] = defaultdict(set)  # lemmas of all synsets sharing it
    for s in usable:
        by_pos[s.pos].append(s)
        same_definition[s.pos, s.definition].update(lem.lower() for lem in s.lemmas)
    rng = random.Random(SEED)
    records: list[dict] = []
    resampled = 0
    for syn in progress(usable, "wordnet_pairs: sampling negatives"):
        own = same_definition[syn.pos, syn.definition]
        pool = by_pos[syn.pos]
        while True:
            other = pool[rng.randrange(len(pool))]
            negative = other.lemmas[rng.randrange(len(other.lemmas))]
            if other.id != syn.id and negative.lower() not in own:
                break
            resampled += 1
        common = {"synset": syn.id, "word_class": syn.pos, "text": syn.definition}
        records.append({"id": f"{syn.id}:match", **common, "text_pair": syn.lemmas[0], "label": "match"})
        records.append({"id": f"{syn.id}:mismatch", **common, "text_pair": negative, "label": "mismatch"})
    stats = _base_stats(synsets)
    stats.update({"synsets_used": len(usable), "records": len(records),
                  "labels": dict(sorted(Counter(r["label"] for r in records).items())),
                  "negatives_resampled": resampled})
    return records, stats


# ---------------------------------------------------------------------------------------------- choice
def read_choice(deb: Path) -> tuple[list[dict], dict]:
    """A word and four definitions, one its own (multiple choice; see ``CHOICE``)."""
    synsets, _ = load(deb)
    usable = [s for s in synsets if s.definition and s.lemmas]
    by_pos: dict[str, list[Synset]] = defaultdict(list)
    for s in usable:
        by_pos[s.pos].append(s)
    rng = random.Random(SEED)
    picked = sorted(rng.sample(range(len(usable)), min(CHOICE_MAX, len(usable))))
    records, resampled = [], 0
    for i in progress(picked, "wordnet_choice: drawing distractors"):
        syn = usable[i]
        word = syn.lemmas[0]
        pool, options = by_pos[syn.pos], [syn.definition]
        while len(options) < CHOICES:
            other = pool[rng.randrange(len(pool))]
            if other.definition in options or word.lower() in (lem.lower() for lem in other.lemmas):
                resampled += 1  # the same definition, or a definition the word also has: not a wrong answer
                continue
            options.append(other.definition)
        rng.shuffle(options)
        records.append({"id": syn.id, "word_class": syn.pos, "text": word, "choices": options,
                        "label": options.index(syn.definition)})
    stats = _base_stats(synsets)
    stats.update({"synsets_usable": len(usable), "records": len(records), "distractors_resampled": resampled,
                  "answer_positions": dict(sorted(Counter(r["label"] for r in records).items()))})
    return records, stats


# ---------------------------------------------------------------------------------------------- supersense
def _proportional(sizes: dict[str, int], total: int) -> dict[str, int]:
    """Largest-remainder allocation of ``total`` over the classes, proportional to their sizes."""
    n = sum(sizes.values())
    if n <= total:
        return dict(sizes)
    quotas = {c: size * total / n for c, size in sizes.items()}
    alloc = {c: int(q) for c, q in quotas.items()}
    for c in sorted(quotas, key=lambda c: (alloc[c] - quotas[c], c))[:total - sum(alloc.values())]:
        alloc[c] += 1
    return alloc


def read_supersense(deb: Path) -> tuple[list[dict], dict]:
    synsets, _ = load(deb)
    candidates = [s for s in synsets if s.pos in ("noun", "verb") and s.definition]
    shared = Counter(s.definition for s in candidates)
    pool: dict[str, list[Synset]] = defaultdict(list)
    for s in candidates:
        if shared[s.definition] == 1:  # a definition of several synsets would be one text in several places
            pool[LEXNAMES[s.lexfile]].append(s)
    alloc = _proportional({c: len(v) for c, v in pool.items()}, SUPERSENSE_MAX)
    rng = random.Random(SEED)
    chosen: list[tuple[Synset, str]] = []
    for label in progress(sorted(pool), "wordnet_supersense: sampling"):
        chosen += [(s, label) for s in rng.sample(pool[label], alloc[label])]
    records = [{"id": s.id, "text": s.definition, "label": label}
               for s, label in sorted(chosen, key=lambda x: x[0].id)]
    counts = Counter(r["label"] for r in records)
    majority, n_majority = counts.most_common(1)[0]
    stats = _base_stats(synsets)
    stats.update({"noun_verb_synsets_with_definition": len(candidates),
                  "dropped_shared_definition": len(candidates) - sum(len(v) for v in pool.values()),
                  "eligible": sum(len(v) for v in pool.values()), "records": len(records), "classes": len(counts),
                  "majority_class": majority, "majority_share": round(n_majority / len(records), 4)})
    return records, stats


# ---------------------------------------------------------------------------------------------- registry
_COMMON = dict(KIND="task", ARTIFACT=ARTIFACT, LICENCE=LICENCE, FORMAT_VERSION=1)
QA = SimpleNamespace(
    **_COMMON, read=read_qa, SPLIT_BY="word_class", GROUP_BY="synset", PRIVATE_FIELDS=("word_class",),
    DESCRIPTION=("WordNet-derived extractive QA proxy in SQuAD format (NOT SQuAD): question = a synset's "
                 "definition, context = one of its example sentences, answer = the span of one of its lemmas "
                 "(or an inflection) in that sentence; split by synset."),
    DERIVED_FROM=_DERIVED + " and {noun,verb,adj,adv}.exc (irregular forms)",
    DERIVATION={
        "record": "one per (synset, example sentence) where a form of one of the synset's lemmas occurs in "
                  "the example; synsets without a definition are skipped",
        "match": "case-insensitive, whole words: the form is neither preceded nor followed by a letter, digit "
                 "or '_' (a hyphen is a boundary); the leftmost occurrence wins, the longest form at that "
                 "position; a form shared by two lemmas goes to the first lemma in WordNet's order",
        "forms": "the lemma itself ('_' read as a space); its irregular forms from WordNet's <pos>.exc "
                 "(ran -> run, geese -> goose, better -> good); for nouns the regular plurals +s, +es, y -> ies "
                 "and for verbs +s, +es, +ed, +ing, e-final +d and e -> ing, y -> ies / ied, a doubled final "
                 "consonant after a single vowel (+Ced, +Cing), applied to the head word of a multi-word lemma "
                 "(last word of a noun, first word of a verb); adjectives and adverbs: exact and irregular only",
        "answer": "answers.text[0] == context[answer_start[0]:answer_start[0] + len(text)] (the span as written "
                  "in the example, original case); lemma = the WordNet lemma it is a form of",
    },
    FIELDS={
        "id": "<synset>:<k>, k = 1-based number of the example sentence within the synset's gloss",
        "question": "the synset's definition (gloss without the examples)",
        "context": "the example sentence (quotes removed)",
        "answers": "SQuAD format: {text: [span], answer_start: [character offset in context]}",
        "lemma": "the WordNet lemma whose form is the answer ('_' as space)",
        "synset": "<offset>-<n|v|a|r>, e.g. 00001740-n (all records of a synset are in one split)",
    },
)
PAIRS = SimpleNamespace(
    **_COMMON, read=read_pairs, SPLIT_BY="word_class", GROUP_BY="synset",
    PRIVATE_FIELDS=("word_class", "synset"),
    DESCRIPTION=("WordNet-derived pair classification proxy (NOT GLUE): definition <-> lemma, 'match' or "
                 "'mismatch', balanced 1:1; split by synset."),
    DERIVED_FROM=_DERIVED,
    DERIVATION={
        "positive": "every synset with a definition: (definition, its first lemma) -> match",
        "negative": f"for each such synset, in synset-id order, with one random.Random({SEED}): a random synset "
                    "of the same part of speech, then a random lemma of it; drawn again while the synset is the "
                    "same or the lemma (case-insensitive) is a lemma of the positive synset or of any synset of "
                    "that part of speech with the very same definition -> mismatch",
        "split": "the match and mismatch records of a synset share its definition and stay in one split "
                 "(grouped by synset, stratified by part of speech; both used for splitting only)",
    },
    FIELDS={
        "id": "<synset>:match or <synset>:mismatch, synset = <offset>-<n|v|a|r>",
        "text": "the synset's definition",
        "text_pair": "a lemma ('_' as space)",
        "label": "match | mismatch",
    },
)
SUPERSENSE = SimpleNamespace(
    **_COMMON, read=read_supersense, SPLIT_BY="label", SPLIT_UNIT="synset",
    DESCRIPTION=(f"WordNet-derived single-sentence classification: noun/verb definition -> supersense "
                 f"(lexicographer file, 41 classes); subsampled to {SUPERSENSE_MAX:,} synsets."),
    DERIVED_FROM=_DERIVED,
    DERIVATION={
        "classes": "lexicographer files 03-43 of lexnames(5WN): noun.Tops ... noun.time, verb.body ... "
                   "verb.weather (41); the full 45-entry table is LEXNAMES in ptm_app/data/sources/wordnet.py",
        "text": "the definition only (examples are left out: they often contain the lemma)",
        "eligible": "noun and verb synsets whose definition is not the definition of another noun or verb "
                    "synset (shared definitions would put one text in several splits, some with two labels)",
        "subsample": f"of the eligible synsets at most {SUPERSENSE_MAX:,} are kept, allocated to the "
                     "classes in proportion to their sizes (largest remainder), each class sampled with "
                     f"random.Random({SEED}).sample over its synsets in id order, classes in name order",
    },
    FIELDS={
        "id": "synset <offset>-<n|v>, e.g. 02084071-n",
        "text": "the synset's definition",
        "label": "lexicographer file name, e.g. noun.animal, verb.motion",
    },
)
CHOICE = SimpleNamespace(
    **_COMMON, read=read_choice, SPLIT_BY="word_class", GROUP_BY="id", PRIVATE_FIELDS=("word_class",),
    DESCRIPTION=(f"WordNet-derived multiple choice (NOT SWAG): a word and {CHOICES} definitions, one of them its "
                 f"own; {CHOICE_MAX:,} questions; split by synset, stratified by part of speech."),
    DERIVED_FROM=_DERIVED,
    DERIVATION={
        "questions": f"random.Random({SEED}).sample of {CHOICE_MAX:,} synsets with a definition (in synset-id "
                     "order); the question is the synset's first lemma",
        "choices": f"the synset's definition and {CHOICES - 1} definitions of random synsets of the same part of "
                   "speech, drawn again when the definition is already a choice or the word is a lemma of that "
                   "synset too (so exactly one choice is a sense of the word); then shuffled",
        "split": "by synset, stratified by part of speech (used for splitting only)",
    },
    FIELDS={
        "id": "synset <offset>-<n|v|a|r>",
        "text": "the word (a lemma, '_' as space)",
        "choices": f"{CHOICES} definitions",
        "label": "the 0-based index of the word's own definition among the choices",
    },
)
