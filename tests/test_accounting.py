"""Accountants and composition theorems against published numbers and closed forms."""

import json
import math

import numpy as np
import pytest
from scipy import optimize, stats

from dpaudit import accounting as acc
from dpaudit.cli import main
from dpaudit.io import read_table

# Jagielski et al. 2020 (Table 2): FMNIST n = 6000, batch 250, 24 epochs.
Q_JAG, T_JAG, DELTA = 250 / 6000, 24 * 24, 1e-5
JAG_SIGMAS = {1: 5.02, 2: 2.68, 4: 1.55, 8: 1.01, 16: 0.73}


def _gauss_delta(eps, mu):
    """delta(eps) of a Gaussian mechanism with sensitivity/std = mu (Balle-Wang 2018)."""
    return stats.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


def _gauss_eps(mu, delta):
    return optimize.brentq(lambda e: _gauss_delta(e, mu) - delta, 0, 100, xtol=1e-13)


@pytest.mark.parametrize("eps", sorted(JAG_SIGMAS))
def test_rdp_classic_reproduces_jagielski_sigmas(eps):
    got = acc.epsilon(JAG_SIGMAS[eps], Q_JAG, T_JAG, DELTA, "rdp_classic")
    assert got == pytest.approx(eps, rel=0.01)  # measured: within 0.6 %


def test_rdp_classic_noise_multiplier_gives_the_published_sigmas():
    for eps in (1, 4, 16):
        sigma = acc.noise_multiplier(eps, Q_JAG, T_JAG, DELTA, "rdp_classic")
        assert sigma == pytest.approx(JAG_SIGMAS[eps], rel=0.01)


def test_abadi_published_numbers():
    # Abadi et al. 2016 Sec. 3.1: q = 0.01, sigma = 4, delta = 1e-5, T = 10^4 gives
    # eps ~ 1.26 by the moments accountant and ~ 9.34 by strong composition.
    assert acc.epsilon(4.0, 0.01, 10_000, DELTA, "rdp_classic") == pytest.approx(1.26, abs=0.01)
    assert acc.sgd_strong_composition(4.0, 0.01, 10_000, DELTA, "abadi") == pytest.approx(
        9.34, rel=0.005)


def test_rdp_classic_conversion_matches_closed_form_without_subsampling():
    # q = 1: T Gaussian steps have RDP T a / (2 sigma^2); Mironov's Prop. 3 over the orders.
    sigma, steps = 3.0, 20
    orders = np.array(acc.CLASSIC_ORDERS)
    ref = np.min(steps * orders / (2 * sigma**2) + math.log(1 / DELTA) / (orders - 1))
    assert acc.epsilon(sigma, 1.0, steps, DELTA, "rdp_classic") == pytest.approx(ref, rel=1e-12)


def test_pld_matches_exact_gaussian_composition_without_subsampling():
    # q = 1: T steps of N(0, sigma^2) are one Gaussian with mu = sqrt(T) / sigma.
    sigma, steps = 2.0, 16
    exact = _gauss_eps(math.sqrt(steps) / sigma, DELTA)
    got = acc.epsilon(sigma, 1.0, steps, DELTA, "pld")
    assert exact <= got <= exact * (1 + 2e-3)  # pessimistic discretization: from above


@pytest.mark.parametrize("sigma,q,steps", [(5.02, Q_JAG, T_JAG), (1.01, Q_JAG, T_JAG),
                                           (4.0, 0.01, 10_000), (0.8, 0.1, 50)])
def test_accountants_are_ordered(sigma, q, steps):
    eps = {m: acc.epsilon(sigma, q, steps, DELTA, m) for m in acc.METHODS}
    assert eps["pld"] <= eps["rdp"] <= eps["rdp_classic"]
    # a valid bound by the same composition theorem can never beat the tight accountant
    assert acc.sgd_strong_composition(sigma, q, steps, DELTA, "sound") >= eps["pld"]


def test_gdp_closed_form_and_agreement_with_pld_in_clt_regime():
    sigma, q, steps = 4.0, 0.01, 10_000
    mu = q * math.sqrt(steps * (math.exp(1 / sigma**2) - 1))  # Bu et al. 2020
    got = acc.epsilon(sigma, q, steps, DELTA, "gdp")
    assert _gauss_delta(got, mu) == pytest.approx(DELTA, rel=1e-6)
    # many steps, small q: the CLT is close to the tight PLD (measured 0.942 vs 0.947)
    assert got == pytest.approx(acc.epsilon(sigma, q, steps, DELTA, "pld"), rel=0.02)


