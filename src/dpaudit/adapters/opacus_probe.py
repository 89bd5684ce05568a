"""Measured, not assumed: the parameters a user's own Opacus training really runs with.

A user's training function ``train(X, y, seed) -> (model, reported_eps)`` makes its own
DataLoader, calls its own ``PrivacyEngine().make_private(...)`` (or
``make_private_with_epsilon``, or Opacus' low-level objects), runs its own loop and returns
the model and the epsilon its code reports for the delta the user declares. :func:`check`
runs it on n rows and on the same rows plus one (add/remove neighbours, the same seed),
with the Opacus objects it creates instrumented for the call's duration and restored after
(nothing of theirs rebuilt): every ``DPOptimizer`` (subclasses included: its
``clip_and_accumulate``, ``add_noise`` and ``pre_step`` are wrapped on the instance, so
overrides are seen), every ``PrivacyEngine`` (its accountant) and every Poisson batch
sampler (``UniformWithReplacementSampler``: its rate and population). Per released step
(one ``add_noise``) it records:

- the batch size (rows of per-sample gradients clipped since the last step), hence the
  steps, the sample rate and whether the sizes are Poisson: Binomial(rows, q) (two tests:
  their total, their dispersion) or fixed (shuffled or sequential batches);
- the clipping actually applied: each example's contribution to the clipped sum, from the
  optimizer's own ``clip_and_accumulate`` on that example alone, its largest norm;
- the noise actually added (gradient after ``add_noise`` minus the clipped sum): its std
  over all coordinates and steps, with a chi-square confidence interval;
- the normaliser: the noisy sum over the gradient ``pre_step`` leaves for the inner
  optimizer, compared with the sampled batch size and ``expected_batch_size``.

Then the accountant's epsilon at the measured parameters (Opacus' accountant the user's
code made, like for like, and dpaudit's PLD) beside the reported one, Chua et al.'s lower
bound where the batches are fixed-size (:mod:`dpaudit.shuffle_accounting`), and the
differences between the n and n + 1 runs: steps, sample rate, noise multiplier or
normaliser that depend on the data set's size are what make_private's ``sample_rate = 1 /
len(data_loader)`` and ``expected_batch_size = int(len(dataset) * sample_rate)`` do
(meta-pytorch/opacus#571 "Privacy Leakage at low sample size"; meta-pytorch/opacus#819;
the EASGM and ASGM normalisations of "Rethinking the Security of DP-SGD", 2026).

What it cannot see: anything outside the probed runs (behaviour that depends on other
data, seeds or sizes), noise added or gradients changed outside the DPOptimizer's methods,
the inner optimizer's update (momentum, weight decay), whether the noise is Gaussian and
independent (only its variance is measured), shuffled against sequential batches, and
gradient accumulation over several ``clip_and_accumulate`` calls beyond their summed size.
Adaptive clipping is disturbed by the per-example measurement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings
from typing import Callable

import numpy as np
import torch
from scipy import stats

from .. import accounting, seeds as seeding, shuffle_accounting

#: Significance of each statistical check (noise std, batch sizes): a correct run is
#: flagged by one of them with probability about this.
ALPHA = 1e-3
#: Relative slack between the reported epsilon and the accountant's at the measured
#: parameters (PRV and PLD discretisation), and between normalisers and clip norms.
RTOL = 0.01

#: Exit statuses of ``dpaudit opacus-check``.
EXIT_CONSISTENT, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2


@dataclasses.dataclass
class _Step:
    size: int = 0
    clip_max: float = 0.0
    noise_sq: float = 0.0
    noise_count: int = 0
    divisor: float | None = None
    noised: bool = False
    per_example: bool = True


@dataclasses.dataclass
class _Record:
    """What one instrumented call of ``train`` did."""

    steps: list = dataclasses.field(default_factory=list)
    optimizers: list = dataclasses.field(default_factory=list)
    accountants: list = dataclasses.field(default_factory=list)
    samplers: list = dataclasses.field(default_factory=list)
    pending: _Step = dataclasses.field(default_factory=_Step)
    noisy: list | None = None


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().reshape(-1) for t in tensors])


def _wrap_optimizer(opt, rec: _Record) -> None:
    """Measuring wrappers of ``opt``'s methods, set on the instance (what its own methods
    call through ``self``), around the bound methods of its class."""
    clip, noise, pre = opt.clip_and_accumulate, opt.add_noise, opt.pre_step

    def clip_and_accumulate():
        params = opt.params
        gs = [p.grad_sample for p in params]
        rows = None
        if all(isinstance(g, torch.Tensor) for g in gs) and len(gs[0]) > 0:
            saved = [p.summed_grad for p in params]
            before = _flat(s for s in saved) if saved[0] is not None else 0.0
            rows = 0.0
            for i in range(len(gs[0])):  # each example alone through the same clipping
                for p, g in zip(params, gs):
                    p.grad_sample, p.summed_grad = g[i:i + 1].clone(), None
                clip()
                one = _flat(p.summed_grad for p in params)
                rec.pending.clip_max = max(rec.pending.clip_max, float(one.norm()))
                rows = rows + one
            for p, g, s in zip(params, gs, saved):
                p.grad_sample, p.summed_grad = g, s
        rec.pending.size += sum(len(g) for g in (gs[0] if isinstance(gs[0], list) else [gs[0]]))
        clip()
        if rows is not None:  # per-example clipping: the batch's sum is the rows' sum
            got = _flat(p.summed_grad for p in params) - before
            if float((got - rows).norm()) > 1e-4 * max(1.0, float(rows.norm())):
                rec.pending.per_example = False

    def add_noise():
        summed = _flat(p.summed_grad for p in opt.params)
        noise()
        rec.noisy = [p.grad.detach().clone() for p in opt.params]
        z = _flat(rec.noisy) - summed
        rec.pending.noise_sq += float(z.square().sum())
        rec.pending.noise_count += z.numel()
        rec.pending.noised = True

    def pre_step(*args, **kwargs):
        rec.noisy = None
        out = pre(*args, **kwargs)
        step = rec.pending
        if step.noised:
            if rec.noisy is not None:
                noisy, final = _flat(rec.noisy), _flat(p.grad for p in opt.params)
                step.divisor = float(noisy @ noisy / (noisy @ final))
            rec.steps.append(step)
            rec.pending = _Step()
        return out

    opt.clip_and_accumulate, opt.add_noise, opt.pre_step = clip_and_accumulate, add_noise, pre_step


@contextlib.contextmanager
def instrumented(*, measure: bool = True, on_module: Callable | None = None,
                 on_optimizer: Callable | None = None):
    """Opacus' accountants (a PrivacyEngine's or the user's own), DPOptimizers and Poisson
    samplers recorded into the yielded :class:`_Record` while the block runs; their classes
    as they were afterwards. ``measure=False``: the optimizers recorded, not measured (no
    per-example clipping, no noise read back). ``on_module(gsm)`` and
    ``on_optimizer(opt)``: called on every ``GradSampleModule`` and ``DPOptimizer`` as it
    is made (after the measuring wrappers), e.g. :mod:`.opacus_loop`'s canary work."""
    from opacus import GradSampleModule
    from opacus.accountants import GaussianAccountant, PRVAccountant, RDPAccountant
    from opacus.optimizers.optimizer import DPOptimizer
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    rec = _Record()
    accountants = (RDPAccountant, PRVAccountant, GaussianAccountant)
    originals = [(cls, cls.__init__) for cls in
                 (*accountants, DPOptimizer, UniformWithReplacementSampler, GradSampleModule)]

    def accountant_init(self, *a, __init, **k):
        __init(self, *a, **k)
        rec.accountants.append(self)

    def optimizer_init(self, *a, __init=DPOptimizer.__init__, **k):
        __init(self, *a, **k)
        rec.optimizers.append(self)
        if measure:
            _wrap_optimizer(self, rec)
        if on_optimizer is not None:
            on_optimizer(self)

    def sampler_init(self, *a, __init=UniformWithReplacementSampler.__init__, **k):
        __init(self, *a, **k)
        rec.samplers.append((int(self.num_samples), float(self.sample_rate)))

    def module_init(self, *a, __init=GradSampleModule.__init__, **k):
        __init(self, *a, **k)
        if on_module is not None:
            on_module(self)

    for cls in accountants:
        cls.__init__ = functools.partialmethod(accountant_init, __init=cls.__init__)
    DPOptimizer.__init__ = optimizer_init
    UniformWithReplacementSampler.__init__ = sampler_init
    GradSampleModule.__init__ = module_init
    try:
        yield rec
    finally:
        for cls, init in originals:
            cls.__init__ = init


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """The measured parameters of one run of ``train`` on ``rows`` rows."""

    rows: int
    steps: int
    sizes: tuple
    sampling: str            # "poisson", "fixed" or "other"
    q: float                 # the sampler's rate (Poisson), else mean size / rows
    size_p: float            # p-value of the sizes against Binomial(rows, q) (NaN if fixed)
    steps_per_epoch: int | None
    clip: float              # the optimizer's max_grad_norm
    clip_max: float          # largest clipped per-example contribution seen
    per_example: bool        # every batch's clipped sum was the sum of its rows' alone
    noise_std: float
    noise_ci: tuple
    declared_std: float      # noise_multiplier * max_grad_norm of the optimizer
    expected_batch_size: float | None
    normaliser: str          # "constant", "sampled" or "varies"
    divisor: float | None    # the constant divisor (median divisor otherwise)
    accountant: str          # the mechanism of the user's Opacus accountant ("prv" if none)
    reported_eps: float

    @property
    def sigma(self) -> float:
        """The noise multiplier to account with: the declared std where the measured one is
        consistent with it, else the upper end of the measured std's interval, over the
        larger of the clipping norm and the largest contribution seen."""
        lo, hi = self.noise_ci
        std = self.declared_std if lo <= self.declared_std <= hi else hi
        return std / max(self.clip, self.clip_max)


