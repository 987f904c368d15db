"""Emoji pictures with their names, in three drawing styles: an image–text set for multimodal pre-training
(docs/multimodal.md).

- OpenMoji 17.0 (the npm tarball the ``openmoji`` text set is read from: one download for both): its 4,495
  colour SVGs, rendered with resvg at ``SIZE`` × ``SIZE``, each named by its CLDR annotation, with OpenMoji's
  group and subgroup;
- Noto Emoji (Debian ``ruby-tanuki-emoji``: 72 × 72 PNGs, Apache-2.0) and EmojiOne 2 (Debian ``ruby-gemojione``:
  64 × 64 PNGs, CC BY-SA 4.0): the same Unicode emoji drawn by other hands, matched to OpenMoji's by their code
  points (variation selector FE0F ignored) and given OpenMoji's name, group and subgroup.

Every picture's alpha channel is composited on white (``data.images``) and resized to ``SIZE`` × ``SIZE``; the
pixels are stored once, in ``images.safetensors`` (uint8 ``(N, SIZE, SIZE, 3)``), and each split's jsonl names its
rows.  The split is by concept (an emoji with its skin-tone variants, in every style): retrieval is tested on
emoji never seen in training.
"""
from __future__ import annotations

import json
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np

from ptm_app.data.images import to_pixels
from ptm_app.data.sources import openmoji
from ptm_app.data.sources.fetch import Artifact, deb_tree, progress
from ptm_app.errors import PtmError

ARTIFACT = openmoji.ARTIFACT
NOTO = Artifact("apt", "ruby-tanuki-emoji", "0.6.0-2", "ruby-tanuki-emoji_0.6.0-2_all.deb",
                "00828824084225f7f70e3e6aa1147468bac84d58a8252281693a28589633d410")
GEMOJIONE = Artifact("apt", "ruby-gemojione", "3.3.0-1", "ruby-gemojione_3.3.0-1_all.deb",
                     "9981df47963de53e10ce097857825c72f2f11dbe2d4cd4887698a99a751bb6bb")
MORE_ARTIFACTS = (NOTO, GEMOJIONE)
KIND = "task"
FORMAT_VERSION = 1
SIZE = 64
STYLES = ("openmoji", "noto", "gemojione")
IMAGES = "images.safetensors"
NOTO_DIR = "usr/share/rubygems-integration/all/gems/tanuki_emoji-0.6.0/app/assets/images/tanuki_emoji/"
GEMOJIONE_DIR = "usr/share/rubygems-integration/all/gems/gemojione-3.3.0/assets/png/"
LICENCE = ("mixed, per style: openmoji pictures and names CC BY-SA 4.0 (OpenMoji, openmoji.org: attribute and share "
           "alike; names from Unicode CLDR, Unicode License v3); noto pictures Apache-2.0 (Google Noto Emoji, via "
           "Debian ruby-tanuki-emoji, whose own code is MIT); gemojione pictures CC BY-SA 4.0 (EmojiOne 2 art, via "
           "Debian ruby-gemojione, whose own code is MIT)")
DESCRIPTION = (f"Emoji pictures ({SIZE}x{SIZE} RGB, alpha composited on white) with their names: OpenMoji 17.0's "
               f"colour SVGs (rendered with resvg) and the Noto and EmojiOne 2 PNGs of the same Unicode emoji, each "
               f"captioned with OpenMoji's name (its CLDR annotation, e.g. 'grinning face'); OpenMoji's group and "
               f"subgroup for zero-shot classification. Split by concept: an emoji, its skin-tone variants and its "
               f"other drawings share one split.")
FIELDS = {
    "id": "style/code points, e.g. openmoji/1F44B-1F3FB",
    "image": f"the picture's row in {IMAGES} (tensor 'pixels', uint8 (N, {SIZE}, {SIZE}, 3))",
    "caption": "the emoji's OpenMoji name (CLDR annotation), e.g. 'waving hand: light skin tone'",
    "concept": "the code points of the base emoji (skin tone removed): the unit the split keeps together",
    "style": "the drawing: openmoji | noto | gemojione",
    "skin_tone": "true for a skin-tone variant",
    "group": "OpenMoji's group, e.g. smileys-emotion",
    "subgroup": "OpenMoji's subgroup, e.g. face-smiling",
}
DERIVATION = {
    "openmoji": "every entry of package/data/openmoji.json whose package/color/svg/<hexcode>.svg exists, rendered at "
                f"{SIZE}x{SIZE} on a transparent canvas",
    "noto": f"every {NOTO_DIR}*.png: emoji_u<code points joined by _>.png, or <two letters>.png for a flag "
            "(regional indicators), matched to OpenMoji by code points without FE0F; unmatched files are dropped "
            "(counted)",
    "gemojione": f"every {GEMOJIONE_DIR}<code points joined by ->.png, matched the same way",
    "pixels": f"RGBA composited on white, resized bicubic to {SIZE}x{SIZE} when not already that size",
    "concept": "OpenMoji's skintone_base_hexcode for a skin-tone variant, else its hexcode; without FE0F",
}
SPLIT = {"by": "group", "group_by": "concept", "unit": "concept"}


def code_key(hexcode: str) -> str:
    """Code points as OpenMoji writes them (upper case, joined by '-'), without the variation selector FE0F."""
    return "-".join(p for p in hexcode.upper().replace("_", "-").split("-") if p and p != "FE0F")