@pytest.mark.parametrize("method", acc.METHODS)
def test_noise_multiplier_inverts_epsilon(method):
    sigma = acc.noise_multiplier(4.0, Q_JAG, T_JAG, DELTA, method)
    tol = 1e-3 if method == "pld" else 1e-7
    assert acc.epsilon(sigma, Q_JAG, T_JAG, DELTA, method) == pytest.approx(4.0, rel=tol)


def test_edge_cases_and_bad_inputs():
    assert acc.epsilon(0.0, 0.1, 10, DELTA, "rdp") == math.inf
    assert acc.epsilon(0.0, 0.1, 10, DELTA, "gdp") == math.inf
    assert acc.epsilon(1.0, 0.1, 0, DELTA, "pld") == 0.0
    with pytest.raises(ValueError, match="rdp_classic.*pld.*gdp"):
        acc.epsilon(1.0, 0.1, 10, DELTA, "moments")
    with pytest.raises(ValueError, match="method"):
        acc.noise_multiplier(1.0, 0.1, 10, DELTA, "zcdp")
    for bad in [dict(sigma=-1.0), dict(sample_rate=0.0), dict(sample_rate=1.5),
                dict(steps=2.5), dict(delta=0.0), dict(delta=1.0)]:
        args = dict(sigma=1.0, sample_rate=0.1, steps=10, delta=DELTA) | bad
        with pytest.raises(ValueError):
            acc.epsilon(**args)
    with pytest.raises(ValueError):
        acc.sgd_strong_composition(1.0, 0.1, 10, DELTA, "kov")


def _optimal_pure_composition(eps0, k, delta):
    """Exact: privacy profile of k-fold randomized response (KOV15 Thm 3.3), by binomials."""
    j = np.arange(k + 1)
    loss = eps0 * (2 * j - k)
    w = stats.binom.pmf(j, k, 1 / (1 + math.exp(-eps0)))
    profile = lambda e: np.sum(w * -np.expm1(np.minimum(e - loss, 0))) - delta  # noqa: E731
    return 0.0 if profile(0) <= 0 else optimize.brentq(profile, 0, k * eps0, xtol=1e-12)


def test_composition_formulas_hand_computed():
    # eps0 = 0.1, k = 1000, delta' = 1e-3: Azuma term 0.1 sqrt(2000 ln 1000) = 11.753940
    eps, delta = acc.basic_composition(0.1, 1e-6, 1000)
    assert eps == pytest.approx(100.0) and delta == pytest.approx(1e-3)
    assert acc.advanced_composition(0.1, 1000, 1e-3, "drv") == pytest.approx(
        11.753940 + 10.517092, abs=1e-5)  # + 1000 * 0.1 * (e^0.1 - 1)
    assert acc.advanced_composition(0.1, 1000, 1e-3, "kov") == pytest.approx(
        11.753940 + 4.995837, abs=1e-5)  # + 1000 * 0.1 * (e^0.1 - 1) / (e^0.1 + 1)
    assert acc.advanced_composition(0.1, 1000, 1e-3, "lecture") == pytest.approx(
        11.753940 + 49.958375, abs=1e-5)  # + 1000 * (e^0.1 - 1) / (e^0.1 + 1)
    with pytest.raises(ValueError, match="form"):
        acc.advanced_composition(0.1, 10, 1e-3, "azuma")
    with pytest.raises(ValueError, match="eps0"):
        acc.advanced_composition(1.5, 10, 1e-3, "lecture")


@pytest.mark.parametrize("eps0", [0.1, 0.5, 1.0])
def test_advanced_composition_bounds_the_optimal_composition(eps0):
    ks = np.array([1, 3, 10, 30, 100, 300, 1000])
    basic = acc.basic_composition(eps0, 0.0, ks)[0]
    for k, b in zip(ks, basic):
        exact = _optimal_pure_composition(eps0, k, 1e-3)
        opt = acc.optimal_composition(eps0, k, 1e-3)
        assert exact * (1 - 1e-9) <= opt <= exact + k * 1e-4  # PLD rounds up
        forms = {f: float(acc.advanced_composition(eps0, k, 1e-3, f))
                 for f in acc.COMPOSITION_FORMS}
        assert all(v >= exact for v in forms.values()) and b >= exact
        assert forms["kov"] <= forms["drv"] and forms["kov"] <= forms["lecture"]
    # advanced beats basic for many steps (the CSCI 699 Week 4 lecture's graph: from k ~ 55
    # on for eps0 = 0.1)
    assert acc.advanced_composition(eps0, 1000, 1e-3, "lecture") < 1000 * eps0


