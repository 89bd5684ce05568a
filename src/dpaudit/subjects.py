"""Implementations under audit: a registry of named DP-SGD subjects and user training functions.

Every subject is a *training function* with one signature, the contract of
``dpaudit audit-impl`` (documented in ``docs/audit_your_implementation.md``)::

    train(X, y, seeds, spec) -> predict
        X      float32 tensor (n, d): the training features (one row per example)
        y      int64 tensor (n,): the training labels
        seeds  list[int]: one independent training run per seed (train them together or not)
        spec   dict: the user's JSON spec, passed through verbatim
        predict(x: float32 tensor (m, d)) -> float32 tensor (len(seeds), m, n_classes): logits

Two subjects reproduce the case study of Tramer et al. (2022, "Debugging Differential
Privacy"), who audited Backpropagation Clipping (github.com/uvm-plaid/backpropagation-clipping):

* ``fixed``: DP-SGD (Abadi et al. 2016, Alg. 1) from :mod:`dpaudit.dpsgd`, Poisson sampling
  at rate q = batch_size / n, per-example clipping to norm C and Gaussian noise of std
  ``sigma * C`` on the clipped sum, ``sigma`` calibrated by :func:`dpaudit.accounting.noise_multiplier`
  so that the T = epochs / q steps are (eps, delta)-DP.
* ``buggy``: the same, but the noise std on the clipped sum is ``sigma * C / B`` (B = the
  expected batch size): the noise is calibrated to a sensitivity divided by the batch size.
  This is the effect of the bug fixed in commit 270964a of that repository: its loss was the
  batch *mean* (``nn.NLLLoss()``), so the per-example gradients its hooks clipped to C were
  already scaled by 1/B, i.e. each example's own gradient was clipped to B*C, and each
  example could move the averaged gradient by C; yet the noise was calibrated to a
  per-layer sensitivity C/B (the clip bound divided by the batch size once more).  The
  fix clips to C/B (``grad_clip / BATCH_SIZE``) so that the sensitivity the noise is
  calibrated to, ``input_bound * grad_bound``, is the true one.  With the bug the noise
  multiplier is effectively ``sigma / B`` instead of ``sigma``.

A third, ``half-steps``, is correct DP-SGD whose noise is calibrated for half its steps
(``round(T / 2)``, at least 1): it trains T steps with the noise multiplier that makes
T / 2 of them (eps, delta)-DP, so its true eps (:func:`true_eps`) is about sqrt(2) to 2
times the claim. A subtler bug than ``buggy``: a black-box audit of the final model
rarely sees it, a white-box one does.

A fourth, ``half-noise``, is correct DP-SGD whose noise std on the clipped sum is
``sigma * C / 2``, calibrated to a sensitivity of C / 2: the factor 2 between the
replace-one sensitivity (2C) and the add/remove one (C) applied in the wrong direction.
Its true eps is about twice the claim (1.9 times at (0.21, 1e-5), 2.1 times at (2, 1e-5);
q = 0.2, T = 100): too little for the eps test at a small claim, within reach of the
profile test (:func:`dpaudit.bounds.profile_audit`) at a larger one.

Two more, ``shuffle`` and ``shuffle-once``, are the gap of deployed DP-SGD (Chua, Ghazi,
Kamath, Kumar, Manurangsi, Sinha and Zhang 2024, "How Private are DP-SGD Implementations?"
and "Scalable DP-SGD: Shuffling vs. Poisson Subsampling"; Annamalai, Balle, Hayes and De
Cristofaro 2026, "To Shuffle or not to Shuffle: Auditing DP-SGD with Shuffling"): the noise
of ``fixed`` (sigma calibrated by the Poisson accountant at q = B / n for T = round(epochs /
q) steps: the claim), but fixed-size batches of B cut from a permutation of the data
(DPSGDConfig.sampling "shuffle": a fresh permutation each epoch; "shuffle-once": one
permutation for every epoch, the persistent shuffling Chua et al. analyse too); epochs must
be whole. Their true eps is not known (:mod:`dpaudit.shuffle_accounting` bounds it from
below and above); ``fixed`` is their control, correct Poisson DP-SGD at the same noise.

Two more, ``easgm`` and ``asgm``, are ``fixed`` (Poisson sampling, the same noise) with the
noisy clipped sum divided by something else than the constant B (DPSGDConfig.normalisation;
the three are named in "Rethinking the Security of DP-SGD", 2026): ``easgm`` by the expected
batch size as Opacus' ``make_private`` computes it from the data set's size, ``int(len(X)
* (1 / ceil(len(X) / B)))`` (:func:`dpaudit.dpsgd.spec.floored_expected_batch`), so that
add/remove neighbours, whose sizes differ by one, can be divided by different numbers (at n
= 10 and B = 5: 5 without the canary row, 3 with it; meta-pytorch/opacus#571 "Privacy
Leakage at low sample size", meta-pytorch/opacus#819); ``asgm`` by each step's sampled
batch size (at least 1), which the canary's inclusion changes. Their true eps is not known
(the accountant covers neither); ``fixed`` ("sgm") is their control. ``asgm`` trains no
gradient canaries (the white box's scores assume a constant normaliser).

The buggy subjects are named test subjects here, never options of the real trainer.

Every subject accepts the two optional keywords of the tight modes of ``dpaudit
audit-impl`` (:mod:`dpaudit.experiments.tramer`): ``init`` (a :class:`dpaudit.dpsgd.Params`
of one model: every run starts from it, DPSGDConfig.init "fixed") and ``canaries`` (a
:class:`dpaudit.dpsgd.GradientCanaries`: the gradient canary inserted as the subject's
sampling treats an example, at the data's sample rate or once per epoch; then the subject returns the trainer's :class:`dpaudit.dpsgd.CanaryRun` instead of
predict).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import torch

from . import accounting, dpsgd, user_code

# An audit trains the same subject in many calls; calibrating sigma takes about a second.
_noise_multiplier = functools.lru_cache(maxsize=64)(accounting.noise_multiplier)

#: predict(x (m, d)) -> logits (runs, m, n_classes)
Predict = Callable[[torch.Tensor], torch.Tensor]
#: train(X, y, seeds, spec) -> predict
TrainFn = Callable[[torch.Tensor, torch.Tensor, Sequence[int], dict], Predict]

#: spec keys of the registry subjects -> what they are (defaults in brackets)
SUBJECT_KEYS = {
    "eps": "claimed epsilon the noise is calibrated to",
    "delta": "claimed delta",
    "epochs": "expected passes over the data (whole ones for the shuffled subjects); steps "
              "T = round(epochs / q)",
    "batch_size": "expected Poisson batch size B (the shuffled subjects' fixed one); sample "
                  "rate q = B / n",
    "lr": "learning rate",
    "clip": "per-example clipping norm C",
    "arch": "model: 'lr' or 'fnn' ['lr']",
    "hidden": "hidden width of 'fnn' [32]",
    "n_classes": "number of classes [max label + 1]",
    "accountant": "accounting method for sigma ['rdp']",
    "n": "data-set size the sample rate refers to [len(X)]",
    "device": "where the runs train: 'auto' (a GPU where torch sees one), 'cpu' or 'cuda' "
              "['auto']",
}


def _plan(X: torch.Tensor, y: torch.Tensor, spec: dict, sampling: str = "poisson",
          normalisation: str = "sgm"):
    """Model, config and calibrated noise multiplier of a registry subject whose batches
    are drawn by ``sampling`` and whose noisy sums are divided as ``normalisation`` says
    (the noise is calibrated for Poisson sampling whatever they are)."""
    unknown = set(spec) - set(SUBJECT_KEYS)
    if unknown:
        raise ValueError(f"spec: unknown keys {sorted(unknown)}; allowed: {sorted(SUBJECT_KEYS)}")
    missing = {"eps", "delta", "epochs", "batch_size", "lr", "clip"} - set(spec)
    if missing:
        raise ValueError(f"spec: missing keys {sorted(missing)} "
                         f"({'; '.join(f'{k}: {SUBJECT_KEYS[k]}' for k in sorted(missing))})")
    # The sample rate must not depend on whether the canary is in: audits pass "n".
    n = int(spec.get("n", len(X)))
    q = spec["batch_size"] / n
    if not 0 < q <= 1:
        raise ValueError(f"spec.batch_size={spec['batch_size']}: must be in (0, n={n}]")
    steps = max(1, round(spec["epochs"] / q))
    sigma = _noise_multiplier(spec["eps"], q, steps, spec["delta"], spec.get("accountant", "rdp"))
    model = model_spec(spec, X.shape[1], int(y.max()) + 1)
    cfg = dpsgd.DPSGDConfig(epochs=spec["epochs"], batch_size=spec["batch_size"], lr=spec["lr"],
                            clip=spec["clip"], noise_multiplier=sigma, sampling=sampling,
                            normalisation=normalisation)
    return model, cfg, sigma, q, steps


def model_spec(spec: dict, in_dim: int, n_classes: int) -> dpsgd.ModelSpec:
    """The model of a registry subject's ``spec`` (its ``arch`` and ``hidden``), the layout
    the tight modes exchange parameters and gradient canaries in."""
    return dpsgd.ModelSpec(arch=spec.get("arch", "lr"), in_dim=in_dim,
                           hidden=spec.get("hidden", 32),
                           n_classes=int(spec.get("n_classes", n_classes)))


def _train(X, y, seeds, spec, noise_std_of, init=None, canaries=None, sampling="poisson",
           normalisation="sgm"):
    model, cfg, sigma, q, steps = _plan(X, y, spec, sampling, normalisation)
    if init is not None:
        cfg = dataclasses.replace(cfg, init="fixed")
    out = dpsgd.train_with_noise_std(X, y, model, cfg, list(seeds),
                                     noise_std_of(cfg, q, spec), init=init,
                                     device=spec.get("device", "auto"), canaries=canaries)
    if canaries is not None:
        return out
    return lambda x: dpsgd.logits(out, x, model)


def _fixed_std(cfg, q, spec):
    return cfg.noise_multiplier * cfg.clip


def _buggy_std(cfg, q, spec):
    return cfg.noise_multiplier * cfg.clip / cfg.batch_size


def _half_noise_std(cfg, q, spec):
    return cfg.noise_multiplier * cfg.clip / 2


def _half_steps_std(cfg, q, spec):
    steps = max(1, round(spec["epochs"] / q))
    return _half_steps_sigma(spec, q, steps) * cfg.clip


def _half_steps_sigma(spec, q, steps):
    return _noise_multiplier(spec["eps"], q, max(1, round(steps / 2)), spec["delta"],
                             spec.get("accountant", "rdp"))


def dpsgd_fixed(X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict, *,
                init: dpsgd.Params | None = None,
                canaries: dpsgd.GradientCanaries | None = None):
    """Correct DP-SGD: noise std ``sigma * C`` on the clipped sum (sensitivity C)."""
    return _train(X, y, seeds, spec, _fixed_std, init, canaries)


def dpsgd_buggy(X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict, *,
                init: dpsgd.Params | None = None,
                canaries: dpsgd.GradientCanaries | None = None):
    """Backpropagation-Clipping bug: noise std ``sigma * C / B``, sensitivity divided by B."""
    return _train(X, y, seeds, spec, _buggy_std, init, canaries)


def dpsgd_half_steps(X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict, *,
                     init: dpsgd.Params | None = None,
                     canaries: dpsgd.GradientCanaries | None = None):
    """Noise calibrated for half the steps: T steps at the sigma of (eps, delta) in T / 2."""
    return _train(X, y, seeds, spec, _half_steps_std, init, canaries)


def dpsgd_half_noise(X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict, *,
                     init: dpsgd.Params | None = None,
                     canaries: dpsgd.GradientCanaries | None = None):
    """Noise calibrated to sensitivity C / 2: noise std ``sigma * C / 2`` on the clipped sum."""
    return _train(X, y, seeds, spec, _half_noise_std, init, canaries)


def dpsgd_shuffle(X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict, *,
                  init: dpsgd.Params | None = None,
                  canaries: dpsgd.GradientCanaries | None = None):
    """Shuffled batches under Poisson accounting: a fresh permutation per epoch cut into
    batches of B, noise std ``sigma * C`` with sigma of the Poisson claim."""
    return _train(X, y, seeds, spec, _fixed_std, init, canaries, "shuffle")


def dpsgd_shuffle_once(X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict, *,
                       init: dpsgd.Params | None = None,
                       canaries: dpsgd.GradientCanaries | None = None):
    """Persistent shuffling under Poisson accounting: one permutation cut into the same
    batches every epoch, noise std ``sigma * C`` with sigma of the Poisson claim."""
    return _train(X, y, seeds, spec, _fixed_std, init, canaries, "shuffle-once")


def dpsgd_easgm(X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict, *,
                init: dpsgd.Params | None = None,
                canaries: dpsgd.GradientCanaries | None = None):
    """``fixed`` with the noisy sum divided by Opacus' floored expected batch size of the
    data's rows, ``int(len(X) * (1 / ceil(len(X) / B)))`` (EASGM)."""
    return _train(X, y, seeds, spec, _fixed_std, init, canaries, normalisation="easgm")


