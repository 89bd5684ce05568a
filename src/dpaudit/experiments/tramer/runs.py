"""The audited training function's runs: their seeds, every call of the function (the
contract of :mod:`dpaudit.subjects`, in a :class:`dpaudit.user_code.Worker` or in this
process, a time limit, its failures named), and the check before the runs that they follow
their seeds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ... import canaries, seeds, subjects, trials, user_code
from ...user_code import CONTRACT, Unauditable, UserCodeFailed, user_call  # noqa: F401


Progress = Callable[[str], None]


def run_seeds(seed: int, split: str, canary_in: bool, count: int) -> list[int]:
    """Distinct 63-bit seeds of the ``count`` runs of one (split, side) under ``seed``
    (:func:`dpaudit.seeds.int_seeds`, keyed by the split and the side)."""
    return seeds.int_seeds(count, int(seed), f"tramer/{split}/{'in' if canary_in else 'out'}")


def run_side(seed: int, split: str, canary_in: bool, count: int) -> trials.Side:
    """The first ``count`` runs of one (split, side) under ``seed`` as a side of
    :func:`dpaudit.trials.run`, with their ``split`` and ``canary_in`` columns."""
    return trials.Side(f"{split} runs {'with' if canary_in else 'without'} canary",
                       run_seeds(seed, split, canary_in, count),
                       {"split": split, "canary_in": canary_in})


def _with_canary(X: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
                 insert_label: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The training data, with (x, insert_label) appended once unless the label is None."""
    if insert_label is None:
        return X, y
    return (torch.cat([X, x[None].to(X.dtype)]),
            torch.cat([y, torch.tensor([insert_label], dtype=y.dtype)]))


def trainer_digest() -> str:
    """SHA-256 of the code that turns a run's seed into its statistics (the trainer, the
    subjects, the canaries, the seed derivation, the trials loop and this package): kept
    batches of runs are reused only under the same digest."""
    import sys

    from ... import dpsgd
    from ...io import source_digest

    return source_digest(dpsgd, subjects, canaries, seeds, trials, user_code,
                         sys.modules[__package__])


#: Seconds one call of a training function (or of its predict) may take by default: a call
#: trains ``batch_runs`` runs, about half a minute for 1000 of the case study on 2 CPU cores.
CALL_LIMIT = 3600.0


#: Seeds :func:`check_seeds` re-trains by default before an audit, and the runs of each side
#: :func:`dpaudit.experiments.tramer.recheck` re-trains after it.
SEED_CHECK = 3


def logits(train_fn, X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict,
           rows: Sequence[torch.Tensor], extra: dict | None = None, named: str = "runs",
           limit: float | None = None, insert: tuple | None = None) -> list[torch.Tensor]:
    """The logits (runs, len(r), C) of ``train_fn``'s runs of ``seeds`` on (X, y) (with
    ``insert`` = (x, label), the canary row appended) on each of ``rows``, C = max label
    + 1; ``extra``: the mode's keyword arguments. ``train_fn``: a function called here or a
    :class:`dpaudit.user_code.Worker` (train and its predict in one round trip there).
    Output that breaks the contract is refused (:class:`Unauditable`); each call of the
    user's code is named by the runs it trains (``named``) and may take ``limit`` seconds
    (:class:`UserCodeFailed`)."""
    request = {"names": (f"train(X, y, seeds, spec) of the {named}",
                         f"predict(x) of the {named}"),
               "seeds": [int(s) for s in seeds], "spec": spec, "extra": extra,
               "insert": insert, "rows": list(rows)}
    return user_code.call(train_fn, X, y, request, limit)["logits"]


def train_runs(train_fn, X: torch.Tensor, y: torch.Tensor, x: torch.Tensor,
               seeds: Sequence[int], spec: dict, insert_label: int | None = None,
               test: tuple[torch.Tensor, torch.Tensor] | None = None,
               extra: dict | None = None, runs: str = "runs",
               limit: float | None = None) -> dict:
    """Train ``len(seeds)`` models at once with ``train_fn`` (``extra``: the mode's keyword
    arguments; with ``insert_label``, the
    canary (x, insert_label) appended once to the training data) and return
    ``log_prob``, the log-probabilities (runs, C) they give the canary input ``x``, and,
    with ``test = (X_test, y_test)``, ``test_acc``, each model's accuracy (runs,) on it.
    Output that breaks the contract (:data:`CONTRACT`) is refused (:class:`Unauditable`);
    ``runs`` names them and ``limit`` bounds each call (:func:`user_call`).

    NaN outputs (a diverged run) become -inf log-probabilities, i.e. infinite loss: a
    fixed decision; a test prediction with a non-finite logit counts as wrong.
    """
    insert = None if insert_label is None else (x, int(insert_label))
    # The canary in a predict call of its own: its logits do not depend on the test set's
    # size (a matmul's rounding does), so the losses stay those of an audit without it.
    rows = [x[None]] + ([test[0]] if test is not None else [])
    z = logits(train_fn, X, y, seeds, spec, rows, extra, runs, limit, insert)
    lp = torch.log_softmax(z[0][:, 0].to(torch.float64), dim=-1).numpy()
    out = {"log_prob": np.nan_to_num(lp, nan=-np.inf, posinf=np.inf, neginf=-np.inf)}
    if test is not None:
        right = (z[1].argmax(-1) == test[1]) & torch.isfinite(z[1]).all(-1)
        out["test_acc"] = right.to(torch.float64).mean(1).numpy()
    return out


