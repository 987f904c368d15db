"""Open Clip Art Library pictures with their titles (Debian ``openclipart-svg``, public domain): a second, noisier
image–text set in the layout of ``emoji`` (docs/multimodal.md).

Each SVG's caption is its work title (the first ``<dc:title>`` of its metadata, else ``<title>``), lowercased.
Titles are noisy: collection names ("gramastar" 1,375 times, "part of the flat icon collection ..." hundreds), so
only pictures whose title is used at most ``MAX_USES`` times are kept; pictures sharing a title are one concept
(one split).  The rendering is ``emoji``'s (resvg at 64 × 64, alpha on white); an SVG that resvg cannot render is
dropped and named in the manifest (``cleaning.unrendered``): third-party files, not the user's input.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from ptm_app.data.images import to_pixels
from ptm_app.data.sources.emoji import IMAGES, SIZE, write_pictures
from ptm_app.data.sources.fetch import Artifact, deb_tree, progress
from ptm_app.errors import PtmError

ARTIFACT = Artifact("apt", "openclipart-svg", "1:0.18+dfsg-19", "openclipart-svg_1%3a0.18+dfsg-19_all.deb",
                    "989712d90d57dfa3230049f553bb43b76c30ee4d4b8c5f6e106e33f7db5cbdc5")
KIND = "task"
FORMAT_VERSION = 1
MAX_USES = 3
ROOT = "usr/share/openclipart/svg/"
LICENCE = "public domain (Open Clip Art Library 0.18, via Debian openclipart-svg; see its copyright file)"
DESCRIPTION = (f"Open Clip Art Library 0.18 SVG clip art ({SIZE}x{SIZE} RGB, rendered with resvg, alpha composited "
               f"on white) captioned with each picture's title; titles used more than {MAX_USES} times (collection "
               f"names) dropped. Split by title.")
FIELDS = {
    "id": "the SVG's path under usr/share/openclipart/svg/",
    "image": f"the picture's row in {IMAGES} (tensor 'pixels', uint8 (N, {SIZE}, {SIZE}, 3))",
    "caption": "the picture's title (lowercased)",
    "concept": "the title: pictures sharing it share a split",
    "style": "openclipart",
    "skin_tone": "false (the emoji field, kept for one layout)",
    "group": "the top folder (animals, food, ...) of the title's first picture",
    "subgroup": "its second folder (animals/birds -> birds), or the top folder",
    "keywords": "the picture's <rdf:li> keywords, lowercased",
}
DERIVATION = {
    "caption": "first <dc:title> of the SVG, else its <title>, whitespace collapsed, lowercased; no title: dropped",
    "kept": f"pictures whose caption at most {MAX_USES} pictures carry",
    "pixels": f"rendered by resvg at {SIZE}x{SIZE}, alpha composited on white; unrenderable SVGs dropped, named",
}
TITLE = (re.compile(r"<dc:title>\s*([^<]*?)\s*</dc:title>"), re.compile(r"<title[^>]*>\s*([^<]*?)\s*</title>"))
KEYWORD = re.compile(r"<rdf:li>\s*([^<]*?)\s*</rdf:li>")


def title_of(svg: str) -> str:
    for pattern in TITLE:
        found = pattern.search(svg)
        if found and found.group(1).strip():
            return " ".join(found.group(1).split()).lower()
    return ""


def write(archives: list[Path], out: Path) -> dict:
    """Titles, the kept pictures rendered, then ``emoji.write_pictures``; returns the manifest facts."""
    files = deb_tree(archives[0], lambda name: name.startswith(ROOT) and name.endswith(".svg"))
    texts = {name: data.decode("utf-8", "replace") for name, data in files.items()}
    titles = {name: title_of(text) for name, text in texts.items()}
    uses = Counter(t for t in titles.values() if t)
    group_of: dict[str, tuple[str, str]] = {}
    for name in sorted(files):
        parts = name.removeprefix(ROOT).split("/")
        group_of.setdefault(titles[name], (parts[0], parts[1] if len(parts) > 2 else parts[0]))
    records, pixels, unrendered = [], [], []
    kept = [n for n in sorted(files) if titles[n] and uses[titles[n]] <= MAX_USES]
    for name in progress(kept, "clipart: rendering"):
        try:
            pixels.append(to_pixels(files[name], SIZE, name))
        except PtmError:
            unrendered.append(name.removeprefix(ROOT))
            continue
        group, subgroup = group_of[titles[name]]
        records.append({"id": name.removeprefix(ROOT), "caption": titles[name], "concept": titles[name],
                        "style": "openclipart", "skin_tone": False, "group": group, "subgroup": subgroup,
                        "keywords": sorted({k.lower() for k in KEYWORD.findall(texts[name]) if k.strip()})})
    if not records:
        raise PtmError(f"{archives[0].name}: no picture kept; delete the file and re-run `python main.py data "
                       f"prepare clipart`")
    stats = {"svg_files": len(files), "without_title": sum(1 for t in titles.values() if not t),
             "dropped_title_used_more_than_max": sum(1 for n in files if titles[n] and uses[titles[n]] > MAX_USES),
             "unrendered": unrendered, "kept": len(records),
             "notes": f"titles carried by more than {MAX_USES} pictures are collection names, not captions"}
    return write_pictures(records, pixels, stats, out, DERIVATION)
