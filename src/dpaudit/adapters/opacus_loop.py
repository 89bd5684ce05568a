"""A user's own Opacus training, run unmodified, as a training function of ``audit-impl`` in
every mode, with the epsilon the user's code reports as the claim.

The user's function is that of ``dpaudit opacus-check`` (:mod:`.opacus_probe`):
``train(X, y, seed) -> (model, reported_eps)`` makes its own DataLoader on (X, y), its own
``PrivacyEngine().make_private(...)`` (or Opacus' low-level ``GradSampleModule``,
``DPOptimizer``, ``DPDataLoader``), runs its own loop, and returns the model and the eps its
code reports at the user's delta. :class:`OpacusLoop` calls it once per seed with the
Opacus objects it makes instrumented (:func:`.opacus_probe.instrumented`: every
``GradSampleModule`` and ``DPOptimizer`` as it is made); nothing of the user's is rebuilt,
so their loader decides which rows a step holds, their ``make_private`` the sample rate
and normaliser, their loop the steps:

- black box: the canary is a row of the data set handed over: n rows without it, n + 1
  with it (add/remove, what the user's code really does with one more row, its sample
  rate, steps and normaliser included); the models returned are scored as ``audit-impl``
  scores any ``predict``.
- worst-case init: the auditor's init is loaded into the user's module when Opacus wraps
  it in a ``GradSampleModule`` (an ``nn.Linear``, or ``nn.Linear -> nn.ReLU ->
  nn.Linear``: :func:`.opacus.layout`).
- white box: the canary is a marker row appended to the data (every feature ``X.max() +
  1``, equal to no row of X; n + 1 rows with it, n without), found in each batch the
  user's loader yields by exact row match at the ``GradSampleModule``'s forward. Its
  per-sample gradient is replaced, before Opacus clips it, by the gradient canary g (norm
  C = ``max_grad_norm``); with ``mates`` every other row's by ``mates * g`` (Chua et al.'s
  crafted batch mates, norm at most C, so no decoupling argument is needed). Opacus' own
  loader thus decides in which steps the canary falls (Poisson or shuffled), and Opacus'
  clipping, noise and step act on it. Every iterate is observed (the DPOptimizer's
  ``step``) and scored as dpaudit's trainer scores it (:class:`dpaudit.dpsgd.CanaryScores`)
  with the parameters :meth:`OpacusLoop.claim` measured on the n-row run, the same for
  both sides (a score may use only what the output shows).

:meth:`OpacusLoop.claim` runs the function on n rows and on n + 1 (the canary row added),
the same seed, measured (:func:`.opacus_probe.probe`): the claim is the eps reported on n
rows, the larger of the two where they differ, and the spec of the audit (clip, layout,
scoring parameters; q, steps and RDP for the profile test where the claim is at least
RDP's eps at the training's declared noise, sample rate and steps).

What it cannot see: gradients changed or noise added outside the DPOptimizer's methods;
input rows the user's code transforms before the module (the white-box marker is then not
found, and the audit refuses the function: the canary never went in); per-sample gradients
accumulated over several backward passes per step (refused); parameter updates outside
the DPOptimizer's ``step`` (not scored).
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import torch

from .. import accounting, dpsgd, user_code
from . import opacus_probe
from .opacus import _Scores, _load, _parts, _params_of, layout

#: The relation of every mode: the data set handed over has n rows, or n + 1 with the canary.
RELATION = "add/remove"


def marker(X: torch.Tensor) -> torch.Tensor:
    """The white box's canary row: every feature ``X.max() + 1``, equal to no row of X."""
    return torch.full((X.shape[1],), float(X.max()) + 1.0, dtype=X.dtype)


