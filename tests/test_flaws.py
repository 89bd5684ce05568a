"""The flaws table (dpaudit.experiments.flaws, ``dpaudit flaws``): its registry, the quick
variant end to end against Opacus' own accountants and the subjects' noise, and the table of
docs/flaws.md against the kept reference/flaws_audit.csv."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("opacus")

from opacus.accountants import PRVAccountant, RDPAccountant  # noqa: E402
from opacus.accountants.utils import get_noise_multiplier  # noqa: E402

from dpaudit import subjects  # noqa: E402
from dpaudit.adapters import opacus_flaws  # noqa: E402
from dpaudit.cli import main  # noqa: E402
from dpaudit.config import schema  # noqa: E402
from dpaudit.experiments import flaws  # noqa: E402
from dpaudit.io import read_provenance, read_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "reference" / "flaws_audit.csv"


def _eps(accountant, sigma, q, steps):
    acc = accountant()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(flaws.DELTA)


def test_every_entry_names_a_runner_and_trainings_of_its_path():
    """One more way to run a training is one more runner: every entry's (path, check) has
    one and a relation, and its target and fix are in the path's registry."""
    registry = {"opacus": opacus_flaws.TRAININGS, "trainer": subjects.SUBJECTS}
    assert set(flaws.RUNNERS) == set(flaws.RELATIONS)
    for e in flaws.ENTRIES:
        assert (e.path, e.check) in flaws.RUNNERS, e
        assert e.target in registry[e.path] and e.fix in registry[e.path], e
    assert {e.flaw for e in flaws.ENTRIES} == set(flaws.FLAWS)
    assert set(schema()["properties"]["flaws"]["properties"]["only"]["items"]["enum"]) == \
        set(flaws.FLAWS)  # the config's names are the registry's
    assert set(opacus_flaws.FIX) | set(opacus_flaws.FIX.values()) <= set(opacus_flaws.TRAININGS)
    with pytest.raises(ValueError, match="flaw='nope': must be one of"):
        flaws.Entry("nope", "opacus", "measured", "correct", "fixed_rate", {"n": 20})


def test_actual_noise_of_the_subjects():
    """buggy's noise is sigma / B, half-noise's sigma / 2: the noise the robust rows' pair
    is computed at (subjects.actual_dpsgd), beside the claimed sigma."""
    spec = {"eps": 2.0, "delta": 1e-5, "epochs": 5, "batch_size": 5, "lr": 0.1, "clip": 1.0}
    sigma, q, steps = subjects.claimed_dpsgd(spec, 2.0, 1e-5, 20)
    assert subjects.actual_dpsgd("buggy", spec, 20) == pytest.approx((sigma / 5, q, steps))
    assert subjects.actual_dpsgd("half-noise", spec, 20) == pytest.approx((sigma / 2, q, steps))
    assert subjects.actual_dpsgd("fixed", spec, 20) == pytest.approx((sigma, 0.25, 20))


def test_quick_table_of_two_flaws_through_the_cli(tmp_path, capsys):
    """`dpaudit flaws --scale quick` for the wrong sample rate (Opacus, measured and white
    box through the user's own loop) and the noise on the mean (dpaudit's trainer, white box): each found, each fix passing, the
    numbers those of Opacus' accountants and of the subject's noise, provenance kept."""
    out = tmp_path / "flaws.csv"
    assert main(["flaws", "--scale", "quick", "--flaw", "wrong sample rate", "--flaw",
                 "noise on the mean", "--seed", "0", "--out", str(out)]) == 0
    df, meta = read_table(out, columns=flaws.COLUMNS)
    assert meta["spec"] == {"scale": "quick", "alpha": 0.05,
                            "only": ["wrong sample rate", "noise on the mean"]}
    assert meta["seed"] == 0 and meta["command"] == "flaws"
    rate, mean = (df[df.flaw == f].iloc[0] for f in ("wrong sample rate", "noise on the mean"))
    # Opacus: sigma for eps 2 at q / 10 = 0.02, 25 steps; trained at q 0.2 (n = 22, B = 5)
    sigma = get_noise_multiplier(target_epsilon=2.0, target_delta=1e-5, sample_rate=0.02,
                                 steps=25, accountant="rdp")
    assert rate.claimed_eps == 2.0 and rate.verdict == "findings: epsilon" and rate.detected
    assert rate.eps_known == pytest.approx(_eps(RDPAccountant, sigma, 0.2, 25), rel=1e-6)
    assert rate.fix_passes and rate.fix_verdict == "consistent"
    assert rate.fix_eps_known == pytest.approx(2.0, abs=0.02)  # calibrated at q 0.2
    # the same training run unmodified in the white box (OpacusLoop, Opacus' own loader
    # placing the canary row): the claim is the 2 it reports, no profile test (below RDP's
    # eps at the declared noise), eps_LB sound, the fix passing
    loop = df[(df.flaw == "wrong sample rate") & (df.check == "white-box")].iloc[0]
    assert (loop.path, loop.claimed_eps, loop.profile) == ("opacus", 2.0, "not tested")
    assert loop.eps_known == pytest.approx(rate.eps_known, rel=1e-9)
    assert 0 <= loop.eps_lb < 2.0 and loop.runs <= flaws.SCALES["quick"].loop_max_runs
    assert loop.fix_passes and loop.fix_claimed_eps == 2.0
    # the trainer: noise sigma C / B, its true eps by Opacus' PRV accountant (a second
    # method beside dpaudit's PLD)
    claim = subjects.claimed_dpsgd({"epochs": 5, "batch_size": 5}, 2.0, 1e-5, 20)
    assert mean.eps_known == pytest.approx(_eps(PRVAccountant, claim[0] / 5, 0.25, 20),
                                           rel=0.02)
    assert mean.detected and mean.runs <= 30 and mean.profile == "violated"
    assert mean.fix_passes and mean.fix_verdict == "no violation detected"
    assert mean.relation == "add/remove" and math.isnan(mean.robust_runs)
    assert "dpaudit flaws: noise on the mean / trainer white-box / buggy" in \
        capsys.readouterr().err


def test_bad_flaw_and_scale_are_refused_by_name(tmp_path, capsys):
    for argv, line in ((["--flaw", "typo"], "flaws.only[0]='typo': 'typo' is not one of"),
                       (["--scale", "huge"], "flaws.scale='huge'")):
        assert main(["flaws", *argv, "--seed", "0", "--out", str(tmp_path / "x.csv")]) == 2
        assert line in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_docs_table_is_the_kept_table():
    """docs/flaws.md holds `dpaudit flaws-md` of reference/flaws_audit.csv, line for line;
    the kept table is the full scale, every fix passes, and every flaw is found by some
    check but EASGM in the trainer, whose black box sees nothing at 1000 runs per side (in
    Opacus it is the floored normaliser, found by the measured check)."""
    df, meta = read_table(KEPT, columns=flaws.COLUMNS)
    assert meta["spec"]["scale"] == "full" and set(df.scale) == {"full"}
    assert df.fix_passes.all()
    assert set(df.flaw) - set(df[df.detected].flaw) == {"EASGM"}
    assert df[df.flaw == "floored normaliser"].detected.all()
    assert flaws.markdown(df) in (ROOT / "docs" / "flaws.md").read_text()
    assert read_provenance(KEPT)["seed"] == 0
