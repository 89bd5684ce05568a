"""The audited training function's runs: their seeds, every call of the function (the
contract of :mod:`dpaudit.subjects`, a time limit, its failures named), and the check that
its runs follow their seeds."""

from __future__ import annotations

import signal
import threading
from typing import Callable, Sequence

import numpy as np
import torch

from ... import canaries, seeds, subjects, trials


Progress = Callable[[str], None]


def run_seeds(seed: int, split: str, canary_in: bool, count: int) -> list[int]:
    """Distinct 63-bit seeds of the ``count`` runs of one (split, side) under ``seed``
    (:func:`dpaudit.seeds.int_seeds`, keyed by the split and the side)."""
    return seeds.int_seeds(count, int(seed), f"tramer/{split}/{'in' if canary_in else 'out'}")


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

    return source_digest(dpsgd, subjects, canaries, seeds, trials, sys.modules[__package__])


class Unauditable(ValueError):
    """The training function's runs cannot be audited (they break the contract, diverge,
    learn nothing or do not follow their seeds): any verdict on them would certify nothing."""


class UserCodeFailed(Exception):
    """A call of the audited training function (or of the ``predict`` it returned) raised
    (its exception is the ``__cause__``) or ran past ``limit`` seconds (``timed_out``);
    ``call`` names the call."""

    def __init__(self, call: str, timed_out: bool = False, limit: float | None = None):
        super().__init__(f"{call} ran past its limit of {limit:g} s" if timed_out else call)
        self.call, self.timed_out, self.limit = call, timed_out, limit


class _PastLimit(BaseException):
    """Raised into a call at its time limit; not an Exception, so that the audited code's
    ``except Exception`` does not swallow it."""


#: Seconds one call of a training function (or of its predict) may take by default: a call
#: trains ``batch_runs`` runs, about half a minute for 1000 of the case study on 2 CPU cores.
CALL_LIMIT = 3600.0


def user_call(call: str, limit: float | None, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, the call of the audited code that ``call`` names;
    :class:`UserCodeFailed` where it raises or runs past ``limit`` seconds. ``limit`` None
    or 0: none. The limit is a SIGALRM timer, so it holds in the main thread of a POSIX
    process only (elsewhere the call runs without one), and it interrupts Python code, not
    a single C call that never returns."""
    timed = bool(limit) and hasattr(signal, "SIGALRM") \
        and threading.current_thread() is threading.main_thread()
    if timed:
        def expire(signum, frame):
            raise _PastLimit
        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return fn(*args, **kwargs)
    except _PastLimit:
        raise UserCodeFailed(call, True, limit) from None
    except Exception as exc:
        raise UserCodeFailed(call) from exc
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


#: Seeds :func:`check_seeds` re-trains by default before an audit.
SEED_CHECK = 3


#: The contract of a training function's output, for messages.
CONTRACT = ("train(X, y, seeds, spec) must return predict, and predict(x) a floating-point "
            "torch tensor of logits of shape (len(seeds), len(x), n_classes)")


def _trained(train_fn, X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict,
             extra: dict | None = None, named: str = "runs", limit: float | None = None):
    """``logits_of(rows)``: the logits (runs, rows, C) of ``train_fn``'s runs on (X, y)
    (``extra``: the mode's keyword arguments), refused (:class:`Unauditable`) unless they
    keep the contract, C = max label + 1. Every call of ``train_fn`` and of its predict is
    a :func:`user_call` under ``limit``, named by the runs it trains (``named``)."""
    predict = user_call(f"train(X, y, seeds, spec) of the {named}", limit, train_fn, X, y,
                        list(seeds), spec, **(extra or {}))
    if not callable(predict):
        raise Unauditable(f"train returned {type(predict).__name__}, not a function; {CONTRACT}")
    runs, n_classes = len(seeds), int(y.max()) + 1

    def logits_of(rows: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            z = user_call(f"predict(x) of the {named}", limit, predict, rows.to(X.dtype))
        shape = tuple(getattr(z, "shape", ()))
        if not (isinstance(z, torch.Tensor) and z.is_floating_point()
                and shape == (runs, len(rows), n_classes)):
            got = type(z).__module__ + "." + type(z).__name__
            if hasattr(z, "shape"):
                got += f" of shape {shape}, dtype {getattr(z, 'dtype', '?')}"
            raise Unauditable(f"predict(x) returned {got}; the contract is a floating-point "
                              f"torch tensor of shape (len(seeds)={runs}, "
                              f"len(x)={len(rows)}, n_classes={n_classes})")
        return z

    return logits_of


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
    X, y = _with_canary(X, y, x, insert_label)
    logits_of = _trained(train_fn, X, y, seeds, spec, extra, runs, limit)
    # The canary in a call of its own: its logits do not depend on the test set's size
    # (a matmul's rounding does), so the losses stay those of an audit without it.
    lp = torch.log_softmax(logits_of(x[None])[:, 0].to(torch.float64), dim=-1).cpu().numpy()
    out = {"log_prob": np.nan_to_num(lp, nan=-np.inf, posinf=np.inf, neginf=-np.inf)}
    if test is not None:
        z = logits_of(test[0])
        right = (z.argmax(-1) == test[1].to(z.device)) & torch.isfinite(z).all(-1)
        out["test_acc"] = right.to(torch.float64).mean(1).cpu().numpy()
    return out


def check_options(seed_check: int, max_diverged: float) -> None:
    """ValueError naming the option unless ``seed_check`` (seeds of :func:`check_seeds`)
    is 0 (no check) or >= 2 and ``max_diverged`` is a fraction in [0, 1)."""
    if seed_check == 1 or seed_check < 0:
        raise ValueError(f"seed_check={seed_check}: must be 0 (no check) or >= 2 seeds")
    if not 0 <= max_diverged < 1:
        raise ValueError(f"max_diverged={max_diverged!r}: must be a fraction in [0, 1)")


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
    z = _trained(train_fn, X, y, seeds, spec, extra, runs, limit)(rows).to(torch.float64).cpu()
    if not torch.isfinite(z[:, 0]).all(-1).any():
        raise Unauditable(f"all {len(seeds)} runs of the seed check diverged (non-finite "
                          "logits on the canary input)")
    again = _trained(train_fn, X, y, seeds[::-1], spec, extra, runs, limit)(rows).to(
        torch.float64).cpu().flip(0)
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
