r"""NUTS as the gold-standard posterior: :func:`run_nuts`, with a fast path that skips Pyro's tracing.

The papers use HMC/NUTS as the reference posterior (Yacoby, Pan & Doshi-Velez (2022),
arXiv:1911.00569, sec. 7.3 and App. E; Pequignot et al. (2020), "Implicit variational inference: the
parameter and the predictor space", sec. 4 and App. C, E; Foong, Li, Hernández-Lobato & Turner
(2019), arXiv:1906.11537, sec. 3). :func:`run_nuts` runs Pyro's own ``MCMC`` and returns it, so
``mcmc.get_samples()``, ``mcmc.summary()`` and :func:`pyro_bnnlv.diagnostics.to_inference_data` work
as usual.

Two ways to evaluate the potential ``U(q) = -log p(y, latents | x)``
-------------------------------------------------------------------
* **traced** (any Pyro model): ``NUTS(model, jit_compile=True)``. Pyro re-runs the model under
  its effect handlers inside every leapfrog step.
* **fast** (models with a :class:`FlatPotential`): ``U`` and ``dU/dq`` are computed directly on
  one flat vector ``q`` of all latent sites (``"w"``, plus ``"z"`` for BNN+LV), with no Pyro
  tracing. For a :class:`~pyro_bnnlv.models.bnn.BNN` with an :class:`~pyro_bnnlv.nets.MLP` the
  gradient is a hand-written backward pass (:func:`mlp_regression_potential`, evaluated by its
  compiled C++ twin when :mod:`pyro_bnnlv.infer.compiled` builds); any other
  potential can be given as a plain differentiable log density
  (:meth:`FlatPotential.from_log_density`). The fast potential equals Pyro's traced potential
  (all normalising constants included) at every point, value and gradient (tested, and checked
  at the initial point of every run with ``check_potential=True``).

The modules
-----------
* :mod:`pyro_bnnlv.models.potential`: :class:`FlatPotential` and :func:`mlp_regression_potential`
  (the potential, value and gradient on one flat vector).
* :mod:`pyro_bnnlv.infer.nuts_kernel`: the kernels, :class:`FlatNUTS` (Pyro's multinomial NUTS on
  one flat tensor, its tree built in C++ or by a Python twin, the tree a ``TreeState``) and Pyro's
  stock ``NUTS`` with step counting (``kernel="pyro"``).
* :mod:`pyro_bnnlv.infer.nuts_chains`: several chains in one process (parallel threads for a
  compiled potential, one after another otherwise).
* :mod:`pyro_bnnlv.infer.nuts_init`: :func:`flat_potential` (which potential), the initial values
  (MAP, prior, given) and the check of the fast potential against the traced model, with the
  contract a model follows to get the fast path (``model.nuts_potential(x, y)``).
* this module: :func:`run_nuts`, which puts them together, and :func:`chain_records`. Every name
  above is importable from here.

``pyro-bnnlv bench nuts`` reports the time per leapfrog step against Pyro's traced
``MCMC(NUTS(model, jit_compile=True))`` and against NumPyro; see docs/results/bench-nuts.csv.

Chain ``c`` of seed ``s`` is the one-chain run of seed ``s + c``, draw for draw (tested), and the
returned ``MCMC`` holds all chains (``get_samples(group_by_chain=True)``, ArviZ export).
"""

from __future__ import annotations

import math
import numbers
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from pyro.infer import MCMC
from torch import Tensor

from .._checks import ArgumentTypeError, check_real, check_seed
from .._compiled import resolve_nuts_extension as resolve_extension
from .._platform import usable_cores  # looked up here by run_nuts (tests patch nuts.usable_cores)
from .._state import set_seed
from ..models.potential import FlatPotential, mlp_regression_potential
from .jit_guard import plate_shape_tracer_warnings_ignored
from .nuts_chains import _chain_potentials, _InProcessMCMC, _sampling_seed
from .nuts_init import _check_flat_potential, _initial_values, _model_sites, _resolve_potential, flat_potential
from .nuts_kernel import FlatNUTS, TreeState, _CountingNUTS
from .nuts_processes import chain_start_method, run_watched
from .svi import _check_positive_int

__all__ = [
    "FlatPotential",
    "FlatNUTS",
    "TreeState",
    "mlp_regression_potential",
    "flat_potential",
    "run_nuts",
    "chain_records",
]

# run_nuts warns when at least this share of the kept draws exhausted max_tree_depth
_SATURATION_WARNING = 0.1