def check_options(seed_check: int, max_diverged: float) -> None:
    """ValueError naming the option unless ``seed_check`` (seeds of :func:`check_seeds`)
    is 0 (no check) or >= 2 and ``max_diverged`` is a fraction in [0, 1)."""
    if seed_check == 1 or seed_check < 0:
        raise ValueError(f"seed_check={seed_check}: must be 0 (no check) or >= 2 seeds")
    if not 0 <= max_diverged < 1:
        raise ValueError(f"max_diverged={max_diverged!r}: must be a fraction in [0, 1)")


@dataclass(frozen=True)
class Checks:
    """What an audit refuses (:class:`Unauditable`, before writing anything) and how long
    the audited code may take: runs that do not follow their seeds (``seed_check`` seeds
    re-trained before the runs and as many runs of each side re-checked after them; 0
    skips both); more than a fraction ``max_diverged`` of runs with a non-finite canary
    loss or score (diverged: they count as "out", a fixed decision); with the test split
    and ``refuse_at_chance``, models whose mean test accuracy is no better than always
    predicting its most frequent class (a user's function that learns nothing is broken;
    dpaudit's own subjects are not, and at a tiny scale may still learn nothing). Every
    call of the training function and of its predict may take ``call_limit`` seconds (None:
    no limit): one that fails or runs past it ends the audit (:class:`UserCodeFailed`,
    naming the call)."""

    seed_check: int = SEED_CHECK
    max_diverged: float = 0.0
    refuse_at_chance: bool = True
    call_limit: float | None = CALL_LIMIT

    def __post_init__(self):
        check_options(self.seed_check, self.max_diverged)

    def diverged(self, values, what: str) -> int:
        """How many runs' ``values`` (their canary ``what``: loss or score) are not finite;
        refused beyond ``max_diverged`` of them."""
        diverged = int((~np.isfinite(values)).sum())
        if diverged > self.max_diverged * len(values):
            raise Unauditable(f"{diverged} of {len(values)} runs diverged (non-finite canary "
                              f"{what}); at most max_diverged={self.max_diverged:g} of them "
                              "may")
        return diverged


@dataclass(frozen=True)
class Batches:
    """How an audit's runs are trained and kept: ``size`` runs per call of the training
    function, progress lines to ``progress``. ``store`` (a folder): each batch is kept
    there under ``key`` (what the runs depend on: implementation, spec, seed, data, device,
    trainer; the audit adds the canary label for the runs with the canary and a tight
    mode's name) and a rerun restores it instead of training (:func:`dpaudit.trials.run`).
    ``together``: {name: (train_fn, store, key)} of other implementations audited with the
    same spec; where :func:`dpaudit.subjects.train_columns` can train them beside the
    audited one (registry subjects), every batch trains them all as the columns of one call
    and keeps their statistics in their stores under their keys, where their own audit
    finds them (with the same canary label) instead of training; black-box mode only."""

    size: int = 1000
    progress: Progress | None = None
    store: Any = None
    key: dict | None = None
    together: dict | None = None


def check_seeds(train_fn, X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict,
                rows: torch.Tensor, extra: dict | None = None,
                limit: float | None = None) -> None:
    """Refuse (:class:`Unauditable`) a function whose runs do not follow their seeds.

    Trains the runs of ``seeds`` (at least 2) twice, the second time in reverse order, and
    compares their logits on ``rows`` (the canary first): a run must give the same logits
    (to 1e-4 of their largest magnitude, which GPU reductions' rounding stays within)
    wherever its seed stands in the call, or its randomness does not come from its seed
    alone (a global generator, or one seeded by the call); and the runs of different seeds
    must not all give identical logits (one fixed seed for every run), or they are not
    independent runs and no count of them bounds a probability.  Refuses first when every
    run's canary logits are non-finite (diverged), as the audit would later.
    """
    seeds = list(seeds)
    if len(seeds) < 2:
        raise ValueError(f"seeds: the check needs at least 2, got {len(seeds)}")
    runs = f"seed check's {len(seeds)} runs"
    z = logits(train_fn, X, y, seeds, spec, [rows], extra, runs, limit)[0].to(torch.float64)
    if not torch.isfinite(z[:, 0]).all(-1).any():
        raise Unauditable(f"all {len(seeds)} runs of the seed check diverged (non-finite "
                          "logits on the canary input)")
    again = logits(train_fn, X, y, seeds[::-1], spec, [rows], extra, runs, limit)[0].to(
        torch.float64).flip(0)
    finite = z[torch.isfinite(z)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    for k, seed in enumerate(seeds):
        if not torch.allclose(z[k], again[k], rtol=0.0, atol=1e-4 * scale, equal_nan=True):
            raise Unauditable(
                f"not deterministic in its seed: the run of seed {seed} gave other logits "
                f"when trained again (seeds {seeds}, then reversed; largest difference "
                f"{float((z[k] - again[k]).abs().nan_to_num(nan=np.inf).max()):.3g} at "
                f"logit scale {scale:.3g}); take all of a run's randomness from its own "
                "seed, e.g. torch.Generator().manual_seed(seed)")
    if all(torch.equal(z[k], z[0]) for k in range(1, len(seeds))):
        raise Unauditable(f"the runs of {len(seeds)} different seeds {seeds} gave identical "
                          "logits: the function ignores its seeds (one fixed seed for every "
                          "run?); runs must be independent, one per seed")
