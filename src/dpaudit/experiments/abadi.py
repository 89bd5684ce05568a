"""Abadi et al. 2016, "Deep Learning with Differential Privacy": the training curves of
Figure 3 (MNIST) and Figure 6 (CIFAR-10), with the moments accountant's epsilon.

Figure 3 (section 5.2): a 60-dimensional differentially private PCA projection of the
pixels, then one 1,000-unit ReLU layer and a softmax, trained by DP-SGD with lots of 600,
clipping norm 4 and a learning rate falling linearly from 0.1 to 0.052 over 10 epochs,
at (sigma, sigma_p) = (8, 16), (4, 7) and (2, 4) for training and PCA: about 90%, 95%
and 97% test accuracy at (0.5, 1e-5), (2, 1e-5) and (8, 1e-5)-DP.

The DP-PCA (section 4; the reference code's ``dp_pca.py``): every training image, as a
vector, is scaled to unit L2 norm (rows a_i of A); the 784 x 784 matrix A^T A =
sum_i a_i a_i^T gets i.i.d. N(0, sigma_p^2) noise on every entry and is symmetrised
((M + M^T) / 2, post-processing); its top 60 eigenvectors V project the pixels (x -> V^T
x, pixels in [0, 1] as the reference code feeds them). Adding or removing one image
changes A^T A by a a^T, of Frobenius norm ||a||^2 = 1: a Gaussian mechanism of
sensitivity 1 and noise multiplier sigma_p, run once on the whole training set. The
training is T Poisson-subsampled Gaussian steps (rate q = L/N, noise multiplier sigma).
Both are accounted together: their Renyi DP adds up (Mironov 2017, Proposition 1), and
:func:`dpaudit.accounting.epsilon_curve` converts the sum at each epoch, so the eps of
every row is that of the whole release, projection included (epoch 0: the PCA alone);
``sigma_pca = 0`` (the exact PCA, a non-private baseline) makes every eps inf.

Figure 6 (section 5.3): CIFAR-10 on convolutional layers pretrained on public data
(CIFAR-100 in the paper), the top layers (two fully connected layers of 384 units and
the softmax) trained by DP-SGD with sigma = 6 and clipping 3, lots of 2,000 (eps 2) and
4,000 (eps 4 and 8): about 67%, 70% and 73%. Here the frozen part is the project's CNN
feature extractor (:mod:`dpaudit.features`, 1024-d features), pretrained on CIFAR-100
where it is available, else on CIFAR-10 training images held out of the private set
(:func:`public_split`; same classes and distribution, so transfer is easier than from
CIFAR-100: docs/abadi.md).

Each noise level trains until the accountant's epsilon at ``delta`` would pass its
target (the paper's "train until (eps, delta)-DP would be violated"), capped at
``max_epochs``. A level is one DP-SGD run (one seed): its train and test accuracy are
measured after every epoch through the trainer's ``on_epoch`` hook.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd

# torch and the accountants are imported where they are used: Snakemake's start-up reads
# this module's levels and paths (workflow/rules/abadi.smk) and needs neither.
from .. import dpsgd, seeds
from ..config import SpecError
from ..device import resolve

if TYPE_CHECKING:
    import torch

FIGURES = ("fig3", "fig6")
#: The paper's reported test accuracy at each noise level's epsilon (Figure 3's text,
#: section 5.2; Figure 6's caption), keyed by figure and level name.
PAPER = {
    "fig3": {"large": {"sigma": 8.0, "sigma_pca": 16.0, "eps": 0.5, "test_acc": 0.90},
             "medium": {"sigma": 4.0, "sigma_pca": 7.0, "eps": 2.0, "test_acc": 0.95},
             "small": {"sigma": 2.0, "sigma_pca": 4.0, "eps": 8.0, "test_acc": 0.97}},
    "fig6": {"eps2": {"sigma": 6.0, "lot_size": 2000, "eps": 2.0, "test_acc": 0.67},
             "eps4": {"sigma": 6.0, "lot_size": 4000, "eps": 4.0, "test_acc": 0.70},
             "eps8": {"sigma": 6.0, "lot_size": 4000, "eps": 8.0, "test_acc": 0.73}},
}
#: Keys of the ``abadi`` section every job receives beside its figure's own keys.
SHARED_KEYS = ("delta", "accountant")
#: Keys of ``abadi.fig6`` the feature extraction depends on (the levels' jobs get the rest).
FEATURE_KEYS = ("public_images", "private_images", "test_images", "pretrain_epochs")
#: Columns of ``results/abadi_accuracy.csv``, in order.
COLUMNS = ("figure", "dataset", "level", "sigma", "sigma_pca", "lot_size", "n_train",
           "epoch", "steps", "lr", "train_acc", "test_acc", "eps", "delta", "accountant",
           "eps_target", "seed", "pretrained_on", "jpeg_reencoded")
#: The columns :func:`summary` shows (beside the paper's test accuracy).
SUMMARY_COLUMNS = ("figure", "dataset", "level", "epoch", "train_acc", "test_acc", "eps")


def dp_pca(X: np.ndarray, dims: int, sigma_pca: float, rng: np.random.Generator) -> np.ndarray:
    """Differentially private principal directions ``(d, dims)`` of the rows of ``X``.

    Rows scaled to unit L2 norm (all-zero rows stay zero), ``C = A^T A`` in float64, plus
    i.i.d. N(0, sigma_pca^2) noise on every entry, symmetrised; the eigenvectors of the
    ``dims`` largest eigenvalues, largest first. A Gaussian mechanism of sensitivity 1
    (module docstring); ``sigma_pca = 0`` is the exact, non-private PCA."""
    X = np.asarray(X, dtype=np.float64)
    if not 1 <= dims <= X.shape[1]:
        raise ValueError(f"dims={dims}: must be in [1, {X.shape[1]}] (the input dimension)")
    if not sigma_pca >= 0:
        raise ValueError(f"sigma_pca={sigma_pca}: must be >= 0")
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    A = np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)
    C = A.T @ A
    if sigma_pca > 0:
        C += rng.normal(0.0, sigma_pca, C.shape)
        C = (C + C.T) / 2
    _, vectors = np.linalg.eigh(C)  # ascending eigenvalues
    return np.ascontiguousarray(vectors[:, ::-1][:, :dims]).astype(np.float32)


def linear_decay(lr: float, lr_end: float, decay_epochs: float,
                 steps_per_epoch: float) -> Callable[[int], float]:
    """The paper's schedule as a function of the step t: ``lr`` at the start, falling
    linearly to ``lr_end`` over ``decay_epochs`` epochs (t / steps_per_epoch of them done),
    then constant; ``decay_epochs = 0`` is the constant ``lr``."""
    if decay_epochs <= 0:
        return lambda t: lr
    span = decay_epochs * steps_per_epoch
    return lambda t: lr + (lr_end - lr) * min(t / span, 1.0)


def eps_by_epoch(cfg: dpsgd.DPSGDConfig, n: int, delta: float, method: str,
                 gaussians=()) -> np.ndarray:
    """Epsilon after epochs 0..``cfg.epochs`` of DP-SGD on n examples (Poisson sampling at
    rate B/n, the steps :func:`dpsgd.epoch_ends` counts, noise multiplier
    ``cfg.noise_multiplier``), composed with the ``gaussians`` run before it."""
    from .. import accounting

    steps = [0] + dpsgd.epoch_ends(cfg, n)
    return accounting.epsilon_curve(cfg.noise_multiplier, cfg.batch_size / n, steps, delta,
                                    method, gaussians)


def epochs_for_eps(target: float | None, sigma: float, n: int, lot_size: int,
                   max_epochs: int, delta: float, method: str, gaussians=()) -> int:
    """The most whole epochs, at most ``max_epochs``, whose epsilon stays <= ``target``
    (None: ``max_epochs``). Raises :class:`SpecError` (a config problem) when even one
    epoch passes the target."""
    if target is None:
        return max_epochs
    cfg = dpsgd.DPSGDConfig(max_epochs, lot_size, 1.0, 1.0, sigma, "poisson")
    curve = eps_by_epoch(cfg, n, delta, method, gaussians)
    within = np.flatnonzero(curve[1:] <= target)
    if within.size == 0 or within[0] != 0:
        raise SpecError(f"eps target {target}: already {curve[1]:.3g} after one epoch "
                         f"(sigma={sigma}, lot size {lot_size}, n={n}"
                         f"{', PCA noise ' + str(list(gaussians)) if gaussians else ''})")
    return int(within[-1] + 1)  # eps grows with the epochs: the last one within


def accuracy(params: dpsgd.Params, X: torch.Tensor, y: torch.Tensor, model: dpsgd.ModelSpec,
             batch: int = 20000) -> float:
    """Top-1 accuracy of model 0 of ``params`` on (X, y), in batches."""
    right = 0
    for start in range(0, len(y), batch):
        z = dpsgd.logits(params, X[start:start + batch], model)[0]
        right += int((z.argmax(-1).cpu() == y[start:start + batch]).sum())
    return right / len(y)


def train_curve(X, y, X_test, y_test, model: dpsgd.ModelSpec, cfg: dpsgd.DPSGDConfig,
                lr_schedule: Callable[[int], float] | None, seed: int, eps: np.ndarray,
                device=None, train_eval: np.ndarray | None = None,
                log: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Train one DP-SGD model (``seed``) and measure it after every epoch: one row per
    epoch 0 (the initialisation) .. ``cfg.epochs`` with ``train_acc`` (on the rows
    ``train_eval`` of the training set, all by default), ``test_acc``, ``steps``, ``lr``
    (of the epoch's last step) and ``eps`` (``eps[epoch]``)."""
    import torch

    say = log or (lambda msg: None)
    dev = resolve(device)
    X, X_test = torch.as_tensor(X), torch.as_tensor(X_test)
    y, y_test = torch.as_tensor(y), torch.as_tensor(y_test)
    X_eval, y_eval = (X, y) if train_eval is None else (X[train_eval], y[train_eval])
    n = len(y)
    ends = [0] + dpsgd.epoch_ends(cfg, n)
    rows = []

    def measure(epoch: int, columns) -> None:
        params = columns[0]
        t = ends[epoch]
        lr = cfg.lr if lr_schedule is None else lr_schedule(max(t - 1, 0))
        rows.append({"epoch": epoch, "steps": t, "lr": lr,
                     "train_acc": accuracy(params, X_eval, y_eval, model),
                     "test_acc": accuracy(params, X_test, y_test, model),
                     "eps": float(eps[epoch])})
        r = rows[-1]
        say(f"epoch {epoch}/{int(cfg.epochs)}: train {r['train_acc']:.4f}, test "
            f"{r['test_acc']:.4f}, eps {r['eps']:.3g}")

    # The trainer's initialisation of this seed (the same draw on the same device).
    measure(0, [dpsgd.init_params(model, 1, [seed], cfg.init_scale, device=dev)])
    dpsgd.train(X, y, model, cfg, [seed], device=dev, lr_schedule=lr_schedule,
                on_epoch=measure)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ Figure 3