def test_cli_tables_carry_provenance_and_plots_render(tmp_path):
    specs = {"abadi": {"sample_rate": 0.01, "sigma": 4.0, "delta": 1e-5, "max_epochs": 20,
                       "num_epochs": 2},
             "composition": {"eps0": 0.1, "delta_prime": 1e-3, "max_k": 200, "num_k": 3}}
    for figure, spec in specs.items():
        table, fig = tmp_path / f"{figure}.csv", tmp_path / f"{figure}.pdf"
        assert main(["accounting-curves", "--figure", figure, "--spec", json.dumps(spec),
                     "--seed", "7", "--out", str(table)]) == 0
        df, meta = read_table(table)
        assert meta["spec"] == spec and meta["seed"] == 7 and meta["figure"] == figure
        assert meta["command"] == "accounting-curves"
        assert main(["accounting-plot", "--figure", figure, "--table", str(table),
                     "--out", str(fig)]) == 0
        assert fig.stat().st_size > 0 and fig.with_suffix(".png").stat().st_size > 0
        if figure == "abadi":
            assert sorted(df.epochs.unique()) == [10.0, 20.0]
            assert len(df) == 2 * (len(acc.METHODS) + len(acc.STRONG_VARIANTS))
            row = df[(df.method == "rdp_classic") & (df.epochs == 10.0)].iloc[0]
            assert row.steps == 1000
            assert row.eps == pytest.approx(acc.epsilon(4.0, 0.01, 1000, 1e-5, "rdp_classic"))
        else:
            assert sorted(df.k.unique()) == [1, 100, 200]
            assert set(df.method) == {"basic", "optimal", *acc.COMPOSITION_FORMS}
            assert (df[df.method == "basic"].delta == 0).all()


def test_cli_rejects_bad_spec_naming_the_key(tmp_path, capsys):
    spec = {"eps0": 0.1, "delta_prime": 2.0, "max_k": 10, "num_k": 3}
    out = tmp_path / "x.csv"
    assert main(["accounting-curves", "--figure", "composition", "--spec", json.dumps(spec),
                 "--seed", "0", "--out", str(out)]) == 2
    assert "accounting.composition.delta_prime=2.0" in capsys.readouterr().err
    assert not out.exists()
    spec = {"eps0": 0.1, "delta_prime": 1e-3, "max_k": 10, "num_k": 3, "kmax": 5}
    assert main(["accounting-curves", "--figure", "composition", "--spec", json.dumps(spec),
                 "--seed", "0", "--out", str(out)]) == 2
    assert "accounting.composition.kmax" in capsys.readouterr().err


def test_replace_one_eps_lies_between_add_remove_and_group_privacy():
    """Replace-one neighbours (ClipBKD, backdoor): the PLD accountant's REPLACE_ONE eps is
    above the add/remove eps, and below 2 eps(delta0) at the delta0 group privacy needs,
    (1 + e^eps(delta0)) delta0 = delta (which holds at delta, unlike 2 eps(delta))."""
    sigma, q, T, delta = 1.01, 250 / 6000, 576, 1e-5
    rep = acc.epsilon_replace_one(sigma, q, T, delta)
    add = acc.epsilon(sigma, q, T, delta, "pld")
    # Fixed point of d0 = delta / (1 + e^eps(d0)), from above: the map grows with d0, so the
    # iterates fall to it and 2 eps(d0) rises to its value; stopping early only makes the
    # check below stricter.
    d0, last = delta, 0.0
    while abs(d0 - last) > 1e-3 * d0:
        last, d0 = d0, delta / (1 + math.exp(acc.epsilon(sigma, q, T, d0, "pld")))
        assert d0 < last
    assert add < rep < 2 * acc.epsilon(sigma, q, T, d0, "pld")
    assert rep == pytest.approx(10.4885, abs=1e-3)
    assert acc.dpsgd_epsilons(0.0, q, T, delta)["eps_pld_replace"] == math.inf


def test_dpsgd_epsilons_are_the_accountants_computed_once_a_new_dict_each_call():
    """The cells of a grid share their (sigma, rate, steps, delta): the second call is the
    cache's, the same numbers as each accountant's own, in a dict the caller may change."""
    args = (2.0, 0.1, 30, 1e-5)
    first = acc.dpsgd_epsilons(*args)
    assert first == {"eps_th": acc.epsilon(*args, "rdp_classic"),
                     "eps_pld": acc.epsilon(*args, "pld"),
                     "eps_pld_replace": acc.epsilon_replace_one(*args)}
    hits = acc._dpsgd_epsilons.cache_info().hits
    first["eps_th"] = -1.0
    again = acc.dpsgd_epsilons(*args)
    assert acc._dpsgd_epsilons.cache_info().hits == hits + 1
    assert again is not first and again["eps_th"] == acc.epsilon(*args, "rdp_classic")