def _stuck_chains(mcmc: MCMC) -> list[int]:
    """Chains whose draws are all one point (no proposal accepted after the warm-up)."""
    samples = mcmc.get_samples(group_by_chain=True)
    if not samples:
        return []
    num_chains = next(iter(samples.values())).shape[0]
    return [c for c in range(num_chains)
            if all(bool((v[c] == v[c, :1]).all()) for v in samples.values())]  # fmt: skip


def chain_records(mcmc: MCMC) -> list[dict]:
    """Per-chain kernel diagnostics of a run MCMC (Pyro's ``divergences`` and ``acceptance
    rate``, plus the per-draw records of this module's kernels), without the R-hat/ESS that
    ``mcmc.diagnostics()`` computes (which needs at least 4 draws)."""
    recs = getattr(mcmc, "_diagnostics", None)
    if not recs or any(r is None for r in recs):
        raise ValueError("the MCMC object has not been run")
    return [dict(r) for r in recs]


def _check_arguments(model: Any, x: Any, y: Any, num_samples: int, warmup_steps: int,
                     num_chains: int, max_tree_depth: int, map_steps: int, seed: Any, kernel: str,
                     target_accept_prob: float, full_mass: bool, step_size: float, map_lr: float,
                     chain_method: str) -> int | None:  # fmt: skip
    """:func:`run_nuts`'s argument checks; returns the checked seed."""
    _check_positive_int(num_samples, "num_samples")
    _check_positive_int(warmup_steps, "warmup_steps", minimum=0)
    _check_positive_int(num_chains, "num_chains")
    _check_positive_int(max_tree_depth, "max_tree_depth")
    _check_positive_int(map_steps, "map_steps")
    seed = check_seed(seed)
    if seed is not None and seed + num_chains + 7 >= 2**32:  # chain c is seeded seed + c (+ 1, + 7)
        raise ValueError(f"seed must be below 2**32 - {num_chains + 7} with num_chains={num_chains} "
                         f"(chain c uses seeds from seed + c), got {seed}")  # fmt: skip
    if kernel not in ("flat", "pyro"):
        raise ValueError(f"kernel must be 'flat' or 'pyro', got {kernel!r}")
    try:
        in_range = 0.0 < check_real(target_accept_prob, "target_accept_prob") < 1.0
    except ArgumentTypeError:
        raise ArgumentTypeError(f"target_accept_prob must lie in (0, 1), got {target_accept_prob!r}") from None
    except ValueError:  # NaN or infinite
        in_range = False
    if not in_range:
        raise ValueError(f"target_accept_prob must lie in (0, 1), got {target_accept_prob}")
    if not isinstance(full_mass, bool):
        raise ValueError("full_mass must be True or False (block lists: use pyro's NUTS directly)")
    for name, value, consequence in (
        ("step_size", step_size, "with step_size <= 0 every draw repeats the initial point"),
        ("map_lr", map_lr, "map_lr <= 0 leaves the MAP initialisation untrained"),
    ):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < value < math.inf:
            raise ValueError(f"{name} must be a positive finite number, got {value!r} ({consequence})")
    if not isinstance(y, Tensor):
        raise TypeError(f"y must be a tensor of targets (NUTS samples the posterior given data), "
                        f"got {type(y).__name__}")  # fmt: skip
    if hasattr(model, "check_data"):
        model.check_data(x, y)
    elif not isinstance(x, Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if chain_method not in ("auto", "threads", "sequential"):
        raise ValueError(f"chain_method must be 'auto', 'threads' or 'sequential', got {chain_method!r}")
    return seed


def run_nuts(
    model: Any,
    x: Tensor,
    y: Tensor,
    *,
    num_samples: int,
    warmup_steps: int,
    num_chains: int = 1,
    init: str | Mapping[str, Tensor] = "map",
    jit_compile: bool = True,
    seed: int | None = None,
    progress: bool = True,
    potential: str | FlatPotential = "auto",
    kernel: str = "flat",
    target_accept_prob: float = 0.8,
    max_tree_depth: int = 10,
    full_mass: bool = False,
    step_size: float = 1.0,
    map_steps: int = 2000,
    map_lr: float = 0.01,
    check_potential: bool = True,
    chain_method: str = "auto",
    mp_context: str | None = None,
) -> MCMC:
    """Run NUTS on ``model(x, y)`` and return Pyro's ``MCMC`` object (already run).

    Args:
        model: a Pyro model called as ``model(x, y)``: a library model (BNN, BNN+LV, ...) or any
            Pyro callable.
        x, y: the data (full batch; NUTS does not subsample).
        num_samples, warmup_steps: draws kept per chain and warm-up (adaptation) iterations.
        num_chains: number of chains. On the fast path with the flat kernel (the default for
            library models) all chains run in this process, each with its own kernel, step-size
            and mass-matrix adaptation and random generator; see ``chain_method``. Chain ``c``
            of ``run_nuts(seed=s, num_chains=K)`` is the chain of ``run_nuts(seed=s + c)``, draw
            for draw. The traced path and ``kernel="pyro"`` use Pyro's ``MCMC``: processes when
            ``num_chains`` is below the number of cores, one chain after another otherwise
            (said by a warning).
        init: ``"map"`` (default; each chain starts at a MAP fit from its own random network
            initialisation, by Adam on ``U(q) / N``), ``"prior"`` (prior draws) or
            ``{site: value}`` with values of the site's shape (shared by all chains) or
            ``(num_chains, *shape)``.
        jit_compile: for the traced path, ``NUTS(model, jit_compile=True)``. The fast path
            ignores it: it uses the compiled C++ core (:mod:`pyro_bnnlv.infer.compiled`; set
            ``PYRO_BNNLV_COMPILED=0`` to disable it). TorchScript and ``torch.compile`` were
            measured not to pay here (1x50 BNN, 100 points: TorchScript no faster than eager
            Python; ``torch.compile`` adds a call overhead per potential evaluation about as large
            as the evaluation itself; AOTInductor costs tens of seconds of compilation per model
            and data set), the C++ core does (it cuts both the value-and-gradient and the tree
            overhead per step; ``pyro-bnnlv bench nuts`` reports both, compiled and Python).
        seed: seeds initialisation and sampling (same seed, same draws). Chain ``c`` uses the
            chain seed ``seed + c`` (``mcmc.run_info["seeds"]``): its initialisation from
            ``seed + c`` and its NUTS draws from a ``torch.Generator`` seeded with a 64-bit mix
            of ``seed + c``.
        progress: Pyro's progress bars, one per chain, with the estimated time left; after the
            first 10 iterations per running chain the estimated total is printed above them when
            it is 10 s or more (and logged at INFO level on the ``pyro_bnnlv`` logger either
            way; ``mcmc.run_info["estimated_sampling_seconds"]``).
        potential: ``"auto"`` (fast when the model has a :class:`FlatPotential`, see
            :func:`flat_potential`; traced otherwise), ``"fast"`` (error if there is none),
            ``"traced"``, or a :class:`FlatPotential` to use.
        kernel: for the fast path, ``"flat"`` (:class:`FlatNUTS`) or ``"pyro"`` (Pyro's stock
            ``NUTS(potential_fn=...)``). The traced path always uses Pyro's ``NUTS(model)``.
        target_accept_prob, max_tree_depth, full_mass, step_size: ``NUTS`` options (Pyro's
            defaults, with ``step_size`` the initial value before adaptation).
        map_steps, map_lr: Adam steps and learning rate of the MAP initialisation.
        check_potential: compare the fast potential with Pyro's traced potential (value and
            gradient) at the first chain's initial point before sampling; a mismatch raises.
        chain_method: how the flat kernel runs several chains: ``"auto"`` (default: parallel
            threads when the potential is compiled, i.e. an MLP regression potential with the
            C++ core, whose trees run without the GIL; one after another otherwise, with a
            warning), ``"threads"`` (error when the potential is not compiled) or
            ``"sequential"``. The draws are the same either way.
        mp_context: start method of Pyro's chain processes (traced path and ``kernel="pyro"``,
            when there are more cores than chains): default ``"spawn"``, not the platform's
            ``fork``, which can hang the chains (:mod:`~pyro_bnnlv.infer.nuts_processes`); spawned
            chains need a picklable model and, in a script, ``if __name__ == "__main__":``. A
            chain process that dies raises an error instead of hanging the run.

    Returns:
        the ``MCMC`` object; ``mcmc.get_samples()`` has ``"w"`` as ``(S, P)`` (and ``"z"`` as
        ``(S, N, K)`` for BNN+LV). ``mcmc.diagnostics()`` adds per-draw ``num_steps``,
        ``potential_energy``, ``accept_prob`` and ``tree_depth`` (completed doublings, as
        Pyro's and Stan's: ``max_tree_depth`` for a saturated draw of
        ``2**max_tree_depth - 1`` leapfrog steps; ``0`` where unknown) to Pyro's
        ``divergences``. ``mcmc.run_info`` records the path taken, whether the compiled core
        ran (``compiled_tree``, ``compiled_potential``), ``chain_method`` (``"threads"``,
        ``"sequential"`` or Pyro's ``"processes"``), the chain seeds, the timings with the
        early estimate of the sampling time, and ``max_tree_depth_share``, the share of kept
        draws that exhausted ``max_tree_depth``.

    Warns when at least 10% of the kept draws exhausted ``max_tree_depth`` (their trajectories
    were cut short: each such draw costs ``2**max_tree_depth - 1`` leapfrog steps).
    """
    seed = _check_arguments(model, x, y, num_samples, warmup_steps, num_chains, max_tree_depth,
                            map_steps, seed, kernel, target_accept_prob, full_mass, step_size,
                            map_lr, chain_method)  # fmt: skip
    model_name = type(model).__name__
    t_start = time.perf_counter()
    set_seed(seed)
    pot = _resolve_potential(model, x, y, potential)
    traced_pot, transforms, latent, shapes = _model_sites(model, x, y, pot)

    t_init = time.perf_counter()
    base = int(torch.randint(0, 2**30, ()).item()) if seed is None else seed
    values = _initial_values(model, x, y, init, latent, shapes, pot, num_chains, base, map_steps,
                             map_lr)  # fmt: skip
    init_seconds = time.perf_counter() - t_init
    unconstrained = {
        k: (transforms[k](v) if k in transforms else v).detach() for k, v in values.items()
    }
    if not all(torch.isfinite(v).all() for v in unconstrained.values()):
        raise ValueError("the initial values contain NaN or infinite entries")
    if pot is not None and check_potential:
        _check_flat_potential(pot, traced_pot, {k: v[0] for k, v in unconstrained.items()},
                              model_name)  # fmt: skip

    options = dict(target_accept_prob=target_accept_prob, max_tree_depth=max_tree_depth,
                   full_mass=full_mass, step_size=step_size)  # fmt: skip
    estimate = None
    t_run = time.perf_counter()
    if pot is not None and kernel == "flat":
        # every chain in this process, each with its own kernel, potential and generator
        pots = _chain_potentials(pot, num_chains)
        ext = resolve_extension(None)
        threaded = ext is not None and all(p.compiled is not None for p in pots)
        if chain_method == "threads" and not threaded and num_chains > 1:
            raise ValueError(
                "chain_method='threads' needs the compiled core and a compiled potential (an MLP "
                "regression potential): this potential is Python code, which holds the GIL. Use "
                "chain_method='auto' or 'sequential'"
            )
        parallel = threaded and num_chains > 1 and chain_method != "sequential"
        method = "threads" if parallel else "sequential"
        if num_chains > 1 and not parallel and chain_method == "auto":
            warnings.warn(
                f"run_nuts: the {num_chains} chains run one after another in this process (about "
                f"{num_chains}x the time of one chain): "
                + ("the compiled NUTS core is unavailable" if ext is None else
                   "the potential is Python code (not an MLP regression potential), which holds the GIL")
                + ". Chains run in parallel threads for MLP potentials with the compiled core",
                UserWarning, stacklevel=2,
            )  # fmt: skip
        cores = usable_cores()
        if parallel and num_chains > cores:
            warnings.warn(
                f"run_nuts: {num_chains} chains share {cores} core(s): they run in parallel threads, "
                f"but take about {num_chains / cores:.1f}x the wall time of one chain (the draws are "
                f"the same as with {cores} chains at a time)",
                UserWarning, stacklevel=2,
            )  # fmt: skip
        kernels = [
            FlatNUTS(p, generator=torch.Generator().manual_seed(_sampling_seed(base + c)), **options)
            for c, p in enumerate(pots)
        ]  # fmt: skip
        starts = [{k: v[c] for k, v in unconstrained.items()} for c in range(num_chains)]
        mcmc: MCMC = _InProcessMCMC(kernels, num_samples, warmup_steps, starts, parallel, progress,
                                    cores=cores)  # fmt: skip
        nuts = kernels[0]
        path = "fast/flat"
        mcmc.run()
        estimate = mcmc.sampler.estimate
    else:
        if chain_method != "auto":
            raise ValueError(
                f"chain_method={chain_method!r} applies to the fast path's flat kernel only; this "
                "run uses Pyro's MCMC (leave chain_method='auto')"
            )
        if pot is None:
            nuts = _CountingNUTS(model, jit_compile=jit_compile, **options)
            path = "traced"
        else:
            nuts = _CountingNUTS(potential_fn=pot.potential_fn, **options)
            path = "fast/pyro"
        available = max((os.cpu_count() or 1) - 1, 1)  # Pyro's rule: one core for the main process
        method = "processes" if 1 < num_chains <= available else "sequential"
        if num_chains > 1 and method == "sequential":
            warnings.warn(
                f"run_nuts: Pyro's MCMC runs the {num_chains} chains of the {path} path one after "
                f"another (it uses processes only for num_chains <= {available}, the number of "
                "cores minus one): about {num_chains}x the time of one chain. The fast path "
                "(kernel='flat', an MLP potential) runs chains in parallel threads".replace(
                    "{num_chains}", str(num_chains)),
                UserWarning, stacklevel=2,
            )  # fmt: skip
        if method == "processes":  # fork can hang (nuts_processes)
            mp_context = chain_start_method(mp_context, nuts, model, pot is not None and pot.compiled is not None)
        initial = unconstrained if num_chains > 1 else {k: v[0] for k, v in unconstrained.items()}
        set_seed(base + 7)
        with warnings.catch_warnings():  # said above, with the reason and the alternative
            warnings.filterwarnings("ignore", message="num_chains=.*Chains will be drawn sequentially")
            mcmc = MCMC(nuts, num_samples=num_samples, warmup_steps=warmup_steps,
                        initial_params=initial, num_chains=num_chains,
                        disable_progbar=not progress, mp_context=mp_context)  # fmt: skip
        if pot is None:
            # Pyro traces the model's potential (jit_compile): hide only the plate messenger's
            # shape checks, as the compiled ELBOs do (jit_guard); every other tracer warning shows
            with plate_shape_tracer_warnings_ignored():
                run_watched(mcmc, x, y, start_method=mp_context)
        else:
            run_watched(mcmc, start_method=mp_context)
    run_seconds = time.perf_counter() - t_run
    records = chain_records(mcmc)
    steps = [rec.get("num_steps", []) for rec in records]
    total = sum(len(v) for v in steps)
    # num_steps == 2**max_tree_depth - 1 exactly when every doubling completed (any kernel)
    flat_steps = [n for v in steps for n in v]
    saturated = sum(n >= 2**max_tree_depth - 1 for n in flat_steps) / len(flat_steps) if flat_steps else math.nan
    if saturated >= _SATURATION_WARNING:
        warnings.warn(
            f"run_nuts: {100 * saturated:.0f}% of the draws reached max_tree_depth={max_tree_depth} "
            f"({2**max_tree_depth - 1} leapfrog steps per draw): the trajectories were cut short, "
            "so each draw costs the maximum and explores less than NUTS would. Raise "
            "max_tree_depth (each +1 doubles the cost of a saturated draw), try full_mass=True, "
            "or reparameterise the model (narrower priors, standardised data)",
            UserWarning, stacklevel=2,
        )  # fmt: skip
    stuck = _stuck_chains(mcmc) if num_samples > 1 else []
    if stuck:
        warnings.warn(
            f"run_nuts: chain(s) {stuck} never moved: all {num_samples} draws are the same point "
            f"(every proposal was rejected), so they are not posterior samples. The warm-up "
            f"(warmup_steps={warmup_steps}) was too short to adapt the step size: raise "
            "warmup_steps (a few hundred is usual) or pass a smaller step_size",
            UserWarning, stacklevel=2,
        )  # fmt: skip
    mcmc.run_info = {  # type: ignore[attr-defined]
        "path": path,
        "compiled_tree": isinstance(nuts, FlatNUTS) and nuts._ext is not None,
        "compiled_potential": pot is not None and pot.compiled is not None,
        "chain_method": method,
        "start_method": mp_context if method == "processes" else None,
        "num_chains": num_chains,
        "seeds": [base + c for c in range(num_chains)],
        "model": model_name,
        "init": init if isinstance(init, str) else "values",
        "init_seconds": init_seconds,
        "sampling_seconds": run_seconds,
        "estimated_sampling_seconds": None if estimate is None else estimate["seconds"],
        "total_seconds": time.perf_counter() - t_start,
        "mean_leapfrog_per_sample": (sum(sum(v) for v in steps) / total) if total else math.nan,
        "max_tree_depth_share": saturated,
    }
    return mcmc
