"""``python main.py attack --config configs/analysis/minilm_attack_tweets.yaml``: a word-substitution attack in the
style of TextFooler (Jin et al. 2020, "Is BERT Really Robust?", §3) against fine-tuned sequence classifiers.

For each test example the classifier gets right:
1. **Word importance by deletion** (§3.1, eq. 2): ``I_w = F_Y(X) - F_Y(X∖w)`` if deleting ``w`` keeps the label ``Y``;
   otherwise ``F_Y(X) - F_Y(X∖w) + F_Ŷ(X∖w) - F_Ŷ(X)`` with ``Ŷ`` the new label.  Function words are never attacked.
2. **Candidates**: WordNet synonyms (the prepared WordNet 3.0 .deb, one-word lemmas) of the word's part of speech: the
   word class it has the most synsets in (WordNet's ordering stands in for the POS tagger of §3.1; documented).
3. **Semantic similarity** (§3.1): the cosine of MiniLM's mean-pooled embeddings (all-MiniLM-L6-v2, a sentence
   encoder, in place of the Universal Sentence Encoder) between the original and the changed text, over a window of
   15 words around the word, must be at least ``similarity`` (0.84, TextAttack's value for TextFooler).
4. **Substitution** (§3.1): among the candidates that pass, one that changes the label ends the attack (the one most
   similar to the original); otherwise the one that lowers ``F_Y`` most is kept and the next word is tried, until the
   label changes or ``max_perturbed`` of the words are changed.

Reports, per classifier: clean accuracy, accuracy under attack, attack success rate (flipped / correctly classified),
the mean share of words changed in successful attacks, and the mean model queries per attacked example; writes
``attack.md|csv|json``, ``attack.png``, ``examples.jsonl`` (each successful adversarial text beside its original)
and ``settings.json``; ``progress.json`` keeps every example's outcome as it is attacked, so a run cut short
continues where it stopped (``Progress``).  Models: run directories (or ``.ckpt``) of ``SequenceClassificationModule``; anything else is
refused in one line.  ``examples.jsonl`` of a training split is what ``defence`` by adversarial data augmentation
would train on; the defence built in is FreeLB (``training.adversarial``).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import torch

from ptm_app.analysis.perturbations import _BARE, _synonym_key, _words
from ptm_app.analysis.robustness import data_settings, load_classifier, run_files, scores
from ptm_app.errors import PtmError
from ptm_app.paths import run_path, write_json

COLUMNS = ["model", "clean_accuracy", "attacked_accuracy", "success_rate", "words_perturbed", "queries",
           "examples", "attacked"]
WINDOW = 15  # words around the substitution compared for similarity (TextFooler §3.1)


def pos_synonyms(synsets) -> tuple[dict[str, dict[str, tuple[str, ...]]], dict[str, str]]:
    """``(synonyms, word_class)``: lower-case one-word lemma -> word class -> its synonyms in that class (first
    appearance order), and each lemma's main word class (the one with the most synsets; ties: WordNet's order)."""
    table: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for syn in synsets:
        lemmas = list(dict.fromkeys(lem.lower() for lem in syn.lemmas if lem.isalpha()))
        for lem in lemmas:
            counts[lem][syn.pos] += 1
            for other in lemmas:
                if other != lem and other not in table[lem][syn.pos]:
                    table[lem][syn.pos].append(other)
    synonyms = {w: {p: tuple(v) for p, v in by.items() if v} for w, by in table.items()}
    main = {w: max(c, key=lambda p: c[p]) for w, c in counts.items()}
    return {w: s for w, s in synonyms.items() if s}, main


_TABLES: dict = {}


def wordnet_pos_synonyms():
    """The part-of-speech synonym table of WordNet 3.0 (the .deb the data sources fetch and verify), read once."""
    if "wordnet" not in _TABLES:
        from ptm_app.data.sources import wordnet
        from ptm_app.data.sources.fetch import fetch

        synsets, _ = wordnet.load(fetch(wordnet.ARTIFACT))
        _TABLES["wordnet"] = pos_synonyms(synsets)
    return _TABLES["wordnet"]


def candidates(word: str, synonyms: dict, word_class: dict, limit: int) -> list[str]:
    """Up to ``limit`` synonyms of ``word`` in its main word class, with its punctuation and first letter's case."""
    key = _synonym_key(word)
    if key is None or key not in synonyms:
        return []
    cls = word_class.get(key)
    options = synonyms[key].get(cls, ())[:limit]
    m = _BARE.match(word)
    capital = m.group(2)[0].isupper()
    return [m.group(1) + (o[0].upper() + o[1:] if capital else o) + m.group(3) for o in options]


