"""The flaws table (docs/flaws.md): flaws found in real DP-SGD code, each through the code
paths and checks that can see it, beside its corrected configuration, which must pass.

One row per :class:`Entry` of :data:`ENTRIES`: a flaw (:data:`FLAWS`), a code path and a
check, the flawed training and its fix. A check is a runner of :data:`RUNNERS`, keyed by
``(path, check)``; a new way to run a training is one more runner and the entries that
use it, nothing else:

``("opacus", "measured")``
    :func:`dpaudit.adapters.opacus_probe.check` on a user's Opacus training of
    :mod:`dpaudit.adapters.opacus_flaws` (``train(X, y, seed) -> (model, reported_eps)``):
    the parameters it runs with, measured on n and n + 1 rows, against the eps it reports.
    No statistics: a finding is arithmetic on what was measured.
``("opacus", "white-box")``, ``("opacus", "black-box")``
    the same trainings run unmodified by ``audit-impl --opacus-loop``
    (:class:`dpaudit.adapters.opacus_loop.OpacusLoop`, in this process): the claim the eps
    the training reports, Opacus' own loader placing the canary row, the sequential audit
    of at most :attr:`Scale.loop_max_runs` runs per side (each run a whole Opacus training).
``("trainer", "white-box")``, ``("trainer", "black-box")``
    ``audit-impl``'s audit (:func:`dpaudit.experiments.tramer.audit_implementation`,
    sequential: it stops at the first certified violation) of a registry subject of
    :mod:`dpaudit.subjects`, dpaudit's own trainer, with the claimed privacy profile
    tested on the same runs.

Robust rows: where the white box through the trainer certifies a violation (of the eps or
of the profile) and the subject's true epsilon is known (:func:`dpaudit.subjects.true_eps`),
the run count at which the fixed (not sequential) audit's eps test has at least
:attr:`Scale.power` power is
computed from the exact pair of its score (:mod:`dpaudit.experiments.runs_needed`: the
trainer's all-iterates score is that pair's likelihood ratio), and the audit is run again
at that count on :attr:`Scale.replications` seeds: each seed's eps_LB and the alpha down to
which its counts refute the claim (:func:`dpaudit.bounds.claim_p_value`).

The data are random (n rows of :data:`DIM` standard normal features, labels in {0, 1},
from the seed), as ``dpaudit opacus-check`` uses: the white box's Dirac canary sits on a
weight the data move least, and the measured check reads the training's parameters, not
what it learns. Every row says its neighbouring relation: add/remove (the canary or the
extra row added), the relation of the claims.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable

import numpy as np
import torch

from .. import seeds as seeding

#: delta of every claim: the Opacus trainings report their eps at it
#: (:data:`dpaudit.adapters.opacus_flaws.DELTA`), the subjects are calibrated to it.
DELTA = 1e-5
#: Features of the random data every check trains on.
DIM = 10
CLASSES = 2
#: Columns of reference/flaws_audit.csv, in order (docs/flaws.md).
COLUMNS = ("flaw", "path", "check", "relation", "target", "claimed_eps", "eps_lb",
           "eps_known", "profile", "runs", "seconds", "cpu_seconds", "verdict", "detected",
           "fix", "fix_claimed_eps", "fix_eps_lb", "fix_eps_known", "fix_profile", "fix_runs",
           "fix_seconds", "fix_cpu_seconds", "fix_verdict", "fix_passes", "robust_runs", "robust_power", "robust_seeds",
           "robust_certified", "robust_eps_lb_mean", "robust_eps_lb_sd",
           "robust_eps_lb_min", "robust_p_max", "n", "scale", "alpha", "delta", "seed")

#: flaw -> (what it is, where it was found)
FLAWS = {
    "size-dependent sampling": (
        "make_private where n and n + 1 rows give different batch counts: sample rate 1 / "
        "len(loader), steps and divisor change with the canary row",
        "meta-pytorch/opacus#571 (Privacy Leakage at low sample size)"),
    "floored normaliser": (
        "make_private where only the floored expected batch size int(n / len(loader)) "
        "differs between n and n + 1 rows (EASGM)",
        "meta-pytorch/opacus#819; Rethinking the Security of DP-SGD (2026)"),
    "shuffled batches": (
        "fixed-size shuffled batches (poisson_sampling=False) reported with Poisson "
        "accounting",
        "Chua et al. 2024, How Private are DP-SGD Implementations?"),
    "EASGM": ("the noisy sum divided by the expected batch size of the data's rows, floored "
              "(in Opacus: the floored normaliser)",
              "Rethinking the Security of DP-SGD (2026); meta-pytorch/opacus#819"),
    "ASGM": ("the noisy sum divided by the sampled batch size",
             "Rethinking the Security of DP-SGD (2026)"),
    "unscaled noise": ("noise std noise_multiplier, not noise_multiplier times the clipping "
                       "norm", "a user's DPOptimizer.add_noise"),
    "wrong sample rate": ("sigma calibrated for the sample rate of ten times the data",
                          "a user's config"),
    "fewer epochs": ("eps reported for fewer epochs (or steps) than trained",
                     "a user's loop"),
    "noise on the mean": ("noise calibrated to the sensitivity of the mean gradient, C / B",
                          "Tramer et al. 2022, Debugging Differential Privacy "
                          "(Backpropagation Clipping)"),
    "batch clipping": ("the batch's summed gradient clipped, not each example's",
                       "a user's DPOptimizer.clip_and_accumulate"),
}


@dataclasses.dataclass(frozen=True)
class Scale:
    """How much a table run trains: ``max_runs`` evaluation runs per side at most in a
    sequential audit (``val_runs`` validation runs choose its thresholds); through a user's
    Opacus loop (a whole Opacus training per run) ``loop_max_runs`` and ``loop_val_runs``;
    robust rows at ``power`` with ``replications`` seeds (0: none), at most
    ``robust_max_runs`` per side."""

    max_runs: int
    val_runs: int
    replications: int
    loop_max_runs: int = 150
    loop_val_runs: int = 40
    power: float = 0.9
    robust_max_runs: int = 5000
    seed_check: int = 2


#: ``dpaudit flaws --scale``: ``quick`` runs the path in seconds (the test's); ``full`` is
#: reference/flaws_audit.csv.
SCALES = {"quick": Scale(max_runs=30, val_runs=20, replications=0, loop_max_runs=4,
                         loop_val_runs=3, seed_check=0),
          "full": Scale(max_runs=1000, val_runs=200, replications=3)}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One row: ``flaw`` (a key of :data:`FLAWS`) through ``path`` and ``check`` (a key
    of :data:`RUNNERS`), the flawed training ``target`` and its ``fix`` (names in the
    path's registry), and the runner's ``setting``."""

    flaw: str
    path: str
    check: str
    target: str
    fix: str
    setting: dict

    def __post_init__(self):
        if self.flaw not in FLAWS:
            raise ValueError(f"flaw={self.flaw!r}: must be one of {sorted(FLAWS)}")


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n random rows of :data:`DIM` features and labels in {0, 1} (both classes in)."""
    gen = seeding.rng(seed, "flaws/data", n)
    X = torch.as_tensor(gen.standard_normal((n, DIM)), dtype=torch.float32)
    y = torch.as_tensor(gen.integers(0, CLASSES, n), dtype=torch.int64)
    y[:CLASSES] = torch.arange(CLASSES)
    return X, y


# ---- the runners: (entry, target name, scale, seed) -> the check's cells ----

@functools.lru_cache(maxsize=None)
def _probe(target: str, n: int, seed: int):
    """:func:`dpaudit.adapters.opacus_probe.check` of the Opacus training ``target`` on n and
    n + 1 rows, and the eps known for it: the accountant's at the measured parameters, or
    Chua et al.'s lower bound where the batches are fixed-size and it is larger. Once per
    table: the measured check and the loop's rows of a training share it."""
    from ..adapters import opacus_flaws, opacus_probe

    report = opacus_probe.check(opacus_flaws.TRAININGS[target], n, opacus_flaws.DELTA,
                                seed=seed, pld=False)
    known = report.eps_accountant
    if not math.isnan(report.eps_shuffle_lb):
        known = max(known, report.eps_shuffle_lb)
    return report, known