def dpsgd_asgm(X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict, *,
               init: dpsgd.Params | None = None,
               canaries: dpsgd.GradientCanaries | None = None):
    """``fixed`` with the noisy sum divided by each step's sampled batch size (ASGM)."""
    return _train(X, y, seeds, spec, _fixed_std, init, canaries, normalisation="asgm")


#: Named subjects of the case study, the buggy subjects of the tight modes and the shuffled
#: subjects under Poisson accounting and the normalisations (``fixed`` their control).
SUBJECTS: dict[str, TrainFn] = {"fixed": dpsgd_fixed, "buggy": dpsgd_buggy,
                                "half-steps": dpsgd_half_steps, "half-noise": dpsgd_half_noise,
                                "shuffle": dpsgd_shuffle, "shuffle-once": dpsgd_shuffle_once,
                                "easgm": dpsgd_easgm, "asgm": dpsgd_asgm}
#: Each subject's noise std on the clipped sum and its batches' sampling.
_NOISE_STD = {dpsgd_fixed: _fixed_std, dpsgd_buggy: _buggy_std,
              dpsgd_half_steps: _half_steps_std, dpsgd_half_noise: _half_noise_std,
              dpsgd_shuffle: _fixed_std, dpsgd_shuffle_once: _fixed_std,
              dpsgd_easgm: _fixed_std, dpsgd_asgm: _fixed_std}
