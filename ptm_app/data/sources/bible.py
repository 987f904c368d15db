"""Verse-aligned English–Spanish Bible (``bible_en_es``): parallel pairs for XLM's translation LM (Lample &
Conneau 2019, §3.3, which trains TLM on aligned sentences).

Two public-domain SWORD modules from Debian bookworm, fetched with ``apt-get download`` (nothing installed) and
pinned by version and sha256 (both equal the SHA256 fields of Debian's package index, ``apt-cache show``):

- ``sword-text-web`` 426.0-1: module engWEB2015eb, the World English Bible (2020 stable text), NRSVA
  versification (with the deuterocanon);
- ``sword-text-sparv`` 2.60-1: module spaRV1909eb, the Reina-Valera 1909, KJV versification (66 books).

The module files are read out of each .deb's data.tar (``fetch.deb_files``) into a temporary SWORD library
and read with ``pysword``. A pair is one (book, chapter, verse) reference of the KJV scheme, the 66 books both
translations have; the two references only the NRSVA scheme has (3John.1.15, Rev.12.18) are empty in the WEB,
whose text follows the KJV verse boundaries there, and are counted. Verse markup (OSIS) is removed here, not
with pysword's cleaner (see ``verse_text``). Where the Reina-Valera divides a chapter differently from the KJV
scheme it claims (it follows the Hebrew in places), the chapter is skipped (``pair_verses``). Pairs are split by
book, stratified by testament.
"""
from __future__ import annotations

import functools
import math
import re
import statistics
import tempfile
from pathlib import Path

from ptm_app.data.sources.fetch import Artifact, deb_files, progress
from ptm_app.errors import PtmError

# Pinned on the first download (Debian bookworm mirror, 2026-11); equal to the SHA256 of Debian's package index.
ARTIFACT = Artifact("apt", "sword-text-web", "426.0-1", "sword-text-web_426.0-1_all.deb",
                    "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1")
MORE_ARTIFACTS = (Artifact("apt", "sword-text-sparv", "2.60-1", "sword-text-sparv_2.60-1_all.deb",
                           "5c87f9b2bc97457e8a872f5bae7ea7ce59cb3de1dcee73e4d4740451863694cf"),)
MODULES = {"en": "engWEB2015eb", "es": "spaRV1909eb"}  # language -> SWORD module in the .deb of that language
KIND = "corpus"
SPLIT_BY = "testament"
GROUP_BY = "book"
SPLIT_UNIT = "book"
MAX_LENGTH_RATIO = 3.0
MISFIT_WINDOW, MISFIT_MARGIN, MIN_MISFITS = 2, 0.3, 2
FORMAT_VERSION = 1
LICENCE = ("Public domain: World English Bible (eBible.org; 'World English Bible' is a trademark of eBible.org: "
           "a changed text may not be called by that name, so this markup-stripped text is 'derived from the "
           "WEB') and Reina-Valera 1909 (Reina and Valera); Debian packaging GPL-2+ (Crosswire Packaging Team)")
DESCRIPTION = ("Verse-aligned English-Spanish Bible: World English Bible and Reina-Valera 1909, one pair per "
               "KJV verse reference of the 66 shared books; split by book (no book in two splits), stratified "
               "by testament; parallel data for XLM's translation language modelling.")
FIELDS = {
    "id": "OSIS verse reference <book>.<chapter>.<verse>, e.g. John.3.16",
    "book": "OSIS book name, e.g. Gen, John, 1Cor (all verses of a book are in one split)",
    "chapter": "chapter number (1-based)",
    "verse": "verse number (1-based)",
    "testament": "ot | nt",
    "en": "the verse in the World English Bible, markup removed",
    "es": "the verse in the Reina-Valera 1909, markup removed",
}
DERIVED_FROM = ("sword-text-web 426.0-1 (usr/share/sword/modules/texts/ztext/engWEB2015eb) and sword-text-sparv "
                "2.60-1 (usr/share/sword/modules/texts/ztext/spaRV1909eb), Debian bookworm .debs, read with pysword")
