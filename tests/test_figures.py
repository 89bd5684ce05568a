"""The figures and report captions say what they draw: every legend entry names an artist
that is drawn, the captions render as Snakemake renders them, and the Abadi, HW3 and
Jagielski figures keep their markers inside the panels and their lines where they mean
something."""

from __future__ import annotations

import math
import re
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
import pytest

from dpaudit.io import read_table, write_table

ROOT = Path(__file__).parents[1]


def _capture(monkeypatch, module):
    """The figures ``module``'s plot functions draw, instead of saved (left open)."""
    figures = []
    monkeypatch.setattr(module, "save", lambda fig, out: figures.append(fig))
    return figures


def _words(text: str) -> str:
    return " ".join(text.split())  # legend_below wraps labels at spaces


def _drawn(fig) -> dict[str, list]:
    """label -> the artists carrying it that show at least one finite point."""
    drawn: dict[str, list] = {}
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for line in ax.get_lines():
            xy = np.asarray(line.get_xydata(), float)
            if line.get_visible() and np.isfinite(xy).all(axis=1).any():
                drawn.setdefault(_words(line.get_label()), []).append(line)
    return drawn


def _legend_labels(fig) -> list[str]:
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [_words(t.get_text()) for leg in legends for t in leg.get_texts()]


def _assert_legend_is_drawn(fig, proxies=()) -> None:
    drawn = _drawn(fig)
    for label in _legend_labels(fig):
        assert label in drawn or label in map(_words, proxies), label


def _under_equal_series(fig) -> set[str]:
    """The series (lines of one label, or of one gid: a line broken at inf) that, in every
    panel drawing them, have exactly the points of another series drawn above them."""
    hidden: dict[str, bool] = {}
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        series: dict[str, list] = {}
        keys = {id(c.lines[0]): c.get_label() for c in ax.containers
                if hasattr(c, "has_xerr")}  # an errorbar's label is its container's
        for i, line in enumerate(ax.get_lines()):
            key = re.split(r"\s\[drawn under",
                           keys.get(id(line)) or line.get_gid() or line.get_label())[0]
            xy = np.asarray(line.get_xydata(), float)
            xy = xy[np.isfinite(xy).all(axis=1)]
            if line.get_visible() and len(xy) and not key.startswith("_"):
                series.setdefault(key, []).append(((line.get_zorder(), i), xy))
        points = {k: np.unique(np.vstack([xy for _, xy in v]), axis=0)
                  for k, v in series.items()}
        top = {k: max(order for order, _ in v) for k, v in series.items()}
        for key in series:
            under = any(other != key and top[other] > top[key]
                        and points[other].shape == points[key].shape
                        and np.array_equal(points[other], points[key]) for other in series)
            hidden[key] = hidden.get(key, True) and under
    return {_words(k) for k, under in hidden.items() if under}


def _assert_hidden_series_say_so(fig, expected: int) -> None:
    """Every legend entry of a series hidden under an equal one says so, no other does,
    and there are ``expected`` of them."""
    hidden = _under_equal_series(fig)
    assert len(hidden) == expected, hidden
    for label in _legend_labels(fig):
        base = label.split(" [drawn under")[0]
        assert ("[drawn under" in label) == (base in hidden), label


# ------------------------------------------------------------------------------ Abadi

def _abadi_table(path, reach: dict[str, bool]) -> None:
    """A fig3 accuracy table: one level per ``reach`` entry, whose eps reaches its target
    (or stays at half of it) by the last of 4 epochs."""
    from dpaudit.experiments.abadi import COLUMNS, PAPER

    rows = []
    for level, reached in reach.items():
        target = PAPER["fig3"][level]["eps"]
        for epoch in range(5):
            rows.append({"figure": "fig3", "dataset": "fmnist", "level": level,
                         "sigma": PAPER["fig3"][level]["sigma"],
                         "sigma_pca": PAPER["fig3"][level]["sigma_pca"], "lot_size": 100,
                         "n_train": 2000, "epoch": epoch, "steps": 20 * epoch, "lr": 0.1,
                         "train_acc": 0.1 + 0.2 * epoch, "test_acc": 0.1 + 0.18 * epoch,
                         "eps": target * epoch / 4 * (1.0 if reached else 0.5),
                         "delta": 1e-5, "accountant": "rdp_classic", "eps_target": target,
                         "seed": 0, "pretrained_on": None, "jpeg_reencoded": False})
    write_table(pd.DataFrame(rows, columns=COLUMNS), path, {})


