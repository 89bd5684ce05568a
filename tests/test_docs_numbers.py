"""The measured numbers the docs quote equal the kept tables behind them (reference/): a
rerun that changes a result, or an edit of a page, shows here. Numbers the pages mark as
"before" are of code this project replaced and are not kept; the pages say so."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from dpaudit.io import read_table

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE = ROOT / "reference"
NUMBER = r"-?\d+(?:\.\d+)?"


def doc_table(page: str, first_header: str) -> list[list[str]]:
    """The rows (cells stripped, the header first) of the Markdown table of ``docs/page``
    whose header row starts with ``| first_header |``."""
    lines = (DOCS / page).read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return [rows[0], *rows[2:]]


def first_number(cell: str) -> float:
    """The cell's value: its first number (bold or not), before any bracket."""
    return float(re.search(NUMBER, cell.replace("**", "")).group())


def assert_2dp(quoted: float, value: float, where) -> None:
    """``quoted`` is ``value`` as the docs print it, to 2 decimals."""
    assert quoted == pytest.approx(value, abs=0.005 + 1e-9), (where, quoted, value)


# --- HW3 (docs/hw3.md): full config, 20 repeats, seed 0 ---

HW3_COLUMNS = ("eps_lb_pure_hoeffding", "eps_lb_pure", "eps_lb_fdp", "eps_hat_max", "eps_gdp",
               "eps_lb", "mu_lb")


def _hw3(grid: str) -> pd.DataFrame:
    df, meta = read_table(REFERENCE / f"hw3_eps_vs_{grid}.csv")
    assert meta["command"] == "hw3-audit" and meta["spec"]["repeats"] == 20
    assert meta["seed"] == 0
    return df


def _hw3_row(label: str) -> tuple[str, str]:
    """(column, calibration) of a row label such as ``eps_lb_fdp analytic (before)``."""
    word = label.replace("*", "").split()[0]
    assert word in HW3_COLUMNS or word == "true", label
    calibration = "analytic" if "analytic" in label else "classical"
    return ("true_eps" if word == "true" else word), calibration


@pytest.mark.parametrize("grid, header", [("eps", "eps"), ("m", "m"), ("d", "d")])
def test_hw3_tables_quote_the_kept_means(grid, header):
    """Each row of docs/hw3.md's three tables (but the `before` rows, of the replaced
    sweep) is the mean over the 20 repeats of that column in the kept table."""
    df = _hw3(grid)
    rows = doc_table("hw3.md", header)
    points = [float(x.replace("1e4", "10000").replace("1e5", "100000")) for x in rows[0][1:]]
    checked = 0
    for row in rows[1:]:
        if row[0].endswith(", before"):
            continue
        column, calibration = _hw3_row(row[0])
        means = df[df.calibration == calibration].groupby(header)[column].mean()
        assert sorted(means.index) == sorted(points), (grid, row[0])
        for point, cell in zip(points, row[1:]):
            assert_2dp(first_number(cell), means[point], (grid, row[0], point))
            checked += 1
    assert checked >= 4 * len(points)


# --- tight audits (docs/tight.md, "How many runs"): the kept white-box table ---

