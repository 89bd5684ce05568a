"""One matplotlib style for every figure, and an atomic PDF+PNG saver."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..io import atomic_path  # noqa: E402

STYLE = {
    "figure.figsize": (5.0, 3.6),
    "figure.dpi": 110,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
    "lines.markersize": 4.5,
    "pdf.fonttype": 42,
}

#: Colours by role, so the same quantity has the same colour in every figure.
COLORS = {
    "theory": "#222222",
    "empirical": "#1f77b4",
    "classical": "#1f77b4",
    "analytic": "#d62728",
    "clipbkd": "#d62728",
    "backdoor": "#2ca02c",
    "mi": "#9467bd",
    "buggy": "#d62728",
    "fixed": "#1f77b4",
}


def figure(nrows: int = 1, ncols: int = 1, **kw):
    """``plt.subplots`` under the project style."""
    with plt.rc_context(STYLE):
        w, h = STYLE["figure.figsize"]
        kw.setdefault("figsize", (w * ncols, h * nrows))
        return plt.subplots(nrows, ncols, **kw)


def save(fig, path: str | os.PathLike) -> None:
    """Save ``fig`` to ``path`` (a .pdf) and a .png beside it, each atomically."""
    path = Path(path)
    with plt.rc_context(STYLE):
        for target in (path.with_suffix(".pdf"), path.with_suffix(".png")):
            with atomic_path(target) as tmp:
                fig.savefig(tmp, format=target.suffix[1:])
    plt.close(fig)