def check_fig3_level(level: dict) -> None:
    """A :class:`SpecError` naming the key for an eps target on a level whose PCA is exact
    (``sigma_pca = 0``): that release is not DP (eps = inf), so no target can stop it."""
    if level["sigma_pca"] == 0 and level["eps"] is not None:
        raise SpecError(f"abadi.fig3.levels[{level['name']}].sigma_pca = 0 is the exact, "
                        f"non-private PCA: the release is not DP (eps = inf), so eps target "
                        f"{level['eps']} cannot stop it; set that level's eps to null (it "
                        f"then trains max_epochs) or sigma_pca > 0")


def fig3_level(spec: dict, level: dict, data_spec: dict, seed: int, device=None,
               log: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, dict]:
    """One noise level of Figure 3 (``level``: name, sigma, sigma_pca, eps): DP-PCA of the
    training images, then DP-SGD on the projections; the rows of
    ``results/abadi_accuracy.csv`` and the provenance."""
    from .. import data

    say = log or (lambda msg: None)
    name, ds = level["name"], spec["dataset"]
    check_fig3_level(level)
    X, y = data.load_ten_class(ds, data_spec["root"], True, data_spec["download"])
    X_test, y_test = data.load_ten_class(ds, data_spec["root"], False, data_spec["download"])
    X, y = _subset(X, y, spec["n_train"], seeds.rng(seed, "abadi/fig3/train"))
    X_test, y_test = _subset(X_test, y_test, spec["n_test"], seeds.rng(seed, "abadi/fig3/test"))
    n, delta, method = len(y), spec["delta"], spec["accountant"]
    gaussians = [level["sigma_pca"]]  # 0: the exact PCA, whose release is not DP (eps = inf)
    epochs = epochs_for_eps(level["eps"], level["sigma"], n, spec["lot_size"],
                            spec["max_epochs"], delta, method, gaussians)
    say(f"{ds}: n={n}, n_test={len(y_test)}; level {name}: sigma={level['sigma']}, "
        f"sigma_pca={level['sigma_pca']}, {epochs} epochs (eps target {level['eps']})")
    V = dp_pca(X, spec["pca_dims"], level["sigma_pca"], seeds.rng(seed, f"abadi/fig3/pca/{name}"))
    model = dpsgd.ModelSpec("fnn", spec["pca_dims"], spec["hidden"], 10)
    cfg = dpsgd.DPSGDConfig(epochs, spec["lot_size"], spec["lr"], spec["clip"],
                            level["sigma"], "poisson")
    eps = eps_by_epoch(cfg, n, delta, method, gaussians)
    schedule = linear_decay(spec["lr"], spec["lr_end"], spec["lr_decay_epochs"],
                            n / spec["lot_size"])
    model_seed = seeds.int_seeds(1, seed, f"abadi/fig3/{name}")[0]
    curve = train_curve(X @ V, y, X_test @ V, y_test, model, cfg, schedule, model_seed, eps,
                        device, _subset_index(n, spec["train_eval_images"], seed), log)
    rows = _rows(curve, "fig3", ds, level, spec["lot_size"], n, delta, method, seed, None,
                 False)
    return rows, {"dataset": ds, "n": n, "n_test": len(y_test), "epochs": epochs,
                  "model_seed": model_seed}