def measured(entry: Entry, target: str, scale: Scale, seed: int, alpha: float) -> dict:
    """The measured-parameters check of the Opacus training ``target`` on n and n + 1 rows
    (``setting["n"]``): the reported eps, the accountant's eps at the measured parameters
    (``eps_known``; Chua et al.'s lower bound where the batches are fixed-size and it is
    larger), the findings as the verdict."""
    report, known = _probe(target, entry.setting["n"], seed)
    whats = sorted({f.what for f in report.findings})
    return {"claimed_eps": report.runs[0].reported_eps, "eps_lb": math.nan,
            "eps_known": known, "profile": "not tested", "runs": 1,
            "verdict": ("findings: " + ", ".join(whats)) if whats else "consistent",
            "detected": bool(whats)}


def _subject_spec(entry: Entry, n: int) -> dict:
    s = entry.setting
    return {"eps": s["eps"], "delta": DELTA, "n": n, "epochs": s["epochs"],
            "batch_size": s["batch_size"], "lr": s.get("lr", 0.1), "clip": s.get("clip", 1.0),
            "device": s.get("device", "cpu")}


def _audit(entry: Entry, target: str, seed: int, alpha: float, runs: int, val_runs: int,
           seed_check: int, schedule, log=None) -> dict:
    """audit-impl's audit of registry subject ``target`` in the entry's mode: its row."""
    from .. import canaries, subjects
    from . import tramer

    s = entry.setting
    X, y = data(s["n"], seed)
    spec = _subject_spec(entry, s["n"])
    claim = subjects.claimed_dpsgd(spec, s["eps"], DELTA, s["n"])
    canary = None if entry.check == "white-box" else canaries.make_canary("clipbkd", X, y)
    row, _ = tramer.audit_implementation(
        subjects.SUBJECTS[target], X, y, canary, tramer.Design(
            s["eps"], DELTA, runs, val_runs, seed, alpha, tramer.claimed_profile(*claim),
            schedule), spec, mode=tramer.Mode(entry.check),
        checks=tramer.Checks(seed_check), batches=tramer.Batches(progress=log))
    return row