class _Run:
    """The instrumentation of one call of the user's function: what the Opacus objects it
    makes do, and in a tight mode what the audit puts into them."""

    def __init__(self, in_dim: int, init=None, model=None, canary=None):
        self.in_dim, self.init, self.model, self.canary = in_dim, init, model, canary
        self.linears, self.parts, self.rows, self.scores = None, None, None, None
        self.steps = self.hits = self.seen = 0
        self.modules = 0

    def on_module(self, gsm) -> None:
        self.modules += 1
        if self.init is None and self.canary is None:
            return
        mode = "white-box" if self.canary is not None else "worst-case-init"
        spec, self.linears = layout(gsm._module, self.in_dim, mode)
        if self.model is not None and (spec.arch, spec.n_params) != (self.model.arch,
                                                                      self.model.n_params):
            raise ValueError(f"mode {mode!r}: the module Opacus wraps is {spec}, not the "
                             f"{self.model} the audit was set up with")
        if self.init is not None:
            _load(self.linears, self.init, spec)
        if self.canary is not None:
            self.parts = _parts(self.canary["direction"], self.linears)
            gsm.register_forward_pre_hook(self._forward)

    def _forward(self, module, args) -> None:
        """The marker rows of a training forward's batch (rows equal to the marker)."""
        if not torch.is_grad_enabled() or not args:
            return
        x = args[0]
        if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[1] == self.in_dim:
            self.rows = (x == self.canary["row"].to(x.dtype)).all(dim=1)
            self.seen += int(len(x))
        else:
            self.rows = None

    def on_optimizer(self, opt) -> None:
        step = opt.step

        def counted_step(*a, **k):
            before = None if self.canary is None else self._flat()
            out = step(*a, **k)
            if not opt._is_last_step_skipped:
                self.steps += 1
                if self.canary is not None:
                    self._observe(opt, before)
            return out

        opt.step = counted_step
        if self.canary is not None:
            self._replace_before_clipping(opt)

    def _flat(self) -> torch.Tensor:
        return dpsgd.flatten(_params_of(self.linears))[0]

    def _observe(self, opt, before: torch.Tensor) -> None:
        if self.scores is None:
            group = opt.original_optimizer.param_groups
            if type(opt.original_optimizer) is not torch.optim.SGD or len(group) != 1 \
                    or group[0]["momentum"] or group[0]["weight_decay"]:
                raise ValueError("mode 'white-box': the canary's scores assume plain SGD "
                                 "(theta -= lr * grad: torch.optim.SGD, one parameter group, "
                                 f"no momentum, no weight decay); the loop's optimizer is "
                                 f"{opt.original_optimizer!r}")
            self.scores = _Scores(self.canary["direction"], before, **self.canary["how"])
        self.scores.prev = before.double()  # this step's update only
        self.scores.observe(self._flat())

    def _replace_before_clipping(self, opt) -> None:
        """The canary row's per-sample gradient (and with mates every other row's) replaced
        in ``grad_sample`` before the optimizer's own ``clip_and_accumulate``."""
        clip, mates = opt.clip_and_accumulate, self.canary["mates"]

        def clip_and_accumulate():
            if self.linears is None:
                raise ValueError("mode 'white-box': the DPOptimizer stepped before any "
                                 "GradSampleModule was made")
            mine = {id(t) for lin in self.linears for t in (lin.weight, lin.bias)}
            if {id(p) for p in opt.params} != mine:
                raise ValueError("mode 'white-box': the DPOptimizer does not train exactly "
                                 "the parameters of the module Opacus wrapped")
            gs = [p.grad_sample for p in opt.params]
            if all(isinstance(g, torch.Tensor) for g in gs):
                rows = self.rows
                if rows is None or any(len(g) != len(rows) for g in gs):
                    raise ValueError(
                        "mode 'white-box': the rows of the module's last training forward "
                        f"({'none' if rows is None else len(rows)}) are not the rows of the "
                        f"per-sample gradients ({len(gs[0])}); the canary row cannot be "
                        "found (one forward and backward per step, on the loader's batch)")
                hit = rows.nonzero()[:, 0]
                self.hits += len(hit)
                with torch.no_grad():
                    for p, g in zip(opt.params, gs):
                        part = self.parts[id(p)][0].to(g.dtype)
                        if mates:
                            g.copy_((mates * part).expand_as(g))
                        g[hit] = part
            elif any(g is not None for g in gs):
                raise ValueError("mode 'white-box': per-sample gradients accumulated over "
                                 "several backward passes (a list per parameter); the "
                                 "canary row's cannot be replaced")
            clip()

        opt.clip_and_accumulate = clip_and_accumulate


