"""Opacus DP-SGD rebuilt by dpaudit, as a training function of the ``audit-impl`` contract,
in all three modes: a reconstruction of ``make_private`` and of a training loop, not the
user's own (:mod:`.opacus_loop` audits that, unmodified).

:class:`OpacusTrainer` takes what a user gives ``PrivacyEngine.make_private``: a model
factory, an optimizer factory, the noise multiplier (or a target epsilon),
``max_grad_norm``, ``poisson_sampling``, the batch size and the epochs, and the data-set
size n the sample rate refers to. Called as ``train(X, y, seeds, spec, *, init=None,
canaries=None)``, it trains one model per seed with Opacus' own objects
(``GradSampleModule``, ``DPOptimizer``, ``DPDataLoader``), put together as ``make_private``
puts them together, with one difference: the sample rate is q = batch_size / n whether or
not the canary row is in. ``make_private`` takes 1 / len(data_loader), which changes with
that row (1/5 at n = 500 and B = 100, 1/6 at 501), so the two neighbouring data sets would
be trained at different rates. Where batch_size divides n, a run is the run of
``make_private`` with the same seeds.

A run's randomness comes from its seed s, via ``dpaudit.seeds.int_seeds(3, s, "opacus")``
(:func:`run_seeds`): torch's global generator, seeded with the first one, draws the
module, the optimizer and the batches (as in a script that calls ``torch.manual_seed``
and then ``make_private``, whose data loader draws from it). ``torch.random.fork_rng``
keeps the caller's generator as it was. The noise comes from a ``torch.Generator`` of the
second (``make_private(noise_generator=...)``), the gradient canary's sampling from one of
the third.

The claim is Opacus' own: :meth:`OpacusTrainer.epsilon` is the epsilon its accountant
reports after training on n rows (Yousefpour et al. 2021, "Opacus: User-Friendly
Differential Privacy Library in PyTorch").
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
from torch import nn

from .. import accounting, dpsgd, seeds as seeding

#: The accountants of Opacus (``PrivacyEngine(accountant=...)``); "prv" is its default.
ACCOUNTANTS = ("prv", "rdp", "gdp")


#: How to install Opacus, in the ImportError of :func:`require_opacus`.
INSTALL = ('pip install -e ".[opacus]" in a dpaudit checkout (or pip install "opacus>=1.5"; '
           "requirements.lock pins the version the tests pass with)")


def require_opacus():
    """The opacus package; an ImportError that says how to get it (the examples import
    Opacus through it, so a missing Opacus is one clear line, not a bare module name)."""
    try:
        import opacus
        import opacus.optimizers  # noqa: F401  (the examples subclass DPOptimizer)
    except ImportError as exc:
        raise ImportError(f"dpaudit.adapters.opacus needs Opacus (>= 1.5), which is not "
                          f"installed: {INSTALL}") from exc
    return opacus


def run_seeds(seed: int) -> tuple[int, int, int]:
    """The seeds of run ``seed``: (torch.manual_seed of the module, the optimizer and the
    batches; the noise generator; the gradient canary's sampling)."""
    return tuple(seeding.int_seeds(3, int(seed), "opacus"))


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def _params_of(linears: Sequence[nn.Linear]) -> dpsgd.Params:
    """One model's dpaudit Params: nn.Linear keeps weight as (out, in), Params W as (in, out)."""
    return dpsgd.Params([lin.weight.detach().T.unsqueeze(0) for lin in linears],
                        [lin.bias.detach().unsqueeze(0) for lin in linears])


def layout(module: nn.Module, in_dim: int, mode: str) -> tuple[dpsgd.ModelSpec, list[nn.Linear]]:
    """dpaudit's :class:`~dpaudit.dpsgd.ModelSpec` of ``module`` and its dense layers in
    order: the layout the tight modes exchange parameters and gradient canaries in. A
    ValueError naming ``mode`` unless ``module`` is one ``nn.Linear`` (arch "lr") or
    ``nn.Linear -> nn.ReLU -> nn.Linear`` (arch "fnn"), with biases, and computes what
    that ModelSpec computes (checked on a few inputs)."""
    linears = _linears(module)
    layers = [(lin.in_features, lin.out_features) for lin in linears]
    owned = {id(t) for lin in linears for t in (lin.weight, lin.bias) if t is not None}
    ok = (len(linears) in (1, 2) and all(lin.bias is not None for lin in linears)
          and {id(p) for p in module.parameters()} == owned and layers[0][0] == in_dim
          and all(a[1] == b[0] for a, b in zip(layers, layers[1:])))
    if ok:
        spec = dpsgd.ModelSpec("lr" if len(linears) == 1 else "fnn", in_dim,
                               layers[0][1], layers[-1][1])
        x = torch.randn(8, in_dim, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            got = module(x.to(linears[0].weight.dtype))
            want = dpsgd.logits(_params_of(linears), x, spec)[0]
        ok = got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    if not ok:
        raise ValueError(
            f"mode {mode!r}: the Opacus adapter loads dpaudit's parameters into, and inserts "
            f"gradient canaries in, an nn.Linear (arch 'lr') or nn.Linear -> nn.ReLU -> "
            f"nn.Linear (arch 'fnn') with biases and in_features={in_dim}; "
            f"{type(module).__name__} with dense layers {layers} is not one of them (audit "
            f"it in the black-box mode)")
    return spec, linears


def _load(linears: Sequence[nn.Linear], init: dpsgd.Params, spec: dpsgd.ModelSpec) -> None:
    """Every layer set to the auditor's ``init`` (one model), transposed into nn.Linear's layout."""
    if not isinstance(init, dpsgd.Params) or init.K != 1:
        raise ValueError("mode 'worst-case-init': init must be the dpaudit.dpsgd.Params of "
                         "one model")
    try:
        init.check(spec)
    except ValueError as exc:
        raise ValueError(f"mode 'worst-case-init': init does not fit the module: {exc}; "
                         f"give the audit the spec of OpacusTrainer.audit_args") from None
    with torch.no_grad():
        for lin, W, b in zip(linears, init.W, init.b):
            lin.weight.copy_(W[0].T)
            lin.bias.copy_(b[0])


def _parts(directions: torch.Tensor, linears: Sequence[nn.Linear]) -> dict:
    """The part of the canaries ``directions`` (m, P), in dpaudit's flat layout
    (:func:`dpaudit.dpsgd.flatten`), of each nn.Linear tensor: {id(tensor): (m, *shape)},
    weights transposed into nn.Linear's (out, in)."""
    parts, off, m = {}, 0, len(directions)
    for lin in linears:
        o, i = lin.weight.shape
        parts[id(lin.weight)] = directions[:, off:off + i * o].reshape(m, i, o) \
            .transpose(1, 2).to(lin.weight.dtype)
        parts[id(lin.bias)] = directions[:, off + i * o:off + (i + 1) * o].to(lin.bias.dtype)
        off += (i + 1) * o
    return parts


class _Scores:
    """One run's :class:`dpaudit.dpsgd.CanaryScores` (the scores of dpaudit's trainer) from
    its iterates in the flat layout (:func:`dpaudit.dpsgd.flatten`): each step's
    <theta_t - theta_{t+1}, g_j>. ``how``: CanaryScores' keywords."""

    def __init__(self, directions: torch.Tensor, theta0: torch.Tensor, **how):
        self.dirs, self.prev, self.t = directions.double(), theta0.double(), 0
        self.of = dpsgd.CanaryScores(1, len(directions), **how)

    def observe(self, theta: torch.Tensor) -> None:
        """The step to ``theta`` (P,), the parameters after it."""
        new = theta.double()
        self.of.add((self.dirs @ (self.prev - new)).unsqueeze(0), self.t)
        self.prev, self.t = new, self.t + 1

    @property
    def scores(self) -> torch.Tensor:
        return self.of.scores[0]

    @property
    def llr(self) -> torch.Tensor | None:
        llr = self.of.llr
        return None if llr is None else llr[0]


class _Canary:
    """One run's gradient canaries (:class:`dpaudit.dpsgd.GradientCanaries`) in an Opacus
    DPOptimizer: each included canary added to the clipped, summed gradient before the
    noise (by wrapping ``add_noise``, Opacus has no hook there) as ``how`` says
    (:meth:`OpacusTrainer._scoring`): at each step with probability ``rate``, or, with
    ``shuffle`` = (sampling, n, batch_size), once per epoch in the step of a uniformly
    random position of [0, n), a fresh one each epoch; with ``mates``, mates * g_j for each
    of the step's :attr:`rows` (set before each step), the canary's slot taking one's place
    when shuffled; and the run's :class:`_Scores` after every step."""

    def __init__(self, directions: torch.Tensor, included: torch.Tensor, how: dict,
                 linears: Sequence[nn.Linear], optimizer, seed: int):
        opt = optimizer.original_optimizer
        group = opt.param_groups
        if (type(opt) is not torch.optim.SGD or len(group) != 1 or group[0]["momentum"]
                or group[0]["weight_decay"] or group[0].get("maximize")):
            raise ValueError(f"mode 'white-box': the canary's scores assume plain SGD "
                             f"(theta -= lr * grad: torch.optim.SGD, one parameter group, no "
                             f"momentum, no weight decay); optimizer_fn gave {opt!r}")
        self.linears, self.rows, self.t = list(linears), 0, 0
        m, shuffle, mates = len(directions), how["shuffle"], how["mates"]
        self.counts = torch.zeros(m, dtype=torch.int64)
        self.scores = _Scores(directions, self.flat(), **how,
                              step_size=group[0]["lr"] / optimizer.expected_batch_size)
        self.rate = self.scores.of.rate
        parts = _parts(directions, self.linears)
        gen = torch.Generator().manual_seed(seed)
        add_noise = optimizer.add_noise

        def add_canary_then_noise():
            # Drawn whether or not the canary is included: runs in and out are paired.
            if shuffle is None:
                hit, slot = torch.rand(m, generator=gen) < self.rate, None
            else:
                _, n, B = shuffle
                s = self.t % self.scores.of.spe
                if s == 0:  # this epoch's position, its batch the canary's step
                    self.slot = torch.randint(n, (m,), generator=gen) // B
                hit = slot = self.slot == s
            hit = hit & included
            self.counts += hit
            add = hit.double()
            if mates:  # every row of the batch a mate, but the one the slot takes
                add += mates * (self.rows - (0 if slot is None else slot.double()))
            if add.any():
                for p in optimizer.params:
                    p.summed_grad.add_(torch.tensordot(add.to(p.dtype), parts[id(p)], 1))
            self.t += 1
            add_noise()

        optimizer.add_noise = add_canary_then_noise

    def flat(self) -> torch.Tensor:
        """The parameters in dpaudit's flat layout (:func:`dpaudit.dpsgd.flatten`)."""
        return dpsgd.flatten(_params_of(self.linears))[0]


@dataclass(frozen=True)
class Target:
    """A privacy target in place of a noise multiplier, as Opacus'
    ``make_private_with_epsilon`` takes it (``target_epsilon``, ``target_delta``): the
    training's sigma is the one Opacus' ``get_noise_multiplier`` gives for ``epsilon`` at
    ``delta``."""

    epsilon: float
    delta: float

    def __post_init__(self):
        for name in ("epsilon", "delta"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < math.inf):
                raise ValueError(f"Target({name}={v!r}): must be a number > 0")


class _Rows(torch.utils.data.TensorDataset):
    """A TensorDataset whose batch is fetched by one indexing per tensor (torch's
    ``__getitems__``), already whole (so the loader's collate_fn passes it on): a
    TensorDataset's batch, without a Python call and a stack per row."""

    def __getitems__(self, rows: list[int]) -> list[torch.Tensor]:
        return [t.index_select(0, torch.as_tensor(rows, dtype=torch.long, device=t.device))
                for t in self.tensors]


class OpacusTrainer:
    """dpaudit's reconstruction of an Opacus ``make_private`` training (its own loop, its
    own accounting; a user's loop: :class:`.opacus_loop.OpacusLoop`), as a training
    function of ``dpaudit audit-impl`` in every mode (the module docstring): ``train(X, y,
    seeds, spec, *, init=None, canaries=None)`` returns predict (logits ``(len(seeds), m,
    n_classes)``), or with ``canaries`` the runs'
    :class:`dpaudit.dpsgd.CanaryRun`. It reads nothing from ``spec``.

    ``model_fn()``: a new ``nn.Module``; ``optimizer_fn(parameters)``: its optimizer (e.g.
    ``lambda p: torch.optim.SGD(p, lr=0.5)``); ``noise_multiplier`` or ``target`` (a
    :class:`Target`, sigma from Opacus' ``get_noise_multiplier`` with ``accountant``);
    ``max_grad_norm``, ``batch_size``, ``epochs``, ``poisson_sampling``
    (False: a shuffled ``DataLoader(batch_size=B, shuffle=True)`` that Opacus leaves as
    it is, as ``make_private(poisson_sampling=False)`` does); ``n``: the data-set size the
    sample rate refers to (the audit's ``--n-train``; with the canary row the data has n +
    1 rows); ``criterion`` (``nn.CrossEntropyLoss()``, make_private's default);
    ``optimizer_class``: the DPOptimizer class (a subclass of Opacus' own, e.g. one with
    a bug to audit).

    Worst-case init and white box need a module of dpaudit's layouts (:func:`layout`);
    white box also plain SGD, since its scores assume theta -= lr * grad. White box
    inserts each included canary with probability ``canaries.rate`` at every step where it
    is given; by default as the data loader treats an example, as dpaudit's trainer does:
    at the accountant's rate :attr:`q` with Poisson sampling, and with the shuffled loader
    once per epoch, in the step of a uniformly random position of the rows (a fresh one
    each epoch, from the run's canary generator). ``canaries.mates`` adds mates * g_j per
    row of each step's batch (the canary's slot taking one's place when shuffled); the
    scores are those of dpaudit's trainer (:class:`dpaudit.dpsgd.CanaryScores`).
    """

    def __init__(self, model_fn: Callable[[], nn.Module],
                 optimizer_fn: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer], *,
                 max_grad_norm: float, batch_size: int, epochs: int, n: int,
                 noise_multiplier: float | None = None, target: Target | None = None,
                 poisson_sampling: bool = True, accountant: str = "prv",
                 criterion: nn.Module | None = None, optimizer_class=None):
        def whole(name, value, low):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"OpacusTrainer({name}={value!r}): must be a whole number "
                                 f">= {low}")
        whole("n", n, 1)
        whole("batch_size", batch_size, 1)
        whole("epochs", epochs, 1)
        if batch_size > n:
            raise ValueError(f"OpacusTrainer(batch_size={batch_size}): must be <= n={n}")
        if not (isinstance(max_grad_norm, (int, float)) and 0 < max_grad_norm < math.inf):
            raise ValueError(f"OpacusTrainer(max_grad_norm={max_grad_norm!r}): must be a "
                             f"number > 0 (flat clipping)")
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"OpacusTrainer(accountant={accountant!r}): must be one of "
                             f"{ACCOUNTANTS}")
        if (noise_multiplier is None) == (target is None):
            raise ValueError("OpacusTrainer: give exactly one of noise_multiplier and "
                             "target (a Target: epsilon and delta)")
        if target is not None and not isinstance(target, Target):
            raise ValueError(f"OpacusTrainer(target={target!r}): must be a Target(epsilon, "
                             "delta) (dpaudit.adapters.opacus.Target)")
        self.model_fn, self.optimizer_fn = model_fn, optimizer_fn
        self.max_grad_norm, self.batch_size, self.epochs, self.n = \
            float(max_grad_norm), batch_size, epochs, n
        self.poisson_sampling, self.accountant = bool(poisson_sampling), accountant
        self.criterion = criterion if criterion is not None else nn.CrossEntropyLoss()
        self.optimizer_class = optimizer_class or require_opacus().optimizers.DPOptimizer
        #: The sample rate Opacus' accountant is told: B / n with Poisson sampling, else
        #: make_private's 1 / len(data_loader) on n rows.
        self.q = batch_size / n if poisson_sampling else 1 / math.ceil(n / batch_size)
        #: Steps of a run on n rows: epochs times the data loader's length on them.
        self.steps = epochs * (int(1 / self.q) if poisson_sampling else math.ceil(n / batch_size))
        if target is not None:
            from opacus.accountants.utils import get_noise_multiplier

            noise_multiplier = get_noise_multiplier(
                target_epsilon=target.epsilon, target_delta=target.delta, sample_rate=self.q,
                steps=self.steps, accountant=accountant)
        if not (isinstance(noise_multiplier, (int, float)) and 0 <= noise_multiplier < math.inf):
            raise ValueError(f"OpacusTrainer(noise_multiplier={noise_multiplier!r}): must be "
                             f"a number >= 0")
        self.noise_multiplier = float(noise_multiplier)

    def epsilon(self, delta: float) -> float:
        """The epsilon Opacus' accountant reports at ``delta`` after training on n rows:
        ``steps`` steps at rate ``q`` and noise multiplier ``noise_multiplier``."""
        from opacus.accountants import create_accountant

        acc = create_accountant(self.accountant)
        acc.history = [(self.noise_multiplier, self.q, self.steps)]
        return float(acc.get_epsilon(delta))

    def audit_args(self, delta: float) -> dict:
        """The claim and spec of an ``audit-impl`` of this training: ``eps`` (Opacus'
        :meth:`epsilon`), ``delta``, ``n_train`` (n) and ``spec``: the clipping norm (the
        white box's canary norm), the module's layout (arch, hidden, n_classes) where it is
        one of dpaudit's, and the profile test's claimed DP-SGD, q and steps with
        accountant "pld" (the tightest of the profile test's; Opacus' default "prv" is not
        one of them). A ValueError where PLD would calibrate more noise for Opacus'
        epsilon than the training has."""
        eps = self.epsilon(delta)
        spec = {"clip": self.max_grad_norm, "q": self.q, "steps": self.steps,
                "accountant": "pld"}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            module = self.model_fn()
        linears = _linears(module)
        if linears:
            try:
                model, _ = layout(module, linears[0].in_features, "white-box")
                spec.update(arch=model.arch, n_classes=model.n_classes)
                if model.arch == "fnn":
                    spec["hidden"] = model.hidden
            except ValueError:
                pass  # the black-box mode needs no layout
        # eps falls as sigma grows: PLD's sigma for Opacus' eps is at most the training's
        # iff PLD's eps at the training's sigma is at most Opacus' eps.
        pld = accounting.epsilon(self.noise_multiplier, self.q, self.steps, delta, "pld")
        if pld > eps:
            raise ValueError(f"OpacusTrainer.audit_args: Opacus' accountant reports eps "
                             f"{eps:.6g}, below the eps {pld:.6g} of the profile test's PLD "
                             f"accountant at the training's noise multiplier "
                             f"{self.noise_multiplier:.6g}: the test would hold it to more "
                             f"privacy than it claims")
        return {"eps": eps, "delta": delta, "n_train": self.n, "spec": spec}

    def cli_args(self, delta: float) -> str:
        """:meth:`audit_args` as ``dpaudit audit-impl`` flags for a shell's command
        substitution, ``dpaudit audit-impl ... $(python -c ...)``: no spaces and no quotes
        within a flag's value (the shell splits the result at spaces and removes no quotes)."""
        a = self.audit_args(delta)
        return " ".join(["--eps", repr(a["eps"]), "--delta", repr(delta), "--n-train",
                         str(a["n_train"]), "--spec", json.dumps(a["spec"],
                                                                  separators=(",", ":"))])

    def _loader(self, X: torch.Tensor, y: torch.Tensor):
        """Opacus' Poisson DPDataLoader at rate q, or a user's shuffled DataLoader; both
        draw from torch's global generator, as make_private leaves them. Each batch's rows
        are taken at once (:class:`_Rows`): the batches of a TensorDataset, row for row."""
        data, whole = _Rows(X, y), lambda batch: batch
        if self.poisson_sampling:
            return require_opacus().data_loader.DPDataLoader(data, sample_rate=self.q,
                                                             collate_fn=whole)
        return torch.utils.data.DataLoader(data, batch_size=self.batch_size, shuffle=True,
                                           collate_fn=whole)

    @property
    def canary_relation(self) -> str:
        """The white-box audit's relation (:func:`dpaudit.subjects.canary_relation`): with
        the shuffled loader the canary takes a slot of the same batches or is absent
        (zero-out), with Poisson sampling it is added at rate q or absent (add/remove)."""
        return "add/remove" if self.poisson_sampling else "zero-out"

    def _scoring(self, canaries: dpsgd.GradientCanaries, rows: int) -> dict:
        """:class:`dpaudit.dpsgd.CanaryScores`' keywords but the step size, for white-box
        runs on ``rows`` rows: the canary inserted as the loader treats an example (with the
        shuffled loader, once per epoch), unless given its own rate, as dpaudit's trainer
        inserts it."""
        shuffled = canaries.rate is None and not self.poisson_sampling
        return {"rate": None if shuffled else canaries.rate or self.q,
                "shuffle": ("shuffle", rows, self.batch_size) if shuffled else None,
                "mates": canaries.mates, "expected_size": self.batch_size,
                "noise_std": self.noise_multiplier * self.max_grad_norm,
                "clip": self.max_grad_norm}

    def _run(self, X, y, seed: int, init, canaries, k: int):
        """One model of run ``seed``: (module, the run's _Canary or None, steps)."""
        opacus = require_opacus()
        s_model, s_noise, s_canary = run_seeds(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s_model)
            module = self.model_fn()
            spec = linears = None
            if init is not None or canaries is not None:
                spec, linears = layout(module, X.shape[1],
                                       "white-box" if canaries is not None else "worst-case-init")
            if init is not None:
                _load(linears, init, spec)
            opacus.validators.ModuleValidator.validate(module, strict=True)
            optimizer = self.optimizer_fn(module.parameters())
            gsm = opacus.GradSampleModule(module)  # make_private's: hooks, batch first, mean
            loader = self._loader(X, y)
            if self.poisson_sampling:
                gsm.forbid_grad_accumulation()
                expected = self.batch_size
            else:  # make_private's expected batch size: len(dataset) / len(data_loader)
                expected = int(len(X) * (1 / len(loader)))
            dp = self.optimizer_class(optimizer, noise_multiplier=self.noise_multiplier,
                                      max_grad_norm=self.max_grad_norm,
                                      expected_batch_size=expected,
                                      generator=torch.Generator().manual_seed(s_noise))
            canary = None
            if canaries is not None:
                canaries.check(spec, self.max_grad_norm, canaries.included.shape[0])
                canary = _Canary(canaries.directions.cpu(), canaries.included[k].cpu(),
                                 self._scoring(canaries, len(X)), linears, dp, s_canary)
            steps = 0
            for _ in range(self.epochs):
                for xb, yb in loader:
                    dp.zero_grad()
                    if canary is not None:
                        canary.rows = len(xb)
                    self.criterion(gsm(xb), yb).backward()
                    dp.step()
                    steps += 1
                    if canary is not None:
                        canary.scores.observe(canary.flat())
        return module, canary, steps

    def __call__(self, X: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], spec: dict,
                 *, init: dpsgd.Params | None = None,
                 canaries: dpsgd.GradientCanaries | None = None):
        X, y = torch.as_tensor(X), torch.as_tensor(y)
        if len(X) not in (self.n, self.n + 1):
            raise ValueError(f"OpacusTrainer: X has {len(X)} rows; this training was built "
                             f"for n={self.n} (the audit's --n-train), n + 1 with the canary")
        if canaries is not None and canaries.included.shape[0] != len(seeds):
            raise ValueError(f"canaries.included: {canaries.included.shape[0]} rows for "
                             f"{len(seeds)} seeds")
        with warnings.catch_warnings():
            # Opacus' per-example hooks make torch warn on every backward pass.
            warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
            runs = [self._run(X, y, int(s), init, canaries, k) for k, s in enumerate(seeds)]
        modules = [module.eval() for module, _, _ in runs]
        if canaries is None:
            def predict(x: torch.Tensor) -> torch.Tensor:
                with torch.no_grad():
                    return torch.stack([m(x) for m in modules])
            return predict
        cs = [c for _, c, _ in runs]
        canaries.record(runs[0][2], cs[0].rate, torch.stack([c.counts for c in cs]))
        ps = [_params_of(c.linears) for c in cs]
        params = dpsgd.Params([torch.cat(ws) for ws in zip(*[p.W for p in ps])],
                              [torch.cat(bs) for bs in zip(*[p.b for p in ps])])
        llr = None if cs[0].scores.llr is None else torch.stack([c.scores.llr for c in cs])
        return dpsgd.CanaryRun(params, torch.stack([c.scores.scores for c in cs]), llr)


__all__ = ["OpacusTrainer", "Target", "ACCOUNTANTS", "layout", "run_seeds"]
