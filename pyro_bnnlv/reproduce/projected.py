"""Proj-BNN vs Bayes-by-Backprop vs FGE on UCI (Pradier et al. 2018, Fig. 3, 5, 6).

Pradier, Pan, Yao, Ghosh & Doshi-Velez (2018), arXiv:1811.07006. ``pyro-bnnlv reproduce proj-uci``
(or ``python -m pyro_bnnlv.reproduce.projected``). Per data set and split scheme (``random``: the
UCI standard train/test split number ``seed`` (default 0; :func:`~pyro_bnnlv.datasets.load_split`),
90% train of which 10% validation, 10% test, instead of the paper's random 80/10/10;
``extrapolation`` / ``interpolation``: App. B's splits by the L2 norm of the standardised inputs
of the pooled data), all data standardised with training statistics, a 1x50 ReLU
network, noise fixed at ``sigma_y = 0.1``, priors ``N(0, 0.1)`` (sec. 5.2):

* **BbB**: mean-field VI on the weights (``AutoNormal``), minibatches of 128, 20 particles and the
  KL term in closed form (App. A: Proj-BNN reduces to BbB with the identity projection; the same
  estimator as Proj-BNN's stage 3);
* **FGE**: the kept FGE candidates as an equally weighted ensemble (App. A's baseline), reported
  by the ``Proj-BNN`` task that computes them;
* **Proj-BNN**: :func:`~pyro_bnnlv.infer.fit_projected_bnn` (FGE, eq. 6's prediction-constrained
  autoencoder, mean-field VI over ``z`` and ``phi`` with eq. 5's KL terms in closed form, as the
  paper computes them), decoder one layer of 20 RBF units;
* **Proj-BNN (MMD)**: the same with the generative MMD decoder
  (:mod:`~pyro_bnnlv.infer.projection.decoder`, issue 17) and ``q(z)`` started at ``p(z)``.

Every fit is a task of :func:`pyro_bnnlv.sweep.run_sweep` (``--out`` store, ``--workers``,
resumable): per data set and scheme one BbB task and, per Proj-BNN method, one task per latent
size ``D_z`` (the task's ``grid``). The step size is cross-validated inside a task, on one set of
FGE candidates and one decoder (:func:`uci_task`); each task reports the validation and test
log-likelihood, and the table keeps, per data set, scheme and method, the fit with the best
validation log-likelihood (:func:`select_best`).

Budgets. The default (stated in the output) is small: R = 100 FGE candidates keeping 50, cycles
of 2 epochs, 3,000 SVI steps, one step size (0.005), ``D_z = 10``, decoder minibatches of 256.
``--paper`` is App. A's: R = 500 keeping the best 150 by validation RMSE, cycles of 10 epochs,
MAP step size 0.001; minibatches of 128 in every stage ("fix the batch-size to 128"); up to
50,000 SVI iterations with early stopping (the validation log-likelihood of the guide every 100
steps, stopping after 30 checks without improvement -- our reading of "early stopping once the
marginal log likelihood in validation set stop increasing after 30 iterations"; each check uses
the same 100 standard-normal draws, :class:`_CheckDraws` says why); step sizes cross-validated
over {0.1, 0.01, 0.001, 0.0005, 0.0001} (BbB: App. A's {0.1, 0.01, 0.005, 0.001, 0.0001}) and
``D_z`` over {2, 10, 50, 100}; 500 posterior draws for the reported metrics (the default: 200).
Each fit is evaluated at its best validation check; a fit that diverges after a check is
evaluated there too (early stopping would have stopped it there or before).

Our readings and deviations from App. A, all budgets:

* not cross-validated: the decoder's architecture (1x20 RBF; the paper also tries 2x10) and the
  decoder stage's step size (0.005) and length (3,000 steps, no early stopping; the paper
  applies both to "each optimization subtask");
* the decoder's objective: eq. 6 with prediction weight beta = 1 and input noise of sd 1 on the
  standardised candidates' scale, or the MMD decoder at beta = 0.01 (the value measured on the
  four-mode toy) -- :mod:`~pyro_bnnlv.infer.projection.fit` and
  :mod:`~pyro_bnnlv.infer.projection.decoder` give the maths;
* the priors ``N(0, 0.1)`` on ``w``, ``z`` and ``phi`` read as variance 0.1 (sd 0.32,
  :data:`~pyro_bnnlv.models.projected.PAPER_SCALE`);
* the MAP fit that starts FGE is a fixed 3,000 Adam steps; BbB's guide starts at a randomly
  initialised network's weights with scale 0.01 (the paper does not say);
* five of the paper's eight data sets, one split and one seed per scheme; the random scheme is
  the UCI standard split (90/10, of which 10% validation) instead of a random 80/10/10, and the
  interpolation scheme is our reading of App. B (:mod:`~pyro_bnnlv.datasets.splits`).

Reported: the average test log-likelihood (eq. 7) on the standardised scale, as the paper plots
it, and RMSE.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyro
import torch
from pyro.infer.autoguide import AutoNormal
from torch import Tensor

from ..datasets import Dataset, extrapolation_split, interpolation_split, load_dataset, load_split
from ..guides import init_to_network
from ..infer import fit_svi
from ..posterior import sample_posterior
from ..infer.elbos.closed_form_kl import ClosedFormKLElbo
from ..infer.projection.fge import fge
from ..infer.projection.fit import ProjectionFit, fit_projected_bnn, fit_projection
from ..infer.svi import set_seed
from ..models import BNN, ProjectedBNN
from ..models.projected import PAPER_SCALE
from ..nets import MLP
from ..stats.predictive import evaluate
from ..sweep import Task, run_sweep, task_function
from ..sweep.cli import add_sweep_arguments, report, sweep_options
from . import tables

__all__ = ["METHODS", "PAPER_BUDGET", "main", "select_best", "uci_experiment", "uci_task", "uci_tasks"]

DATASETS = ("boston", "concrete", "energy", "wine", "yacht")
SCHEMES = ("random", "extrapolation", "interpolation")
#: the task methods; the ``"FGE"`` rows come from the ``"Proj-BNN"`` tasks
METHODS = ("BbB", "Proj-BNN", "Proj-BNN (MMD)")
#: the decoder objective of each Proj-BNN method
_OBJECTIVE = {"Proj-BNN": "autoencoder", "Proj-BNN (MMD)": "mmd"}
#: App. A's budget (``--paper``)
PAPER_BUDGET = dict(
    num_candidates=500,
    keep=150,
    cycle_epochs=10,
    map_steps=3000,
    map_lr=0.001,
    ae_steps=3000,
    ae_batch=128,
    vi_steps=50_000,
    eval_every=100,
    patience=30,
    num_samples=500,
    lrs=(0.1, 0.01, 0.001, 0.0005, 0.0001),
    bbb_lrs=(0.1, 0.01, 0.005, 0.001, 0.0001),
    latent_dims=(2, 10, 50, 100),
)


def _split(name: str, scheme: str, seed: int):
    base = load_split(name, seed)
    if scheme == "random":
        return base
    fn = extrapolation_split if scheme == "extrapolation" else interpolation_split
    return fn(base, seed=seed, standardize=True)


#: guide draws per early-stopping check (:class:`_CheckDraws`)
CHECK_DRAWS = 100


class _CheckDraws:
    """``num`` draws per site from a mean-field ``AutoNormal`` for the early-stopping checks, with
    common random numbers: ``loc + scale * eps``, ``eps`` drawn once per fit from its own
    generator (seeded by ``seed``), so a check is a deterministic function of the guide's
    parameters and consumes none of the training's random numbers.

    Why: the validation log-likelihood of 20 fresh draws (this code before issue 17's paper run)
    had a standard deviation of 0.25 nats at fixed parameters on boston (BbB, 3,000 steps; 100
    draws: 0.11) and read 0.4-0.6 nats below a 5,000-draw value. A check that noisy picks the best
    step and the stopping step by chance, and these decide the reported fit (a helper's review
    measured 0.7 nats of test log-likelihood between two otherwise identical runs). With common
    random numbers successive checks differ only by what training changed."""

    def __init__(self, sites: Sequence[str], num: int, seed: int) -> None:
        self.sites, self.num = tuple(sites), int(num)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.eps: dict[str, Tensor] = {}

    def __call__(self, guide: AutoNormal) -> dict[str, Tensor]:
        out = {}
        for site in self.sites:
            loc, scale = getattr(guide.locs, site), getattr(guide.scales, site)
            if site not in self.eps:
                self.eps[site] = torch.randn(self.num, *loc.shape, generator=self.generator, dtype=loc.dtype)
            out[site] = loc + scale * self.eps[site]
        return out


def _diverged(err: Exception) -> bool:
    """Whether ``err`` is a fit diverging: ``fit_svi``'s ``NonFiniteLossError`` (a
    ``FloatingPointError``), or parameters gone NaN after an infinite gradient, which the next
    step's distributions refuse ("found invalid values")."""
    return isinstance(err, FloatingPointError) or (isinstance(err, ValueError) and "found invalid values" in str(err))


