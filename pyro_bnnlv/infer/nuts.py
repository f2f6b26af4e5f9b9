r"""NUTS as the gold-standard posterior: :func:`run_nuts`, with a fast path that skips Pyro's tracing.

The papers use HMC/NUTS as the reference posterior (``ncai-bnnlv-nonidentifiability.txt`` sec.
7.3 and App. E; ``hypernet-implicit-vi-parameter-predictor-space.txt`` sec. 4 and App. C, E;
``in-between-uncertainty-linearised-laplace.txt`` sec. 3). :func:`run_nuts` runs Pyro's own
``MCMC`` and returns it, so ``mcmc.get_samples()``, ``mcmc.summary()`` and
:func:`pyro_bnnlv.diagnostics.to_inference_data` work as usual.

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

Two NUTS kernels for the fast potential
---------------------------------------
* ``kernel="pyro"``: Pyro's stock ``NUTS(potential_fn=...)``. Its tree building works on dicts
  of tensors with 0-dim tensor arithmetic and a ``pyro.sample`` per tree merge; on the 1x50 BNN
  that costs about 0.15 ms per leapfrog step on top of the potential, so the fast potential
  alone buys only a factor 2 over the traced model (``pyro-bnnlv bench nuts``).
* ``kernel="flat"`` (default): :class:`FlatNUTS`, a subclass of Pyro's ``NUTS`` that runs the
  *same* algorithm -- multinomial NUTS with Pyro's tree recursion, generalised U-turn criterion,
  divergence threshold, the same random draws in the same order, and Pyro's own step-size and
  mass-matrix adaptation (``WarmupAdapter``) -- but keeps the state in one flat tensor and the
  scalar bookkeeping in plain floats, and builds each tree in C++ (the compiled core of
  :mod:`pyro_bnnlv.infer.compiled`, built on first use; a Python twin of the same recursion is
  the fallback). With a float64 potential it reproduces Pyro's ``NUTS(potential_fn=...)`` draw
  for draw up to rounding, with either tree (tested). The compiled potential is one pass of
  plain loops over raw pointers (products above 65k multiply-adds go to the BLAS): per
  value-and-gradient 0.65x the time of the earlier ATen-operation version on the 1x50 toy
  (100 points) and 1.0x on boston (409 x 13 inputs), measured side by side. ``pyro-bnnlv
  bench nuts`` reports the time per leapfrog step against Pyro's traced
  ``MCMC(NUTS(model, jit_compile=True))`` and against NumPyro; see docs/results/bench-nuts.csv.

Several chains in one process
-----------------------------
``run_nuts(num_chains=K)`` on the flat kernel runs all chains in the calling process, each with
its own :class:`FlatNUTS` (so its own step-size and mass-matrix adaptation, Pyro's
``WarmupAdapter``), its own ``torch.Generator`` and, for a compiled potential, its own
``MLPPotential.clone()``. The compiled tree releases the GIL, so the chains run in parallel
threads (``chain_method="auto"``); a Python potential holds the GIL, so its chains run one after
another (with a warning). Nothing needs pickling or ``fork``. Chain ``c`` of seed ``s`` is the
one-chain run of seed ``s + c``, draw for draw (tested), and the returned ``MCMC`` holds all
chains (``get_samples(group_by_chain=True)``, ArviZ export). Compare NumPyro's
``chain_method="parallel"`` (one XLA device per chain) and ``"vectorized"`` (all chains in one
batched computation that advances in lock step, every chain waiting for the longest tree).

The contract for other models (BNN+LV, ...)
-------------------------------------------
A model gets the fast path by exposing ``model.nuts_potential(x, y) -> FlatPotential``. The
simplest implementation writes ``log p(y, w, z | x)`` on plain tensors and lets autograd do the
gradient::

    def nuts_potential(self, x, y):
        P, N, K = self.net.num_weights, x.shape[0], self.latent_dim
        def log_density(p):                       # p = {"w": (P,), "z": (N, K)}, unconstrained
            ...                                   # log prior(w) + log prior(z) + log lik, with constants
        return FlatPotential.from_log_density({"w": (P,), "z": (N, K)}, log_density)

For MLP regression models (BNN, and BNN+LV whose network input is ``[x, z]``)
:func:`mlp_regression_potential` already provides a hand-written gradient::

    def nuts_potential(self, x, y):
        return mlp_regression_potential(self.net, x, y, prior_loc=self.prior_loc,
                                        prior_scale=self.prior_scale, noise_scale=self.noise_scale,
                                        latent_dim=self.latent_dim, latent_scale=self.latent_scale)

Site names, shapes and values are those of the Pyro model's unconstrained latent sites (here
all real-valued), ``U`` must include every constant (so the run-time check against the traced
model can compare values), and the sites are laid out in sorted name order in ``q``.

Initialisation
--------------
NUTS started far from the data (a prior draw, or Pyro's default ``init_to_uniform`` in
``[-2, 2]``) spends its warm-up adapting a tiny step size to the steep region it starts in, and
on a BNN often never reaches the posterior bulk within the warm-up. The default ``init="map"``
starts each chain at a MAP estimate from its own random network initialisation (``train_map``
for a BNN, Adam on the flat potential for other fast-path models, ``AutoDelta`` otherwise);
``init="prior"`` starts at prior draws; a dict gives explicit values.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import queue
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS
from pyro.infer.mcmc.api import AbstractMCMC
from pyro.infer.mcmc.util import initialize_model
from pyro.ops.integrator import potential_grad
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from .._compiled import resolve_nuts_extension as resolve_extension
from ..models.potential import FlatPotential, mlp_regression_potential
from ..nets import MLP
from .._checks import ArgumentTypeError, check_real, check_seed
from .svi import _check_positive_int, set_seed
from .._platform import usable_cores

__all__ = [
    "FlatPotential",
    "FlatNUTS",
    "mlp_regression_potential",
    "flat_potential",
    "run_nuts",
    "chain_records",
]

_log = logging.getLogger("pyro_bnnlv")
# run_nuts warns when at least this share of the kept draws exhausted max_tree_depth
_SATURATION_WARNING = 0.1
def flat_potential(model: Any, x: Tensor, y: Tensor) -> FlatPotential | None:
    """The model's fast potential, or ``None`` if it has none (then NUTS traces the model).

    Resolution order: ``model.nuts_potential(x, y)`` if the model defines it; the built-in
    potential of a plain :class:`~pyro_bnnlv.models.bnn.BNN` (hand-written gradient for an
    ``MLP``, autograd through ``model.f`` for any other ``FlatNet``); otherwise ``None``.
    Subclasses of ``BNN`` that override ``forward`` (BNN+LV, ...) are *not* treated as a BNN.
    """
    custom = getattr(model, "nuts_potential", None)
    if callable(custom):
        pot = custom(x, y)
        if not isinstance(pot, FlatPotential):
            raise TypeError(
                f"{type(model).__name__}.nuts_potential must return a FlatPotential, "
                f"got {type(pot).__name__}"
            )
        return pot
    if not _is_plain_bnn(model):
        return None
    sigma = torch.as_tensor(model.noise_scale).detach()
    if isinstance(model.net, MLP):
        return mlp_regression_potential(
            model.net, x, y, prior_loc=model.prior_loc, prior_scale=model.prior_scale,
            noise_scale=sigma,
        )  # fmt: skip
    loc, scale = model.prior_loc.detach(), model.prior_scale.detach()
    N = x.shape[0]

    def log_density(p: dict[str, Tensor]) -> Tensor:
        w = p["w"]
        f = model.f(x, w).reshape(N, -1)
        lik = torch.distributions.Normal(f, sigma).log_prob(y.reshape(N, -1)).sum()
        return lik + torch.distributions.Normal(loc, scale).log_prob(w).sum()

    return FlatPotential.from_log_density({"w": (model.net.num_weights,)}, log_density)


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------
class _RecordingMixin:
    """Per-draw statistics of the sampling phase, returned by ``diagnostics()``.

    ``mcmc.diagnostics()`` then has, per chain, ``num_steps`` (leapfrog steps of each draw),
    ``potential_energy`` (``-log p(y, latents)`` of each draw, constants included),
    ``accept_prob`` (mean Metropolis acceptance probability over the draw's trajectory; NaN for
    Pyro's stock kernel), ``tree_depth`` (doublings; 0 where unknown) and ``seconds`` (time
    inside the kernel's ``sample``), and the warm-up's ``warmup_num_steps`` and
    ``warmup_seconds``, beside Pyro's ``divergences`` and ``acceptance rate``.
    """

    _records: dict[str, list]

    def _reset_records(self) -> None:
        self._records = {"num_steps": [], "potential_energy": [], "accept_prob": [],
                         "tree_depth": [], "seconds": [], "warmup_num_steps": [],
                         "warmup_seconds": []}  # fmt: skip

    def _record(self, num_steps: int, potential_energy: float, accept_prob: float, depth: int,
                seconds: float) -> None:  # fmt: skip
        rec = self._records
        if self._t > self._warmup_steps:  # type: ignore[attr-defined]
            rec["num_steps"].append(int(num_steps))
            rec["potential_energy"].append(float(potential_energy))
            rec["accept_prob"].append(float(accept_prob))
            rec["tree_depth"].append(int(depth))
            rec["seconds"].append(float(seconds))
        else:
            rec["warmup_num_steps"].append(int(num_steps))
            rec["warmup_seconds"].append(float(seconds))

    def diagnostics(self) -> dict:
        out = super().diagnostics()  # type: ignore[misc]
        out.update({k: list(v) for k, v in self._records.items()})
        return out


class _CountingNUTS(_RecordingMixin, NUTS):
    """Pyro's stock ``NUTS`` that counts leapfrog steps (potential evaluations) per draw."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._calls = 0
        self._reset_records()

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        super().setup(warmup_steps, *args, **kwargs)
        self._reset_records()
        inner = self.potential_fn
        if not getattr(inner, "_counting", False):

            def counted(params: Mapping[str, Tensor]) -> Tensor:
                self._calls += 1
                return inner(params)

            counted._counting = True  # type: ignore[attr-defined]
            self.potential_fn = counted

    def sample(self, params: dict) -> dict:
        before, t0 = self._calls, time.perf_counter()
        out = super().sample(params)
        seconds = time.perf_counter() - t0
        self._record(self._calls - before, float(self._potential_energy_last), math.nan, 0, seconds)
        return out


# A (sub)tree is a plain tuple (fast to build), with the fields of Pyro's ``_TreeInfo``:
# (q_left, r_left, u_left, g_left, q_right, r_right, u_right, g_right, q_proposal, pe_proposal,
#  g_proposal, r_sum, weight, turning, diverging, sum_accept_probs, num_proposals)
_QL, _RL, _UL, _GL, _QR, _RR, _UR, _GR, _QP, _PEP, _GP, _RSUM, _WEIGHT, _TURN, _DIV, _ACC, _NPROP = range(17)


def _logaddexp(x: float, y: float) -> float:
    lo, hi = (x, y) if x < y else (y, x)
    return math.log1p(math.exp(lo - hi)) + hi


class FlatNUTS(_RecordingMixin, NUTS):
    """Pyro's multinomial NUTS with the tree built on one flat tensor and float scalars.

    A subclass of :class:`pyro.infer.NUTS` for a :class:`FlatPotential`. Setup, the initial
    step-size search and the warm-up adaptation (dual averaging, Welford mass matrix, Pyro's
    window schedule) are Pyro's own code; :meth:`sample` re-implements ``NUTS.sample`` and
    ``NUTS._build_tree`` step for step (same recursion, U-turn test on the unscaled momenta,
    divergence threshold, biased progressive sampling at the top level, uniform within subtrees),
    drawing the same random numbers in the same order, but

    * the position, momentum and gradient are single flat tensors, and the leapfrog step is
      four fused tensor operations instead of Pyro's dict-of-tensors arithmetic;
    * energies, tree weights and acceptance probabilities are Python floats (one ``.item()``
      per leapfrog step for the energy instead of a dozen 0-dim tensor operations);
    * the per-merge subtree choice calls ``torch.bernoulli`` directly instead of
      ``pyro.sample(dist.Bernoulli(...))`` (the same draw).

    The tree recursion (leapfrog steps, merges, U-turn tests, the per-merge Bernoulli draw) runs
    in C++ (``build_tree`` of :mod:`pyro_bnnlv.infer.compiled`, the line-for-line twin of
    :meth:`_build_tree_flat`) when the compiled core builds; it calls the potential's compiled
    twin (:attr:`FlatPotential.compiled`) directly, or its Python ``value_and_grad`` otherwise.
    The top level of each draw (direction and acceptance draws through ``pyro.sample``) and all
    of Pyro's adaptation stay in Python.

    Only multinomial sampling (Pyro's default) is implemented.

    Random numbers: without ``generator`` the kernel draws from Pyro/torch's global generator
    (through ``pyro.sample`` at the top level), exactly as Pyro's ``NUTS`` does, so both give the
    same chain from the same seed. With a ``torch.Generator`` every draw of the chain (momenta,
    including those of Pyro's step-size search, directions, acceptance and per-merge draws) comes
    from it, with the same torch calls in the same order: a kernel with a generator seeded ``s``
    reproduces a kernel on the global generator seeded ``s``, and several kernels with their own
    generators can advance in parallel threads (:func:`run_nuts` does so) without touching each
    other's random streams.

    ``tree_depth`` in the records is Pyro's (and Stan's ``treedepth__``): the number of completed
    doublings, so a trajectory that exhausts ``max_tree_depth`` has depth ``max_tree_depth`` and
    ``2**max_tree_depth - 1`` leapfrog steps; a doubling stopped by a U-turn or divergence inside
    the new subtree does not count.

    Args:
        potential: the :class:`FlatPotential`.
        compiled: build trees in C++: ``None`` (default) when the compiled core builds, ``True``
            to require it, ``False`` for the Python recursion.
        generator: the chain's own ``torch.Generator`` (CPU), or ``None`` for the global one.
        **kwargs: ``NUTS`` options: ``step_size``, ``adapt_step_size``, ``adapt_mass_matrix``,
            ``full_mass``, ``target_accept_prob``, ``max_tree_depth``.
    """

    def __init__(self, potential: FlatPotential, compiled: bool | None = None,
                 generator: torch.Generator | None = None, **kwargs: Any) -> None:  # fmt: skip
        if not kwargs.pop("use_multinomial_sampling", True):
            raise ValueError("FlatNUTS implements multinomial sampling only; use pyro's NUTS")
        for bad in ("model", "potential_fn", "jit_compile", "transforms"):
            if bad in kwargs:
                raise TypeError(f"FlatNUTS takes a FlatPotential, not {bad}=")
        super().__init__(potential_fn=potential.potential_fn, **kwargs)
        self.flat_potential = potential
        self._vg = potential.value_and_grad
        self._ext = resolve_extension(compiled)
        self._tree_potential = potential.compiled if potential.compiled is not None else self._vg
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        if generator is not None and generator.device.type != "cpu":
            raise ValueError(f"generator must be a CPU generator (FlatNUTS runs on the CPU), got {generator.device}")
        self._generator = generator
        self._mass_key: tuple | None = None
        self._reset_records()

    # -- random draws: the chain's generator, or Pyro's sample statements on the global one -------
    def _sample_r(self, name: str) -> tuple[dict, dict]:
        if self._generator is None:
            return super()._sample_r(name)
        pe = self._potential_energy_last
        r_unscaled = {
            sites: torch.normal(torch.zeros(size, dtype=pe.dtype), torch.ones(size, dtype=pe.dtype),
                                generator=self._generator)  # fmt: skip
            for sites, size in self.mass_matrix_adapter.mass_matrix_size.items()
        }
        return self.mass_matrix_adapter.scale(r_unscaled, r_prototype=self.initial_params), r_unscaled

    def _draw_direction(self, depth: int, half: Tensor) -> int:
        if self._generator is None:
            name = "direction_t={}_treedepth={}".format(self._t, depth)
            return int(pyro.sample(name, dist.Bernoulli(probs=half)).item())
        return int(torch.bernoulli(half, generator=self._generator).item())

    def _draw_uniform(self, depth: int) -> float:
        if self._generator is None:
            zero, one = torch.zeros((), dtype=self._dtype), torch.ones((), dtype=self._dtype)
            return pyro.sample("rand_t={}_treedepth={}".format(self._t, depth), dist.Uniform(zero, one)).item()
        return torch.rand((), dtype=self._dtype, generator=self._generator).item()

    # -- setup ---------------------------------------------------------------------------------
    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        super().setup(warmup_steps, *args, **kwargs)
        self._reset_records()
        self._mass_key = None
        order = [n for block in self.mass_matrix_adapter.inverse_mass_matrix for n in block]
        if order != list(self.flat_potential.names):
            raise ValueError(
                f"FlatNUTS needs the mass-matrix blocks in sorted site order "
                f"{list(self.flat_potential.names)}, got {order}; use full_mass=False or True"
            )

    def _flat_mass(self) -> tuple[Tensor, Tensor, bool]:
        """Inverse mass matrix and ``M^{-1/2}`` (Pyro's upper Cholesky factor) over flat ``q``."""
        imm = self.mass_matrix_adapter.inverse_mass_matrix
        key = tuple(id(v) for v in imm.values())
        if key != self._mass_key:
            blocks = list(imm.values())
            if all(b.dim() == 1 for b in blocks):
                minv = torch.cat(blocks)
                self._mass = (minv, minv.sqrt(), True)
            else:
                mats = [torch.diag(b) if b.dim() == 1 else b for b in blocks]
                minv = torch.block_diag(*mats)
                sqrt_inv = torch.block_diag(
                    *[torch.diag(b.sqrt()) if b.dim() == 1 else torch.linalg.cholesky(b).t()
                      for b in blocks])  # fmt: skip
                self._mass = (minv, sqrt_inv, False)
            self._mass_key = key
        return self._mass

    # -- one NUTS transition ---------------------------------------------------------------------
    def sample(self, params: dict) -> dict:
        t0 = time.perf_counter()
        out, stats = self._flat_sample(params)  # Pyro's adaptation (step-size search) needs grad mode
        self._record(*stats, time.perf_counter() - t0)
        return out

    def _leaf(self, q: Tensor, r: Tensor, g: Tensor, eps: float) -> tuple:
        minv, sqrt_inv, diag = self._m
        r = torch.add(r, g, alpha=-0.5 * eps)
        if diag:
            q = torch.addcmul(q, minv, r, value=eps)
        else:
            q = torch.add(q, torch.mv(minv, r), alpha=eps)
        pe, g = self._vg(q)
        r = torch.add(r, g, alpha=-0.5 * eps)
        u = sqrt_inv * r if diag else torch.mv(sqrt_inv, r)
        return q, r, u, g, float(pe), 0.5 * torch.dot(u, u).item()

    def _flat_is_turning(self, u_left: Tensor, u_right: Tensor, r_sum: Tensor) -> bool:
        rho = torch.add(r_sum, u_left + u_right, alpha=-0.5)
        left, right = torch.mv(torch.stack((u_left, u_right)), rho).tolist()
        return left <= 0 or right <= 0

    def _build_basetree_flat(self, q, r, g, direction, energy_current) -> tuple:
        eps = self.step_size if direction == 1 else -self.step_size
        q, r, u, g, pe, ke = self._leaf(q, r, g, eps)
        energy_new = pe + ke
        if math.isnan(energy_new):
            energy_new = math.inf
        delta = energy_new - energy_current  # = sliced energy: log_slice = -energy_current
        accept_prob = 1.0 if delta <= 0 else math.exp(-delta)
        return (q, r, u, g, q, r, u, g, q, pe, g, u, -delta, False,
                delta > self._max_sliced_energy, accept_prob, 1)  # fmt: skip

    def _build_tree_flat(self, q, r, g, direction, depth, energy_current) -> tuple:
        if depth == 0:
            return self._build_basetree_flat(q, r, g, direction, energy_current)
        half = self._build_tree_flat(q, r, g, direction, depth - 1, energy_current)
        if half[_TURN] or half[_DIV]:
            return half
        if direction == 1:
            other = self._build_tree_flat(half[_QR], half[_RR], half[_GR], direction, depth - 1,
                                          energy_current)  # fmt: skip
            left, right = half, other
        else:
            other = self._build_tree_flat(half[_QL], half[_RL], half[_GL], direction, depth - 1,
                                          energy_current)  # fmt: skip
            left, right = other, half
        weight = _logaddexp(half[_WEIGHT], other[_WEIGHT])
        r_sum = half[_RSUM] + other[_RSUM]
        # the same draw as pyro.sample("is_other_half_tree", dist.Bernoulli(probs=p_other))
        p_other = math.exp(other[_WEIGHT] - weight)
        prop = other if torch.bernoulli(self._p.fill_(p_other), generator=self._generator).item() == 1 else half
        turning = other[_TURN] or self._flat_is_turning(left[_UL], right[_UR], r_sum)
        return (left[_QL], left[_RL], left[_UL], left[_GL],
                right[_QR], right[_RR], right[_UR], right[_GR],
                prop[_QP], prop[_PEP], prop[_GP], r_sum, weight, turning, other[_DIV],
                half[_ACC] + other[_ACC], half[_NPROP] + other[_NPROP])  # fmt: skip

    def _flat_sample(self, params: dict) -> dict:
        pot = self.flat_potential
        z, pe_t, z_grads = self._fetch_from_cache()
        if z is None:
            z = params
            z_grads, pe_t = potential_grad(self.potential_fn, z)
            self._cache(z, pe_t, z_grads)
        self._dtype = pe_t.dtype
        self._p = torch.zeros((), dtype=self._dtype)
        self._m = self._flat_mass()
        q, g, pe = pot.pack(z).contiguous(), pot.pack(z_grads).contiguous(), float(pe_t)
        r_d, ru_d = self._sample_r(name="r_t={}".format(self._t))
        r = pot.pack(r_d).contiguous()
        u = torch.cat([v.reshape(-1) for v in ru_d.values()]) if len(ru_d) > 1 else next(iter(ru_d.values()))
        energy_current = 0.5 * torch.dot(u, u).item() + pe
        if self._ext is not None:
            minv, sqrt_inv, diag = (m.to(q.dtype) if isinstance(m, Tensor) else m for m in self._m)
            eps, max_sliced = float(self.step_size), float(self._max_sliced_energy)

            def build_tree(q, r, g, direction, depth):
                return self._ext.build_tree(self._tree_potential, q, r, g, direction, depth,
                                            energy_current, eps, max_sliced, minv, sqrt_inv, diag,
                                            self._generator)  # fmt: skip
        else:

            def build_tree(q, r, g, direction, depth):
                return self._build_tree_flat(q, r, g, direction, depth, energy_current)

        q_left = q_right = q
        r_left = r_right = r
        u_left = u_right = u
        g_left = g_right = g
        r_sum = u
        accepted = False
        sum_accept, num_proposals = 0.0, 0
        tree_weight = 0.0
        new_pe, new_g, new_q = pe, g, q
        depth = 0
        half = torch.tensor(0.5, dtype=self._dtype)
        with torch.no_grad():
            while depth < self._max_tree_depth:
                direction = self._draw_direction(depth, half)
                if direction == 1:
                    new = build_tree(q_right, r_right, g_right, 1, depth)
                    q_right, r_right, u_right, g_right = new[_QR], new[_RR], new[_UR], new[_GR]
                else:
                    new = build_tree(q_left, r_left, g_left, 0, depth)
                    q_left, r_left, u_left, g_left = new[_QL], new[_RL], new[_UL], new[_GL]
                sum_accept += new[_ACC]
                num_proposals += new[_NPROP]
                if new[_DIV]:
                    if self._t >= self._warmup_steps:
                        self._divergences.append(self._t - self._warmup_steps)
                    break
                if new[_TURN]:
                    break
                depth += 1
                d = new[_WEIGHT] - tree_weight
                p_new = math.exp(d) if d < 700.0 else math.inf
                if self._draw_uniform(depth - 1) < p_new:
                    accepted = True
                    new_q, new_pe, new_g = new[_QP], new[_PEP], new[_GP]
                r_sum = r_sum + new[_RSUM]
                if self._flat_is_turning(u_left, u_right, r_sum):
                    break
                tree_weight = _logaddexp(tree_weight, new[_WEIGHT])

        if accepted:
            z = pot.unpack(new_q)
            z_grads = pot.unpack(new_g)
            self._cache(z, torch.tensor(new_pe, dtype=self._dtype), z_grads)
        accept_prob = sum_accept / num_proposals
        self._t += 1
        if self._t > self._warmup_steps:
            n = self._t - self._warmup_steps
            if accepted:
                self._accept_cnt += 1
        else:
            n = self._t
            self._adapter.step(self._t, z, torch.tensor(accept_prob, dtype=self._dtype), z_grads)
        self._mean_accept_prob += (accept_prob - self._mean_accept_prob) / n
        # depth: completed doublings, Pyro's tree_depth (max_tree_depth when the tree saturated)
        return z.copy(), (num_proposals, new_pe if accepted else pe, accept_prob, depth)


# ----------------------------------------------------------------------------------------------
# several chains in one process
# ----------------------------------------------------------------------------------------------
_MASK64 = (1 << 64) - 1


def _sampling_seed(chain_seed: int) -> int:
    """Seed of a chain's NUTS generator: SplitMix64's mix of the chain seed (Steele, Lea & Flood
    2014, "Fast splittable pseudorandom number generators", OOPSLA), so that the sampling stream
    of chain seed ``s`` never coincides with an initialisation stream (``set_seed(s' + 1)``) of
    this or another chain."""
    z = (int(chain_seed) * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1  # 63 bits


def _chain_potentials(pot: FlatPotential, num_chains: int) -> list[FlatPotential]:
    """One potential per chain. A compiled potential keeps work buffers, so each further chain
    gets an independent ``clone()`` (same data); a Python potential is shared (its chains run one
    after another)."""
    if pot.compiled is None or not hasattr(pot.compiled, "clone"):
        return [pot] * num_chains
    out = [pot]
    for _ in range(num_chains - 1):
        core = pot.compiled.clone()
        out.append(FlatPotential(dict(pot.sites), core.value_and_grad, compiled=core))
    return out


def _format_seconds(sec: float) -> str:
    if sec < 120:
        return f"{sec:.0f} s"
    if sec < 7200:
        return f"{sec / 60:.1f} min"
    return f"{sec / 3600:.1f} h"


class _ChainRunner:
    """Runs several :class:`FlatNUTS` chains in this process, in Pyro's sampler protocol.

    ``run()`` yields ``(item, chain_id)`` as Pyro's samplers do for :class:`~pyro.infer.MCMC`:
    first the sites' shapes, then each kept draw as one flat tensor, then the chain's
    diagnostics. With ``parallel=True`` every chain runs in its own thread; the tree building
    (almost all of the time) runs in C++ without the GIL, so the chains advance in parallel on
    as many cores as there are. Otherwise the chains run one after another. Each chain owns its
    kernel, potential and generator, so the draws do not depend on the order of execution.

    After ``estimate_after`` iterations per running chain the total run time is estimated from
    the rate so far and said (a ``tqdm`` line above the progress bars when they are on and the
    estimate is 10 s or more, and an INFO record of the ``pyro_bnnlv`` logger either way); the
    bars' postfix keeps an updated estimate of the time left.

    While the chains run in threads, torch's intra-op thread count is ``cores // K`` (at least
    1; restored afterwards): the chains themselves occupy the cores, and BLAS calls of BLAS-sized
    layers would otherwise oversubscribe them.
    """

    def __init__(self, kernels: Sequence["FlatNUTS"], initial_params: Sequence[dict], warmup_steps: int,
                 num_samples: int, parallel: bool, progress: bool, estimate_after: int = 10) -> None:  # fmt: skip
        self.kernels = list(kernels)
        self.initial_params = list(initial_params)
        self.warmup_steps, self.num_samples = warmup_steps, num_samples
        self.parallel = parallel
        self.progress = progress
        self.estimate_after = estimate_after
        self.estimate: dict[str, float] | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def terminate(self, *args: Any, **kwargs: Any) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads = []

    def _chain(self, c: int):
        kernel = self.kernels[c]
        kernel.initial_params = self.initial_params[c]
        kernel.setup(self.warmup_steps)
        params = kernel.initial_params
        names = sorted(params)
        yield "structure", {n: params[n].shape for n in names}
        for i in range(self.warmup_steps + self.num_samples):
            if self._stop.is_set():
                return
            params = kernel.sample(params)
            if i < self.warmup_steps:
                yield "warmup", None
            else:
                yield "draw", torch.cat([params[n].reshape(-1) for n in names])
        yield "diagnostics", kernel.diagnostics()
        kernel.cleanup()

    def _events(self):
        K = len(self.kernels)
        if not self.parallel:
            for c in range(K):
                for kind, payload in self._chain(c):
                    yield c, kind, payload
            return
        events: queue.Queue = queue.Queue()

        def work(c: int) -> None:
            try:
                for kind, payload in self._chain(c):
                    events.put((c, kind, payload))
                events.put((c, "end", None))
            except BaseException as err:  # noqa: BLE001 -- re-raised in the caller's thread
                events.put((c, "error", err))

        self._stop.clear()
        self._threads = [threading.Thread(target=work, args=(c,), name=f"nuts-chain-{c}", daemon=True)
                         for c in range(K)]  # fmt: skip
        for t in self._threads:
            t.start()
        running = K
        while running:
            c, kind, payload = events.get()
            if kind == "error":
                self.terminate()
                raise payload
            if kind == "end":
                running -= 1
                continue
            yield c, kind, payload

    def run(self, *args: Any, **kwargs: Any):
        from pyro.infer.mcmc.logger import ProgressBar

        K, W, S = len(self.kernels), self.warmup_steps, self.num_samples
        total = K * (W + S)
        intra = torch.get_num_threads()
        if self.parallel:  # the chains occupy the cores: no intra-op threads on top (restored below),
            # and never more than the caller allowed with torch.set_num_threads
            torch.set_num_threads(min(intra, max(1, usable_cores() // K)))
        bar = ProgressBar(W, S, disable=not self.progress, num_bars=K)
        done = [0] * K
        t0 = time.perf_counter()
        last_postfix = t0
        running = K if self.parallel else 1
        try:
            for c, kind, payload in self._events():
                if kind in ("warmup", "draw"):
                    done[c] += 1
                    bar.update(pos=c)
                    if done[c] == W + 1 or (W == 0 and done[c] == 1):
                        bar.set_description("Sample" if K == 1 else f"Sample [{c + 1}]", pos=c)
                    now = time.perf_counter()
                    n = sum(done)
                    if self.estimate is None and n >= min(self.estimate_after * running, total):
                        self._say_estimate(bar, n, now - t0, total)
                    if self.progress and now - last_postfix > 0.5:
                        left = (now - t0) * (total - n) / n
                        for b in range(K):
                            bar.set_postfix({"left": _format_seconds(left)}, refresh=False, pos=b)
                        last_postfix = now
                if kind != "warmup":
                    yield payload, c
        finally:
            self.terminate()
            bar.close()
            torch.set_num_threads(intra)

    def _say_estimate(self, bar: Any, n: int, elapsed: float, total: int) -> None:
        est = elapsed * total / n
        K = len(self.kernels)
        cores = usable_cores()
        how = (f"{K} chains in parallel threads" + (f" on {cores} cores" if K > cores else "")
               if self.parallel and K > 1 else f"{K} chains one after another" if K > 1 else "1 chain")  # fmt: skip
        msg = (f"NUTS: estimated {_format_seconds(est)} in total for {how} x "
               f"{self.warmup_steps + self.num_samples} iterations, from the first {n} iterations "
               f"({1e3 * elapsed / n:.1f} ms per iteration; warm-up trees often grow later)")  # fmt: skip
        self.estimate = {"seconds": est, "from_iterations": n}
        _log.info(msg)
        if self.progress and not bar.disable and est >= 10:  # worth a line above the bars
            from tqdm import tqdm

            tqdm.write(msg, file=sys.stderr)


class _InProcessMCMC(MCMC):
    """Pyro's :class:`~pyro.infer.MCMC` (``get_samples``, ``summary``, ``diagnostics``) whose
    ``run`` advances several :class:`FlatNUTS` chains in this process (:class:`_ChainRunner`)
    instead of Pyro's one-after-another or multiprocessing samplers. ``kernel`` is chain 0's
    kernel, ``kernels`` all of them."""

    def __init__(self, kernels: Sequence["FlatNUTS"], num_samples: int, warmup_steps: int,
                 initial_params: Sequence[dict], parallel: bool, progress: bool) -> None:  # fmt: skip
        AbstractMCMC.__init__(self, kernels[0], len(kernels), None)
        self.kernels = list(kernels)
        self.warmup_steps, self.num_samples = warmup_steps, num_samples
        self.disable_validation = True
        self._samples = None
        self._args, self._kwargs = None, None
        self._diagnostics = [None] * len(kernels)
        self.sampler = _ChainRunner(kernels, initial_params, warmup_steps, num_samples, parallel,
                                    progress)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# initialisation
# ----------------------------------------------------------------------------------------------
def _is_plain_bnn(model: Any) -> bool:
    from ..models.bnn import BNN

    return isinstance(model, BNN) and type(model).forward is BNN.forward


def _prior_draw(model: Any, x: Tensor, y: Tensor, names: Sequence[str]) -> dict[str, Tensor]:
    with torch.no_grad():
        tr = poutine.trace(model).get_trace(x, y)
    return {k: tr.nodes[k]["value"].detach().clone() for k in names}


def _map_on_potential(pot: FlatPotential, q0: Tensor, steps: int, lr: float, n_obs: int) -> Tensor:
    """Adam on the flat potential (divided by the number of observations)."""
    q = torch.nn.Parameter(q0.detach().clone())
    opt = torch.optim.Adam([q], lr=lr)
    for step in range(steps):
        u, g = pot(q)
        if not torch.isfinite(u):
            raise FloatingPointError(f"MAP initialisation: non-finite potential at step {step}")
        q.grad = g / n_obs
        opt.step()
    return q.detach()


def _map_traced(model: Any, x: Tensor, y: Tensor, names: Sequence[str], steps: int, lr: float,
                seed: int) -> dict[str, Tensor]:  # fmt: skip
    from pyro.infer.autoguide import AutoDelta, init_to_sample

    from .svi import fit_svi

    guide = AutoDelta(model, init_loc_fn=init_to_sample)
    fit_svi(model, guide, x, y, num_steps=steps, lr=lr, seed=seed, progress=False)
    with torch.no_grad():
        med = guide.median(x, y)
    return {k: med[k].detach().clone() for k in names}


def _initial_values(
    model: Any, x: Tensor, y: Tensor, init: Any, names: Sequence[str], shapes: Mapping[str, Any],
    pot: FlatPotential | None, num_chains: int, base: int, map_steps: int, map_lr: float,
) -> dict[str, Tensor]:  # fmt: skip
    """``{site: (num_chains, *shape)}`` initial values in the constrained space; chain ``c``'s
    depend only on its chain seed ``base + c``."""
    from .svi import train_map

    if isinstance(init, Mapping):
        out = {}
        for k in names:
            if k not in init:
                raise ValueError(f"init lacks site {k!r}; the model's latent sites are {list(names)}")
            v = torch.as_tensor(init[k]).detach()
            shape = tuple(shapes[k])
            if tuple(v.shape) == shape:
                v = v.expand(num_chains, *shape)
            elif tuple(v.shape) != (num_chains, *shape):
                raise ValueError(
                    f"init[{k!r}] must have shape {shape} or {(num_chains, *shape)}; got {tuple(v.shape)}"
                )
            out[k] = v.clone()
        return out
    if init not in ("map", "prior"):
        raise ValueError(f"init must be 'map', 'prior' or a dict of site values; got {init!r}")
    draws: list[dict[str, Tensor]] = []
    for c in range(num_chains):
        set_seed(base + c + 1)
        if init == "prior":
            draws.append(_prior_draw(model, x, y, names))
        elif pot is not None:
            # Adam on U / N from the network's own initialisation: for a BNN the objective and
            # the start of train_map, on the fast potential (no autograd)
            start = _prior_draw(model, x, y, names)
            if "w" in start and hasattr(getattr(model, "net", None), "init_weights"):
                start["w"] = model.net.init_weights(torch.Generator().manual_seed(base + c)).to(x.dtype)
            q = _map_on_potential(pot, pot.pack(start), map_steps, map_lr, x.shape[0])
            draws.append({k: v.clone() for k, v in pot.unpack(q).items()})
        elif _is_plain_bnn(model):
            w = train_map(model, x, y, num_steps=map_steps, lr=map_lr, seed=base + c, progress=False)
            draws.append({"w": w})
        else:
            draws.append(_map_traced(model, x, y, names, map_steps, map_lr, base + c))
    return {k: torch.stack([d[k] for d in draws]) for k in names}


def _check_flat_potential(pot: FlatPotential, traced_potential: Callable, params: dict[str, Tensor],
                          model_name: str) -> None:  # fmt: skip
    """Compare the fast potential with Pyro's traced one at ``params`` and a perturbed point."""
    gen = torch.Generator().manual_seed(12345)
    q0 = pot.pack(params).detach()
    for q in (q0, q0 + 0.05 * torch.randn(q0.shape, generator=gen, dtype=q0.dtype)):
        u_fast, g_fast = pot(q)
        z = {k: v.clone() for k, v in pot.unpack(q).items()}
        g_dict, u_ref = potential_grad(traced_potential, z)
        g_ref = pot.pack(g_dict)
        tol_u = 1e-4 * (1.0 + abs(float(u_ref)))
        tol_g = 1e-3 * (1.0 + float(g_ref.abs().max()))
        if abs(float(u_fast) - float(u_ref)) > tol_u or float((g_fast - g_ref).abs().max()) > tol_g:
            raise ValueError(
                f"the fast potential of {model_name} disagrees with the traced Pyro model: "
                f"U = {float(u_fast):.6g} vs {float(u_ref):.6g}, max |grad difference| = "
                f"{float((g_fast - g_ref).abs().max()):.3g}. Check nuts_potential (sites, signs, "
                "normalising constants), or pass potential='traced'"
            )


# ----------------------------------------------------------------------------------------------
# run_nuts
# ----------------------------------------------------------------------------------------------
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
            Python; ``torch.compile`` has a ~26 us call overhead per potential evaluation;
            AOTInductor costs ~25 s of compilation per model and data set), the C++ core does
            (26 -> 12.6 us per value-and-gradient, 18 -> 3.4 us of tree overhead per step).
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
        mp_context: multiprocessing context for Pyro's parallel chains (traced path and
            ``kernel="pyro"``).

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
    model_name = type(model).__name__
    t_start = time.perf_counter()
    set_seed(seed)

    # the potential
    if isinstance(potential, FlatPotential):
        pot: FlatPotential | None = potential
    elif potential in ("auto", "fast"):
        pot = flat_potential(model, x, y)
        if pot is None and potential == "fast":
            raise ValueError(
                f"{model_name} has no fast potential: define {model_name}.nuts_potential(x, y) "
                "returning a pyro_bnnlv.infer.nuts.FlatPotential, or use potential='traced'"
            )
    elif potential == "traced":
        pot = None
    else:
        raise ValueError(
            f"potential must be 'auto', 'fast', 'traced' or a FlatPotential, got {potential!r}"
        )

    # Pyro's view of the model: latent sites, transforms, traced potential (for init and checks)
    _, traced_pot, transforms, proto = initialize_model(model, model_args=(x, y))
    latent = [
        name for name, site in proto.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    ]  # fmt: skip
    shapes = {k: proto.nodes[k]["value"].shape for k in latent}
    if pot is not None and sorted(latent) != list(pot.names):
        raise ValueError(
            f"the fast potential's sites {list(pot.names)} differ from {model_name}'s latent "
            f"sites {sorted(latent)}"
        )
    if pot is not None:
        for k in pot.names:
            if tuple(pot.sites[k]) != tuple(shapes[k]):
                raise ValueError(
                    f"fast potential site {k!r} has shape {tuple(pot.sites[k])}, the model's has "
                    f"{tuple(shapes[k])}"
                )

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
        mcmc: MCMC = _InProcessMCMC(kernels, num_samples, warmup_steps, starts, parallel, progress)
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
        initial = unconstrained if num_chains > 1 else {k: v[0] for k, v in unconstrained.items()}
        set_seed(base + 7)
        with warnings.catch_warnings():  # said above, with the reason and the alternative
            warnings.filterwarnings("ignore", message="num_chains=.*Chains will be drawn sequentially")
            mcmc = MCMC(nuts, num_samples=num_samples, warmup_steps=warmup_steps,
                        initial_params=initial, num_chains=num_chains,
                        disable_progbar=not progress, mp_context=mp_context)  # fmt: skip
        if pot is None:
            mcmc.run(x, y)
        else:
            mcmc.run()
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