def trainer(entry: Entry, target: str, scale: Scale, seed: int, alpha: float) -> dict:
    """The sequential audit of registry subject ``target`` (at most ``scale.max_runs``
    evaluation runs per side): eps_LB (anytime-valid), the profile test, the verdict;
    ``eps_known`` the subject's true eps where known."""
    from .. import subjects
    from . import tramer

    s = entry.setting
    row = _audit(entry, target, seed, alpha, scale.max_runs, scale.val_runs,
                 scale.seed_check, tramer.schedule_of(scale.max_runs))
    try:
        known = subjects.true_eps(target, _subject_spec(entry, s["n"]), s["n"])
    except ValueError:  # shuffled batches, the normalisations: not known
        known = math.nan
    return {"claimed_eps": s["eps"], "eps_lb": float(row["eps_lb"]), "eps_known": known,
            "profile": "violated" if row.get("profile_violated") else "not violated",
            "runs": int(row["runs"]), "verdict": row["verdict"],
            "detected": row["verdict"] != tramer.NO_VIOLATION}


def loop(entry: Entry, target: str, scale: Scale, seed: int, alpha: float) -> dict:
    """The sequential audit (at most ``scale.loop_max_runs`` evaluation runs per side) of the
    Opacus training ``target`` run unmodified (:class:`dpaudit.adapters.opacus_loop.
    OpacusLoop`, in this process) on ``setting["n"]`` rows: the claim the eps it reports
    (the larger of n and n + 1 rows), the profile test where the claim is at least RDP's eps
    at its declared noise, ``eps_known`` the accountant's eps at the measured parameters
    (:func:`measured`'s, shared with it)."""
    from .. import canaries, subjects
    from ..adapters import opacus_flaws
    from ..adapters.opacus_loop import OpacusLoop
    from . import tramer

    s = entry.setting
    X, y = data(s["n"], seed)
    train = OpacusLoop(opacus_flaws.TRAININGS[target])
    canary = None if entry.check == "white-box" else canaries.make_canary("clipbkd", X, y)
    row = None if canary is None else (
        canary.x, 0 if canary.label is None else int(canary.label))
    claim = train.claim(X, y, seeding.int_seeds(1, seed, "flaws/loop-claim"),
                        {"delta": DELTA}, row=row)
    spec = claim["spec"]
    profile = subjects.claimed_dpsgd(spec, claim["eps"], DELTA, s["n"]) if "q" in spec \
        else None
    got, _ = tramer.audit_implementation(
        train, X, y, canary, tramer.Design(
            claim["eps"], DELTA, scale.loop_max_runs, scale.loop_val_runs, seed, alpha,
            None if profile is None else tramer.claimed_profile(*profile),
            tramer.schedule_of(scale.loop_max_runs)), spec, mode=tramer.Mode(entry.check),
        checks=tramer.Checks(scale.seed_check, refuse_at_chance=False, call_limit=None))
    _, known = _probe(target, s["n"], seed)
    return {"claimed_eps": claim["eps"], "eps_lb": float(got["eps_lb"]), "eps_known": known,
            "profile": ("not tested" if profile is None else "violated"
                        if got.get("profile_violated") else "not violated"),
            "runs": int(got["runs"]), "verdict": got["verdict"],
            "detected": got["verdict"] != tramer.NO_VIOLATION}