def _sizes_p(sizes: np.ndarray, rows: int, q: float) -> float:
    """Two-sided p-value (Bonferroni over two tests) of batch sizes ~ Binomial(rows, q):
    their total, and their dispersion about rows q (chi-square with len(sizes) degrees)."""
    total = stats.binomtest(int(sizes.sum()), rows * len(sizes), q).pvalue
    var = rows * q * (1 - q)
    if var == 0:
        return float(total)
    chi = float(((sizes - rows * q) ** 2).sum() / var)
    disp = 2 * min(stats.chi2.cdf(chi, len(sizes)), stats.chi2.sf(chi, len(sizes)))
    return float(min(1.0, 2 * min(total, disp)))


def _sampling(rec: _Record, sizes: np.ndarray, rows: int):
    """(sampling, q, p-value, steps per epoch) of one run's batch sizes."""
    rates = [r for m, r in rec.samplers if m == rows]
    if rates:
        return "poisson", rates[-1], _sizes_p(sizes, rows, rates[-1]), None
    if len(set(sizes.tolist())) <= 2 and len(sizes) >= 2:
        ends = np.flatnonzero(np.cumsum(sizes) % rows == 0)
        spe = int(ends[0]) + 1 if len(ends) else None
        return "fixed", float(sizes[0] / rows), math.nan, spe
    q = float(sizes.mean() / rows)
    return "other", q, _sizes_p(sizes, rows, q), None