def test_tight_how_many_runs_quotes_the_kept_white_box_rows():
    """The label-2 white-box numbers of "How many runs": the 2-layer net's AUC of both
    scores and what each certifies (and LR's), from reference/tight_whitebox.csv; the
    0.39-GDP test's AUC and the 1-GDP eps are closed forms."""
    from scipy.stats import norm

    from dpaudit.bounds import eps_from_mu

    df, _ = read_table(REFERENCE / "tight_whitebox.csv")
    cell = df[df.eps_label.astype(str) == "2"].set_index(["arch", "method"])
    text = (DOCS / "tight.md").read_text().split("### How many runs", 1)[1].split("\n#", 1)[0]
    text = " ".join(text.split())
    fnn, lr = cell.loc["fnn"], cell.loc["lr"]
    assert_2dp(1.54, fnn.eps_th.iloc[0], "eps_th")
    auc = float(re.search(rf"2-layer rows measure ({NUMBER}) for both scores", text).group(1))
    for method in ("whitebox-llr", "whitebox-dot-sum"):
        assert_2dp(auc, fnn.loc[method, "auc"], method)
    quoted = re.search(rf"certifying ({NUMBER}) and ({NUMBER}) \(LR: ({NUMBER}) and ({NUMBER})\)",
                       text)
    assert quoted, text
    values = [fnn.loc["whitebox-llr", "eps_lb"], fnn.loc["whitebox-dot-sum", "eps_lb"],
              lr.loc["whitebox-llr", "eps_lb"], lr.loc["whitebox-dot-sum", "eps_lb"]]
    for got, value in zip(map(float, quoted.groups()), values):
        assert_2dp(got, value, "certified")
    assert "Phi(0.39 / sqrt 2) = 0.61" in text
    assert_2dp(0.61, norm.cdf(0.39 / 2 ** 0.5), "AUC of 0.39-GDP")
    assert "eps 4.38 at delta 1e-5" in text
    assert_2dp(4.38, eps_from_mu(1.0, 1e-5), "1-GDP")
# --- Abadi et al. (docs/abadi.md): the quick config's last epochs ---

def test_abadi_quick_table_quotes_the_kept_last_epochs():
    """docs/abadi.md's quick-config table: each level's last epoch, its train and test
    accuracy (%, 1 decimal) and eps (2 decimals), from reference/abadi_accuracy_quick.csv."""
    from dpaudit.experiments.abadi import summary

    df, meta = read_table(REFERENCE / "abadi_accuracy_quick.csv")
    assert meta["command"] == "abadi-table"
    last = summary(df).set_index(["figure", "level"])
    rows = doc_table("abadi.md", "figure")
    quick = [r for r in rows[1:] if "n = 2,000" in r[1] or "n = 1,500" in r[1]]
    assert len(quick) == len(last) == 6
    for figure, data, level, epochs, train, test, eps, _ in quick:
        got = last.loc[(f"fig{figure}", level.split()[0])]
        where = (figure, level)
        assert int(epochs) == got.epoch, where
        assert float(train.rstrip("%")) == pytest.approx(100 * got.train_acc, abs=0.05), where
        assert float(test.rstrip("%")) == pytest.approx(100 * got.test_acc, abs=0.05), where
        assert_2dp(float(eps), got.eps, where)




# --- one-run audits of DP-SGD (docs/onerun.md): the quick config ---