@pytest.mark.parametrize("reach", [{"large": False, "medium": False},
                                   {"large": True, "medium": False}])
def test_abadi_legend_names_the_star_only_where_a_panel_draws_it(tmp_path, monkeypatch,
                                                                  reach):
    from dpaudit.plots import abadi

    figures = _capture(monkeypatch, abadi)
    _abadi_table(tmp_path / "acc.csv", reach)
    abadi.plot_abadi(tmp_path / "acc.csv", "fig3", tmp_path / "fig.pdf")
    fig = figures[0]
    _assert_legend_is_drawn(fig)
    stars = [lab for lab in _legend_labels(fig) if "paper's test accuracy" in lab]
    assert len(stars) == any(reach.values())
    # the right axis names the accountant, not its key; the final numbers sit in the titles
    right = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel().startswith("$\\vareps")]
    assert right and "rdp_classic" not in right[0] and "moments accountant" in right[0]
    titles = [ax.get_title() for ax in fig.axes[:len(reach)]]
    eps = 0.5 if reach["large"] else 0.25  # large: target 0.5, reached or half of it
    assert f"epoch 4: test 82.0%, $\\varepsilon$ = {eps:.2f}" in titles[0]
    assert not [t for ax in fig.axes for t in ax.texts if "test" in t.get_text()]


def test_abadi_fig2_legend_says_which_strong_composition_is_sound(tmp_path, monkeypatch):
    from dpaudit.plots import accounting

    rows = [{"method": m, "epochs": e, "eps": 1.0 + i + e, "sample_rate": 0.01, "sigma": 4.0,
             "delta": 1e-5} for i, m in enumerate(accounting._ABADI) for e in (1, 2)]
    write_table(pd.DataFrame(rows), tmp_path / "f2.csv", {})
    figures = _capture(monkeypatch, accounting)
    accounting.plot_abadi_fig2(tmp_path / "f2.csv", tmp_path / "f2.pdf")
    labels = _legend_labels(figures[0])
    _assert_legend_is_drawn(figures[0])
    by_style = {line.get_label(): line.get_linestyle()
                for line in figures[0].axes[0].get_lines()}
    sound = [lab for lab in labels if "sound version" in lab]
    paper = [lab for lab in labels if "the paper's line" in lab]
    assert len(sound) == len(paper) == 1
    assert "not a sound bound" in paper[0]
    assert {by_style[k] for k in by_style if "sound version" in _words(k)} == {"--"}


# ------------------------------------------------------------------------------ HW3

def _hw3_table(path, pure_offset: float) -> None:
    rows = []
    for cal in ("classical", "analytic"):
        for eps in (1.0, 4.0):
            for rep in range(2):
                lb = 0.3 * eps + 0.01 * rep
                rows.append({"calibration": cal, "eps": eps, "m": 1000, "d": 100,
                             "repeat": rep, "delta": 1e-5, "beta": 0.05, "eps_lb": lb,
                             "eps_lb_fdp": lb + 0.002, "eps_lb_pure": lb + pure_offset,
                             "eps_lb_pure_hoeffding": 0.5 * lb, "eps_hat_max": 1.2 * lb,
                             "true_eps": eps})
    write_table(pd.DataFrame(rows), path, {})


@pytest.mark.parametrize("pure_offset", [0.004, 0.5])
def test_hw3_legend_colours_match_every_panel_and_say_what_hides(tmp_path, monkeypatch,
                                                                 pure_offset):
    from matplotlib.colors import to_hex

    from dpaudit.plots import hw3

    _hw3_table(tmp_path / "t.csv", pure_offset)
    figures = _capture(monkeypatch, hw3)
    hw3.plot_grid(tmp_path / "t.csv", "eps", tmp_path / "f.pdf")
    fig = figures[0]
    _assert_legend_is_drawn(fig)
    drawn = _drawn(fig)
    legend = fig.legends[0]
    for handle, text in zip(legend.legend_handles, legend.get_texts()):
        colours = {to_hex(line.get_color()) for line in drawn[_words(text.get_text())]}
        assert colours == {to_hex(handle.get_color())}, text.get_text()  # every panel
    hidden = [lab for lab in _legend_labels(fig) if "within 0.01 of the thick line" in lab]
    # f-DP is 0.002 above the bound everywhere; pure-eps only in the first table
    assert len(hidden) == (2 if pure_offset < 0.01 else 1)


