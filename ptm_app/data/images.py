"""Pictures as pixels: decode a raster image (PNG, JPEG ...) or render an SVG, composite any alpha channel on
white, and resize to a square of ``size`` pixels (uint8 RGB, ``(size, size, 3)``).

SVGs are rendered by ``resvg`` (the ``resvg-py`` wheel bundles its renderer: no system library such as cairo).
Transparent pixels become white: emoji and clip art are drawn on a transparent canvas, and white is the page they
are meant for.  A file that does not decode or render is refused in one line naming it.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np

from ptm_app.errors import PtmError

WHITE = (255, 255, 255)


def _is_svg(data: bytes) -> bool:
    head = data[:512].lstrip().lower()
    return head.startswith(b"<svg") or head.startswith(b"<?xml") and b"<svg" in data[:4096].lower()


PX_PER = {"px": 1.0, "pt": 4 / 3, "pc": 16.0, "mm": 96 / 25.4, "cm": 96 / 2.54, "in": 96.0}
ROOT_SIZE = re.compile(r'(<svg\b[^>]*?\s)(width|height)\s*=\s*"\s*([0-9.]+)\s*(pt|pc|mm|cm|in|px)\s*"', re.S)


def px_root_size(svg: str) -> str:
    """The SVG with its root ``width`` / ``height`` in absolute units (pt, mm ...) written as pixel numbers (what
    they mean: 1pt = 4/3 px), which resvg otherwise refuses as "an invalid size"."""
    for _ in range(2):
        svg = ROOT_SIZE.sub(lambda m: f'{m.group(1)}{m.group(2)}="{float(m.group(3)) * PX_PER[m.group(4)]:g}"', svg,
                            count=1)
    return svg


def render_svg(data: bytes, size: int, name: str) -> bytes:
    """PNG bytes of the SVG ``data`` rendered at ``size`` × ``size`` (resvg; transparent background)."""
    import resvg_py

    try:
        text = data.decode("utf-8")
        try:
            return resvg_py.svg_to_bytes(svg_string=text, width=size, height=size)
        except ValueError as exc:
            if "invalid size" not in str(exc):
                raise
            return resvg_py.svg_to_bytes(svg_string=px_root_size(text), width=size, height=size)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PtmError(f"{name}: the SVG does not render ({' '.join(str(exc).split())[:160]}); "
                       f"give a valid SVG file") from None


def to_pixels(data: bytes, size: int, name: str) -> np.ndarray:
    """``(size, size, 3)`` uint8 RGB of an image file's bytes: SVG rendered at ``size``, rasters decoded and
    resized (bicubic); an alpha channel (or a palette's transparency) is composited on white."""
    from PIL import Image, UnidentifiedImageError

    if _is_svg(data):
        data = render_svg(data, size, name)
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            rgba = img.convert("RGBA")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise PtmError(f"{name}: the image does not decode ({' '.join(str(exc).split())[:160]}); "
                       f"give a PNG, JPEG, GIF, WebP or SVG file") from None
    page = Image.new("RGBA", rgba.size, WHITE + (255,))
    rgb = Image.alpha_composite(page, rgba).convert("RGB")
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BICUBIC)
    return np.asarray(rgb, dtype=np.uint8)


def load_image(path: str | Path, size: int) -> np.ndarray:
    """``to_pixels`` of a file (``embed --image``, ``predict --image``); a missing file is one line."""
    path = Path(path).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PtmError(f"{path}: cannot read the image ({exc.strerror or exc}); give an existing image file") from None
    return to_pixels(data, size, str(path))