DERIVATION = {
    "pairs": "every verse reference of the KJV versification (the Reina-Valera's), in canon order, read from "
             "both modules by (book, chapter, verse); the WEB's NRSVA scheme has all of them",
    "markup": "OSIS tags removed: notes (footnotes, cross references) and non-canonical titles (section headings) "
              "and speaker labels with their content; canonical psalm titles keep their text (the Reina-Valera "
              "has them in verse 1 too); word-level tags (w, transChange, name, seg, hi, foreign, divineName, "
              "reference) leave their text; every other tag (paragraphs, lines, quotes, lists) becomes a space; "
              "a removed note (or the edge of an added word next to a tagged word) becomes a space when "
              "text is on both sides and a letter or digit follows; whitespace collapsed, no space "
              "before , . ; : ! ? ) ] and closing quotes",
    "skipped": "a verse empty (after markup removal) in the WEB (verses the critical text omits, e.g. Acts.8.37); "
               "where the Reina-Valera leaves a KJV verse empty it divides the chapter differently (Hebrew "
               "numbering: its Num.13.1 is KJV Num.12.16, shifting Num 13), so that chapter and the book's next "
               "are skipped whole, and so is a chapter where 2 or more verses fit a neighbour's translation better "
               "by length (mean |log length ratio - median| over +-2 verses lower by more than 0.3 when shifted "
               "by one verse); a pair whose character lengths differ more than 3 times; all counted in cleaning",
    "split": "by book: all verses of a book stay in one split; books stratified by testament (ot, nt)",
}

_BOOK_END = re.compile(r"<div\b(?=[^>]*\beID=)(?=[^>]*\btype=\"book\")[^>]*>.*", re.S)  # + what follows
_WHOLE = re.compile(r"<(note|speaker)\b[^>]*?(?<!/)>.*?</\1\s*>", re.S)  # removed with their content
_TITLE = re.compile(r"<title\b([^>]*?)(?<!/)>(.*?)</title\s*>", re.S)
_INLINE = re.compile(r"</?(?:w|transChange|name|seg|hi|foreign|divineName|reference)\b[^>]*>")
_TAG = re.compile(r"<[^>]*>")
_GAP = "\x00"  # where removed markup separated two words only if text follows it at once
_UNSPACED_ADDITION = re.compile(r"</w>(?=<transChange\b)|</transChange>(?=<w\b)")
_SPACE_BEFORE_CLOSE = re.compile(r"\s+([,.;:!?)\]’”»])")


def verse_text(raw: str) -> str:
    """Plain text of one verse's OSIS markup (rules in ``DERIVATION['markup']``).

    pysword's own cleaner glues the words on both sides of a removed footnote ("Godcreated") and keeps
    ``<lb/>`` tags, so the markup is removed here.
    """
    text = _BOOK_END.sub("", raw)
    text = _UNSPACED_ADDITION.sub(lambda m: m.group(0) + _GAP, text)
    text = _WHOLE.sub(lambda m: _GAP if m.group(1) == "note" else " ", text)
    text = _TITLE.sub(lambda m: f" {m.group(2)} " if 'canonical="true"' in m.group(1) else " ", text)
    text = _TAG.sub(" ", _INLINE.sub("", text))
    text = re.sub(rf"(?<=\S){_GAP}+(?=\w)", " ", text).replace(_GAP, "")
    text = " ".join(text.split())
    return _SPACE_BEFORE_CLOSE.sub(r"\1", text)


def _module_files(deb: Path, module: str) -> dict[str, bytes]:
    root = "usr/share/sword/"
    data = f"{root}modules/texts/ztext/{module}/"
    wanted = [f"{root}mods.d/{module}.conf"] + [f"{data}{t}.bz{x}" for t in ("ot", "nt") for x in "svz"]
    return {name.removeprefix(root): body for name, body in deb_files(deb, wanted).items()}