# ------------------------------------------------------------------------------ Jagielski

@pytest.fixture
def quick_fig2(tmp_path):
    """The reference Figure 2 table at the quick grid's eps labels (4 and inf)."""
    df, meta = read_table(ROOT / "reference/jagielski_fig2.csv")
    df = df[df.eps_label.isin([4.0, math.inf])]
    assert len(df) == 2 * 2 * 2 * 3  # data sets x models x eps x attacks
    write_table(df, tmp_path / "fig2.csv", meta)
    return tmp_path / "fig2.csv", df


def test_jagielski_fig2_breaks_lines_at_inf_and_keeps_markers_inside(quick_fig2, tmp_path,
                                                                      monkeypatch):
    from dpaudit.plots import jagielski

    table, df = quick_fig2
    figures = _capture(monkeypatch, jagielski)
    jagielski.plot_fig2(table, tmp_path / "f.pdf")
    fig = figures[0]
    _assert_legend_is_drawn(fig, proxies=[jagielski.SPLIT_LABEL])
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 4 and len({ax.get_position().x0 for ax in panels}) == 2  # 2 x 2
    for ax in panels:
        ticks = dict(zip(ax.get_xticks(), (t.get_text() for t in ax.get_xticklabels())))
        x_inf = next(x for x, t in ticks.items() if t == "inf")
        top = ax.get_ylim()[1]
        for line in ax.get_lines():
            xy = np.asarray(line.get_xydata(), float)
            xy = xy[np.isfinite(xy).all(axis=1)]
            if not len(xy):
                continue
            assert xy[:, 1].max() < top, line.get_label()  # not clipped at the top
            at_inf = np.isclose(xy[:, 0], x_inf, rtol=0.15)
            if line.get_linestyle() not in ("None", "none", " ", ""):
                assert at_inf.all() or not at_inf.any(), line.get_label()  # no slope to inf
        reference = [line for line in ax.get_lines() if line.get_label().startswith("eps = ")]
        for x in reference[0].get_xdata():  # the eps = eps_th line at labelled eps_th only
            assert any(math.isclose(x, t, rel_tol=1e-2) for t in ticks), x
    fig.canvas.draw()
    width, height = fig.get_size_inches() * 200  # savefig.dpi
    assert width < 2100 and height < 2000


def test_fig2_legend_says_which_series_hide_under_equal_ones(quick_fig2, tmp_path,
                                                              monkeypatch):
    """MI's Katz and Bayesian bounds equal to its certified one in every cell: drawn under
    its filled markers (the certified bounds are drawn on top), their legend entries say
    so; the others' do not."""
    from dpaudit.plots import jagielski

    _, df = quick_fig2
    mi = df.attack == "mi"
    df.loc[mi, "eps_lb_katz"] = df.loc[mi, "eps_lb_bayes"] = df.loc[mi, "eps_lb"]
    write_table(df, tmp_path / "equal.csv", {})
    figures = _capture(monkeypatch, jagielski)
    jagielski.plot_fig2(tmp_path / "equal.csv", tmp_path / "f.pdf")
    _assert_legend_is_drawn(figures[0], proxies=[jagielski.SPLIT_LABEL])
    _assert_hidden_series_say_so(figures[0], expected=2)
    labels = [lab for lab in _legend_labels(figures[0]) if "[drawn under" in lab]
    assert all(lab.startswith("MI: ") and '"MI: 99% lower bound"' in lab for lab in labels)


def _onerun_table(path, last_equals_all: bool) -> None:
    rows = []
    for label, pld in (("4", 1.28), ("inf", math.inf)):
        for canary, threat in (("input", "black-box"), ("dirac", "last-iterate"),
                               ("dirac", "all-iterates")):
            for rep in range(2):
                bound = 0.0 if canary == "input" else 0.2 + 0.1 * rep + (
                    0.0 if last_equals_all or threat == "all-iterates" else 0.3)
                rows.append({"arch": "lr", "eps_label": label, "canary": canary,
                             "threat_model": threat, "m": 100, "repeat": rep,
                             "delta": 1e-5, "eps_pld": pld * (1.0 if canary == "dirac"
                                                               else 0.99),
                             "eps_lb": 0.5 * bound, "eps_lb_fdp": bound})
    write_table(pd.DataFrame(rows), path, {})