@dataclass
class Outcome:
    """One example's attack: ``status`` skipped (misclassified already), success or failure."""

    status: str
    text: str
    adversarial: str = ""
    perturbed: float = 0.0  # share of the words changed
    queries: int = 0
    changes: list = field(default_factory=list)


class Victim:
    """A classifier's probabilities over texts, counting the texts it is asked about (queries)."""

    def __init__(self, model, max_length: int, batch_size: int):
        self.model, self.max_length, self.batch_size, self.queries = model, max_length, batch_size, 0

    @torch.no_grad()
    def probs(self, texts: list[str]) -> torch.Tensor:
        tok, out = self.model.tokenizer, []
        self.queries += len(texts)
        for start in range(0, len(texts), self.batch_size):
            enc = tok(texts[start:start + self.batch_size], truncation=True, max_length=self.max_length,
                      padding=True, return_tensors="pt")
            batch = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            out.append(torch.softmax(self.model(batch).float(), dim=-1))
        return torch.cat(out)


def importance(p0: torch.Tensor, deleted: torch.Tensor, gold: int) -> torch.Tensor:
    """TextFooler's eq. 2 for each deletion (rows of ``deleted``) against the original probabilities ``p0``."""
    score = p0[gold] - deleted[:, gold]
    new = deleted.argmax(-1)
    flipped = new != gold
    gain = deleted.gather(1, new[:, None]).squeeze(1) - p0[new]
    return torch.where(flipped, score + gain, score)