#: (path, check) -> runner(entry, target, scale, seed, alpha) -> its cells: claimed_eps,
#: eps_lb, eps_known, profile, runs, verdict, detected.
RUNNERS: dict[tuple[str, str], Callable[..., dict]] = {
    ("opacus", "measured"): measured,
    ("opacus", "white-box"): loop,
    ("opacus", "black-box"): loop,
    ("trainer", "white-box"): trainer,
    ("trainer", "black-box"): trainer,
}
#: The neighbouring relation of each runner's rows.
RELATIONS = {("opacus", "measured"): "add/remove", ("opacus", "white-box"): "add/remove",
             ("opacus", "black-box"): "add/remove", ("trainer", "white-box"): "add/remove",
             ("trainer", "black-box"): "add/remove"}

# The trainer's setting: 20 rows, B 5 (q 0.25), 5 epochs (T 20), claim (2, 1e-5).
_TRAINER = {"n": 20, "batch_size": 5, "epochs": 5, "eps": 2.0}
# The normalisations' black box: n 10, B 5, where EASGM divides by 5 without the canary
# row and by 3 with it (docs/flaws.md), 2 epochs, claim 1.
_NORMALISED = {"n": 10, "batch_size": 5, "epochs": 2, "eps": 1.0}

ENTRIES = (
    Entry("size-dependent sampling", "opacus", "measured", "correct", "fixed_rate", {"n": 20}),
    Entry("floored normaliser", "opacus", "measured", "correct", "fixed_rate", {"n": 24}),
    Entry("shuffled batches", "opacus", "measured", "shuffled", "fixed_rate", {"n": 20}),
    Entry("ASGM", "opacus", "measured", "sampled_mean", "low_level", {"n": 22}),
    Entry("unscaled noise", "opacus", "measured", "unscaled_noise", "scaled_noise", {"n": 22}),
    Entry("wrong sample rate", "opacus", "measured", "wrong_rate", "right_rate", {"n": 22}),
    Entry("fewer epochs", "opacus", "measured", "one_epoch", "all_epochs", {"n": 22}),
    Entry("batch clipping", "opacus", "measured", "batch_clipping", "low_level", {"n": 22}),
    Entry("wrong sample rate", "opacus", "white-box", "wrong_rate", "right_rate", {"n": 22}),
    Entry("unscaled noise", "opacus", "white-box", "unscaled_noise", "scaled_noise",
          {"n": 22}),
    Entry("EASGM", "trainer", "black-box", "easgm", "fixed", _NORMALISED),
    Entry("ASGM", "trainer", "black-box", "asgm", "fixed", _NORMALISED),
    # std sigma at clip 2 is sigma C / 2: the half-noise subject
    Entry("unscaled noise", "trainer", "white-box", "half-noise", "fixed",
          {**_TRAINER, "clip": 2.0}),
    # noise for T / 2 steps: the eps of half the steps reported for all of them
    Entry("fewer epochs", "trainer", "white-box", "half-steps", "fixed", _TRAINER),
    Entry("noise on the mean", "trainer", "white-box", "buggy", "fixed", _TRAINER),
)