# ------------------------------------------------------------------------------ Figure 6

def public_split(n: int, public_images: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the public (pretraining) and the private (DP-SGD) images among n
    CIFAR-10 training images when no CIFAR-100 is at hand: a seeded permutation, its first
    ``public_images`` public, the rest private (disjoint, so the DP guarantee covers every
    private image; the public ones are given away)."""
    if not 1 <= public_images < n:
        raise ValueError(f"public_images={public_images}: must be in [1, {n - 1}]")
    order = seeds.rng(seed, "abadi/fig6/public").permutation(n)
    return order[:public_images], order[public_images:]


def fig6_features(spec: dict, data_spec: dict, seed: int, device=None,
                  log: Callable[[str], None] | None = None) -> tuple[dict, dict]:
    """Pretrain the feature CNN on public images and map the private CIFAR-10 training
    images and the test images to its 1024-d features: ``(arrays X, y, X_test, y_test,
    provenance)``. Public: CIFAR-100's training set (a seeded sample of ``public_images``)
    when found, else ``public_images`` CIFAR-10 training images held out of the private
    set (:func:`public_split`)."""
    from .. import data, features
    from ..io import DataNotFound

    say = log or (lambda msg: None)
    root, dl = data_spec["root"], data_spec["download"]
    tarball = data_spec["cifar10_tarball"]
    root100 = data_spec["cifar100_root"] if data_spec["cifar100_root"] is not None else root
    want = spec["public_images"]
    try:
        pub = data.load_cifar100(root100, download=dl)
        keep = seeds.rng(seed, "abadi/fig6/cifar100").permutation(len(pub.labels))[:want]
        public, public_y = pub.images[keep], pub.labels[keep]
        pretrained_on = f"cifar100:{pub.source}"
        sample = spec["private_images"] or None
        train = data.load_cifar10(root, True, None, dl, tarball, sample=sample,
                                  sample_seed=seed)
        private, y = train.images, train.labels
    except DataNotFound:
        # Only what is used is decoded: the public and private images, when both are given.
        total = want + spec["private_images"] if spec["private_images"] else None
        try:
            train = data.load_cifar10(root, True, None, dl, tarball, sample=total,
                                      sample_seed=seed)
        except ValueError as err:
            raise SpecError(f"abadi.fig6.public_images + private_images = {total}: more "
                             f"than the CIFAR-10 training images ({err})") from err
        pub_idx, priv_idx = public_split(len(train.labels), want, seed)
        public, public_y = train.images[pub_idx], train.labels[pub_idx]
        private, y = train.images[priv_idx], train.labels[priv_idx]
        pretrained_on = f"cifar10-heldout[{len(pub_idx)}]:{train.source}"
    test = data.load_cifar10(root, False, None, dl, tarball, sample=spec["test_images"] or None,
                             sample_seed=seed)
    say(f"pretraining the CNN on {len(public_y)} public images ({pretrained_on}), "
        f"{spec['pretrain_epochs']} epochs")
    cnn, history = features.pretrain(public, public_y, spec["pretrain_epochs"],
                                     seeds.int_seeds(1, seed, "abadi/fig6/pretrain")[0],
                                     device)
    say(f"extracting features of {len(y)} private and {len(test.labels)} test images")
    arrays = {"X": features.extract_features(cnn, private, device=device), "y": y,
              "X_test": features.extract_features(cnn, test.images, device=device),
              "y_test": test.labels}
    return arrays, {"pretrained_on": pretrained_on, "public_images": int(len(public_y)),
                    "pretrain_epochs": spec["pretrain_epochs"], "pretrain_loss": history,
                    "source": train.source, "jpeg_reencoded": train.source != "torchvision",
                    "n": int(len(y)), "n_test": int(len(test.labels))}


def fig6_level(spec: dict, level: dict, arrays: dict, pretrained_on: str, seed: int,
               device=None, log: Callable[[str], None] | None = None, *,
               jpeg_reencoded: bool) -> tuple[pd.DataFrame, dict]:
    """One level of Figure 6 (``level``: name, lot_size, eps) on the features: DP-SGD of
    the dense head; the rows of ``results/abadi_accuracy.csv`` and the provenance.
    ``jpeg_reencoded``: the features' ``jpeg_reencoded`` (:func:`fig6_features`), which
    every row carries."""
    say = log or (lambda msg: None)
    name, lot = level["name"], level["lot_size"]
    X, y = arrays["X"], arrays["y"]
    n, delta, method = len(y), spec["delta"], spec["accountant"]
    epochs = epochs_for_eps(level["eps"], spec["sigma"], n, lot, spec["max_epochs"], delta,
                            method)
    say(f"features: n={n}, n_test={len(arrays['y_test'])}; level {name}: lot size {lot}, "
        f"sigma={spec['sigma']}, {epochs} epochs (eps target {level['eps']})")
    model = dpsgd.ModelSpec("fnn", X.shape[1], tuple(spec["hidden"]), 10)
    cfg = dpsgd.DPSGDConfig(epochs, lot, spec["lr"], spec["clip"], spec["sigma"], "poisson")
    eps = eps_by_epoch(cfg, n, delta, method)
    model_seed = seeds.int_seeds(1, seed, f"abadi/fig6/{name}")[0]
    curve = train_curve(X, y, arrays["X_test"], arrays["y_test"], model, cfg, None,
                        model_seed, eps, device,
                        _subset_index(n, spec["train_eval_images"], seed), log)
    level = {**level, "sigma": spec["sigma"], "sigma_pca": None}
    rows = _rows(curve, "fig6", "cifar10", level, lot, n, delta, method, seed, pretrained_on,
                 jpeg_reencoded)
    return rows, {"n": n, "epochs": epochs, "model_seed": model_seed}


# ------------------------------------------------------------------------------ workflow

def levels(abadi_cfg: dict, figure: str) -> dict[str, dict]:
    """The levels of ``figure`` by name; a ValueError naming the key if names repeat or a
    Figure 3 level is refused by :func:`check_fig3_level`."""
    named = {lv["name"]: lv for lv in abadi_cfg[figure]["levels"]}
    if len(named) != len(abadi_cfg[figure]["levels"]):
        raise ValueError(f"abadi.{figure}.levels: every level needs its own name")
    for level in named.values() if figure == "fig3" else ():
        check_fig3_level(level)
    return named


def job_spec(abadi_cfg: dict, figure: str, keys=None) -> dict:
    """What one job of ``figure`` is passed: the figure's section without its levels (or
    only ``keys``), with :data:`SHARED_KEYS`; a level's job is not rerun when another
    level changes."""
    section = {k: v for k, v in abadi_cfg[figure].items()
               if k != "levels" and (keys is None or k in keys)}
    return {**section, **{k: abadi_cfg[k] for k in SHARED_KEYS}}


def level_paths(abadi_cfg: dict, figure: str) -> list[str]:
    """The per-level result tables of ``figure``."""
    return [f"results/abadi/{figure}_{name}.csv" for name in levels(abadi_cfg, figure)]


# ------------------------------------------------------------------------------ helpers

def _subset(X, y, count: int, rng: np.random.Generator):
    """A random ``count`` of the rows (0: all, in file order)."""
    if not count or count >= len(y):
        return X, y
    keep = rng.permutation(len(y))[:count]
    return X[keep], y[keep]


def _subset_index(n: int, count: int, seed: int) -> np.ndarray | None:
    """The training rows whose accuracy is reported (0: all of them)."""
    if not count or count >= n:
        return None
    return np.sort(seeds.rng(seed, "abadi/train-eval").permutation(n)[:count])


def _rows(curve: pd.DataFrame, figure: str, dataset: str, level: dict, lot: int, n: int,
          delta: float, method: str, seed: int, pretrained_on: str | None,
          jpeg_reencoded: bool) -> pd.DataFrame:
    out = curve.assign(figure=figure, dataset=dataset, level=level["name"],
                       sigma=float(level["sigma"]), sigma_pca=level.get("sigma_pca"),
                       lot_size=lot, n_train=n, delta=delta, accountant=method,
                       eps_target=level["eps"], seed=seed, pretrained_on=pretrained_on,
                       jpeg_reencoded=bool(jpeg_reencoded))
    return out[list(COLUMNS)]


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """The last epoch of every (figure, level), beside the paper's test accuracy."""
    last = table.loc[table.groupby(["figure", "level"], sort=False).epoch.idxmax()]
    paper = [PAPER.get(f, {}).get(lv, {}).get("test_acc", math.nan)
             for f, lv in zip(last.figure, last.level)]
    return last.assign(paper_test_acc=paper).reset_index(drop=True)