def _open(library: Path, module: str, deb: Path):
    """A pysword bible of ``module`` in the SWORD library folder; each compressed book is decompressed once."""
    from pysword.modules import SwordModules

    modules = SwordModules(str(library))
    if module not in modules.parse_modules():
        raise PtmError(f"{deb}: no SWORD module {module} in it; delete the file and re-run "
                       f"`python main.py data prepare bible_en_es`")
    bible = modules.get_bible_from_module(module)
    # pysword decompresses a whole book's block for every verse it reads; keep the last block (books are read
    # in order), which takes reading both Bibles from about 90 s to about 2 s
    bible._decompressed_text = functools.lru_cache(maxsize=2)(bible._decompressed_text)
    return bible


def _raw_verse(bible, book: str, chapter: int, verse: int) -> str:
    """One verse's OSIS text as stored in the module (pysword's cleaning off)."""
    return bible.get(books=[book], chapters=[chapter], verses=[verse], clean=False)


def read(web_deb: Path, rv_deb: Path) -> tuple[list[dict], dict]:
    """The verse pairs of the two .debs (filtered by ``pair_verses``), in canon order, and the cleaning stats."""
    with tempfile.TemporaryDirectory(prefix="ptm-sword-") as tmp:
        library = Path(tmp)
        for deb, module in ((web_deb, MODULES["en"]), (rv_deb, MODULES["es"])):
            for name, body in _module_files(deb, module).items():
                (library / name).parent.mkdir(parents=True, exist_ok=True)
                (library / name).write_bytes(body)
        en, es = _open(library, MODULES["en"], web_deb), _open(library, MODULES["es"], rv_deb)
        kjv = [(testament, book) for testament, books in es.get_structure().get_books().items() for book in books]
        nrsva = {book.osis_name: book.chapter_lengths for books in en.get_structure().get_books().values()
                 for book in books}
        verses = []  # (testament, book, chapter, verse, en, es) of every KJV reference, in canon order
        for testament, book in progress(kjv, "bible_en_es: reading verses"):
            if book.osis_name not in nrsva:
                raise PtmError(f"{web_deb}: the WEB module has no book {book.osis_name}; delete the file and "
                               f"re-run `python main.py data prepare bible_en_es`")
            verses += [(testament, book.osis_name, chapter, verse,
                        verse_text(_raw_verse(en, book.osis_name, chapter, verse)),
                        verse_text(_raw_verse(es, book.osis_name, chapter, verse)))
                       for chapter, n_verses in enumerate(book.chapter_lengths, 1)
                       for verse in range(1, n_verses + 1)]
        kjv_lengths = {book.osis_name: book.chapter_lengths for _, book in kjv}
        only_nrsva = {f"{b}.{c}.{v}": verse_text(_raw_verse(en, b, c, v)) for b in kjv_lengths
                      for c, n in enumerate(nrsva[b], 1) for v in range(1, n + 1)
                      if c > len(kjv_lengths[b]) or v > kjv_lengths[b][c - 1]}
        del en, es  # pysword keeps the module files open until its objects go
    records, stats = pair_verses(verses)
    stats.update({"books": len(kjv), "nrsva_only_references": sorted(only_nrsva),
                  "nrsva_only_references_with_text": sorted(ref for ref, text in only_nrsva.items() if text)})
    return records, stats


