"""Canaries and test statistics of Jagielski et al. 2020 ([JUO20], Algorithms 3 and 4).

Every construction returns the two neighbouring training sets ``D0`` (canary out) and
``D1`` (canary in); every statistic maps per-model outputs to one score per model with
the sign convention **higher score = "the canary was in"** (models trained on ``D1``), the
direction ``dpaudit.bounds`` counts as positive.  Shapes: ``logits`` ``(K, m, C)`` and
``losses`` ``(K, m)`` for ``K`` models evaluated on ``m`` points (``dpaudit.dpsgd.logits``
and ``dpaudit.dpsgd.losses``); torch tensors or arrays.

Poisoning follows the authors' code (jagielski/auditing-dpsgd, ``datasets/fmnist``):
poisoned rows *replace the last rows* of the (randomly ordered) training set, so ``D0``
and ``D1`` have the same size and differ in ``k`` rows (replace-one adjacency, ``k``-fold;
the bound divides by ``k``, group privacy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np
import torch
from scipy import linalg, optimize, special

Dataset = tuple[np.ndarray, np.ndarray]


def _np(a) -> np.ndarray:
    """float64 numpy view of a tensor (any device) or array."""
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu()
    return np.asarray(a, dtype=np.float64)


def _rng(rng: int | np.random.RandomState | np.random.Generator):
    return np.random.RandomState(rng) if isinstance(rng, (int, np.integer)) else rng


def _replace_last(X: np.ndarray, y: np.ndarray, xs: np.ndarray, ys) -> Dataset:
    """Copy of ``(X, y)`` whose last ``len(xs)`` rows are ``xs`` with labels ``ys``."""
    X, y = X.copy(), y.copy()
    if len(xs):
        X[-len(xs):], y[-len(xs):] = xs, ys
    return X, y


# ----------------------------------------------------------------------------- ClipBKD

def least_variance_direction(X: np.ndarray) -> np.ndarray:
    """Unit direction of least variance of the rows of ``X``: the right singular vector of
    the *centred* data for the smallest singular value.

    The reference (``make_new.py``) takes ``sklearn.decomposition.PCA(d).fit(X)
    .components_[-1]``; PCA centres the data, so this is the last principal axis, not
    ``V_d`` of the raw ``X`` that Algorithm 4 writes.  Sign as sklearn's ``svd_flip`` of that
    time (``u_based_decision=True``): the entry of ``(X - mean) v`` largest in absolute value
    is positive (if that vector is zero, the largest entry of ``v`` is).
    """
    X = np.asarray(X, dtype=np.float64)
    Xc = X - X.mean(axis=0)
    n, d = Xc.shape
    # n < d: the least-variance direction lies in the null space, only a full V holds it.
    _, _, Vt = linalg.svd(Xc, full_matrices=n < d)
    v = Vt[-1]
    u = Xc @ v
    ref = u if np.abs(u).max() > 1e-12 * max(1.0, np.abs(Xc).max()) else v
    return v if ref[np.argmax(np.abs(ref))] > 0 else -v


def fit_logreg(X: np.ndarray, y: np.ndarray, C: float = 1.0,
               max_iter: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """L2-regularised logistic regression with intercept, as
    ``sklearn.linear_model.LogisticRegression(C=C)`` (defaults of the reference):
    minimise ``C * sum_i CE(x_i, y_i) + ||W||^2 / 2`` (intercept unpenalised) by L-BFGS.

    Two classes: one weight row (``P(y=1) = sigmoid(w.x + b)``), as sklearn; more classes:
    multinomial softmax.  Returns ``W`` ``(r, d)`` and ``b`` ``(r,)`` for
    :func:`logreg_proba`, ``r = 1`` for two classes, else the number of classes.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    n_classes = int(y.max()) + 1
    if n_classes < 2:
        raise ValueError("fit_logreg needs labels of at least two classes")
    n, d = X.shape
    r = 1 if n_classes == 2 else n_classes
    T = (y[:, None] == 1).astype(float) if r == 1 else np.eye(n_classes)[y]

    def objective(theta):
        W, b = theta[:r * d].reshape(r, d), theta[r * d:]
        Z = X @ W.T + b
        if r == 1:
            loss = np.sum(np.logaddexp(0, Z) - T * Z)
            resid = special.expit(Z) - T
        else:
            lse = special.logsumexp(Z, axis=1, keepdims=True)
            loss = np.sum(lse - np.sum(T * Z, axis=1, keepdims=True))
            resid = np.exp(Z - lse) - T
        grad_W = C * resid.T @ X + W
        return C * loss + 0.5 * np.sum(W * W), np.concatenate([grad_W.ravel(), C * resid.sum(0)])

    res = optimize.minimize(objective, np.zeros(r * (d + 1)), jac=True, method="L-BFGS-B",
                            options={"maxiter": max_iter, "gtol": 1e-8, "ftol": 1e-14})
    return res.x[:r * d].reshape(r, d), res.x[r * d:]


