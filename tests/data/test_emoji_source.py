"""The emoji image–text set: pictures from three styles matched to OpenMoji's names, alpha on white, split by
concept (docs/multimodal.md)."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from ptm_app.data.images import load_image, to_pixels
from ptm_app.data.sources import SOURCES, emoji
from ptm_app.errors import PtmError

SQUARE = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72">'
          '<rect x="18" y="18" width="36" height="36" fill="{}"/></svg>')


def _png(rgba: tuple, size: int = 72, mode: str = "RGBA") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    img = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    img.paste(Image.new("RGBA", (size // 2, size // 2), rgba), (size // 4, size // 4))
    (img if mode == "RGBA" else img.convert(mode)).save(buf, format="PNG")
    return buf.getvalue()


def _tar(files: dict[str, bytes], mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_deb(path: Path, files: dict[str, bytes]) -> Path:
    """A minimal Debian package: an ar archive whose data.tar.xz holds ``files`` (paths under './')."""
    members = {"debian-binary": b"2.0\n", "control.tar.xz": _tar({}, "w:xz"),
               "data.tar.xz": _tar({f"./{k}": v for k, v in files.items()}, "w:xz")}
    out = bytearray(b"!<arch>\n")
    for name, body in members.items():
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body
        out += b"\n" if len(body) % 2 else b""
    path.write_bytes(bytes(out))
    return path


ENTRIES = [
    {"hexcode": "1F600", "annotation": "grinning face", "group": "smileys-emotion", "subgroups": "face-smiling",
     "skintone": "", "skintone_base_hexcode": ""},
    {"hexcode": "1F44B", "annotation": "waving hand", "group": "people-body", "subgroups": "hand-fingers-open",
     "skintone": "", "skintone_base_hexcode": ""},
    {"hexcode": "1F44B-1F3FB", "annotation": "waving hand: light skin tone", "group": "people-body",
     "subgroups": "hand-fingers-open", "skintone": 1, "skintone_base_hexcode": "1F44B"},
    {"hexcode": "2764-FE0F", "annotation": "red heart", "group": "smileys-emotion", "subgroups": "heart",
     "skintone": "", "skintone_base_hexcode": ""},
    {"hexcode": "1F1E6-1F1E8", "annotation": "flag: Ascension Island", "group": "flags", "subgroups": "country-flag",
     "skintone": "", "skintone_base_hexcode": ""},
]


@pytest.fixture
def archives(tmp_path: Path) -> list[Path]:
    svgs = {f"package/color/svg/{e['hexcode']}.svg": SQUARE.format("#ff0000").encode() for e in ENTRIES}
    tgz = tmp_path / "openmoji-17.0.0.tgz"
    tgz.write_bytes(_tar({"package/data/openmoji.json": json.dumps(ENTRIES).encode(), **svgs}, "w:gz"))
    noto = make_deb(tmp_path / "noto.deb", {emoji.NOTO_DIR + name: _png((0, 0, 255, 255)) for name in (
        "emoji_u1f600.png", "emoji_u2764.png", "AC.png", "emoji_u1f9ff.png")})  # 1F9FF: not in these entries
    gem = make_deb(tmp_path / "gem.deb", {emoji.GEMOJIONE_DIR + "1F44B-1F3FB.png": _png((0, 255, 0, 255), 64, "P"),
                                          emoji.GEMOJIONE_DIR + "1F600.png": _png((0, 255, 0, 128), 64)})
    return [tgz, noto, gem]


def test_pictures_matched_by_code_points_alpha_on_white_and_split_by_concept(archives, tmp_path):
    from safetensors.numpy import load_file

    out = tmp_path / "out"
    out.mkdir()
    facts = emoji.write(archives, out)
    records = [json.loads(line) for s in ("train", "validation", "test") for line in (out / f"{s}.jsonl").open()]
    by_id = {r["id"]: r for r in records}
    assert sorted(by_id) == sorted(["openmoji/1F600", "openmoji/1F44B", "openmoji/1F44B-1F3FB", "openmoji/2764-FE0F",
                                    "openmoji/1F1E6-1F1E8", "noto/1F600", "noto/2764", "noto/1F1E6-1F1E8",
                                    "gemojione/1F44B-1F3FB", "gemojione/1F600"])
    assert by_id["noto/2764"]["caption"] == "red heart"  # FE0F ignored when matching
    assert by_id["noto/1F1E6-1F1E8"]["caption"] == "flag: Ascension Island"  # AC.png: regional indicators A, C
    assert by_id["gemojione/1F44B-1F3FB"] == {**by_id["openmoji/1F44B-1F3FB"], "id": "gemojione/1F44B-1F3FB",
                                              "style": "gemojione", "image": by_id["gemojione/1F44B-1F3FB"]["image"]}
    assert by_id["openmoji/1F44B-1F3FB"]["concept"] == "1F44B" and by_id["openmoji/1F44B-1F3FB"]["skin_tone"]
    assert facts["cleaning"]["noto_not_in_openmoji"] == 1
    pixels = load_file(str(out / emoji.IMAGES))["pixels"]
    assert pixels.shape == (10, 64, 64, 3) and pixels.dtype == np.uint8
    red = pixels[by_id["openmoji/1F600"]["image"]]
    assert tuple(red[0, 0]) == (255, 255, 255) and tuple(red[32, 32]) == (255, 0, 0)  # transparent corner -> white
    blue = pixels[by_id["noto/1F600"]["image"]]  # 72 -> 64 resized
    assert tuple(blue[0, 0]) == (255, 255, 255) and tuple(blue[32, 32]) == (0, 0, 255)
    half = pixels[by_id["gemojione/1F600"]["image"]][32, 32]  # 50 % green over white
    assert abs(int(half[0]) - 127) <= 2 and half[1] == 255 and abs(int(half[2]) - 127) <= 2
    assert tuple(pixels[by_id["gemojione/1F44B-1F3FB"]["image"]][32, 32]) == (0, 255, 0)  # palette PNG
    split_of = {}
    for s in ("train", "validation", "test"):
        for line in (out / f"{s}.jsonl").open():
            r = json.loads(line)
            assert split_of.setdefault(r["concept"], s) == s, f"{r['concept']} in {split_of[r['concept']]} and {s}"


def test_a_picture_that_does_not_render_or_decode_is_one_line_naming_it(archives, tmp_path):
    with pytest.raises(PtmError, match=r"^broken\.svg: the SVG does not render"):
        to_pixels(b"<svg xmlns='http://www.w3.org/2000/svg'><rect", 64, "broken.svg")
    with pytest.raises(PtmError, match=r"^x\.png: the image does not decode"):
        to_pixels(b"\x89PNG\r\n\x1a\nnot really", 64, "x.png")
    bad = make_deb(tmp_path / "bad.deb", {emoji.NOTO_DIR + "emoji_u1f600.png": b"garbage"})
    with pytest.raises(PtmError, match=r"bad\.deb:usr/share/.*/emoji_u1f600\.png: the image does not decode"):
        emoji.write([archives[0], bad, archives[2]], tmp_path)
    with pytest.raises(PtmError, match=r"nothing\.png: cannot read the image"):
        load_image(tmp_path / "nothing.png", 64)


def test_registered_with_pinned_artifacts_and_licences():
    src = SOURCES["emoji"]
    assert src.artifact == SOURCES["openmoji"].artifact  # one download for the text set and the pictures
    assert [a.package for a in src.more_artifacts] == ["ruby-tanuki-emoji", "ruby-gemojione"]
    assert all(a.registry == "apt" and len(a.sha256) == 64 for a in src.more_artifacts)
    assert all(w in src.licence for w in ("CC BY-SA 4.0", "Apache-2.0"))


def test_prepared_emoji_keeps_every_concept_in_one_split(prepared: Path):
    """The real set: 8,063 pictures of 2,465 concepts; no concept (with its skin tones and styles) crosses."""
    root = prepared / "emoji"
    manifest = json.loads((root / "manifest.json").read_text())
    splits = {s: [json.loads(line) for line in (root / f"{s}.jsonl").open()] for s in ("train", "validation", "test")}
    concepts = {s: {r["concept"] for r in recs} for s, recs in splits.items()}
    assert not (concepts["train"] & concepts["validation"] or concepts["train"] & concepts["test"]
                or concepts["validation"] & concepts["test"])
    assert manifest["counts"]["total"]["styles"] == {"openmoji": 4495, "noto": 1794, "gemojione": 1774}
    assert sum(len(r) for r in splits.values()) == manifest["counts"]["total"]["records"] == 8063
    assert {r["style"] for r in splits["test"]} == set(emoji.STYLES)


def test_clipart_keeps_titles_used_at_most_three_times_and_renders_point_sizes(tmp_path):
    from safetensors.numpy import load_file

    from ptm_app.data.sources import clipart

    def svg(title: str, size: str = 'width="72" height="72"') -> bytes:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:dc="http://purl.org/dc/elements/1.1/" '
                f'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" {size}>'
                f'<metadata><dc:title> {title} </dc:title><rdf:li>Stars</rdf:li></metadata>'
                f'<rect x="18" y="18" width="36" height="36" fill="#0000ff"/></svg>').encode()

    files = {f"{clipart.ROOT}shapes/stars/s{i}.svg": svg("Gramastar") for i in range(4)}  # a collection name
    files[clipart.ROOT + "animals/birds/owl.svg"] = svg("Night  Owl", 'width="54pt" height="54pt"')  # 72 px
    files[clipart.ROOT + "food/apple.svg"] = svg("apple")
    deb = make_deb(tmp_path / "oc.deb", files)
    out = tmp_path / "out"
    out.mkdir()
    facts = clipart.write([deb], out)
    records = {json.loads(line)["id"]: json.loads(line) for s in ("train", "validation", "test")
               for line in (out / f"{s}.jsonl").open()}
    assert sorted(records) == ["animals/birds/owl.svg", "food/apple.svg"]
    owl = records["animals/birds/owl.svg"]
    assert (owl["caption"], owl["group"], owl["subgroup"], owl["keywords"]) == ("night owl", "animals", "birds",
                                                                                 ["stars"])
    assert facts["cleaning"]["dropped_title_used_more_than_max"] == 4 and facts["cleaning"]["unrendered"] == []
    pixels = load_file(str(out / clipart.IMAGES))["pixels"]
    assert tuple(pixels[owl["image"]][32, 32]) == (0, 0, 255) and tuple(pixels[owl["image"]][2, 2]) == (255, 255, 255)