def _misfits(rows: list[tuple[str, str]], centre: float) -> int:
    """How many verses of a chapter fit a neighbour's translation better than their own, by length.

    Around each verse (a window of ``MISFIT_WINDOW`` verses each side) the mean |log(len es / len en) - centre|
    of the pairs as given is compared with that of the Spanish verses paired with the English verse before, and
    after; a verse is a misfit when a shifted pairing is better by more than ``MISFIT_MARGIN``. This finds the
    chapters the Reina-Valera divides differently without leaving a verse empty (1Chr 21, 1Kgs 22, Judg 14).
    """
    lengths = [(len(en), len(es)) for en, es in rows]
    n, misfits = len(rows), 0

    def cost(i: int, lag: int) -> float | None:
        window = [abs(math.log(lengths[k][1] / lengths[k + lag][0]) - centre)
                  for k in range(max(0, i - MISFIT_WINDOW), min(n, i + MISFIT_WINDOW + 1))
                  if 0 <= k + lag < n and lengths[k][1] and lengths[k + lag][0]]
        return sum(window) / len(window) if window else None

    for i in range(n):
        own = cost(i, 0)
        if own is not None and any(c is not None and c < own - MISFIT_MARGIN for c in (cost(i, -1), cost(i, 1))):
            misfits += 1
    return misfits


def pair_verses(verses: list[tuple[str, str, int, int, str, str]]) -> tuple[list[dict], dict]:
    """Records from ``(testament, book, chapter, verse, en, es)`` rows in canon order, and what was skipped.

    - a verse empty in the WEB only is skipped: the WEB leaves out verses the critical text omits (Acts.8.37);
    - a verse empty in the Reina-Valera means its text sits in a neighbour, as the RV1909 divides the chapters
      there like the Hebrew (its Num.13.1 is KJV Num.12.16, which shifts all of Num 13): that chapter and the
      book's next chapter are skipped whole, and so is a chapter with ``MIN_MISFITS`` or more verses that fit
      a neighbour's translation better (``_misfits``);
    - a pair whose character lengths differ more than ``MAX_LENGTH_RATIO`` times is skipped (a verse with
      extra text on one side, e.g. Rom.14.23, where the WEB has the doxology of Rom.16.25-27).
    """
    empty: dict[str, list[str]] = {"en": [], "es": [], "both": []}
    chapters: dict[tuple[str, int], list[tuple[str, str]]] = {}
    shifted: set[tuple[str, int]] = set()
    for _, book, chapter, verse, en, es in verses:
        chapters.setdefault((book, chapter), []).append((en, es))
        missing = [lang for lang, text in (("en", en), ("es", es)) if not text]
        if missing:
            empty["both" if len(missing) == 2 else missing[0]].append(f"{book}.{chapter}.{verse}")
        if not es:
            shifted |= {(book, chapter), (book, chapter + 1)}
    centre = statistics.median(math.log(len(es) / len(en)) for *_, en, es in verses if en and es)
    misfit = {key for key, rows in chapters.items() if key not in shifted and _misfits(rows, centre) >= MIN_MISFITS}
    records, uneven, in_shifted = [], [], 0
    for testament, book, chapter, verse, en, es in verses:
        ref = f"{book}.{chapter}.{verse}"
        if not en or not es:
            continue
        if (book, chapter) in shifted | misfit:
            in_shifted += 1
            continue
        if max(len(en), len(es)) > MAX_LENGTH_RATIO * min(len(en), len(es)):
            uneven.append(ref)
            continue
        records.append({"id": ref, "book": book, "chapter": chapter, "verse": verse, "testament": testament,
                        "en": en, "es": es})
    stats = {"verse_references": len(verses), "pairs": len(records),
             "skipped_empty_english": len(empty["en"]), "skipped_empty_spanish": len(empty["es"]),
             "skipped_empty_both": len(empty["both"]),
             "skipped_empty_references": {lang: refs for lang, refs in empty.items() if refs},
             "skipped_chapters_after_empty_spanish_verse": [f"{b}.{c}" for b, c in sorted(shifted & chapters.keys())],
             "skipped_chapters_misfit_lengths": [f"{b}.{c}" for b, c in sorted(misfit)],
             "skipped_in_those_chapters": in_shifted,
             "skipped_length_ratio": len(uneven), "skipped_length_ratio_references": uneven}
    return records, stats