def logreg_proba(W: np.ndarray, b: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Class probabilities ``(n, n_classes)`` of a :func:`fit_logreg` model."""
    Z = np.atleast_2d(np.asarray(X, dtype=np.float64)) @ W.T + b
    if W.shape[0] == 1:
        p1 = special.expit(Z[:, 0])
        return np.stack([1 - p1, p1], axis=1)
    return special.softmax(Z, axis=1)


def clipbkd_point(X: np.ndarray, y: np.ndarray, norm: float = 10.0) -> tuple[np.ndarray, int]:
    """ClipBKD poison ([JUO20] Algorithm 4; ``make_new.py``): ``x_p = norm * v`` with ``v``
    the :func:`least_variance_direction` of ``X`` and ``y_p`` the least likely class of
    ``x_p`` under a logistic regression fitted on the clean ``(X, y)`` (the reference's
    "pretrained model f"; ``argmin_i f(x_p)_i``, the class maximising the gradient norm)."""
    x_p = norm * least_variance_direction(X)
    W, b = fit_logreg(X, y)
    return x_p.astype(np.asarray(X).dtype), int(np.argmin(logreg_proba(W, b, x_p)[0]))


def clipbkd_datasets(X: np.ndarray, y: np.ndarray, x_p: np.ndarray, y_p: int, k: int,
                     d0: Literal["flipped", "clean"] = "flipped") -> tuple[Dataset, Dataset]:
    """``D0``, ``D1`` of ClipBKD with ``k`` poison copies.

    ``D1``: the last ``k`` rows replaced by ``(x_p, y_p)`` (Algorithm 4's
    REPLACERANDOMROWS; the rows are random since the subset is in random order).

    ``d0="flipped"`` (the reference's experiments): ``D0`` has only its *last row*
    replaced, by ``(x_p, 1 - y_p)``, for every ``k``: ``audit.py`` trains on
    ``clipbkd-new-{k}.npy``, whose ``D0`` flips the poison labels, and ``exp_run.py`` trains
    all no-backdoor models with ``--n_pois=1``, which ``bkd_parser.py`` reuses for every
    ``k``.  Two classes only.  ``d0="clean"``: ``D0 = (X, y)`` (Algorithm 4 as printed,
    ``clipbkd-old``).  Either way ``D0`` and ``D1`` differ in exactly ``k`` rows.
    """
    if not 1 <= k <= len(X):
        raise ValueError(f"k must be in 1..{len(X)}, got {k}")
    D1 = _replace_last(X, y, np.repeat(x_p[None], k, axis=0), y_p)
    if d0 == "clean":
        return (X.copy(), y.copy()), D1
    if d0 != "flipped":
        raise ValueError(f"d0 must be 'flipped' or 'clean', got {d0!r}")
    if y_p not in (0, 1) or np.asarray(y).max() > 1:
        raise ValueError("d0='flipped' relabels the poison 1 - y_p: two classes only")
    return _replace_last(X, y, x_p[None], 1 - y_p), D1


def clipbkd_score(logits_p, y_p: int, logits_zero=None) -> np.ndarray:
    """ClipBKD statistic per model: ``sum_m (f(x_p) - f(0))_{y_p}`` ([JUO20] Algorithm 4,
    CLIPBKDTEST) with ``logits_zero`` the logits at the all-zero input, or the reference's
    variant ``sum_m f(x_p)_{y_p}`` (raw logit; ``make_nps.py`` runs with ``subtract=False``)
    when ``logits_zero`` is None.  ``logits`` are pre-softmax, ``(K, m, C)``; higher = in.
    """
    score = _np(logits_p)[..., y_p].sum(axis=-1)
    if logits_zero is not None:
        score = score - _np(logits_zero)[..., y_p].sum(axis=-1)
    return score


# ----------------------------------------------------------------------------- backdoor

def apply_patch(x: np.ndarray, size: int = 5, value: float = 1.0,
                image_shape: Sequence[int] | None = None) -> np.ndarray:
    """Copy of ``x`` with the top-left ``size x size`` pixels set to ``value`` (white for
    pixels in [0, 1]; every channel).  ``x`` is ``(n, ..., H, W)``, or flat ``(n, prod
    image_shape)`` with ``image_shape`` ending in ``(H, W)`` (FMNIST: ``(28, 28)``).
    Reference ``make_old.py``: ``x[:, :5, :5] = 1`` on ``(n, 28, 28, 1)`` images."""
    x = np.array(x, copy=True)
    view = x if image_shape is None else x.reshape(len(x), *image_shape)
    if view.ndim < 3:
        raise ValueError("apply_patch needs images (n, ..., H, W) or image_shape for flat rows")
    view[..., :size, :size] = value
    return x


def backdoor_pool(X: np.ndarray, y: np.ndarray, n_pool: int = 16, source: int = 0,
                  target: int = 1, rng: int | np.random.RandomState = 0,
                  image_shape: Sequence[int] | None = None, size: int = 5,
                  value: float = 1.0) -> Dataset:
    """The backdoor poison candidates ([JUO20] Algorithm 3; ``make_old.py``): ``n_pool``
    training points of class ``source`` drawn without replacement by ``rng.choice``,
    patched by :func:`apply_patch`, labelled ``target``.  The reference uses source 0,
    target 1, ``n_pool = 16`` (the largest k), and its ``np.random.seed(0)`` stream right
    after the subset draw: pass the stream returned by
    :func:`dpaudit.data.subset_indices` to reproduce its points exactly."""
    cand = np.flatnonzero(np.asarray(y) == source)
    pick = cand[_rng(rng).choice(len(cand), n_pool, replace=False)]
    return (apply_patch(X[pick], size=size, value=value, image_shape=image_shape),
            np.full(n_pool, target, dtype=np.asarray(y).dtype))


def backdoor_datasets(X: np.ndarray, y: np.ndarray, pool_x: np.ndarray, pool_y: np.ndarray,
                      k: int) -> tuple[Dataset, Dataset]:
    """``D0 = (X, y)`` (clean; ``oldbkd-old``) and ``D1`` = the last ``k`` rows replaced by
    the last ``k`` pool points (nested in ``k``, as ``make_old.py``)."""
    if not 1 <= k <= len(pool_x):
        raise ValueError(f"k must be in 1..{len(pool_x)} (pool size), got {k}")
    return (X.copy(), y.copy()), _replace_last(X, y, pool_x[-k:], pool_y[-k:])


def backdoor_test_set(X_test: np.ndarray, y_test: np.ndarray, source: int = 0, target: int = 1,
                      image_shape: Sequence[int] | None = None, size: int = 5,
                      value: float = 1.0) -> Dataset:
    """Every test point of class ``source``, patched, labelled ``target`` (``bkd_tst`` of
    ``make_old.py``): the points BACKDOORTEST sums the loss over."""
    idx = np.flatnonzero(np.asarray(y_test) == source)
    return (apply_patch(X_test[idx], size=size, value=value, image_shape=image_shape),
            np.full(len(idx), target, dtype=np.asarray(y_test).dtype))


def backdoor_score(losses) -> np.ndarray:
    """Backdoor statistic per model: ``-sum_m loss(f; Pert(x_m), y_target)`` over the
    :func:`backdoor_test_set` ([JUO20] Algorithm 3).  Negated so that higher = in: a
    backdoored model gives the patched points the target label, i.e. a *low* loss.
    (The public ``make_nps.py`` instead scores the ClipBKD point for every attack.)"""
    return -_np(losses).sum(axis=-1)


# ----------------------------------------------------------------------------- membership

def mi_datasets(X: np.ndarray, y: np.ndarray, index: int = -1) -> tuple[Dataset, Dataset, tuple]:
    """One-point membership inference: ``D1 = (X, y)``, ``D0 = D1`` without row ``index``
    (add/remove adjacency, the one the DP-SGD accountant certifies), and the target
    ``(x, y)``.  The subset is in random order, so the default last row is a random point."""
    keep = np.delete(np.arange(len(X)), index)
    return (X[keep], y[keep]), (X.copy(), y.copy()), (X[index], y[index])


def mi_score(losses) -> np.ndarray:
    """Loss-threshold MI statistic per model (Yeom et al. 2018): ``-sum_m loss`` on the
    target point(s) ``(K, m)``; higher = in (members have low loss)."""
    return -_np(losses).sum(axis=-1)


def yeom_mi_eps(losses_in, losses_out) -> np.ndarray:
    """The reference's population MI estimate (``make_nps.py: mi``) per model: a point is
    called a member when its true-class confidence ``exp(-loss)`` is at least the mean
    confidence on the training sample; returns ``log(TPR + TNR) = log(1 + advantage)``,
    which an eps-DP model keeps below eps (Yeom et al. 2018, Thm 1).  A point estimate
    (no confidence interval); the paper averages it over 10 models.  (The reference
    compares every softmax column with the threshold; here only the true class.)"""
    conf_in, conf_out = np.exp(-_np(losses_in)), np.exp(-_np(losses_out))
    thresh = conf_in.mean(axis=-1, keepdims=True)
    tpr = (conf_in >= thresh).mean(axis=-1)
    tnr = (conf_out < thresh).mean(axis=-1)
    return np.log(tpr + tnr)


# ---------------------------------------------- input canaries of Tramer et al. 2022

#: Kinds of :func:`make_canary`.
INPUT_CANARIES = ("checkerboard", "clipbkd")


@dataclass(frozen=True)
class Canary:
    """The inserted example: features ``x`` (d,), and its label (None: chosen on validation)."""

    kind: str
    x: torch.Tensor
    label: int | None = None


def checkerboard(X: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """The checkerboard canary image (CSCI 699 Week 4 lecture notes, after Tramer et al.
    2022): pixels alternate between the data's min and max.

    ``shape`` is the image shape of a row of ``X`` (default: square if ``d`` is a square,
    else a line).  Using the data's own range keeps the canary in the input domain
    whatever the preprocessing.  The alternating part of the pattern is nearly orthogonal
    to natural images, so a model can fit an arbitrary label on it at little cost on the
    rest of the data (the lecture: "insert a unique image which the model is likely to
    memorize"); its mean brightness is shared with the data, which resists.
    """
    d = X.shape[1]
    if shape is None:
        side = math.isqrt(d)
        shape = (side, side) if side * side == d else (d,)
    if math.prod(shape) != d:
        raise ValueError(f"checkerboard shape {shape} does not have d={d} pixels")
    grids = torch.meshgrid(*(torch.arange(s) for s in shape), indexing="ij")
    pattern = (sum(grids) % 2).to(X.dtype).reshape(d)
    lo, hi = X.min(), X.max()
    return lo + (hi - lo) * pattern


def make_canary(kind: str, X: torch.Tensor, y: torch.Tensor, label: int | None = None,
                clipbkd_norm: float = 10.0) -> Canary:
    """The canary ``kind`` ('checkerboard' or 'clipbkd') for data (X, y).

    'clipbkd' is ClipBKD of Jagielski et al. 2020 (Algorithm 4) from
    :func:`dpaudit.canaries.clipbkd_point`: ``clipbkd_norm`` times the data's direction of
    least variance, labelled with the class a logistic regression fitted on (X, y) finds
    least likely.  For the checkerboard, ``label=None`` leaves the label to
    :func:`least_likely_label` on the validation runs; a given ``label`` overrides both.
    """
    if kind == "checkerboard":
        return Canary(kind, checkerboard(X).to(torch.float32), label)
    if kind == "clipbkd":
        x, y_p = clipbkd_point(X.numpy(), y.numpy(), clipbkd_norm)
        x = torch.as_tensor(x, dtype=torch.float32)
        return Canary(kind, x, y_p if label is None else label)
    raise ValueError(f"canary={kind!r}: must be one of {list(INPUT_CANARIES)}")


def least_likely_label(log_probs: np.ndarray) -> int:
    """The "incorrect label" of the CSCI 699 Week 4 lecture's account of Tramer et al.
    2022: the class the models trained *without* the canary find least likely for it
    (lowest mean probability over runs)."""
    return int(np.argmin(np.exp(log_probs).mean(axis=0)))