class _EarlyStopping:
    """Every ``every`` SVI steps the validation log-likelihood of draws of ``w`` (``draw(guide)``,
    :class:`_CheckDraws`); ``StopIteration`` after ``patience`` checks without improvement
    (``None``: never stops). ``steps`` counts the steps run, ``best_step`` the step of the best
    check, whose guide parameters :meth:`restore` puts back (early stopping returns the best
    state, not the last); ``guide`` is the guide of the last call (for a fit that diverged)."""

    def __init__(
        self,
        draw: Callable[[AutoNormal], Tensor],
        bnn: BNN,
        x_valid: Tensor,
        y_valid: Tensor,
        every: int,
        patience: int | None,
    ) -> None:
        self.draw, self.bnn, self.x_valid, self.y_valid = draw, bnn, x_valid, y_valid
        self.every, self.patience = every, patience
        self.best, self.bad, self.steps, self.best_step = -math.inf, 0, 0, 0
        self._snapshot: dict[str, Tensor] | None = None
        self.guide: AutoNormal | None = None

    @property
    def has_checkpoint(self) -> bool:
        """Whether a check has saved a state to :meth:`restore`."""
        return self._snapshot is not None

    def __call__(self, step: int, loss: float, guide: AutoNormal) -> None:
        self.steps, self.guide = step + 1, guide
        if self.patience is None or (step + 1) % self.every:
            return
        with torch.no_grad():
            w = self.draw(guide)
            ll = float(
                evaluate(self.bnn, {"w": w}, self.x_valid, self.y_valid, y_mean=0.0, y_std=1.0, intervals=False)[
                    "test_ll"
                ]
            )
        if ll > self.best:  # a NaN never improves
            self.best, self.bad, self.best_step = ll, 0, step + 1
            self._snapshot = {k: v.detach().clone() for k, v in guide.named_parameters()}
        else:
            self.bad += 1
            if self.bad >= self.patience:
                raise StopIteration

    def restore(self, guide: AutoNormal) -> None:
        """Put the best check's parameters back into ``guide`` (nothing if no check ran)."""
        if self._snapshot is None:
            return
        with torch.no_grad():
            for name, value in guide.named_parameters():
                value.copy_(self._snapshot[name])