@pytest.mark.parametrize("last_equals_all", [True, False])
def test_onerun_legend_breaks_at_inf_labels_every_pld_and_says_what_hides(
        tmp_path, monkeypatch, last_equals_all):
    """The last-iterate bounds equal to the all-iterates ones hide under them and say so;
    no line joins label 4 to inf; both PLD diamonds carry their value; markers at 0 are
    drawn whole."""
    from dpaudit.plots import onerun

    _onerun_table(tmp_path / "t.csv", last_equals_all)
    figures = _capture(monkeypatch, onerun)
    onerun.plot_onerun(tmp_path / "t.csv", tmp_path / "f.pdf")
    fig = figures[0]
    _assert_legend_is_drawn(fig)
    # the input canaries' Steinke et al. bound (0) under their f-DP one, and the last
    # iterate's two under the all-iterates ones where equal
    _assert_hidden_series_say_so(fig, expected=3 if last_equals_all else 1)
    ax = fig.axes[0]
    for line in ax.get_lines():
        xy = np.asarray(line.get_xydata(), float)
        xy = xy[np.isfinite(xy).all(axis=1)]
        if line.get_linestyle() not in ("None", "none", " ", "") and len(xy) > 1:
            assert np.ptp(xy[:, 0]) == 0 or 1 not in xy[:, 0], line.get_label()  # inf: x 1
    values = {t.get_text() for t in ax.texts}
    assert {"1.28", "1.27"} <= values  # dirac and input canaries' eps by PLD
    assert not any(line.get_clip_on() for line in ax.get_lines()
                   if "bound" in line.get_label())


def test_ridge_legend_says_app_d_hides_under_equal_fdp(tmp_path, monkeypatch):
    from dpaudit.plots import ridge

    rows = [{"rho": rho, "repeat": rep, "delta": 1e-5, "m": 40, "d": 40, "n": 40,
             "eps_lb": 0.1 * rho + 0.01 * rep, "eps_lb_fdp": 0.1 * rho + 0.01 * rep,
             "eps_hat_max": 0.3 * rho, "eps_theory_bs": 2 * rho + 1, "eps_theory_exact": rho + 1}
            for rho in (0.5, 2.0) for rep in range(2)]
    write_table(pd.DataFrame(rows), tmp_path / "t.csv", {})
    figures = _capture(monkeypatch, ridge)
    ridge.plot_audit(tmp_path / "t.csv", tmp_path / "f.pdf")
    _assert_hidden_series_say_so(figures[0], expected=1)
    (label,) = [lab for lab in _legend_labels(figures[0]) if "[drawn under" in lab]
    assert "vs. exact GDP conversion" in label and '"f-DP' in label