def noto_key(filename: str) -> str | None:
    """The code points of a tanuki_emoji file name: ``emoji_u1f600.png`` or a flag's ``AC.png``."""
    stem = filename.rsplit("/", 1)[-1].removesuffix(".png")
    if stem.startswith("emoji_u"):
        return code_key(stem.removeprefix("emoji_u"))
    if len(stem) == 2 and stem.isalpha() and stem.isupper():  # regional indicators A..Z = 1F1E6..1F1FF
        return "-".join(f"{0x1F1E6 + ord(c) - ord('A'):X}" for c in stem)
    return None


def openmoji_entries(archive: Path) -> tuple[list[dict], dict[str, bytes]]:
    """OpenMoji's entries and its colour SVGs by hexcode, in one pass over the tarball."""
    svgs, entries = {}, None
    with tarfile.open(archive, "r:gz") as tf:
        for member in tf:
            if member.name == "package/data/openmoji.json":
                entries = json.loads(tf.extractfile(member).read().decode("utf-8"))
            elif member.name.startswith("package/color/svg/") and member.name.endswith(".svg"):
                svgs[member.name.rsplit("/", 1)[-1].removesuffix(".svg")] = tf.extractfile(member).read()
    if entries is None:
        raise PtmError(f"{archive.name}: no package/data/openmoji.json; delete the cached download and re-run "
                       f"`python main.py data prepare emoji`")
    return entries, svgs


def _pictures(archives: list[Path]) -> tuple[list[dict], list[np.ndarray], dict]:
    entries, svgs = openmoji_entries(archives[0])
    by_code: dict[str, dict] = {}
    records, pixels, stats = [], [], Counter()
    for e in entries:
        concept = code_key(e.get("skintone_base_hexcode") or e["hexcode"])
        meta = {"caption": e["annotation"], "concept": concept, "skin_tone": bool(e.get("skintone")),
                "group": e["group"], "subgroup": e["subgroups"]}
        by_code.setdefault(code_key(e["hexcode"]), meta)
        if e["hexcode"] not in svgs:
            stats["openmoji_without_svg"] += 1
            continue
        pixels.append(to_pixels(svgs[e["hexcode"]], SIZE, f"{archives[0].name}:package/color/svg/{e['hexcode']}.svg"))
        records.append({"id": f"openmoji/{e['hexcode']}", **meta, "style": "openmoji"})
    for style, deb, folder, key in (("noto", archives[1], NOTO_DIR, noto_key),
                                    ("gemojione", archives[2], GEMOJIONE_DIR, lambda f: code_key(
                                        f.rsplit("/", 1)[-1].removesuffix(".png")))):
        files = deb_tree(deb, lambda name, d=folder: name.startswith(d) and name.endswith(".png"))
        for name in progress(sorted(files), f"emoji: {style}"):
            code = key(name)
            meta = by_code.get(code) if code else None
            if meta is None:
                stats[f"{style}_not_in_openmoji"] += 1
                continue
            pixels.append(to_pixels(files[name], SIZE, f"{deb.name}:{name}"))
            records.append({"id": f"{style}/{code}", **meta, "style": style})
    stats.update({f"{style}_pictures": sum(r["style"] == style for r in records) for style in STYLES})
    return records, pixels, dict(sorted(stats.items()))


def _counts(recs: list[dict]) -> dict:
    return {"records": len(recs), "concepts": len({r["concept"] for r in recs}),
            "styles": dict(Counter(r["style"] for r in recs)), "groups": dict(sorted(Counter(
                r["group"] for r in recs).items()))}


def write(archives: list[Path], out: Path) -> dict:
    """Render and decode every picture, write ``images.safetensors`` and the split jsonl files into ``out``
    (inside ``prepare``'s atomic directory); return the manifest facts."""
    records, pixels, stats = _pictures(archives)
    stats["notes"] = ("<style>_not_in_openmoji: pictures whose code points name no OpenMoji emoji (dropped); "
                      "alpha composited on white")
    return write_pictures(records, pixels, stats, out, DERIVATION)


def write_pictures(records: list[dict], pixels: list[np.ndarray], stats: dict, out: Path, derivation: dict) -> dict:
    """An image-text set's files: ``images.safetensors`` (the pixels, row ``image`` of each record) and the splits,
    by concept (``SPLIT``); returns the manifest facts."""
    from safetensors.numpy import save_file

    from ptm_app.data.sources.splits import FRACTIONS, GROUP_SPLIT_METHOD, SEED, split_records, write_jsonl

    for row, rec in enumerate(records):
        rec["image"] = row
    save_file({"pixels": np.stack(pixels)}, str(out / IMAGES))
    (out / IMAGES).chmod(0o644)  # readable like the jsonl files (safetensors writes 0600)
    splits = split_records(records, SPLIT["by"], group_by=SPLIT["group_by"])
    for name, recs in splits.items():
        write_jsonl(out / f"{name}.jsonl", recs)
    counts = {name: _counts(recs) for name, recs in splits.items()}
    counts["total"] = _counts(records)
    split = {"seed": SEED, "fractions": FRACTIONS, "by": SPLIT["by"], "group_by": SPLIT["group_by"],
             "method": GROUP_SPLIT_METHOD.format(key=SPLIT["by"], group=SPLIT["group_by"])}
    return {"split": split, "counts": counts, "cleaning": stats, "derivation": derivation,
            "image_size": SIZE, "files": [IMAGES, *(f"{name}.jsonl" for name in splits)]}