def _normaliser(steps, sizes) -> tuple[str, float | None]:
    divs = np.array([s.divisor for s in steps if s.divisor is not None], dtype=float)
    if not len(divs):
        return "unseen", None
    if np.allclose(divs, divs[0], rtol=1e-6):
        return "constant", float(divs[0])
    ok = [s.divisor for s in steps if s.divisor is not None and s.size > 0]
    if np.allclose(ok, [s.size for s in steps if s.divisor is not None and s.size > 0],
                   rtol=1e-6):
        return "sampled", float(np.median(divs))
    return "varies", float(np.median(divs))


def _summary(rec: _Record, rows: int, reported: float) -> RunSummary:
    if not rec.optimizers or not rec.steps:
        raise ValueError("train: no DPOptimizer step was seen (the probe measures Opacus' "
                         "DPOptimizer, as make_private makes it)")
    opt = rec.optimizers[-1]
    sizes = np.array([s.size for s in rec.steps])
    sampling, q, p, spe = _sampling(rec, sizes, rows)
    sq = sum(s.noise_sq for s in rec.steps)
    count = sum(s.noise_count for s in rec.steps)
    std = math.sqrt(sq / count)
    ci = (math.sqrt(sq / stats.chi2.ppf(1 - ALPHA / 2, count)),
          math.sqrt(sq / stats.chi2.ppf(ALPHA / 2, count)))
    kind, divisor = _normaliser(rec.steps, sizes)
    # The first accountant that saw steps (the engine's or the user's own; Opacus' PRV makes
    # RDP accountants of its own later, while it computes).
    used = [a for a in rec.accountants if len(a)] or rec.accountants
    acc = used[0] if used else None
    return RunSummary(
        rows=rows, steps=len(rec.steps), sizes=tuple(int(s) for s in sizes),
        sampling=sampling, q=float(q), size_p=p, steps_per_epoch=spe,
        clip=float(opt.max_grad_norm), clip_max=max(s.clip_max for s in rec.steps),
        per_example=all(s.per_example for s in rec.steps),
        noise_std=std, noise_ci=ci, declared_std=float(opt.noise_multiplier * opt.max_grad_norm),
        expected_batch_size=getattr(opt, "expected_batch_size", None), normaliser=kind,
        divisor=divisor, accountant=acc.mechanism() if acc is not None else "prv",
        reported_eps=reported)