@task_function("projected/uci")
def uci_task(
    task: Task,
    *,
    hidden: int,
    latent_dim: int,
    num_candidates: int,
    keep: int,
    cycle_epochs: float,
    map_steps: int,
    ae_steps: int,
    vi_steps: int,
    lr: float,
    num_samples: int,
    map_lr: float = 0.001,
    ae_batch: int | None = 256,
    lrs: Sequence[float] = (),
    bbb_lrs: Sequence[float] = (),
    eval_every: int = 100,
    check_draws: int = CHECK_DRAWS,
    patience: int | None = None,
) -> dict[str, float]:
    """One task of :func:`uci_experiment`: ``task.method`` (one of :data:`METHODS`) on
    ``task.dataset`` with split scheme ``task.split``, seeded by ``task.seed``; ``task.grid`` may
    set ``latent_dim`` (else the keyword default).

    The step size is cross-validated inside the task: stage 3 (or BbB) is fitted once per value in
    ``lrs`` (BbB: ``bbb_lrs``; empty: ``lr`` alone) on the same FGE candidates and decoder, and the
    fit with the best validation log-likelihood is reported. With early stopping (``patience``)
    each fit is evaluated at its best validation check (``check_draws`` guide draws with common
    random numbers, :class:`_CheckDraws`), not its last step. A fit that diverges (a non-finite
    loss, or parameters gone NaN) after a check saved a state is evaluated at that state, as early
    stopping would have done, and ``diverged_at@lr=<v>`` records the step; one that diverges before
    any check, or whose validation log-likelihood is not finite, loses the comparison instead of
    failing the task: its ``valid_ll@lr=<v>`` is ``-inf`` and ``error@lr=<v>`` says why. Returns
    the chosen fit's ``lr``, ``valid_ll``, ``test_ll``, ``rmse``, ``steps`` (SVI steps run, fewer
    than ``vi_steps`` after early stopping), ``best_step``, and ``seconds`` (the whole task),
    ``valid_ll@lr=<v>`` per step size; the Proj-BNN tasks also return the FGE ensemble they start
    from as ``fge_valid_ll``, ``fge_test_ll``, ``fge_rmse``, ``fge_seconds``. ``ae_batch`` is the
    decoder stage's minibatch size. Every step size diverging fails the task
    (``FloatingPointError``)."""
    if task.split not in SCHEMES:
        raise ValueError(f"unknown scheme {task.split!r}; choose from {SCHEMES}")
    if task.method not in METHODS:
        raise ValueError(f"unknown method {task.method!r}; the tasks are {METHODS} (the Proj-BNN task gives FGE too)")
    latent_dim = int(task.params.get("latent_dim", latent_dim))
    step_sizes = [float(v) for v in (bbb_lrs if task.method == "BbB" else lrs)] or [float(lr)]
    seed = task.seed
    set_seed(seed)
    data = _split(task.dataset, str(task.split), seed)
    x = data.x_train
    net = MLP(data.input_dim, [hidden], 1, activation="relu")
    bnn = BNN(net, prior_scale=PAPER_SCALE, noise_scale=0.1)
    batch = min(128, len(x))

    t0 = time.perf_counter()
    out: dict[str, float] = {}
    model = projection = None
    if task.method != "BbB":
        model = ProjectedBNN(net, latent_dim=latent_dim, decoder_hidden=[20])
        projection = _fge_and_decoder(
            model,
            bnn,
            data,
            out,
            objective=_OBJECTIVE[task.method],
            num_candidates=num_candidates,
            keep=keep,
            map_steps=map_steps,
            map_lr=map_lr,
            cycle_epochs=cycle_epochs,
            ae_steps=ae_steps,
            ae_batch=ae_batch,
            seed=seed,
        )
    fit_at = functools.partial(
        _fit_at_step_size,
        task.method,
        bnn,
        model,
        projection,
        data,
        out,
        seed=seed,
        vi_steps=vi_steps,
        batch=batch,
        check_draws=check_draws,
        eval_every=eval_every,
        patience=patience,
        num_samples=num_samples,
    )
    best = _best_step_size(step_sizes, fit_at, out)  # writes each step size's outcome into out
    return {**out, **best, "seconds": time.perf_counter() - t0}


