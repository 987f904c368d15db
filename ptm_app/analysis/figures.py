"""Pictures: matplotlib on its file-only backend (Agg, no display needed), saved atomically as PNG."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from ptm_app.paths import atomic_file  # noqa: E402


def new_figure(panels: int, width: float = 5.0, height: float = 3.6, columns: int = 3):
    """A figure with ``panels`` axes in rows of up to ``columns``; returns ``(figure, axes list)``."""
    columns = max(1, min(columns, panels))
    rows = (panels + columns - 1) // columns
    fig, grid = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)
    axes = list(grid.flat)
    for extra in axes[panels:]:
        extra.set_visible(False)
    return fig, axes[:panels]


def save_png(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to ``path`` (a PNG) atomically and close it."""
    path = Path(path)
    with atomic_file(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return path