_SAMPLING = {dpsgd_shuffle: "shuffle", dpsgd_shuffle_once: "shuffle-once"}
#: Each subject's normalisation (DPSGDConfig.normalisation), "sgm" where not named.
_NORMALISATION = {dpsgd_easgm: "easgm", dpsgd_asgm: "asgm"}


def train_columns(fns: Sequence[TrainFn], X: torch.Tensor, y: torch.Tensor,
                  seeds: Sequence[int], spec: dict) -> list[Predict] | None:
    """The registry subjects ``fns`` trained with one ``spec`` as the columns of one wide
    DP-SGD call (:func:`dpaudit.dpsgd.train_with_noise_std`): the runs of a seed share
    their batches, noise draw and initialisation and differ only in the noise std, the
    one thing the subjects differ in; what each would train alone, to float rounding
    (other matmul shapes). One predict per subject; None unless every one of ``fns`` is
    a registry subject and all draw their batches and divide their sums alike (columns
    share the batches and the normaliser)."""
    if not fns or not all(fn in _NOISE_STD for fn in fns) \
            or len({(_SAMPLING.get(fn, "poisson"), _NORMALISATION.get(fn, "sgm"))
                    for fn in fns}) != 1:
        return None
    model, cfg, sigma, q, steps = _plan(X, y, spec, _SAMPLING.get(fns[0], "poisson"),
                                        _NORMALISATION.get(fns[0], "sgm"))
    stds = [_NOISE_STD[fn](cfg, q, spec) for fn in fns]
    params = dpsgd.train_with_noise_std(X, y, model, [cfg] * len(fns), list(seeds), stds,
                                        device=spec.get("device", "auto"))
    return [lambda x, p=p: dpsgd.logits(p, x, model) for p in params]


