"""OpenMoji's emoji names with their tags: a small multi-label text classification set, read from the openmoji npm
tarball (``package/data/openmoji.json``)."""
from __future__ import annotations

import json
import tarfile
from collections import Counter
from pathlib import Path

from ptm_app.data.sources.fetch import Artifact
from ptm_app.errors import PtmError

ARTIFACT = Artifact("npm", "openmoji", "17.0.0", "openmoji-17.0.0.tgz",
                    "55ee7d13485dec86e9f38c1f3a645a13382d33ff97c0cd845ee824b0aef45e68")
KIND = "task"
SPLIT_BY = "group"
PRIVATE_FIELDS = ("group",)
SPLIT_UNIT = "emoji"
FORMAT_VERSION = 1
MIN_EXAMPLES = 20  # a tag is a label when at least this many emoji carry it
LICENCE = ("CC BY-SA 4.0 (OpenMoji, openmoji.org: attribute and share alike); the tags join OpenMoji's own with the "
           "Unicode CLDR annotations (Unicode License v3)")
DESCRIPTION = (f"OpenMoji 17.0 emoji: each emoji's name (its CLDR annotation, e.g. 'grinning face') labelled with "
               f"the set of its tags (CLDR keywords and OpenMoji's own, lowercased) that at least {MIN_EXAMPLES} "
               f"emoji carry; skin-tone variants (no tags of their own) and emoji left with no such tag are dropped. "
               f"Multi-label classification; the name often shares words with its tags.")
FIELDS = {
    "id": "the emoji's Unicode code points, e.g. 1F600 (OpenMoji's hexcode)",
    "text": "the emoji's name (annotation), e.g. 'grinning face'",
    "labels": f"its tags that at least {MIN_EXAMPLES} emoji carry, sorted (one or more)",
}
DERIVATION = {
    "records": "the emoji of package/data/openmoji.json without a skintone value (skin-tone variants carry no tags)",
    "labels": f"tags = the comma-separated 'tags' and 'openmoji_tags' fields, stripped and lowercased; a tag is a "
              f"label when at least {MIN_EXAMPLES} of those emoji carry it; an emoji keeps its labels and is "
              f"dropped when it has none",
    "split": "stratified by the emoji's OpenMoji group (smileys-emotion, flags, ...), not written to the jsonl",
}


def _tags(entry: dict) -> set[str]:
    return {t.strip().lower() for field in ("tags", "openmoji_tags") for t in str(entry.get(field) or "").split(",")
            if t.strip()}


def read(archive: Path) -> tuple[list[dict], dict]:
    """One record per tagged emoji, sorted by id, and the counts of what was dropped."""
    with tarfile.open(archive, "r:gz") as tf:
        try:
            entries = json.loads(tf.extractfile("package/data/openmoji.json").read().decode("utf-8"))
        except (KeyError, AttributeError, ValueError) as exc:
            raise PtmError(f"{archive.name}: no readable package/data/openmoji.json ({exc}); delete the cached "
                           f"download and re-run `python main.py data prepare openmoji`") from None
    base = [e for e in entries if not e.get("skintone")]
    counts = Counter(tag for e in base for tag in _tags(e))
    kept_tags = {tag for tag, n in counts.items() if n >= MIN_EXAMPLES}
    records, seen = [], set()
    for entry in base:
        labels = sorted(_tags(entry) & kept_tags)
        if not labels or entry["hexcode"] in seen:
            continue
        seen.add(entry["hexcode"])
        records.append({"id": entry["hexcode"], "text": entry["annotation"], "labels": labels,
                        "group": entry["group"]})
    records.sort(key=lambda r: r["id"])
    stats = {"emoji_read": len(entries), "dropped_skin_tone_variants": len(entries) - len(base),
             "dropped_without_a_label": len(base) - len(records), "kept": len(records), "labels": len(kept_tags),
             "label_assignments": sum(len(r["labels"]) for r in records),
             "notes": f"tags carried by fewer than {MIN_EXAMPLES} emoji are not labels"}
    return records, stats