def test_onerun_quick_numbers_quote_the_kept_runs():
    """The quick paragraph of docs/onerun.md: the mean f-DP bound of the 2 runs per cell and
    the quick Figure 2's ClipBKD cells beside them, from reference/onerun_*_quick.csv."""
    runs, meta = read_table(REFERENCE / "onerun_dpsgd_quick.csv")
    assert meta["spec"]["repeats"] == 2 and meta["train"]["epochs"] == 4
    many, _ = read_table(REFERENCE / "onerun_many_model_quick.csv")
    text = " ".join((DOCS / "onerun.md").read_text().split("The quick config (4 epochs", 1)[1]
                    .split("![", 1)[0].split())

    def mean(arch, threat, label):
        cell = runs[(runs.arch == arch) & (runs.threat_model == threat)
                    & (runs.eps_label.astype(str).isin([label, f"{label}.0"]))]
        assert len(cell) == 2, (arch, threat, label)
        return cell.eps_lb_fdp.mean()

    found = re.search(rf"FNN white box ({NUMBER}) without noise \(both threat models\) and "
                      rf"({NUMBER}) / ({NUMBER}) \(all / last iterate\) at label 4 \(eps_th "
                      rf"({NUMBER}) for the gradient canaries\); LR white box ({NUMBER}) "
                      rf"without noise, 0 at 4; black box 0 everywhere", text)
    assert found, text
    fnn_inf, fnn_all, fnn_last, eps_th, lr_inf = map(float, found.groups())
    for threat in ("all-iterates", "last-iterate"):
        assert_2dp(fnn_inf, mean("fnn", threat, "inf"), threat)
        assert_2dp(lr_inf, mean("lr", threat, "inf"), threat)
        assert mean("lr", threat, "4") == 0
    assert_2dp(fnn_all, mean("fnn", "all-iterates", "4"), "fnn all")
    assert_2dp(fnn_last, mean("fnn", "last-iterate", "4"), "fnn last")
    dirac = runs[(runs.canary == "dirac") & (runs.eps_label.astype(str).isin(["4", "4.0"]))]
    assert_2dp(eps_th, dirac.eps_th.iloc[0], "eps_th")
    assert (runs[runs.threat_model == "black-box"].eps_lb_fdp == 0).all()
    found = re.search(rf"\(40 models per side and k\): ({NUMBER}) without noise for both "
                      rf"models \(({NUMBER}) best over k, [^)]*\), 0 at 4", text)
    assert found, text
    clipbkd, best = map(float, found.groups())
    noise_free = many[many.eps_label.astype(str).isin(["inf"])]
    assert len(noise_free) == 2 and (noise_free.trials == 40).all()
    for _, row in noise_free.iterrows():
        assert_2dp(clipbkd, row.eps_lb, row.arch)
        assert_2dp(best, row.eps_lb_best_k, row.arch)
    assert (many[many.eps_label.astype(str).isin(["4", "4.0"])].eps_lb == 0).all()


# --- one-run audits of DP-SGD (docs/onerun.md): the full config ---

#: docs/onerun.md's row names -> (canary, threat model) of the kept table.
ONERUN_ROWS = {"black box": ("input", "black-box"),
               "white box, last iterate": ("dirac", "last-iterate"),
               "white box, all iterates": ("dirac", "all-iterates")}


def _onerun_full() -> pd.DataFrame:
    runs, meta = read_table(REFERENCE / "onerun_dpsgd.csv")
    assert meta["command"] == "onerun-audit" and meta["seed"] == 0
    assert meta["spec"]["repeats"] == 5 and meta["train"]["epochs"] == 24
    assert len(runs) == 180
    return runs.assign(label=runs.eps_label.astype(str).str.removesuffix(".0"))


def _onerun_runs(runs, arch, name, label) -> pd.DataFrame:
    canary, threat = ONERUN_ROWS[name]
    cell = runs[(runs.arch == arch) & (runs.canary == canary) & (runs.threat_model == threat)
                & (runs.label == label)]
    assert len(cell) == 5, (arch, name, label)
    return cell


def test_onerun_full_table_quotes_the_kept_runs():
    """docs/onerun.md's full-config table: eps_th / eps_pld of the gradient canaries, and
    each cell's mean f-DP bound over the 5 runs (with its min-max where quoted; bold is the
    column's largest), from reference/onerun_dpsgd.csv."""
    runs = _onerun_full()
    rows = doc_table("onerun.md", "eps_th label")
    labels = rows[0][1:]
    assert sorted(labels) == sorted(runs.label.unique())
    dirac = runs[runs.canary == "dirac"].groupby("label")[["eps_th", "eps_pld"]].first()
    assert rows[1][0] == "eps_th / eps_pld (gradient canaries)"
    for label, cell in zip(labels, rows[1][1:]):
        if label == "inf":
            assert cell == "inf" and dirac.loc[label].isin([float("inf")]).all()
            continue
        th, pld = map(float, cell.split(" / "))
        assert_2dp(th, dirac.eps_th[label], label)
        assert_2dp(pld, dirac.eps_pld[label], label)
    cells = rows[2:]
    assert len(cells) == 2 * len(ONERUN_ROWS)
    for row in cells:
        arch, name = row[0].split(", ", 1)
        for label, cell in zip(labels, row[1:]):
            fdp = _onerun_runs(runs, arch.lower(), name, label).eps_lb_fdp
            where = (row[0], label)
            assert_2dp(first_number(cell), fdp.mean(), where)
            spread = re.search(rf"\(({NUMBER})-({NUMBER})\)", cell)
            if spread:
                assert_2dp(float(spread.group(1)), fdp.min(), where)
                assert_2dp(float(spread.group(2)), fdp.max(), where)
            if "**" in cell:
                column = [first_number(r[1 + labels.index(label)]) for r in cells]
                assert first_number(cell) == max(column), where