def _fge_and_decoder(
    model: ProjectedBNN,
    bnn: BNN,
    data: Dataset,
    out: dict[str, float],
    *,
    objective: str,
    num_candidates: int,
    keep: int,
    map_steps: int,
    map_lr: float,
    cycle_epochs: float,
    ae_steps: int,
    ae_batch: int | None,
    seed: int,
) -> ProjectionFit:
    """The Proj-BNN tasks' stages 1 and 2 (shared by every step size): FGE candidates, whose
    ensemble metrics go into ``out`` (``fge_*``), and the decoder fitted to them."""
    x, y = data.x_train, data.y_train
    t1 = time.perf_counter()
    res = fge(
        bnn,
        x,
        y,
        x_valid=data.x_valid,
        y_valid=data.y_valid,
        num_candidates=num_candidates,
        keep=keep,
        map_steps=map_steps,
        map_lr=map_lr,
        cycle_epochs=cycle_epochs,
        seed=seed,
        progress=False,
    )
    out.update(_metrics(bnn, res.kept, data, prefix="fge_"), fge_seconds=time.perf_counter() - t1)
    return fit_projection(
        model,
        res.kept,
        x,
        y,
        objective=objective,
        num_steps=ae_steps,
        lr=0.005,
        batch_size=ae_batch,
        seed=seed,
        progress=False,
    )


def _fit_bbb(
    bnn: BNN, x: Tensor, y: Tensor, stop: _EarlyStopping, *, step_size: float, vi_steps: int, batch: int, seed: int
) -> tuple[BNN, AutoNormal]:
    """BbB: mean-field VI on the weights from the network's initial weights, with early stopping."""
    with pyro.get_param_store().scope():
        guide = AutoNormal(bnn, init_scale=0.01, init_loc_fn=init_to_network(bnn, seed=seed))
        # BbB is Proj-BNN with the identity projection (App. A): the same 20 particles
        # and closed-form KL as stage 3
        loss = ClosedFormKLElbo(("w",), num_particles=20, max_plate_nesting=1)
        fit_svi(
            bnn,
            guide,
            x,
            y,
            num_steps=vi_steps,
            lr=step_size,
            batch_size=batch,
            seed=seed,
            progress=False,
            loss=loss,
            callback=lambda step, value: stop(step, value, guide),
        )
    return bnn, guide


def _fit_at_step_size(
    method: str,
    bnn: BNN,
    model: ProjectedBNN | None,
    projection: ProjectionFit | None,
    data: Dataset,
    out: dict[str, float],
    step_size: float,
    *,
    seed: int,
    vi_steps: int,
    batch: int,
    check_draws: int,
    eval_every: int,
    patience: int | None,
    num_samples: int,
) -> dict[str, float]:
    """:func:`uci_task`'s fit at one step size (BbB, or stage 3 on the task's decoder) with early
    stopping, evaluated at its best check; a fit that diverges after a check is evaluated at the
    checked state and ``out`` records the step (``diverged_at@lr=<v>``)."""
    x, y = data.x_train, data.y_train
    draws = _CheckDraws(("w",) if method == "BbB" else ("z", "phi"), check_draws, seed)
    check = (lambda g: draws(g)["w"]) if method == "BbB" else (lambda g: model.project(**draws(g)))
    stop = _EarlyStopping(check, bnn, data.x_valid, data.y_valid, eval_every, patience)
    try:
        if method == "BbB":
            fitted, guide = _fit_bbb(bnn, x, y, stop, step_size=step_size, vi_steps=vi_steps, batch=batch, seed=seed)
        else:
            fit = fit_projected_bnn(
                model,
                x,
                y,
                projection=projection,
                num_steps=vi_steps,
                lr=step_size,
                batch_size=batch,
                callback=stop,
                seed=seed,
                progress=False,
            )
            fitted, guide = fit.model, fit.guide
    except (FloatingPointError, ValueError) as err:
        if not (_diverged(err) and stop.has_checkpoint):
            raise
        # early stopping would have kept the best checked state: evaluate that one
        fitted, guide = (bnn if method == "BbB" else model), stop.guide
        out[f"diverged_at@lr={step_size:g}"] = stop.steps
    stop.restore(guide)
    w = sample_posterior(fitted, guide, x, num_samples=num_samples, seed=seed)["w"]
    return {"lr": step_size, **_metrics(bnn, w, data), "steps": stop.steps, "best_step": stop.best_step}