def robust(entry: Entry, scale: Scale, seed: int, alpha: float) -> dict:
    """The fixed white-box audit of the entry's target at the fewest runs per side with
    ``scale.power`` power (:func:`dpaudit.experiments.runs_needed.answer` on the exact
    pair of its score at the subject's actual noise, validation runs as many as
    evaluation runs), on ``scale.replications`` seeds derived from ``seed``: each one's
    eps_LB and claim p-value. Empty where the count is above ``scale.robust_max_runs``."""
    from .. import bounds, subjects
    from . import runs_needed as rn

    s = entry.setting
    spec = _subject_spec(entry, s["n"])
    sigma, q, steps = subjects.actual_dpsgd(entry.target, spec, s["n"])
    true = subjects.true_eps(entry.target, spec, s["n"])
    question = rn.Question(s["eps"], DELTA, true / s["eps"], q, steps, alpha,
                           power=scale.power, reps=100, seed=seed,
                           max_runs=scale.robust_max_runs)
    got = rn.answer(question, grid=rn.poisson_pair(sigma, q, steps).coarse(rn.LEVELS))
    runs = got["runs"]
    if runs is None:
        return {"robust_runs": math.nan}
    power = next(r["power"] for r in got["tried"] if r["runs"] == runs)
    eps, ps = [], []
    for rep in seeding.int_seeds(scale.replications, seed, "flaws/robust", entry.target):
        row = _audit(entry, entry.target, rep, alpha, runs, runs, 0, None)
        eps.append(float(row["eps_lb"]))
        ct_in, ct_out = round(row["tpr"] * runs), round(row["fpr"] * runs)
        ps.append(bounds.claim_p_value(ct_in, runs, ct_out, runs, s["eps"], DELTA))
    eps = np.array(eps)
    return {"robust_runs": runs, "robust_power": power, "robust_seeds": len(eps),
            "robust_certified": int((eps > s["eps"]).sum()),
            "robust_eps_lb_mean": float(eps.mean()), "robust_eps_lb_sd": float(eps.std(ddof=1)),
            "robust_eps_lb_min": float(eps.min()), "robust_p_max": float(max(ps))}


def run_entry(entry: Entry, scale: Scale, seed: int, alpha: float,
              log: Callable[[str], None] | None = None, done: dict | None = None) -> dict:
    """The entry's row: the check on its target, then on its fix (which must pass), then
    its robust columns where the white box certifies a violation. ``done``: the cells of
    checks already run in this table, by what they depend on (a fix shared by several
    flaws runs once)."""
    runner = RUNNERS[(entry.path, entry.check)]
    cells, done = {}, {} if done is None else done
    for prefix, target in (("", entry.target), ("fix_", entry.fix)):
        key = (entry.path, entry.check, target, tuple(sorted(entry.setting.items())))
        if key not in done:
            t0, c0 = time.perf_counter(), time.process_time()
            done[key] = runner(entry, target, scale, seed, alpha)
            done[key].update(seconds=time.perf_counter() - t0,
                             cpu_seconds=time.process_time() - c0)
        got = dict(done[key])
        cells.update({prefix + k: v for k, v in got.items() if not (prefix and k == "detected")})
        if log:
            log(f"{entry.flaw} / {entry.path} {entry.check} / {target}: {got['verdict']} "
                f"(eps_lb {got['eps_lb']:.3g}, claim {got['claimed_eps']:.3g}, "
                f"{got['runs']} runs, {got['seconds']:.1f} s)")
        if prefix:
            cells["fix_passes"] = not got["detected"]
    cells.update({k: math.nan for k in COLUMNS if k.startswith("robust_")})
    if (scale.replications and entry.check == "white-box" and entry.path == "trainer"
            and cells["detected"] and math.isfinite(cells["eps_known"])):
        t0 = time.perf_counter()
        cells.update(robust(entry, scale, seed, alpha))
        if log:
            took = f"({time.perf_counter() - t0:.0f} s)"
            log(f"{entry.flaw} / robust: no run count up to {scale.robust_max_runs} per "
                f"side has power {scale.power} {took}" if math.isnan(cells["robust_runs"])
                else f"{entry.flaw} / robust: {cells['robust_certified']} of "
                f"{cells['robust_seeds']} seeds certified at {cells['robust_runs']} runs "
                f"per side, p <= {cells['robust_p_max']:.3g} {took}")
    return {"flaw": entry.flaw, "path": entry.path, "check": entry.check,
            "relation": RELATIONS[(entry.path, entry.check)], "target": entry.target,
            "fix": entry.fix, "n": entry.setting["n"], **cells}