def canary_relation(fn: TrainFn) -> str:
    """The neighbouring relation of a white-box audit of ``fn``: its own
    ``canary_relation`` attribute where it has one (an adapter whose insertion depends on
    its settings, e.g. :class:`dpaudit.adapters.opacus.OpacusTrainer`); "zero-out" for the
    shuffled subjects (their gradient canary takes a slot of the same batches, or is
    absent: the data set keeps its size); "add/remove" for every other function (the
    canary added at the data's rate, or absent)."""
    own = getattr(fn, "canary_relation", None)
    if isinstance(own, str):
        return own
    return "zero-out" if fn in _SAMPLING else "add/remove"


def load_train_fn(target: str) -> TrainFn:
    """The training function named ``target``: a registry name or ``"module.path:function"``.

    Raises ValueError (naming ``target``) if the module cannot be imported or has no such
    callable, before any training starts.
    """
    if target in SUBJECTS:
        return SUBJECTS[target]
    if not all(target.partition(":")):
        raise ValueError(f"--train {target!r}: must be 'module.path:function' or one of "
                         f"{sorted(SUBJECTS)}")
    return user_code.import_target(target)


def claimed_noise_multiplier(spec: dict, n: int, fn: TrainFn | None = None) -> float:
    """The noise multiplier sigma a registry subject calibrates for ``spec`` on n examples;
    a ValueError (by key) where the subject ``fn`` cannot train ``spec`` (e.g. epochs not
    whole for the shuffled subjects)."""
    X = torch.zeros(n, 1)
    return _plan(X, torch.zeros(n, dtype=torch.long), {**spec, "n": n, "n_classes": 2},
                 _SAMPLING.get(fn, "poisson"))[2]