def _metrics(bnn: BNN, w: Tensor, data: Dataset, prefix: str = "") -> dict[str, float]:
    """Validation and test log-likelihood and test RMSE of the draws ``w`` (standardised scale)."""
    m = evaluate(bnn, {"w": w}, data.x_test, data.y_test, y_mean=0.0, y_std=1.0)
    v = evaluate(bnn, {"w": w}, data.x_valid, data.y_valid, y_mean=0.0, y_std=1.0)
    return {
        f"{prefix}valid_ll": float(v["test_ll"]),
        f"{prefix}test_ll": float(m["test_ll"]),
        f"{prefix}rmse": float(m["rmse"]),
    }


def _best_step_size(step_sizes: list[float], fit_at: Callable[[float], dict], out: dict) -> dict[str, float]:
    """:func:`uci_task`'s cross-validation: ``fit_at`` per step size, the fit with the best finite
    validation log-likelihood; a diverging or non-finite fit loses (``out`` records why)."""
    best: dict[str, float] | None = None
    for step_size in step_sizes:
        key = f"{step_size:g}"
        try:
            result = fit_at(step_size)
        except (FloatingPointError, ValueError) as err:
            if not _diverged(err):
                raise
            out[f"valid_ll@lr={key}"], out[f"error@lr={key}"] = -math.inf, f"{type(err).__name__}: {err}"[:300]
            continue
        if not math.isfinite(result["valid_ll"]):
            out[f"error@lr={key}"] = f"non-finite validation log-likelihood {result['valid_ll']}"
            result["valid_ll"] = -math.inf
        out[f"valid_ll@lr={key}"] = result["valid_ll"]
        if math.isfinite(result["valid_ll"]) and (best is None or result["valid_ll"] > best["valid_ll"]):
            best = result
    if best is None:
        raise FloatingPointError(f"every step size {step_sizes} diverged: {out}")
    return best


def uci_tasks(
    datasets: Sequence[str] = DATASETS,
    schemes: Sequence[str] = SCHEMES,
    *,
    methods: Sequence[str] = METHODS,
    latent_dims: Sequence[int] = (),
    seed: int = 0,
) -> list[Task]:
    """The tasks: per data set, scheme and method one task, and for the Proj-BNN methods one per
    ``D_z`` in ``latent_dims`` (grid ``{"latent_dim": D_z}``; empty: the default ``D_z``)."""
    for scheme in schemes:
        if scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}; choose from {SCHEMES}")
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"unknown method {m!r}; choose from {METHODS}")
    proj_grid = [{"latent_dim": int(k)} for k in latent_dims] or [{}]
    return [
        Task(name, method=m, split=scheme, grid=g, seed=seed)
        for name in datasets
        for scheme in schemes
        for m in methods
        for g in ([{}] if m == "BbB" else proj_grid)
    ]


