"""One matplotlib style for every figure, and an atomic PDF+PNG saver."""

from __future__ import annotations

import os
import re
from pathlib import Path

import matplotlib
import numpy as np

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


#: A word of a label for wrapping: a run of non-space text, $math$ kept whole.
_WORD = re.compile(r"(?:\$[^$]*\$|[^\s$])+")


def _shown_length(text: str) -> int:
    """Roughly how many characters ``text`` shows (mathtext commands count as one)."""
    return len(re.sub(r"\\[a-zA-Z]+", "x", re.sub(r"[${}^_]", "", text)))


def _wrap(label: str, width: int) -> str:
    lines: list[str] = []
    for word in _WORD.findall(label):
        if lines and _shown_length(lines[-1]) + 1 + _shown_length(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def legend_below(fig, axes, handles, labels, ncol: int = 2, title: str | None = None, **kw):
    """``fig.legend`` centred under ``axes`` and no wider than they are (with their tick
    and axis labels): labels and ``title`` are wrapped at spaces until it fits, in fewer
    columns where a column would get narrower than about 28 characters, so that a figure
    saved with a tight bounding box keeps its panels at its full width. ``kw`` goes to
    ``fig.legend``."""
    axes = list(getattr(axes, "flat", axes))
    renderer = fig.canvas.get_renderer()
    with plt.rc_context(STYLE):
        boxes = [ax.get_tightbbox(renderer) for ax in axes]
        left, right = min(b.x0 for b in boxes), max(b.x1 for b in boxes)
        bottom = min(b.y0 for b in boxes)
        anchor = fig.transFigure.inverted().transform([((left + right) / 2, bottom)])[0]
        text, head, legend = list(labels), title, None
        for _ in range(12):
            if legend is not None:
                legend.remove()
            legend = fig.legend(handles, text, loc="upper center", ncol=ncol, title=head,
                                bbox_to_anchor=tuple(anchor), **kw)
            wide = legend.get_window_extent(renderer).width
            if wide <= right - left:
                break
            shrink = 0.95 * (right - left) / wide
            width = int(shrink * max(_shown_length(line)
                                     for t in text for line in t.split("\n")))
            if width < 28 and ncol > 1:  # too narrow: one column fewer, labels whole again
                ncol, text, head = ncol - 1, list(labels), title
                continue
            text = [_wrap(label, max(width, 12)) for label in labels]
            if head:
                longest = max(map(_shown_length, head.split("\n")))
                head = _wrap(title, max(12, int(shrink * longest)))
    return legend


def save(fig, path: str | os.PathLike) -> None:
    """Save ``fig`` to ``path`` (a .pdf) and a .png beside it, each atomically."""
    path = Path(path)
    with plt.rc_context(STYLE):
        for target in (path.with_suffix(".pdf"), path.with_suffix(".png")):
            with atomic_path(target) as tmp:
                fig.savefig(tmp, format=target.suffix[1:])
    plt.close(fig)


def _points(line) -> np.ndarray:
    """The finite (x, y) points a line draws, as floats."""
    xy = np.column_stack([np.asarray(line.get_xdata(), float),
                          np.asarray(line.get_ydata(), float)])
    return xy[np.isfinite(xy).all(axis=1)]


def _series(ax) -> dict[str, list]:
    """The visible series of ``ax``: key -> its lines. A series is the lines of one label,
    or of one ``gid`` (the unlabelled parts of a line broken at inf, :func:`broken_plot`),
    or the data line of a labelled errorbar."""
    series: dict[str, list] = {}
    for ln in ax.lines:
        if ln.get_visible():
            series.setdefault(ln.get_gid() or ln.get_label(), []).append(ln)
    for c in ax.containers:
        if hasattr(c, "has_xerr") and c.lines[0] is not None and c.lines[0].get_visible():
            series.setdefault(c.get_label(), []).append(c.lines[0])
    return series


def note_hidden(axes) -> None:
    """Add to the label of every series that lies, in every panel that draws it, under
    other series of the same values (each of its points drawn again by a line above it)
    the note ``[drawn under "<that series>": equal values]``, on a line of its own, so
    that a legend never names a series the reader cannot tell apart without saying so
    (see :func:`_series`); call this before the legend is made."""
    axes = list(getattr(axes, "flat", axes))
    hidden: dict[str, str | None] = {}  # label -> the series above it; None: seen somewhere
    for ax in axes:
        series = _series(ax)
        owner = {id(ln): key for key, lines in series.items() for ln in lines}
        lines = [ln for ln in ax.lines if id(ln) in owner]
        order = {id(ln): (ln.get_zorder(), i) for i, ln in enumerate(lines)}
        for key, own in series.items():
            if key.startswith("_") or hidden.get(key, "") is None:
                continue
            points = [(ln, p) for ln in own for p in _points(ln)]
            if not points:
                continue
            above = None
            for ln, p in points:
                cover = next((other for other in lines if owner[id(other)] != key
                              and order[id(other)] > order[id(ln)]
                              and np.isclose(_points(other), p, rtol=1e-9,
                                             atol=1e-12).all(axis=1).any()), None)
                if cover is None:
                    hidden[key] = None
                    break
                above = above or owner[id(cover)]
            else:
                hidden.setdefault(key, above)
    for ax in axes:
        for artist in [*ax.lines, *ax.containers]:
            under = hidden.get(artist.get_label())
            if under is not None:
                artist.set_label(f'{artist.get_label()}\n[drawn under "{_short(under)}": '
                                 'equal values]')  # a line of its own: legends stay narrow


def _short(label: str) -> str:
    """``label`` up to its first parenthesis, enough to name the series (whole where the
    cut would split a $math$ part)."""
    head = label.split(" (")[0]
    return head if head.count("$") % 2 == 0 else label


def broken_plot(ax, x, y, at_inf, label=None, **kw) -> None:
    """``ax.plot`` of the finite eps labels joined by a line and the points at eps = inf
    apart (the same marker, no line to them: a slope from a finite eps to inf means
    nothing); both parts are one series (one ``gid``) for :func:`note_hidden`."""
    at_inf = np.asarray(at_inf, bool)
    x, y = np.asarray(x), np.asarray(y)
    ax.plot(x[~at_inf], y[~at_inf], label=label, gid=label, **kw)
    if at_inf.any():
        ax.plot(x[at_inf], y[at_inf], **{**kw, "ls": "none"}, gid=label,
                label=None if (~at_inf).any() else label)