def reported_eps(out) -> float:
    """The reported epsilon of ``train``'s output ``out``, a ValueError where it is not
    ``(model, reported_eps)`` with a finite number >= 0."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError(f"train must return (model, reported_eps); got {type(out).__name__}")
    try:  # a Python, numpy or 0-d torch number
        eps = None if isinstance(out[1], bool) else float(out[1])
    except (TypeError, ValueError, RuntimeError):
        eps = None
    if eps is None or not 0 <= eps < math.inf:
        raise ValueError(f"train: reported_eps={out[1]!r}: must be a finite number >= 0")
    return eps


def probe(train: Callable, X: torch.Tensor, y: torch.Tensor, seed: int,
          **hooks) -> RunSummary:
    """One instrumented call ``train(X, y, seed)``: its measured parameters. A ValueError
    where it does not return ``(model, reported_eps)`` with a number >= 0, or takes no
    DPOptimizer step. ``hooks``: :func:`instrumented`'s ``on_module`` and ``on_optimizer``."""
    with instrumented(**hooks) as rec, warnings.catch_warnings(), \
            torch.random.fork_rng(devices=[]):
        # Opacus' per-example hooks make torch warn on every backward pass, and every
        # PrivacyEngine without secure_mode says so.
        warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
        warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG")
        out = train(X, y, seed)
    return _summary(rec, len(X), reported_eps(out))


def opacus_epsilon(mechanism: str, sigma: float, q: float, steps: int, delta: float) -> float:
    """Opacus' accountant ``mechanism`` ("prv", "rdp", "gdp") at (sigma, q, steps)."""
    from opacus.accountants import create_accountant

    acc = create_accountant(mechanism)
    acc.history = [(sigma, q, steps)]
    return float(acc.get_epsilon(delta))


@dataclasses.dataclass(frozen=True)
class Finding:
    what: str
    message: str


@dataclasses.dataclass(frozen=True)
class Report:
    """:func:`check`'s result: the two runs, the epsilons at the measured parameters of the
    n-row run, and the findings (none: consistent)."""

    delta: float
    runs: tuple              # (RunSummary on n rows, RunSummary on n + 1 rows)
    eps_accountant: float    # the user's Opacus accountant at the measured parameters
    eps_pld: float           # dpaudit's PLD there (Poisson); NaN for fixed batches
    eps_shuffle_lb: float    # Chua et al.'s lower bound for fixed batches, else NaN
    findings: tuple

    @property
    def status(self) -> int:
        return EXIT_FINDINGS if self.findings else EXIT_CONSISTENT