def select_best(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per (data set, scheme, method) the finished task with the best validation log-likelihood;
    the FGE ensemble that the Proj-BNN tasks start from becomes an ``"FGE"`` row (FGE has no grid:
    every Proj-BNN task of a cell computes the same candidates; the row comes from the first
    finished task that reports it, so a cell whose eq. 6 tasks all failed still has one). A cell
    without a finished task keeps a row with the status of its first task; a cell whose grid is
    only partly finished (a sweep stopped with ``stop_after``) has status ``"partial"``: its pick
    may change when the rest arrives."""
    rows = []
    grid_cols = [c for c in ("latent_dim",) if c in sweep.columns]
    fge_done: set[tuple] = set()
    for (dataset, scheme, method), g in sweep.groupby(["dataset", "split", "method"], sort=False):
        done = g[g["status"] == "done"]
        key = {"dataset": dataset, "scheme": scheme}
        if method != "BbB" and (dataset, scheme) not in fge_done and "fge_valid_ll" in sweep.columns:
            cell = sweep[(sweep["dataset"] == dataset) & (sweep["split"] == scheme) & (sweep["status"] == "done")]
            with_fge = cell[cell["fge_valid_ll"].notna()]
            if not with_fge.empty:
                f = with_fge.iloc[0]
                rows.append(
                    {
                        **key,
                        "method": "FGE",
                        "valid_ll": f["fge_valid_ll"],
                        "test_ll": f["fge_test_ll"],
                        "rmse": f["fge_rmse"],
                        "seconds": f["fge_seconds"],
                        "status": "done",
                    }
                )
                fge_done.add((dataset, scheme))
        if done.empty:
            rows.append({**key, "method": method, "status": g["status"].iloc[0]})
            continue
        finite = done[np.isfinite(done["valid_ll"].astype(float))]
        if finite.empty:  # uci_task fails rather than return this; a store from older code might
            rows.append({**key, "method": method, "status": "failed"})
            continue
        r = finite.loc[finite["valid_ll"].idxmax()]
        status = "done" if len(done) == len(g) or (g["status"] != "pending").all() else "partial"
        rows.append(
            {
                **key,
                "method": method,
                "lr": r["lr"],
                **{c: r[c] for c in grid_cols},
                "valid_ll": r["valid_ll"],
                "test_ll": r["test_ll"],
                "rmse": r["rmse"],
                "seconds": r["seconds"],
                "steps": r["steps"],
                "grid_points": len(done),
                "status": status,
            }
        )
    cols = [
        "dataset",
        "scheme",
        "method",
        "lr",
        "latent_dim",
        "valid_ll",
        "test_ll",
        "rmse",
        "seconds",
        "steps",
        "grid_points",
        "status",
    ]
    return pd.DataFrame(rows).reindex(columns=cols)


def uci_experiment(
    datasets: Sequence[str] = DATASETS,
    schemes: Sequence[str] = SCHEMES,
    *,
    methods: Sequence[str] = METHODS,
    seed: int = 0,
    paper: bool = False,
    hidden: int = 50,
    latent_dim: int = 10,
    num_candidates: int = 100,
    keep: int = 50,
    cycle_epochs: float = 2,
    map_steps: int = 3000,
    map_lr: float = 0.001,
    ae_steps: int = 2000,
    ae_batch: int | None = 256,
    vi_steps: int = 3000,
    lr: float = 0.005,
    lrs: Sequence[float] = (),
    bbb_lrs: Sequence[float] = (),
    latent_dims: Sequence[int] = (),
    eval_every: int = 100,
    patience: int | None = None,
    num_samples: int = 200,
    overrides: dict | None = None,
    progress: bool = True,
    out_dir: str | Path | None = None,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    code_version: str | None = None,
    stop_after: float | None = None,
) -> pd.DataFrame:
    """One row per (data set, scheme, method) with the selected grid point (:func:`select_best`):
    ``lr``, ``latent_dim``, ``valid_ll``, ``test_ll``, ``rmse``, ``seconds``, ``steps``, ``status``.

    ``paper=True`` replaces every setting :data:`PAPER_BUDGET` names by App. A's value, and
    ``overrides`` (those names) replace them again (e.g. a smoke run of the paper's grids). ``lrs`` x
    ``latent_dims`` (Proj-BNN) and ``bbb_lrs`` (BbB) are the cross-validation grids (empty: ``lr``
    and ``latent_dim``): a task per ``D_z``, the step sizes inside it (:func:`uci_task`);
    ``patience`` turns on early stopping. The fits are tasks of :func:`pyro_bnnlv.sweep.run_sweep`
    (``out_dir``, ``executor``, ``workers``, ``address``, ``code_version``, ``stop_after`` go to
    it); the table of
    every task is ``table.attrs["sweep"]``.
    """
    settings = dict(
        num_candidates=num_candidates,
        keep=keep,
        cycle_epochs=cycle_epochs,
        map_steps=map_steps,
        map_lr=map_lr,
        ae_steps=ae_steps,
        ae_batch=ae_batch,
        vi_steps=vi_steps,
        eval_every=eval_every,
        patience=patience,
        lrs=lrs,
        bbb_lrs=bbb_lrs,
        latent_dims=latent_dims,
        num_samples=num_samples,
    )
    if paper:
        settings.update(PAPER_BUDGET)
    unknown = set(overrides or {}) - set(settings)
    if unknown:
        raise ValueError(f"overrides {sorted(unknown)} are not settings; choose from {sorted(settings)}")
    settings.update(overrides or {})
    lrs, bbb_lrs, latent_dims = (tuple(settings.pop(k)) for k in ("lrs", "bbb_lrs", "latent_dims"))
    fn = functools.partial(uci_task, hidden=hidden, latent_dim=latent_dim, lr=lr, lrs=lrs, bbb_lrs=bbb_lrs, **settings)
    tasks = uci_tasks(datasets, schemes, methods=methods, latent_dims=latent_dims, seed=seed)
    sweep = run_sweep(
        tasks,
        fn,
        out_dir=out_dir,
        executor=executor,
        workers=workers,
        address=address,
        code_version=code_version,
        progress=progress,
        desc="proj-uci",
        stop_after=stop_after,
    )
    table = select_best(sweep)
    table.attrs = dict(sweep.attrs)
    table.attrs["sweep"] = sweep
    return table


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pyro-bnnlv reproduce proj-uci", description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="*", default=list(DATASETS))
    p.add_argument("--schemes", nargs="*", default=list(SCHEMES))
    p.add_argument("--methods", nargs="*", default=list(METHODS), help=f"of {METHODS}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--paper",
        action="store_true",
        help="App. A's budget: R = 500 keeping 150, up to 50,000 steps with early stopping, step "
        "sizes (5 fits inside each task) and D_z cross-validated: per data set and scheme one "
        "BbB task and 4 tasks (one per D_z) per Proj-BNN method; about 3 hours on 2 cores",
    )
    p.add_argument("--small", action="store_true", help="a smoke-test size (meaningless numbers)")
    p.add_argument("--steps", type=int, help="override the (maximum) SVI steps, e.g. a smoke run of --paper's grid")
    p.add_argument("--decoder-steps", type=int, help="override the decoder stage's steps")
    p.add_argument("--candidates", type=int, nargs=2, metavar=("R", "KEEP"), help="override FGE's R and kept count")
    p.add_argument("--output", help="CSV path")
    p.add_argument("--quiet", action="store_true")
    add_sweep_arguments(p)
    args = p.parse_args(argv)
    if args.small and args.paper:
        p.error("--small and --paper exclude each other")
    torch.set_num_threads(1)
    kw = {}
    if args.small:
        kw = dict(
            hidden=10,
            latent_dim=2,
            num_candidates=6,
            keep=4,
            cycle_epochs=1,
            map_steps=50,
            ae_steps=30,
            vi_steps=30,
            num_samples=20,
        )
    overrides = {}
    if args.steps is not None:
        overrides["vi_steps"] = args.steps
    if args.decoder_steps is not None:
        overrides["ae_steps"] = args.decoder_steps
    if args.candidates is not None:
        overrides.update(num_candidates=args.candidates[0], keep=args.candidates[1])
    table = uci_experiment(
        args.datasets,
        args.schemes,
        methods=args.methods,
        seed=args.seed,
        paper=args.paper,
        overrides=overrides,
        progress=not args.quiet,
        **kw,
        **sweep_options(args),
    )
    print(
        table.pivot_table(index=["dataset", "scheme"], columns="method", values="test_ll").to_string(
            float_format="%.3f"
        )
    )
    if args.output:
        table.to_csv(args.output, index=False)
    return report(table)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


def proj_bench(steps: int = 300, rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """``pyro-bnnlv bench proj``: ms per SVI step of proj-uci's fits on boston (1x50 ReLU, 20
    particles, minibatches of 128): the projected BNN's stage 3 (``D_z = 10``, 1x20 RBF decoder)
    with eq. 5's KL terms in closed form, fused (:class:`~pyro_bnnlv.infer.elbos.closed_form_kl.ClosedFormKLElbo`,
    the default) and traced (``fused=False``), and by Monte Carlo (``Trace_ELBO``); BbB
    (``AutoNormal`` on ``w``, closed-form KL) fused and traced. Arms alternated in rounds, medians
    of the per-step times after 20 warm-up steps; ``ratio`` is to the fit's fused arm."""
    data = load_dataset("boston", seed=seed)
    x, y = data.x_train, data.y_train
    net = MLP(data.input_dim, [50], 1, activation="relu")
    bnn = BNN(net, prior_scale=PAPER_SCALE, noise_scale=0.1)
    model = ProjectedBNN(net, latent_dim=10, decoder_hidden=[20])
    cands = fge(bnn, x, y, num_candidates=40, keep=20, map_steps=300, cycle_epochs=2, seed=seed, progress=False)
    projection = fit_projection(model, cands.kept, x, y, num_steps=200, seed=seed, progress=False)

    def stage3(kl: str, fused: bool, r: int, stamp) -> None:
        fit_projected_bnn(
            model,
            x,
            y,
            projection=projection,
            num_steps=steps + 21,
            batch_size=128,
            kl=kl,
            fused=fused,
            seed=seed + r,
            progress=False,
            callback=lambda step, value, guide: stamp(),
        )

    def bbb(fused: bool, r: int, stamp) -> None:
        with pyro.get_param_store().scope():
            guide = AutoNormal(bnn, init_scale=0.01)
            fit_svi(
                bnn,
                guide,
                x,
                y,
                num_steps=steps + 21,
                lr=0.001,
                batch_size=128,
                seed=seed + r,
                progress=False,
                loss=ClosedFormKLElbo(("w",), num_particles=20, max_plate_nesting=1, fused=fused),
                callback=lambda step, value: stamp(),
            )

    arms = {
        ("Proj-BNN stage 3", "closed-form, fused"): lambda r, st: stage3("closed-form", True, r, st),
        ("Proj-BNN stage 3", "closed-form, traced"): lambda r, st: stage3("closed-form", False, r, st),
        ("Proj-BNN stage 3", "monte-carlo"): lambda r, st: stage3("monte-carlo", True, r, st),
        ("BbB", "closed-form, fused"): lambda r, st: bbb(True, r, st),
        ("BbB", "closed-form, traced"): lambda r, st: bbb(False, r, st),
    }
    times: dict[tuple[str, str], list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        for key, run in arms.items():
            stamps: list[float] = []
            run(r, lambda: stamps.append(time.perf_counter()))
            times[key].append(1e3 * statistics.median(b - a for a, b in zip(stamps[20:], stamps[21:])))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [(fit, kl, v, v / med[fit, "closed-form, fused"]) for (fit, kl), v in med.items()]
    table = pd.DataFrame(rows, columns=["fit", "kl", "ms_per_step", "ratio"]).set_index(["fit", "kl"])
    table.attrs["stage 3: traced / fused step"] = (
        med["Proj-BNN stage 3", "closed-form, traced"] / med["Proj-BNN stage 3", "closed-form, fused"]
    )
    table.attrs["stage 3: Monte-Carlo / closed-form (traced) step"] = (
        med["Proj-BNN stage 3", "monte-carlo"] / med["Proj-BNN stage 3", "closed-form, traced"]
    )
    table.attrs["BbB: traced / fused step"] = med["BbB", "closed-form, traced"] / med["BbB", "closed-form, fused"]
    return table


# --------------------------------------------------------------------------- results tables


def uci_table(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv reproduce proj-uci --output CSV``: per data set, split scheme and method the
    test LL (``values=test_ll``, the default; bold: the best per row), the test RMSE
    (``values=rmse``; bold: the smallest) or what validation selected (``values=selected``: the
    step size and latent size ``D_z`` as ``lr / D_z``), all on the standardised scale. A CSV of a
    sweep under way (``--stop-after``): a cell picked from a partly finished grid is marked ``*``
    (status ``partial``), a cell without a finished fit is empty."""
    values_of = options.get("values", "test_ll")
    if values_of not in ("test_ll", "rmse", "selected"):
        raise ValueError(f"values={values_of!r}; choose values=test_ll, values=rmse or values=selected")
    t = pd.concat(frames, ignore_index=True)
    methods = list(t["method"].drop_duplicates())
    partial = set()
    if "status" in t:
        t = t[t["status"].isin(["done", "partial"])]
        partial = {tuple(k) for k in t.loc[t["status"] == "partial", ["dataset", "scheme", "method"]].to_numpy()}
    selected = values_of == "selected"
    if selected:
        for column in ("lr", "latent_dim"):
            if column not in t:
                raise KeyError(f"values=selected needs column {column!r}, which {', '.join(paths)} lacks")
        t = t.assign(
            selected=[" / ".join(f"{v:g}" for v in pair if not pd.isna(v)) for pair in zip(t["lr"], t["latent_dim"])]
        )
    wide = t.pivot_table(
        index=["dataset", "scheme"], columns="method", values=values_of, aggfunc="first" if selected else "mean"
    )
    out = []
    for (dataset, scheme), row in wide.sort_index().iterrows():
        values = [row.get(m, float("nan")) for m in methods]
        texts = [v if isinstance(v, str) else "" for v in values] if selected else [tables.num(v) for v in values]
        best = None if selected else tables.best(values, largest=values_of == "test_ll")
        cells = [
            tables.bold(text, i == best) + ("*" if (dataset, scheme, m) in partial else "")
            for i, (m, text) in enumerate(zip(methods, texts))
        ]
        out.append([dataset, scheme] + cells)
    return tables.table(["data set", "split"] + methods, out)


def uci_wins_summary(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """In how many ``proj-uci`` cells (data set x split scheme) a Proj-BNN beats both baselines
    (BbB and FGE) in test LL: the variant chosen per cell by validation LL (eq. 6's decoder or
    the MMD decoder, Pradier et al. 2018, arXiv:1811.07006, eq. 6 and sec. 4), and each variant
    alone. Taking the better of the two by its *test* LL would pick after seeing the test, so it
    is not counted."""
    t = pd.concat(frames, ignore_index=True)
    if "status" in t:
        t = t[t["status"] == "done"]
    missing = [c for c in ("dataset", "scheme", "method", "valid_ll", "test_ll") if c not in t]
    if missing:
        raise KeyError(
            f"{', '.join(paths)} lacks column(s) {missing}; write it with `pyro-bnnlv reproduce proj-uci --output`"
        )
    eq6, mmd, baselines = "Proj-BNN", "Proj-BNN (MMD)", ["BbB", "FGE"]
    wins: dict[str, list[str]] = {"chosen": [], eq6: [], mmd: []}
    cells, chose_mmd = [], 0
    for (dataset, scheme), block in t.groupby(["dataset", "scheme"], sort=True):
        g = block.set_index("method")
        if not {eq6, mmd, *baselines} <= set(g.index):
            continue
        cell = f"{dataset} {scheme}"
        cells.append(cell)
        chosen = mmd if g.loc[mmd, "valid_ll"] > g.loc[eq6, "valid_ll"] else eq6
        chose_mmd += chosen == mmd
        base = g.loc[baselines, "test_ll"].max()
        for key, method in (("chosen", chosen), (eq6, eq6), (mmd, mmd)):
            if g.loc[method, "test_ll"] > base:
                wins[key].append(cell)
    n = len(cells)
    if not n:
        raise ValueError(f"{', '.join(paths)} has no cell with finished BbB, FGE, {eq6} and {mmd} fits")

    def count(key: str) -> str:
        lost = [c for c in cells if c not in wins[key]]
        return f"{len(wins[key])} of {n}" + (f" (not on {tables.listing(lost)})" if lost else "")

    return (
        f"Against BbB and FGE in test LL, the Proj-BNN variant chosen per cell by validation LL (the MMD "
        f"decoder in {chose_mmd} of {n} cells, eq. 6 in {n - chose_mmd}) is best in {count('chosen')}; eq. 6's "
        f"decoder alone in {count(eq6)}; the MMD decoder alone in {count(mmd)}."
    )