def claimed_dpsgd(spec: dict, eps: float, delta: float, n: int) -> tuple[float, float, int] | None:
    """``(sigma, q, T)`` of correct DP-SGD claiming (eps, delta) in the setting ``spec``
    names, the claim the profile test holds an implementation to: the sample rate and steps
    ``q = spec["q"]``, ``T = spec["steps"]``, or as the registry subjects read them, ``q =
    batch_size / n`` (``spec["n"]`` if given, else ``n``) and ``T = round(epochs / q)``;
    sigma calibrated to (eps, delta) by ``spec["accountant"]`` (default ``rdp``). None
    when ``spec`` names neither pair. A ValueError names a key of the wrong kind."""
    if "q" in spec and "steps" in spec:
        q, steps = spec["q"], spec["steps"]
    elif "batch_size" in spec and "epochs" in spec:
        size = spec.get("n", n)
        for key, value in (("batch_size", spec["batch_size"]), ("epochs", spec["epochs"]),
                           ("n", size)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"spec.{key}={value!r}: must be a number > 0")
        q = spec["batch_size"] / size
        steps = max(1, round(spec["epochs"] / q)) if 0 < q <= 1 else 0
    else:
        return None
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
        raise ValueError(f"spec: sample rate q={q!r}: must lie in (0, 1] (q, or batch_size / n)")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"spec.steps={steps!r}: must be a whole number >= 1")
    method = spec.get("accountant", "rdp")
    if method not in accounting.METHODS:
        raise ValueError(f"spec.accountant={method!r}: must be one of {accounting.METHODS}")
    return _noise_multiplier(eps, q, steps, delta, method), float(q), steps


def true_eps(name: str, spec: dict, n: int, delta: float | None = None) -> float:
    """The add/remove eps at ``delta`` (default the claimed one) that registry subject
    ``name`` really has for ``spec`` on n examples: the PLD accountant's eps of its T
    Poisson-subsampled Gaussian steps at its actual noise multiplier (noise std / C).
    A ValueError for the shuffled subjects and the normalisations other than "sgm", whose
    eps is not known."""
    if _SAMPLING.get(SUBJECTS[name]) is not None:
        raise ValueError(f"true_eps: the eps of {name!r} (shuffled batches) is not known; "
                         f"dpaudit.shuffle_accounting bounds it")
    if SUBJECTS[name] in _NORMALISATION:
        raise ValueError(f"true_eps: the eps of {name!r} (normalisation "
                         f"{_NORMALISATION[SUBJECTS[name]]!r}) is not known")
    actual, q, steps = actual_dpsgd(name, spec, n)
    return accounting.epsilon(actual, q, steps, spec["delta"] if delta is None else delta,
                              "pld")


def actual_dpsgd(name: str, spec: dict, n: int) -> tuple[float, float, int]:
    """``(sigma, q, T)`` that registry subject ``name`` really trains with for ``spec`` on
    n examples: its noise std over the clipping norm, its Poisson rate and steps."""
    X = torch.zeros(n, 1)
    model, cfg, sigma, q, steps = _plan(X, torch.zeros(n, dtype=torch.long),
                                        {**spec, "n": n, "n_classes": 2})
    return _NOISE_STD[SUBJECTS[name]](cfg, q, spec) / cfg.clip, q, steps


__all__ = ["SUBJECTS", "SUBJECT_KEYS", "TrainFn", "Predict", "dpsgd_fixed", "dpsgd_buggy",
           "dpsgd_half_steps", "dpsgd_half_noise", "dpsgd_shuffle", "dpsgd_shuffle_once",
           "dpsgd_easgm", "dpsgd_asgm",
           "model_spec", "train_columns", "canary_relation", "load_train_fn",
           "claimed_noise_multiplier", "claimed_dpsgd", "true_eps", "actual_dpsgd"]