class OpacusLoop:
    """A user's ``train(X, y, seed) -> (model, reported_eps)`` (their own Opacus loop,
    unmodified) as a training function of ``audit-impl`` in every mode (module docstring):
    ``OpacusLoop(train)(X, y, seeds, spec, *, init=None, canaries=None)``. ``train``: the
    function, or its ``"module.path:function"`` (imported at the first call, in the
    process that calls it: ``audit-impl`` sends an OpacusLoop to its worker process).
    ``spec``: what :meth:`claim` returned as ``spec`` (the white box reads its scoring
    parameters there). Every call refuses (ValueError) a run that takes no DPOptimizer
    step or reports an eps that is not a finite number > 0."""

    #: The white-box relation (:func:`dpaudit.subjects.canary_relation`): n or n + 1 rows.
    canary_relation = RELATION

    def __init__(self, train: Callable | str):
        self.target, self._fn = train, None if isinstance(train, str) else train

    def __getstate__(self):
        return {"target": self.target}

    def __setstate__(self, state):
        self.__init__(state["target"])

    def __repr__(self) -> str:
        return f"OpacusLoop({getattr(self.target, '__qualname__', self.target)!r})"

    @property
    def fn(self) -> Callable:
        if self._fn is None:
            self._fn = user_code.import_target(self.target)
        return self._fn

    def _call(self, X, y, seed: int, run: _Run):
        """One call of the user's function under ``run``'s instrumentation: (model,
        reported eps, the record of :func:`.opacus_probe.instrumented`)."""
        with opacus_probe.instrumented(measure=False, on_module=run.on_module,
                                       on_optimizer=run.on_optimizer) as rec, \
                warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
            out = self.fn(X, y, int(seed))
        eps = _positive(opacus_probe.reported_eps(out))
        if not run.steps:
            raise ValueError("train took no DPOptimizer step (the audit instruments Opacus' "
                             "DPOptimizer, as make_private makes it)")
        if run.init is not None and not run.modules:
            raise ValueError("mode 'worst-case-init': no GradSampleModule was made, so the "
                             "init could not be loaded (wrap the module with make_private "
                             "or GradSampleModule)")
        return out[0], eps, rec

    def __call__(self, X: torch.Tensor, y: torch.Tensor, seeds, spec: dict, *,
                 init: dpsgd.Params | None = None,
                 canaries: dpsgd.GradientCanaries | None = None):
        X, y = torch.as_tensor(X), torch.as_tensor(y)
        if canaries is not None:
            return self._whitebox(X, y, list(seeds), spec, canaries)
        models = []
        for s in seeds:
            model, _, _ = self._call(X, y, s, _Run(X.shape[1], init=init))
            if not callable(model):
                raise ValueError(f"train returned {type(model).__name__} as its model; the "
                                 "model must be callable on a batch (m, d) to logits")
            models.append(model.eval() if hasattr(model, "eval") else model)

        def predict(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return torch.stack([m(x) for m in models])
        return predict

    def _whitebox(self, X, y, seeds: list, spec: dict, canaries: dpsgd.GradientCanaries):
        how = spec.get("opacus_loop")
        if not isinstance(how, dict):
            raise ValueError("mode 'white-box': spec has no 'opacus_loop' scoring parameters; "
                             "give the spec OpacusLoop.claim returns")
        if canaries.directions.shape[0] != 1:
            raise ValueError("mode 'white-box': OpacusLoop inserts one canary row "
                             f"(canaries.directions has {canaries.directions.shape[0]})")
        model = dpsgd.ModelSpec(spec.get("arch", "lr"), X.shape[1], spec.get("hidden", 32),
                                int(spec["n_classes"]))
        canaries.check(model, float(spec["clip"]), len(seeds))
        row = marker(X)
        X1 = torch.cat([X, row[None]])
        y1 = torch.cat([y, torch.zeros(1, dtype=y.dtype)])
        scoring = {"rate": how["rate"], "expected_size": how["expected_size"],
                   "shuffle": None if how["shuffle"] is None else ("shuffle", *how["shuffle"]),
                   "mates": float(canaries.mates), "noise_std": how["noise_std"],
                   "clip": float(spec["clip"]), "step_size": how["step_size"]}
        runs, counts, steps, rates = [], [], [], []
        for k, s in enumerate(seeds):
            inside = bool(canaries.included[k, 0])
            run = _Run(X.shape[1], model=model, canary={
                "direction": canaries.directions.detach().cpu().double(), "row": row,
                "mates": float(canaries.mates), "how": scoring})
            _, _, rec = self._call(X1 if inside else X, y1 if inside else y, s, run)
            rows = len(X) + inside
            q = [r for m, r in rec.samplers if m == rows]
            # The rate at which the loader took a row: its Poisson sampler's, else the
            # rows its batches held per step (1 / steps per epoch with fixed batches).
            rates.append(q[-1] if q else run.seen / (run.steps * rows))
            runs.append(run)
            counts.append(run.hits)
            steps.append(run.steps)
        canaries.record(max(steps), float(sum(rates) / len(rates)),
                        torch.tensor(counts, dtype=torch.int64).view(-1, 1))
        ps = [_params_of(r.linears) for r in runs]
        params = dpsgd.Params([torch.cat(ws) for ws in zip(*[p.W for p in ps])],
                              [torch.cat(bs) for bs in zip(*[p.b for p in ps])])
        scores = torch.stack([r.scores.scores for r in runs])
        llr = None if runs[0].scores.llr is None else torch.stack([r.scores.llr for r in runs])
        return dpsgd.CanaryRun(params, scores, llr)

    def claim(self, X: torch.Tensor, y: torch.Tensor, seeds, spec: dict, *,
              row: tuple | None = None) -> dict:
        """The user's function on X (n rows) and on X with the canary row (``row`` = (x,
        label), the black box's; None: the white box's :func:`marker`), with ``seeds[0]``,
        measured (:func:`.opacus_probe.probe`), at ``spec["delta"]``: a dict of plain
        values: ``eps`` the claim (the eps reported on n rows; the larger where the two
        differ), ``reported`` (on n, on n + 1 rows), ``rows``, ``measured`` (each run's
        steps, sample rate, sampling, noise multiplier declared, clip, expected batch
        size), ``spec`` (the audit's: ``clip``, the module's layout where it is one of
        dpaudit's, ``opacus_loop`` (the white box's scoring parameters, from the n-row run)
        and, where the claim is at least RDP's eps at the declared noise, sample rate and
        steps of the n-row run, ``q``, ``steps`` and ``accountant`` "rdp" for the profile
        test), and ``profile``: why there is no profile test, or None."""
        X, y = torch.as_tensor(X), torch.as_tensor(y)
        delta = float(spec["delta"])
        x, label = row if row is not None else (marker(X), 0)
        X1 = torch.cat([X, torch.as_tensor(x, dtype=X.dtype)[None]])
        y1 = torch.cat([y, torch.tensor([int(label)], dtype=y.dtype)])
        seen = {}

        def on_module(gsm):
            seen["module"] = gsm._module

        def on_optimizer(opt):
            seen["optimizer"] = opt

        a = opacus_probe.probe(self.fn, X, y, int(seeds[0]), on_module=on_module,
                               on_optimizer=on_optimizer)
        b = opacus_probe.probe(self.fn, X1, y1, int(seeds[0]))
        for r in (a, b):
            _positive(r.reported_eps)
        opt = seen["optimizer"]
        lr = float(opt.original_optimizer.param_groups[0].get("lr", math.nan))
        expected = float(opt.expected_batch_size or a.rows * a.q)
        fixed = a.sampling == "fixed"
        out_spec = {"clip": a.clip, "opacus_loop": {
            "rate": None if fixed else a.q,
            "shuffle": [a.rows, a.sizes[0]] if fixed else None,
            "expected_size": a.rows * a.q, "noise_std": a.declared_std,
            "step_size": lr / expected}}
        if "module" in seen:
            try:
                model, _ = layout(seen["module"], X.shape[1], "white-box")
                out_spec.update(arch=model.arch, n_classes=model.n_classes)
                if model.arch == "fnn":
                    out_spec["hidden"] = model.hidden
            except ValueError:
                pass  # the black box needs no layout; the tight modes refuse it by name
        eps = max(a.reported_eps, b.reported_eps)
        sigma = a.declared_std / a.clip
        # The profile test holds the function to DP-SGD at the noise RDP calibrates for the
        # claim: sound where that is at most the training's declared noise, i.e. where RDP's
        # eps at the declared noise is at most the claim (equal for RDP's own report).
        rdp = accounting.epsilon(sigma, a.q, a.steps, delta, "rdp") if sigma > 0 else math.inf
        profile = None
        if rdp <= eps * (1 + 1e-9):
            out_spec.update(q=a.q, steps=a.steps, accountant="rdp")
        else:
            profile = (f"the claim {eps:.4g} is below RDP's eps {rdp:.4g} at the n-row run's "
                       f"declared noise multiplier {sigma:.4g}, sample rate {a.q:.4g} and "
                       f"{a.steps} steps (a report below the accountant's eps at the "
                       f"training's own parameters, or Opacus' PRV, which reports below "
                       f"RDP; dpaudit opacus-check compares them)")

        def measured(r):
            return {"rows": r.rows, "steps": r.steps, "q": r.q, "sampling": r.sampling,
                    "noise_multiplier": r.declared_std / r.clip, "clip": r.clip,
                    "expected_batch_size": r.expected_batch_size}
        return {"eps": eps, "reported": (a.reported_eps, b.reported_eps),
                "rows": (a.rows, b.rows), "measured": (measured(a), measured(b)),
                "spec": out_spec, "profile": profile, "relation": RELATION}


def _positive(eps: float) -> float:
    if not 0 < eps < math.inf:
        raise ValueError(f"train: reported_eps={eps!r}: must be a finite number > 0 (the "
                         "claim under audit)")
    return eps


__all__ = ["OpacusLoop", "RELATION", "marker"]