def _window(pieces: list[str], at: int) -> str:
    words = [i for i, p in enumerate(pieces) if not p.isspace()]
    k = words.index(at)
    keep = words[max(0, k - WINDOW // 2): k + WINDOW // 2 + 1]
    return " ".join(pieces[i] for i in keep)


def attack_one(victim: Victim, text: str, gold: int, synonyms: dict, word_class: dict, similar,
               similarity: float, max_candidates: int, max_perturbed: float) -> Outcome:
    """TextFooler against one text (see the module docstring)."""
    start = victim.queries
    pieces = _words(text)
    words = [i for i, p in enumerate(pieces) if not p.isspace()]
    p0 = victim.probs([text])[0]
    if int(p0.argmax()) != gold:
        return Outcome("skipped", text, queries=victim.queries - start)
    spots = [i for i in words if candidates(pieces[i], synonyms, word_class, max_candidates)]
    if not spots:
        return Outcome("failure", text, queries=victim.queries - start)
    deleted = victim.probs(["".join(p for j, p in enumerate(pieces) if j != i) for i in spots])
    order = [spots[k] for k in torch.argsort(importance(p0, deleted, gold), descending=True, stable=True).tolist()]
    current, p_gold, changes = list(pieces), float(p0[gold]), []
    budget = max(1, int(max_perturbed * len(words)))
    for i in order:
        if len(changes) >= budget:
            break
        options = candidates(pieces[i], synonyms, word_class, max_candidates)
        tried = []
        for option in options:
            changed = list(current)
            changed[i] = option
            tried.append(changed)
        sims = similar(_window(current, i), [_window(c, i) for c in tried])
        kept = [(c, s, o) for c, s, o in zip(tried, sims, options) if s >= similarity]
        if not kept:
            continue
        probs = victim.probs(["".join(c) for c, _, _ in kept])
        flips = [k for k in range(len(kept)) if int(probs[k].argmax()) != gold]
        if flips:
            best = max(flips, key=lambda k: kept[k][1])
            changes.append((pieces[i], kept[best][2]))
            return Outcome("success", text, "".join(kept[best][0]), len(changes) / len(words),
                           victim.queries - start, changes)
        k = int(probs[:, gold].argmin())
        if float(probs[k, gold]) < p_gold:
            current, p_gold = kept[k][0], float(probs[k, gold])
            changes.append((pieces[i], kept[k][2]))
    return Outcome("failure", text, "".join(current), len(changes) / len(words), victim.queries - start, changes)


class MiniLMSimilarity:
    """Cosine of mean-pooled all-MiniLM-L6-v2 embeddings (the Universal Sentence Encoder's stand-in)."""

    def __init__(self, model: str = "minilm"):
        from ptm_app.inference.loading import load_for_inference

        self.loaded = load_for_inference(model)

    def __call__(self, original: str, changed: list[str]) -> list[float]:
        """The cosine of each changed text with the original (embedded once)."""
        from ptm_app.inference.embed import embed_texts

        if not changed:
            return []
        vectors = torch.from_numpy(embed_texts(self.loaded, [original, *changed], pooling="mean", normalize=True))
        return (vectors[1:] @ vectors[0]).tolist()


PROGRESS = "progress.json"
OUTCOME_SETTINGS = ("checkpoint", "split", "source", "examples", "similarity", "max_candidates", "max_perturbed",
                    "similarity_model", "batch_size", "seed")  # what decides an example's outcome, beside the model


class Progress:
    """The outcomes attacked so far (``progress.json`` in the output directory, rewritten atomically after every
    example), so an attack cut short (a long article costs hundreds of queries) goes on where it stopped: per
    classifier checkpoint (its sha256) and example index, each with its text, under the settings that decide an
    outcome (``OUTCOME_SETTINGS``); a file of other settings is started afresh."""

    def __init__(self, path: Path, settings: dict):
        from ptm_app.paths import read_object

        self.path, self.settings = path, settings
        kept = read_object(path) if path.is_file() else {}
        self.runs = kept.get("runs", {}) if kept.get("settings") == settings else {}
        self._sha: dict[Path, str] = {}

    def _key(self, ckpt: Path) -> str:
        from ptm_app.paths import sha256_file

        if ckpt not in self._sha:
            self._sha[ckpt] = sha256_file(ckpt)
        return self._sha[ckpt]

    def of(self, ckpt: Path) -> dict[str, dict]:
        """Example index (a string) -> the kept outcome's fields, for this checkpoint."""
        return self.runs.get(self._key(ckpt), {})

    def add(self, ckpt: Path, index: int, outcome: Outcome) -> None:
        from dataclasses import asdict

        self.runs.setdefault(self._key(ckpt), {})[str(index)] = asdict(outcome)
        write_json(self.path, {"settings": self.settings, "runs": self.runs})


def summary(name: str, outcomes: list[Outcome]) -> dict:
    attacked = [o for o in outcomes if o.status != "skipped"]
    won = [o for o in attacked if o.status == "success"]
    n = len(outcomes)
    return {"model": name, "clean_accuracy": len(attacked) / n, "attacked_accuracy": (len(attacked) - len(won)) / n,
            "success_rate": len(won) / len(attacked) if attacked else 0.0,
            "words_perturbed": sum(o.perturbed for o in won) / len(won) if won else 0.0,
            "queries": sum(o.queries for o in attacked) / len(attacked) if attacked else 0.0,
            "examples": n, "attacked": len(attacked)}


def draw(rows: list[dict]):
    """Clean against attacked accuracy per classifier (bars)."""
    from ptm_app.analysis.figures import new_figure

    fig, (ax,) = new_figure(1, columns=1)
    names = [r["model"] for r in rows]
    x = list(range(len(rows)))
    ax.bar([i - 0.2 for i in x], [r["clean_accuracy"] for r in rows], width=0.4, label="clean")
    ax.bar([i + 0.2 for i in x], [r["attacked_accuracy"] for r in rows], width=0.4, label="under attack")
    for i, r in zip(x, rows):
        ax.text(i + 0.2, r["attacked_accuracy"], f"{r['success_rate']:.0%} flipped", ha="center", va="bottom",
                fontsize="small")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=15, ha="right")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1.05)
    ax.set_title("TextFooler-style synonym attack")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def attack(runs: list[str], checkpoint: Literal["best", "last"] = "best",
           split: Literal["train", "validation", "test"] = "test", source: Optional[str] = None,
           examples: Optional[int] = 200, similarity: float = 0.84, max_candidates: int = 50,
           max_perturbed: float = 0.3, similarity_model: str = "minilm", batch_size: int = 32, seed: int = 0,
           run_name: str = "attack", output_dir: Optional[str] = None, readme: Optional[str] = None) -> Path:
    """A TextFooler-style synonym-substitution attack on fine-tuned sequence classifiers.

    Args:
        runs: run directories (or .ckpt files) of SequenceClassificationModule fits.
        checkpoint: which checkpoint of a run directory (best, else last).
        split: the split of the run's data that is attacked.
        source: the data (prepared name or directory of split files) instead of the run's own.
        examples: records sampled from the split (null = all); every run gets the same ones.
        similarity: least cosine between the original and the changed 15-word window (TextFooler's ε).
        max_candidates: synonyms tried per word (TextFooler's N).
        max_perturbed: most of a text's words changed before the attack gives up.
        similarity_model: the sentence encoder for the similarity constraint (a prepared name or directory).
        batch_size: texts per forward pass.
        seed: the sample of examples.
        run_name: output directory name under the runs root (checkpoints/).
        output_dir: output directory (overrides run_name).
        readme: also put the table into this file (e.g. docs/results/robustness.md), between the lines
            ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``, NAME the output directory's name.
    """
    resolved = dict(locals())
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.representations import sample_indices
    from ptm_app.analysis.tables import check_readme, show, write_table
    from ptm_app.data.datamodules import resolve_source
    from ptm_app.data.sources.fetch import progress as progress_bar
    from ptm_app.data.tasks import read_labelled
    from ptm_app.paths import atomic_file

    if not 0.0 <= similarity <= 1.0 or not 0.0 < max_perturbed <= 1.0 or max_candidates < 1:
        raise PtmError("attack: similarity must be in [0, 1], max_perturbed in (0, 1] and max_candidates >= 1")
    synonyms, word_class = wordnet_pos_synonyms()
    similar = MiniLMSimilarity(similarity_model)
    out = Path(output_dir) if output_dir else run_path(run_name)
    check_readme(readme, out)
    rows, adversarial = [], []
    progress = Progress(out / PROGRESS, {k: v for k, v in resolved.items() if k in OUTCOME_SETTINGS})
    for run in runs:
        ckpt, config = run_files(run, checkpoint)
        model = load_classifier(ckpt, "attack")
        data = data_settings(config, source)
        if data["text_pair_field"]:
            raise PtmError(f"{run}: attack changes single texts; {data['source']} is a text-pair set")
        files = resolve_source(data["source"])
        if split not in files:
            raise PtmError(f"{data['source']} has no {split} split ({', '.join(files)}); set 'split'")
        records = read_labelled(files[split], text_field=data["text_field"], text_pair_field=None,
                                label_field=data["label_field"], id_field=data["id_field"],
                                unlabelled=data["unlabelled"])
        labels = list(model.hparams.labels)
        chosen = sample_indices(len(records.texts), examples, seed)
        strangers = sorted({str(records.labels[i]) for i in chosen} - set(labels))
        if strangers:
            raise PtmError(f"{files[split]}: labels {', '.join(strangers)} are not among the classifier's "
                           f"({', '.join(labels)}); give the data it was trained on")
        victim = Victim(model, data["max_length"], batch_size)
        outcomes, done = [], progress.of(ckpt)
        kept = {i: Outcome(**done[str(i)]) for i in chosen
                if str(i) in done and done[str(i)]["text"] == records.texts[i]}
        if kept:
            print(f"attack: {run}: {len(kept)} of {len(chosen)} examples attacked before, reused ({progress.path}; "
                  f"move it away to attack them again)", flush=True)
        for i in progress_bar(chosen, f"attack: {Path(run).name}"):
            o = kept.get(i)
            if o is None:
                o = attack_one(victim, records.texts[i], labels.index(str(records.labels[i])), synonyms, word_class,
                               similar, similarity, max_candidates, max_perturbed)
                progress.add(ckpt, i, o)
            outcomes.append(o)
            if o.status == "success":
                adversarial.append({"model": Path(run).name, "id": records.ids[i], "label": str(records.labels[i]),
                                    "text": o.text, "adversarial": o.adversarial, "changes": o.changes})
        rows.append(summary(Path(run).name, outcomes))
        del model
    write_json(out / "settings.json", resolved)
    import json

    with atomic_file(out / "examples.jsonl", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in adversarial))
    md = write_table(rows, COLUMNS, out / "attack",
                     "TextFooler-style synonym attack (success rate = flipped / correctly classified; words "
                     "perturbed over successful attacks)")
    save_png(draw(rows), out / "attack.png")
    show([md], readme, out, out / "attack.png")
    return out
