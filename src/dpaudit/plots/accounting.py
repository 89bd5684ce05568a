"""Figures: Abadi et al. Fig. 2 (eps vs epochs per accountant) and the basic-vs-advanced
composition graph of the CSCI 699 Week 4 lecture notes, each rendered from its result
table."""

from __future__ import annotations

import os

from ..io import read_table
from .style import COLORS, figure, legend_below, save

#: method -> (label, colour, line style), in legend order.
_ABADI = {
    "strong_abadi": ("strong composition as Abadi et al. compute it (the paper's line; "
                     "not a sound bound)", "#ff7f0e", "-"),
    "strong_sound": ("strong composition, sound version (exact Gaussian, tight "
                     "amplification)", "#ff7f0e", "--"),
    "rdp_classic": ("moments accountant (RDP, 2019 TF-Privacy)", COLORS["empirical"], "-"),
    "rdp": ("RDP, improved conversion", "#17becf", "--"),
    "pld": ("PLD (tight)", COLORS["theory"], "-"),
    "gdp": ("GDP CLT (asymptotic)", "#2ca02c", ":"),
}
#: The columns of each accounting-curves table that its figure reads.
COLUMNS = {"abadi": ("method", "epochs", "eps", "sample_rate", "sigma", "delta"),
           "composition": ("method", "k", "eps", "eps0", "delta_prime")}
#: Each accountant's name in a figure (``abadi.accountant``, ``accounting.METHODS``).
ACCOUNTANTS = {method: label for method, (label, _, _) in _ABADI.items()}
_COMPOSITION = {
    "basic": (r"basic: $k\varepsilon_0$", COLORS["theory"], "-"),
    "lecture": (r"lecture notes (CSCI 699): $\varepsilon_0\sqrt{2k\ln(1/\delta')}"
                r" + k\frac{e^{\varepsilon_0}-1}{e^{\varepsilon_0}+1}$", "#d62728", "-"),
    "drv": (r"Dwork, Rothblum, Vadhan 2010: $\ldots + k\varepsilon_0(e^{\varepsilon_0}-1)$",
            "#ff7f0e", "--"),
    "kov": (r"Kairouz, Oh, Viswanath 2015: $\ldots + k\varepsilon_0\frac{e^{\varepsilon_0}-1}"
            r"{e^{\varepsilon_0}+1}$", "#9467bd", "--"),
    "optimal": ("optimal composition (Kairouz et al. 2015, PLD)", COLORS["empirical"], "-"),
}


def _lines(ax, df, x: str, styles: dict) -> None:
    for method, (label, color, ls) in styles.items():
        sub = df[df.method == method].sort_values(x)
        ax.plot(sub[x], sub.eps, ls, color=color, label=label)


def plot_abadi_fig2(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """eps vs epochs for q, sigma, delta of the table: linear axes as in [ACG+16] Fig. 2
    (left) and a log scale separating the accountants (right)."""
    df, _ = read_table(table, columns=COLUMNS["abadi"],
                       what="accounting-curves --figure abadi")
    first = df.iloc[0]
    fig, axes = figure(1, 2)
    for ax, log in zip(axes, (False, True)):
        _lines(ax, df, "epochs", _ABADI)
        ax.set_xlabel("epochs E")
        ax.set_ylabel(r"$\varepsilon$")
        ax.set_xlim(left=0)
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
    axes[0].set_title(rf"q = {first.sample_rate:g}, $\sigma$ = {first.sigma:g}, "
                      rf"$\delta$ = {first.delta:g} (Abadi et al. Fig. 2)")
    axes[1].set_title("same, log scale")
    legend_below(fig, axes, *axes[0].get_legend_handles_labels(), ncol=3)
    save(fig, out)


def plot_composition(table: str | os.PathLike, out: str | os.PathLike) -> None:
    """eps of k-fold composition of eps0-DP steps at delta' against k (the CSCI 699
    Week 4 lecture's graph)."""
    df, _ = read_table(table, columns=COLUMNS["composition"],
                       what="accounting-curves --figure composition")
    first = df.iloc[0]
    fig, ax = figure()
    _lines(ax, df, "k", _COMPOSITION)
    ax.set_xlabel("number of composed mechanisms k")
    ax.set_ylabel(r"$\varepsilon$ of the composition")
    ax.set_xlim(0, df.k.max())
    ax.set_ylim(0, None)
    ax.set_title(rf"Composing $\varepsilon_0$ = {first.eps0:g}-DP steps, "
                 rf"$\delta'$ = {first.delta_prime:g}")
    # below the axes: inside, the legend would cover the steep lines at large k
    legend_below(fig, [ax], *ax.get_legend_handles_labels(), ncol=1)
    save(fig, out)