def _run_findings(r: RunSummary, delta: float, eps_acc: float, eps_lb: float) -> list:
    out = []
    lo, hi = r.noise_ci
    if not lo <= r.declared_std <= hi:
        out.append(Finding("noise", f"noise std per coordinate {r.noise_std:.4g} "
                           f"({1 - ALPHA:.1%} CI {lo:.4g}-{hi:.4g}) is not the declared "
                           f"noise_multiplier * max_grad_norm = {r.declared_std:.4g}: "
                           f"noise multiplier {r.noise_std / r.clip:.4g}, not "
                           f"{r.declared_std / r.clip:.4g}"))
    if r.clip_max > r.clip * (1 + RTOL):
        out.append(Finding("clip", f"an example moved the clipped sum by {r.clip_max:.4g} > "
                           f"max_grad_norm {r.clip:.4g}"))
    if not r.per_example:
        out.append(Finding("clip", "the clipped sum of a batch is not the sum of its "
                           "examples' clipped gradients (clipping not per example): an "
                           "example's effect is not bounded by max_grad_norm"))
    if r.sampling == "fixed":
        lb = "n/a (batch size does not divide n)" if math.isnan(eps_lb) else f"{eps_lb:.4g}"
        out.append(Finding("sampling", f"fixed-size batches ({r.sizes[0]} rows, "
                           f"{r.steps_per_epoch} per epoch): not the Poisson sampling the "
                           f"accountant assumes; Chua et al.'s lower bound on the eps of "
                           f"shuffled batches {lb} against the reported {r.reported_eps:.4g}"))
    elif r.size_p < ALPHA:
        out.append(Finding("sampling", f"batch sizes (mean {np.mean(r.sizes):.3g}) are not "
                           f"Binomial({r.rows}, {r.q:.4g}) (p = {r.size_p:.2g})"))
    if r.normaliser == "sampled":
        out.append(Finding("normaliser", "the noisy sum is divided by the sampled batch size "
                           "(ASGM): its sensitivity is not clip / B; the accountant does "
                           "not cover it"))
    elif r.normaliser == "varies":
        out.append(Finding("normaliser", "the noisy sum's divisor changes between steps, "
                           "neither constant nor the sampled batch size"))
    if r.reported_eps < eps_acc * (1 - RTOL):
        out.append(Finding("epsilon", f"reported eps {r.reported_eps:.4g} < {eps_acc:.4g}, "
                           f"the {r.accountant} accountant's at the measured parameters "
                           f"(sigma {r.sigma:.4g}, q {r.q:.4g}, {r.steps} steps, delta "
                           f"{delta:g})"))
    return out


def _neighbour_findings(a: RunSummary, b: RunSummary) -> list:
    """Where the run on n + 1 rows is trained differently from the run on n rows."""
    out = []
    for what, va, vb in (("steps", a.steps, b.steps), ("sample rate", a.q, b.q),
                         ("noise multiplier", a.declared_std / a.clip,
                          b.declared_std / b.clip),
                         ("normaliser", a.divisor, b.divisor)):
        if what == "normaliser" and not a.normaliser == b.normaliser == "constant":
            continue  # a per-step divisor is a finding of its own run
        if not math.isclose(va, vb, rel_tol=1e-6):
            out.append(Finding(
                "neighbours", f"{what} depends on the data set's size: {va:.6g} on n = "
                f"{a.rows}, {vb:.6g} on n + 1 = {b.rows} (add/remove neighbours are "
                f"trained differently; the accountant does not cover it)"))
    return out