def test_onerun_full_paragraphs_quote_the_kept_runs():
    """The numbers under docs/onerun.md's full-config table (Steinke et al.'s bound, the
    GDP estimate, the counts, the ratios to eps_th) and the input canaries' line above it,
    from reference/onerun_dpsgd.csv; the perfect attack's bound is computed."""
    from dpaudit.bounds.fdp import eps_lb_one_run_fdp

    runs = _onerun_full()
    page = " ".join((DOCS / "onerun.md").read_text().split())
    text = page.split("Which input canary:", 1)[1].split("## Cost", 1)[0]

    def mean(arch, name, label, column="eps_lb_fdp"):
        return _onerun_runs(runs, arch, name, label)[column].mean()

    def quoted(pattern):
        found = re.search(pattern, text)
        assert found, pattern
        return list(map(float, found.groups()))

    cells = runs.groupby(["arch", "canary", "threat_model", "label"])
    within, *lb = quoted(rf"`eps_lb` on the same guesses is within ({NUMBER}) of `eps_lb_fdp` "
                         rf"in every cell \(FNN all iterates: ({NUMBER}) at 8, ({NUMBER}) at "
                         rf"16, ({NUMBER}) at inf; LR all iterates ({NUMBER}) at 8\)")
    assert (cells.eps_lb.mean() - cells.eps_lb_fdp.mean()).abs().max() <= within
    all_iterates = "white box, all iterates"
    for got, (arch, label) in zip(lb, [("fnn", "8"), ("fnn", "16"), ("fnn", "inf"),
                                        ("lr", "8")]):
        assert_2dp(got, mean(arch, all_iterates, label, "eps_lb"), (arch, label))
    positive, rows = quoted(r"both are positive in (\d+) of the (\d+) rows")
    assert rows == len(runs)
    assert (runs.eps_lb > 0).sum() == (runs.eps_lb_fdp > 0).sum() == positive
    gdp = quoted(rf"`eps_gdp` is higher still \(FNN all iterates: ({NUMBER}) at 8, "
                 rf"({NUMBER}) at 16, ({NUMBER}) at inf\) and certifies nothing")
    for got, label in zip(gdp, ["8", "16", "inf"]):
        assert_2dp(got, mean("fnn", all_iterates, label, "eps_gdp"), label)
    black = runs[runs.canary == "input"].groupby(["arch", "label"]).eps_lb_fdp.mean()
    assert_2dp(*quoted(rf"loss \(({NUMBER}) at most on average\)"), black.max(), "black box")
    gains = quoted(rf"\(FNN: ({NUMBER}) against ({NUMBER}) at eps_th = 8, ({NUMBER}) against "
                   rf"({NUMBER}) at 16\)")
    for got, name, label in zip(gains, [all_iterates, "white box, last iterate"] * 2,
                                ["8", "8", "16", "16"]):
        assert_2dp(got, mean("fnn", name, label), (name, label))
    th_8, th_16, pld_8 = quoted(rf"best one-run bound is ({NUMBER}) of eps_th at 8 and "
                                rf"({NUMBER}) at 16 \(({NUMBER}) of eps_pld at 8\)")
    eps = runs[runs.canary == "dirac"].groupby("label")[["eps_th", "eps_pld"]].first()
    assert_2dp(th_8, mean("fnn", all_iterates, "8") / eps.eps_th["8"], "8")
    assert_2dp(th_16, mean("fnn", all_iterates, "16") / eps.eps_th["16"], "16")
    assert_2dp(pld_8, mean("fnn", all_iterates, "8") / eps.eps_pld["8"], "pld 8")
    assert "all right at k = 292 (584 guesses) in 4 of the 5 runs and 999 of 1000 at k = 500 " \
           "in the fifth" in text
    for threat in ("all-iterates", "last-iterate"):
        cell = _onerun_runs(runs, "fnn", f"white box, {threat.replace('-', ' ')}", "inf")
        assert sorted(zip(cell.best_k, cell.r, cell.v)) == [(292, 584, 584)] * 4 + [
            (500, 1000, 999)], threat
    bound, low, high, perfect = quoted(rf"bound, ({NUMBER}) \(({NUMBER})-({NUMBER})\), is "
                                       rf"about the most .* on 1000 guesses: ({NUMBER})\)")
    fdp = _onerun_runs(runs, "fnn", all_iterates, "inf").eps_lb_fdp
    for got, value in zip([bound, low, high], [fdp.mean(), fdp.min(), fdp.max()]):
        assert_2dp(got, value, "inf")
    spec = runs.iloc[0]
    assert_2dp(perfect, eps_lb_one_run_fdp(1000, 1000, 1000, spec.delta, spec.beta / 10),
               "perfect")
    assert_2dp(*quoted(rf"LR is harder to audit white box\*\* \(({NUMBER}) at inf\)"),
               mean("lr", all_iterates, "inf"), "LR inf")
    paper = quoted(rf"gives ClipBKD ({NUMBER}), ({NUMBER}) and ({NUMBER}) at eps_th = 8, 16 "
                   rf"and inf")
    low, high, *many = quoted(rf"black-box audit of the 2-layer net certifies ({NUMBER}) to "
                              rf"({NUMBER}) times\s+that \(({NUMBER}), ({NUMBER}) and "
                              rf"({NUMBER})\)")
    for got, label in zip(many, ["8", "16", "inf"]):
        assert_2dp(got, mean("fnn", "black box", label), label)
    ratios = [mean("fnn", "black box", label) / float(p)
              for label, p in zip(["8", "16", "inf"], paper)]
    assert_2dp(low, min(ratios), "ratio to the paper, lowest")
    assert_2dp(high, max(ratios), "ratio to the paper, highest")
    pca = quoted(rf"`pca` certifies a small positive bound \(up to ({NUMBER})\) in (\d+) of "
                 rf"its (\d+) runs")
    inputs = runs[runs.canary == "input"].eps_lb_fdp
    assert_2dp(pca[0], inputs.max(), "pca")
    assert pca[1:] == [(inputs > 0).sum(), len(inputs)]


def test_readme_quotes_the_kept_onerun_runs():
    """The README's one-run row: the 2-layer net's mean white-box all-iterates bound at
    eps_th labels 8, 16 and inf, and the largest black-box mean, from
    reference/onerun_dpsgd.csv."""
    runs = _onerun_full()
    found = re.search(rf"\| ({NUMBER}) / ({NUMBER}) / ({NUMBER}) \(black box: mean at most "
                      rf"({NUMBER})\) \|", (ROOT / "README.md").read_text())
    assert found, "README.md: the one-run row"
    *best, most = map(float, found.groups())
    for got, label in zip(best, ["8", "16", "inf"]):
        cell = _onerun_runs(runs, "fnn", "white box, all iterates", label)
        assert_2dp(got, cell.eps_lb_fdp.mean(), label)
    black = runs[runs.canary == "input"].groupby(["arch", "label"]).eps_lb_fdp.mean()
    assert_2dp(most, black.max(), "black box")
