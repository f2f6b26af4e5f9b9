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
  gradient is a hand-written backward pass (:func:`mlp_regression_potential`, or
  :func:`mlp_classification_potential` for a categorical or Bernoulli likelihood, evaluated by
  its compiled C++ twin when :func:`pyro_bnnlv._compiled.nuts_extension` builds); any other
  potential can be given as a plain differentiable log density
  (:meth:`FlatPotential.from_log_density`). The fast potential equals Pyro's traced potential
  (all normalising constants included) at every point, value and gradient (tested, and checked
  at the initial point of every run with ``check_potential=True``).

The pieces (:mod:`pyro_bnnlv.infer.mcmc` lists them): the potentials in
:mod:`pyro_bnnlv.models.potential`, the kernels, the chains and the initial values; this module
puts them together (the contract for the fast path, ``model.nuts_potential(x, y)``, is in
:mod:`~pyro_bnnlv.infer.mcmc.init`). ``pyro-bnnlv bench nuts`` times a leapfrog step against
Pyro's traced ``NUTS`` and NumPyro (docs/results/bench-nuts.csv).
"""

from __future__ import annotations

import math
import multiprocessing
import numbers
import os
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from pyro.infer import MCMC
from torch import Tensor

from ..._checks import ArgumentTypeError, check_int, check_real, check_seed
from ..._compiled import resolve_nuts_extension as resolve_extension
from ..._platform import usable_cores  # looked up here by run_nuts (tests patch nuts.usable_cores)
from ..._state import set_seed
from ...protocols import ChecksData
from ...models.potential import FlatPotential
from ..elbos.jit_guard import plate_shape_tracer_warnings_ignored
from .chains import _chain_potentials, _InProcessMCMC, _sampling_seed
from .init import _check_flat_potential, _initial_values, _model_sites, _resolve_potential
from .kernel import FlatNUTS, CountingNUTS
from .processes import chain_start_method, run_watched

__all__ = ["RunInfo", "chain_records", "run_nuts"]

# run_nuts warns when at least this share of the kept draws exhausted max_tree_depth
_SATURATION_WARNING = 0.1
# Pyro's MCMC draws from the global generator, seeded base + 7: clear of the initialisation
# streams of the chains (base + c and base + c + 1 for c < num_chains <= 6)... and checked in
# _check_counts to stay below 2**32 for every chain
_PYRO_SAMPLING_SEED_OFFSET = 7


def _stuck_chains(mcmc: MCMC) -> list[int]:
    """Chains whose draws are all one point (no proposal accepted after the warm-up)."""
    samples = mcmc.get_samples(group_by_chain=True)
    if not samples:
        return []
    num_chains = next(iter(samples.values())).shape[0]
    return [c for c in range(num_chains) if all(bool((v[c] == v[c, :1]).all()) for v in samples.values())]


def chain_records(mcmc: MCMC) -> list[dict]:
    """Per-chain kernel diagnostics of a run MCMC (Pyro's ``divergences`` and ``acceptance
    rate``, plus the per-draw records of this module's kernels), without the R-hat/ESS that
    ``mcmc.diagnostics()`` computes (which needs at least 4 draws)."""
    recs = getattr(mcmc, "_diagnostics", None)
    if not recs or any(r is None for r in recs):
        raise ValueError("the MCMC object has not been run")
    return [dict(r) for r in recs]


@dataclass(frozen=True)
class RunInfo:
    """What :func:`run_nuts` did, as ``mcmc.run_info``.

    Attributes:
        path: ``"fast/flat"`` (flat potential, :class:`FlatNUTS`), ``"fast/pyro"`` (flat
            potential, Pyro's ``NUTS(potential_fn=...)``) or ``"traced"`` (``NUTS(model)``).
        compiled_tree, compiled_potential: whether the C++ core built the trees / evaluated the
            potential.
        chain_method: ``"threads"``, ``"sequential"`` or Pyro's ``"processes"``.
        start_method: the chain processes' start method (``None`` unless ``"processes"``).
        num_chains, seeds: the chains and their seeds (chain ``c``: ``seed + c``).
        model, init: the model's class name; ``"map"``, ``"prior"`` or ``"values"``.
        init_seconds, sampling_seconds, total_seconds: wall times.
        estimated_sampling_seconds: the early estimate of the sampling time (flat kernel), or
            ``None``.
        reestimated_sampling_seconds: its re-estimate at the end of the warm-up, from the cost of
            the last warm-up iterations (:func:`~pyro_bnnlv.infer.mcmc.chains.warmup_reestimate`;
            flat kernel), or ``None``.
        mean_leapfrog_per_sample: leapfrog steps per kept draw, over all chains.
        max_tree_depth_share: share of the kept draws that exhausted ``max_tree_depth``.
    """

    path: str
    compiled_tree: bool
    compiled_potential: bool
    chain_method: str
    start_method: str | None
    num_chains: int
    seeds: list[int]
    model: str
    init: str
    init_seconds: float
    sampling_seconds: float
    estimated_sampling_seconds: float | None
    total_seconds: float
    mean_leapfrog_per_sample: float
    max_tree_depth_share: float
    reestimated_sampling_seconds: float | None = None


class _Plan(NamedTuple):
    """Everything :func:`run_nuts` settles before the first draw."""

    potential: FlatPotential | None  # None: the traced path
    starts: dict[str, Tensor]  # unconstrained initial values, (num_chains, *shape) per site
    base_seed: int  # chain c is seeded base_seed + c
    init_seconds: float
    options: dict[str, Any]  # the NUTS kernel's options


class _Sampled(NamedTuple):
    mcmc: MCMC
    kernel: Any
    path: str
    chain_method: str
    start_method: str | None
    estimate: dict | None
    reestimate: dict | None = None


def _plan(
    model: Any,
    x: Tensor,
    y: Tensor,
    init: Any,
    potential: Any,
    num_chains: int,
    seed: int | None,
    map_steps: int,
    map_lr: float,
    check_potential: bool,
    options: dict[str, Any],
) -> _Plan:
    """Pick the potential, draw or fit the chains' starting points and check the fast potential
    against the traced one at the first start."""
    set_seed(seed)
    pot = _resolve_potential(model, x, y, potential)
    traced_pot, transforms, latent, shapes = _model_sites(model, x, y, pot)
    t_init = time.perf_counter()
    base = int(torch.randint(0, 2**30, ()).item()) if seed is None else seed
    values = _initial_values(model, x, y, init, latent, shapes, pot, num_chains, base, map_steps, map_lr)
    init_seconds = time.perf_counter() - t_init
    starts = {k: (transforms[k](v) if k in transforms else v).detach() for k, v in values.items()}
    if not all(torch.isfinite(v).all() for v in starts.values()):
        raise ValueError("the initial values contain NaN or infinite entries")
    if pot is not None and check_potential:
        _check_flat_potential(pot, traced_pot, {k: v[0] for k, v in starts.items()}, type(model).__name__)
    return _Plan(pot, starts, base, init_seconds, options)


def _sample_flat(
    plan: _Plan, num_samples: int, warmup_steps: int, num_chains: int, chain_method: str, progress: bool
) -> _Sampled:
    """Every chain in this process, each with its own :class:`FlatNUTS`, potential and generator:
    parallel threads when the potential and the tree are compiled, one after another otherwise."""
    pots = _chain_potentials(plan.potential, num_chains)
    ext = resolve_extension(None)
    threaded = ext is not None and all(p.compiled is not None for p in pots)
    if chain_method == "threads" and not threaded and num_chains > 1:
        raise ValueError(
            "chain_method='threads' needs the compiled core and a compiled potential (an MLP "
            "regression or classification potential): this potential is Python code, which holds the GIL. Use "
            "chain_method='auto' or 'sequential'"
        )
    parallel = threaded and num_chains > 1 and chain_method != "sequential"
    if num_chains > 1 and not parallel and chain_method == "auto":
        reason = (
            "the compiled NUTS core is unavailable"
            if ext is None
            else "the potential is Python code (not an MLP potential), which holds the GIL"
        )
        warnings.warn(
            f"run_nuts: the {num_chains} chains run one after another in this process (about "
            f"{num_chains}x the time of one chain): {reason}. Chains run in parallel threads for "
            "MLP potentials with the compiled core",
            UserWarning,
            stacklevel=3,
        )
    cores = usable_cores()
    if parallel and num_chains > cores:
        warnings.warn(
            f"run_nuts: {num_chains} chains share {cores} core(s): they run in parallel threads, "
            f"but take about {num_chains / cores:.1f}x the wall time of one chain (the draws are "
            f"the same as with {cores} chains at a time)",
            UserWarning,
            stacklevel=3,
        )
    kernels = [
        FlatNUTS(p, generator=torch.Generator().manual_seed(_sampling_seed(plan.base_seed + c)), **plan.options)
        for c, p in enumerate(pots)
    ]
    starts = [{k: v[c] for k, v in plan.starts.items()} for c in range(num_chains)]
    mcmc = _InProcessMCMC(kernels, num_samples, warmup_steps, starts, parallel, progress, cores=cores)
    mcmc.run()
    method = "threads" if parallel else "sequential"
    return _Sampled(mcmc, kernels[0], "fast/flat", method, None, mcmc.sampler.estimate, mcmc.sampler.reestimate)


def _sample_pyro(
    plan: _Plan,
    model: Any,
    x: Tensor,
    y: Tensor,
    num_samples: int,
    warmup_steps: int,
    num_chains: int,
    jit_compile: bool,
    progress: bool,
    mp_context: str | None,
    chain_method: str,
) -> _Sampled:
    """Pyro's ``MCMC`` with ``NUTS(model)`` (traced) or ``NUTS(potential_fn=...)``: chain
    processes when there are more cores than chains (Pyro's rule), one after another otherwise."""
    if chain_method != "auto":
        raise ValueError(
            f"chain_method={chain_method!r} applies to the fast path's flat kernel only; "
            "this run uses Pyro's MCMC (leave chain_method='auto')"
        )
    pot = plan.potential
    if pot is None:
        kernel, path = CountingNUTS(model, jit_compile=jit_compile, **plan.options), "traced"
    else:
        kernel, path = CountingNUTS(potential_fn=pot.potential_fn, **plan.options), "fast/pyro"
    available = max((os.cpu_count() or 1) - 1, 1)  # Pyro's rule: one core for the main process
    method = "processes" if 1 < num_chains <= available else "sequential"
    if num_chains > 1 and method == "sequential":
        warnings.warn(
            f"run_nuts: Pyro's MCMC runs the {num_chains} chains of the {path} path one after "
            f"another (it uses processes only for num_chains <= {available}, the number of cores "
            f"minus one): about {num_chains}x the time of one chain. The fast path (kernel='flat', "
            "an MLP potential) runs chains in parallel threads",
            UserWarning,
            stacklevel=3,
        )
    if method == "processes":  # fork can hang (processes.py)
        mp_context = chain_start_method(mp_context, kernel, model, pot is not None and pot.compiled is not None)
    initial = plan.starts if num_chains > 1 else {k: v[0] for k, v in plan.starts.items()}
    set_seed(plan.base_seed + _PYRO_SAMPLING_SEED_OFFSET)
    with warnings.catch_warnings():  # said above, with the reason and the alternative
        warnings.filterwarnings("ignore", message="num_chains=.*Chains will be drawn sequentially")
        mcmc = MCMC(
            kernel,
            num_samples=num_samples,
            warmup_steps=warmup_steps,
            initial_params=initial,
            num_chains=num_chains,
            disable_progbar=not progress,
            mp_context=mp_context,
        )
    if pot is None:
        # Pyro traces the model's potential (jit_compile): hide only the plate messenger's shape
        # checks, as the compiled ELBOs do (jit_guard); every other tracer warning shows
        with plate_shape_tracer_warnings_ignored():
            run_watched(mcmc, x, y, start_method=mp_context)
    else:
        run_watched(mcmc, start_method=mp_context)
    return _Sampled(mcmc, kernel, path, method, mp_context if method == "processes" else None, None)


def _review(
    plan: _Plan,
    sampled: _Sampled,
    model: Any,
    init: Any,
    num_samples: int,
    warmup_steps: int,
    max_tree_depth: int,
    run_seconds: float,
    t_start: float,
) -> RunInfo:
    """Warn about draws that exhausted ``max_tree_depth`` and chains that never moved; the run's
    :class:`RunInfo`."""
    steps = [n for rec in chain_records(sampled.mcmc) for n in rec.get("num_steps", [])]
    # num_steps == 2**max_tree_depth - 1 exactly when every doubling completed (any kernel)
    saturated = sum(n >= 2**max_tree_depth - 1 for n in steps) / len(steps) if steps else math.nan
    if saturated >= _SATURATION_WARNING:
        warnings.warn(
            f"run_nuts: {100 * saturated:.0f}% of the draws reached max_tree_depth={max_tree_depth} "
            f"({2**max_tree_depth - 1} leapfrog steps per draw): the trajectories were cut short, "
            "so each draw costs the maximum and explores less than NUTS would. Raise "
            "max_tree_depth (each +1 doubles the cost of a saturated draw), try full_mass=True, "
            "or reparameterise the model (narrower priors, standardised data)",
            UserWarning,
            stacklevel=3,
        )
    stuck = _stuck_chains(sampled.mcmc) if num_samples > 1 else []
    if stuck:
        warnings.warn(
            f"run_nuts: chain(s) {stuck} never moved: all {num_samples} draws are the same point "
            f"(every proposal was rejected), so they are not posterior samples. The warm-up "
            f"(warmup_steps={warmup_steps}) was too short to adapt the step size: raise "
            "warmup_steps (a few hundred is usual) or pass a smaller step_size",
            UserWarning,
            stacklevel=3,
        )
    num_chains = len(plan.starts[next(iter(plan.starts))])
    return RunInfo(
        path=sampled.path,
        compiled_tree=isinstance(sampled.kernel, FlatNUTS) and sampled.kernel._ext is not None,
        compiled_potential=plan.potential is not None and plan.potential.compiled is not None,
        chain_method=sampled.chain_method,
        start_method=sampled.start_method,
        num_chains=num_chains,
        seeds=[plan.base_seed + c for c in range(num_chains)],
        model=type(model).__name__,
        init=init if isinstance(init, str) else "values",
        init_seconds=plan.init_seconds,
        sampling_seconds=run_seconds,
        estimated_sampling_seconds=None if sampled.estimate is None else sampled.estimate["seconds"],
        total_seconds=time.perf_counter() - t_start,
        mean_leapfrog_per_sample=sum(steps) / len(steps) if steps else math.nan,
        max_tree_depth_share=saturated,
        reestimated_sampling_seconds=None if sampled.reestimate is None else sampled.reestimate["seconds"],
    )


def _check_counts(
    num_samples: int, warmup_steps: int, num_chains: int, max_tree_depth: int, map_steps: int, seed: Any
) -> int | None:
    """:func:`run_nuts`'s checks of the counts and the seed (the first of its argument checks);
    returns the checked seed."""
    check_int(num_samples, "num_samples")
    check_int(warmup_steps, "warmup_steps", minimum=0)
    check_int(num_chains, "num_chains")
    check_int(max_tree_depth, "max_tree_depth")
    check_int(map_steps, "map_steps")
    seed = check_seed(seed)
    if (
        seed is not None and seed + num_chains + _PYRO_SAMPLING_SEED_OFFSET >= 2**32
    ):  # chain c is seeded seed + c (+ 1, + 7)
        raise ValueError(
            f"seed must be below 2**32 - {num_chains + 7} with num_chains={num_chains} "
            f"(chain c uses seeds from seed + c), got {seed}"
        )
    return seed


def _check_kernel_options(
    kernel: str, target_accept_prob: float, full_mass: bool, step_size: float, map_lr: float
) -> None:
    """:func:`run_nuts`'s checks of the kernel's and the MAP initialisation's options."""
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


def _check_data_and_execution(model: Any, x: Any, y: Any, mp_context: str | None, chain_method: str) -> None:
    """:func:`run_nuts`'s checks of the data (the model's own ``check_data`` where it has one) and
    of how the chains run (the last of its argument checks)."""
    if not isinstance(y, Tensor):
        raise TypeError(
            f"y must be a tensor of targets (NUTS samples the posterior given data), got {type(y).__name__}"
        )
    if isinstance(model, ChecksData):
        model.check_data(x, y)
    elif not isinstance(x, Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    else:  # a plain Pyro model checks nothing itself: NaN would only show as a stuck chain
        for name, value in (("x", x), ("y", y)):
            if value.is_floating_point() and not torch.isfinite(value).all():
                raise ValueError(f"{name} contains NaN or infinite values; drop or impute those rows before NUTS")
    if mp_context is not None and mp_context not in multiprocessing.get_all_start_methods():
        raise ValueError(
            f"mp_context={mp_context!r} is not a start method of this platform; use one of "
            f"{multiprocessing.get_all_start_methods()} or None (spawn)"
        )
    if chain_method not in ("auto", "threads", "sequential"):
        raise ValueError(f"chain_method must be 'auto', 'threads' or 'sequential', got {chain_method!r}")


def run_nuts(
    model: Callable[..., Any],
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
        num_chains: number of chains, each with its own adaptation and random generator; chain
            ``c`` of ``run_nuts(seed=s, num_chains=K)`` is ``run_nuts(seed=s + c)``, draw for
            draw, and the ``MCMC`` holds all chains (``get_samples(group_by_chain=True)``). The flat kernel runs them in this process (``chain_method``); the traced path
            and ``kernel="pyro"`` in Pyro's chain processes when there are more cores than chains.
        init: ``"map"`` (default; each chain starts at a MAP fit from its own random network
            initialisation, by Adam on ``U(q) / N``), ``"prior"`` (prior draws) or
            ``{site: value}`` with values of the site's shape (shared by all chains) or
            ``(num_chains, *shape)``.
        jit_compile: for the traced path, ``NUTS(model, jit_compile=True)``. The fast path
            ignores it: it uses the compiled C++ core (:func:`pyro_bnnlv._compiled.nuts_extension`;
            ``PYRO_BNNLV_COMPILED=0`` disables it).
        seed: seeds initialisation and sampling (same seed, same draws); chain ``c`` is
            initialised from ``seed + c`` and draws from a generator seeded with a 64-bit mix of
            ``seed + c``.
        progress: Pyro's progress bars, one per chain; the estimated total sampling time is
            printed above them once it is known, when it is 10 s or more, and re-estimated in one
            more line at the end of the warm-up (whose trees deepen as it adapts).
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
        chain_method: how the flat kernel runs several chains: ``"auto"`` (parallel threads when
            the potential is compiled, whose trees run without the GIL; one after another
            otherwise, with a warning), ``"threads"`` or ``"sequential"``; same draws either way.
        mp_context: start method of Pyro's chain processes: default ``"spawn"``, not ``fork``,
            which can hang them (:mod:`~pyro_bnnlv.infer.mcmc.processes`); spawned chains need a
            picklable model and, in a script, ``if __name__ == "__main__":``.

    Returns:
        the ``MCMC`` object; ``mcmc.get_samples()`` has ``"w"`` as ``(S, P)`` (and ``"z"`` as
        ``(S, N, K)`` for BNN+LV); :func:`chain_records` the per-draw kernel records (``num_steps``,
        ``potential_energy``, ``accept_prob``, ``tree_depth``, Pyro's ``divergences``);
        ``mcmc.run_info`` a :class:`RunInfo`. Warns when at least 10% of the kept draws exhausted
        ``max_tree_depth`` and when a chain never moved.
    """
    seed = _check_counts(num_samples, warmup_steps, num_chains, max_tree_depth, map_steps, seed)
    _check_kernel_options(kernel, target_accept_prob, full_mass, step_size, map_lr)
    _check_data_and_execution(model, x, y, mp_context, chain_method)
    t_start = time.perf_counter()
    options = dict(
        target_accept_prob=target_accept_prob, max_tree_depth=max_tree_depth, full_mass=full_mass, step_size=step_size
    )
    plan = _plan(model, x, y, init, potential, num_chains, seed, map_steps, map_lr, check_potential, options)
    t_run = time.perf_counter()
    if plan.potential is not None and kernel == "flat":
        sampled = _sample_flat(plan, num_samples, warmup_steps, num_chains, chain_method, progress)
    else:
        sampled = _sample_pyro(
            plan, model, x, y, num_samples, warmup_steps, num_chains, jit_compile, progress, mp_context, chain_method
        )
    run_seconds = time.perf_counter() - t_run
    run_info = _review(plan, sampled, model, init, num_samples, warmup_steps, max_tree_depth, run_seconds, t_start)
    sampled.mcmc.run_info = run_info  # type: ignore[attr-defined]
    return sampled.mcmc