def test_tramer_threshold_line_ends_below_the_legend(tmp_path, monkeypatch):
    from dpaudit.plots import tramer

    figures = _capture(monkeypatch, tramer)
    tramer.plot_canary_losses(ROOT / "reference/tramer_audit.csv", tmp_path / "f.pdf",
                              hist=ROOT / "reference/tramer_audit_hist.csv")
    fig = figures[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent(renderer)
        (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("threshold")]
        top = ax.transAxes.transform((0, line.get_ydata()[1]))[1]
        bars = max(p.get_window_extent(renderer).y1 for p in ax.patches)
        assert bars <= top < legend.y0, ax.get_title()


# ------------------------------------------------------------------------------ captions

class _Snake:
    def __init__(self, config: dict, **wildcards):
        self.config = config
        self.wildcards = type("W", (), wildcards)


def _caption(name: str, config: dict, **wildcards) -> str:
    """The caption as Snakemake renders it (trim_blocks, lstrip_blocks)."""
    text = (ROOT / "workflow/report" / name).read_text()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return _words(env.from_string(text).render(snakemake=_Snake(config, **wildcards)))


@pytest.fixture(scope="module")
def quick_config():
    import yaml

    def merge(base, over):
        for k, v in over.items():
            base[k] = merge(base.get(k, {}), v) if isinstance(v, dict) else v
        return base

    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    return merge(config, yaml.safe_load((ROOT / "config/quick.yaml").read_text()))


def test_abadi_captions_describe_their_own_figure(quick_config):
    fig3 = _caption("abadi.rst", quick_config, figure="fig3")
    fig6 = _caption("abadi.rst", quick_config, figure="fig6")
    assert "DP-PCA included" in fig3 and "DP-PCA" not in fig6
    for text in (fig3, fig6):
        assert "epochs). Training accuracy" in text, text


def test_onerun_and_table2_captions_name_what_is_shown(quick_config):
    onerun = _caption("onerun_dpsgd.rst", quick_config)
    assert f"up to m = {quick_config['onerun']['m']} canaries per run" in onerun
    assert "Config: initialisation fixed (" in onerun  # the quick Figure 2's cells
    assert "results/jagielski_table2.html" in _caption("jagielski_table2_table.rst",
                                                       quick_config)


def test_tight_caption_gives_each_audits_level_init_and_labels(quick_config):
    """The quick config: the tight audits at 95%, Figure 2's ClipBKD cells at 99% and at
    the fixed init, the one-run rows at 95%, and the labels that have those rows."""
    text = _caption("tight_audit.rst", quick_config)
    assert "64 runs per side, Clopper-Pearson at 95%" in text
    assert "Figure 2 cells at init fixed, 40 models per side, 99%, trained with shuffle" in text
    assert "1000 gradient canaries, init fixed, f-DP bound at 95%" in text
    assert "labels of jagielski.fig2.eps, 4, inf, and of onerun.eps, 4, inf)" in text


# every caption's wildcards and the values the rules give them
CAPTION_WILDCARDS = {"figure": ["fig3", "fig6", "tramer", "audit_user"],
                     "grid": ["eps", "m", "d"], "experiment": ["fig2", "table2"]}


@pytest.mark.parametrize("config_name", ["quick", "full"])
def test_captions_quote_the_config_as_a_reader_writes_it(quick_config, config_name):
    """No caption prints a Python list or dict (``['4', 'inf']``, ``{'d': [...]}``), a
    config code for a data set, model or attack (``fmnist / fnn``), or "1 epochs"."""
    import itertools

    import yaml

    config = quick_config if config_name == "quick" else yaml.safe_load(
        (ROOT / "config/config.yaml").read_text())
    config = {**config, "abadi": {**config["abadi"], "fig3": {
        **config["abadi"]["fig3"], "lr_decay_epochs": 1, "max_epochs": 1}}}
    rendered = 0
    for path in sorted((ROOT / "workflow/report").glob("*.rst")):
        names = sorted(set(re.findall(r"snakemake\.wildcards\.(\w+)", path.read_text())))
        for values in itertools.product(*(CAPTION_WILDCARDS[n] for n in names)):
            text = re.sub(r"<style>.*?</style>", "",  # the front page's CSS
                          _caption(path.name, config, **dict(zip(names, values))))
            rendered += 1
            assert not re.search(r"[\[\]{}]|'\w+'|\b1 epochs\b", text), (path.name, text)
            assert not re.search(r"\b(fmnist|cifar|fnn|lr|clipbkd|dirac|pca)\b", text), (
                path.name, text)
    assert rendered >= 17


def test_trials_needed_title_says_where_no_range_is_shaded(tmp_path, monkeypatch):
    """The reference study: at eps_th inf ClipBKD separates every draw perfectly (each
    method's quartiles are equal at every n), at 8 it does not."""
    from dpaudit.plots import trials_needed

    table, _ = read_table(ROOT / "reference/trials_needed.csv")
    spread = table.groupby(["eps_label", "n"]).eps_lb.agg(lambda v: v.max() - v.min())
    assert spread.loc[math.inf].max() == 0 and spread.loc[8.0].max() > 0
    figures = _capture(monkeypatch, trials_needed)
    trials_needed.plot_trials_needed(ROOT / "reference/trials_needed.csv",
                                     ROOT / "reference/trials_needed_summary.csv",
                                     tmp_path / "f.pdf")
    fig = figures[0]
    _assert_legend_is_drawn(fig)
    titles = {ax.get_title().split("label ")[1].split("\n")[0]: ax.get_title()
              for ax in fig.axes}
    assert "no shaded range" in titles["inf"] and "no shaded range" not in titles["8"]