def table(scale: str, seed: int, alpha: float, entries=ENTRIES,
          log: Callable[[str], None] | None = None):
    """Every entry's row at ``scale`` (a key of :data:`SCALES`), columns :data:`COLUMNS`."""
    import pandas as pd

    if scale not in SCALES:
        raise ValueError(f"scale={scale!r}: must be one of {sorted(SCALES)}")
    done = {}
    rows = [run_entry(e, SCALES[scale], seed, alpha, log, done) for e in entries]
    for row in rows:
        row.update(scale=scale, alpha=alpha, delta=DELTA, seed=seed)
    return pd.DataFrame(rows)[list(COLUMNS)]


def _num(v, fmt: str = ".3g") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def markdown(df) -> str:
    """The table of docs/flaws.md from a flaws table (:func:`table`'s columns): one line
    per row, the fix beside it, the robust columns where there are any."""
    head = ("| flaw | path, check | training | claim | eps_LB | eps known | profile test | "
            "runs per side | CPU s | verdict | fix: claim / eps known, eps_LB, verdict | "
            "robust: runs at 90% power, eps_LB over seeds, certified, p <= |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in df.itertuples():
        robust = "-"
        scale = SCALES[r.scale]
        if (scale.replications and r.path == "trainer" and r.check == "white-box"
                and r.detected and math.isfinite(r.eps_known)):
            robust = f"none up to {scale.robust_max_runs}"
        if math.isfinite(r.robust_runs):
            robust = (f"{int(r.robust_runs)} (power {r.robust_power:.2f}): "
                      f"{r.robust_eps_lb_mean:.2f} +- {r.robust_eps_lb_sd:.2f} (min "
                      f"{r.robust_eps_lb_min:.2f}), {int(r.robust_certified)} of "
                      f"{int(r.robust_seeds)}, {_num(r.robust_p_max, '.2g')}")
        lines.append(
            f"| {r.flaw} | {r.path}, {r.check} | `{r.target}` | {r.claimed_eps:.3g} | "
            f"{_num(r.eps_lb, '.2f')} | {_num(r.eps_known)} | {r.profile} | {r.runs} | "
            f"{r.cpu_seconds:.0f} | {'**' + r.verdict + '**' if r.detected else r.verdict} | "
            f"`{r.fix}`: {r.fix_claimed_eps:.3g} / {_num(r.fix_eps_known)}, "
            f"{_num(r.fix_eps_lb, '.2f')}, {r.fix_verdict}"
            f"{'' if r.fix_passes else ' (FAILS)'} | {robust} |")
    return "\n".join(lines)


__all__ = ["markdown", "DIM", "CLASSES", "COLUMNS", "FLAWS", "Scale", "SCALES", "Entry", "ENTRIES",
           "RUNNERS", "RELATIONS", "DELTA", "data", "measured", "trainer", "robust", "run_entry",
           "table"]