def check(train: Callable, n: int, delta: float, *, dim: int = 10, classes: int = 2,
          seed: int = 0, pld: bool = True) -> Report:
    """Probe ``train`` on n random rows of ``dim`` features and ``classes`` labels and on
    the same rows plus one (the same ``seed``), and compare what it did with what it
    reports at ``delta``: :class:`Report` (``pld=False``: without dpaudit's PLD epsilon,
    seconds of accounting)."""
    for name, v, low in (("n", n, 2), ("dim", dim, 1), ("classes", classes, 2)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"{name}={v!r}: must be a whole number >= {low}")
    if not (isinstance(delta, float) and 0 < delta < 1):
        raise ValueError(f"delta={delta!r}: must lie strictly between 0 and 1")
    gen = seeding.rng(seed, "opacus-check/data")
    X = torch.as_tensor(gen.standard_normal((n + 1, dim)), dtype=torch.float32)
    y = torch.as_tensor(gen.integers(0, classes, n + 1), dtype=torch.int64)
    y[:classes] = torch.arange(classes)  # every class in the n rows
    runs = (probe(train, X[:n], y[:n], seed), probe(train, X, y, seed))
    r = runs[0]
    eps_acc = opacus_epsilon(r.accountant, r.sigma, r.q, r.steps, delta)
    eps_pld = eps_lb = math.nan
    if r.sampling == "fixed":
        S = r.steps_per_epoch
        if S and r.steps % S == 0 and len(set(r.sizes)) == 1:
            eps_lb = shuffle_accounting.shuffle_eps_lower(r.sigma, S, r.steps // S, delta)
    elif pld:
        eps_pld = accounting.epsilon(r.sigma, r.q, r.steps, delta, "pld")
    findings = _run_findings(r, delta, eps_acc, eps_lb) + _neighbour_findings(*runs)
    return Report(delta, runs, eps_acc, eps_pld, eps_lb, tuple(findings))


def _num(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.4g}"


def table(report: Report) -> str:
    """The report as a Markdown table of the measured parameters, then its findings."""
    a, b = report.runs

    def divisor_cell(r):
        if r.divisor is None:
            return r.normaliser
        return f"{r.normaliser} {r.divisor:.4g} ({r.expected_batch_size})"

    def size_cell(r):
        return (f"{r.sampling}: mean {np.mean(r.sizes):.3g}, {min(r.sizes)}-{max(r.sizes)}"
                + ("" if math.isnan(r.size_p) else f", p {r.size_p:.2g}"))

    rows = [("rows", a.rows, b.rows), ("steps", a.steps, b.steps),
            ("sample rate q", f"{a.q:.4g}", f"{b.q:.4g}"),
            ("batch sizes", size_cell(a), size_cell(b)),
            ("max_grad_norm / largest clipped contribution", f"{a.clip:.4g} / {a.clip_max:.4g}",
             f"{b.clip:.4g} / {b.clip_max:.4g}"),
            ("noise std declared / measured", f"{a.declared_std:.4g} / {a.noise_std:.4g}",
             f"{b.declared_std:.4g} / {b.noise_std:.4g}"),
            ("normaliser (expected_batch_size)", divisor_cell(a), divisor_cell(b)),
            ("reported eps", f"{a.reported_eps:.4g}", f"{b.reported_eps:.4g}"),
            (f"{a.accountant} eps at the measured parameters", f"{report.eps_accountant:.4g}", ""),
            ("PLD eps there (Poisson)", _num(report.eps_pld), ""),
            ("Chua et al. lower bound (fixed batches)", _num(report.eps_shuffle_lb), "")]
    lines = ["| measured | n | n + 1 |", "|---|---|---|"]
    lines += [f"| {k} | {u} | {v} |" for k, u, v in rows]
    lines.append("")
    lines += [f"FINDING {f.what}: {f.message}" for f in report.findings] or \
        [f"consistent: no finding at delta {report.delta:g}"]
    return "\n".join(lines)


__all__ = ["ALPHA", "RTOL", "EXIT_CONSISTENT", "EXIT_FINDINGS", "EXIT_BAD_INPUT", "Finding",
           "Report", "RunSummary", "check", "instrumented", "opacus_epsilon", "probe",
           "reported_eps", "table"]
