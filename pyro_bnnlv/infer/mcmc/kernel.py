r"""The NUTS kernels: :class:`FlatNUTS` (Pyro's multinomial NUTS on one flat tensor, its tree built in
C++ or by the Python twin of the same recursion) and ``CountingNUTS`` (Pyro's stock ``NUTS`` that
counts leapfrog steps), both recording per-draw statistics (``_RecordingMixin``).

A (sub)tree of the Python builder is a :class:`TreeState` (the fields of Pyro's ``_TreeInfo``);
the compiled core returns the same 17 values in the same order.

* ``kernel="pyro"`` of :func:`~pyro_bnnlv.infer.mcmc.nuts.run_nuts`: Pyro's stock
  ``NUTS(potential_fn=...)``. Its tree building works on dicts of tensors with 0-dim tensor
  arithmetic and a ``pyro.sample`` per tree merge (its cost: docs/design-notes.md,
  'infer.mcmc.kernel').
* ``kernel="flat"`` (default): :class:`FlatNUTS`, a subclass of Pyro's ``NUTS`` that runs the
  *same* algorithm -- multinomial NUTS with Pyro's tree recursion, generalised U-turn criterion,
  divergence threshold, the same random draws in the same order, and Pyro's own step-size and
  mass-matrix adaptation (``WarmupAdapter``) -- but keeps the state in one flat tensor and the
  scalar bookkeeping in plain floats, and builds each tree in C++ (the compiled core of
  :func:`pyro_bnnlv._compiled.nuts_extension`, built on first use; a Python twin of the same recursion is
  the fallback). With a float64 potential it reproduces Pyro's ``NUTS(potential_fn=...)`` draw
  for draw up to rounding, with either tree (tested).

``FlatNUTS`` uses private attributes of Pyro's ``HMC``/``NUTS`` (``_t``, ``_warmup_steps``,
``_adapter``, ``_cache``, ...); ``pyro-ppl`` is pinned to the tested minor version and
``tests/test_pyro_private_api.py`` fails, naming the attribute, when one of them changes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import NUTS
from pyro.ops.integrator import potential_grad
from torch import Tensor

from ..._compiled import resolve_nuts_extension as resolve_extension
from ...models.potential import FlatPotential

__all__ = ["CountingNUTS", "FlatNUTS", "TreeState"]


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
        self._records = {
            "num_steps": [],
            "potential_energy": [],
            "accept_prob": [],
            "tree_depth": [],
            "seconds": [],
            "warmup_num_steps": [],
            "warmup_seconds": [],
        }

    def _record(self, num_steps: int, potential_energy: float, accept_prob: float, depth: int, seconds: float) -> None:
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


class CountingNUTS(_RecordingMixin, NUTS):
    """Pyro's stock ``NUTS`` that counts leapfrog steps (potential evaluations) per draw."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._calls = 0
        self._threads = torch.get_num_threads()  # a chain in a spawned process keeps the caller's
        self._reset_records()

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        if torch.get_num_threads() != self._threads:  # a fresh process starts with one per core
            torch.set_num_threads(self._threads)
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


class TreeState(NamedTuple):
    """A NUTS (sub)tree over flat tensors: the fields of Pyro's ``_TreeInfo``, in its order.

    The compiled core (``build_tree`` of :func:`pyro_bnnlv._compiled.nuts_extension`) returns the same 17
    values as a plain tuple in this order; :meth:`FlatNUTS._flat_sample` wraps it with
    ``TreeState._make``.
    """

    q_left: Tensor  #: position of the leftmost leaf
    r_left: Tensor  #: its momentum
    u_left: Tensor  #: its unscaled momentum ``M^{-1/2} r`` (for the U-turn test)
    g_left: Tensor  #: its potential gradient
    q_right: Tensor  #: position of the rightmost leaf
    r_right: Tensor
    u_right: Tensor
    g_right: Tensor
    q_proposal: Tensor  #: the subtree's proposal (multinomial draw among its leaves)
    pe_proposal: float  #: its potential energy
    g_proposal: Tensor  #: its potential gradient
    r_sum: Tensor  #: sum of the leaves' unscaled momenta
    weight: float  #: log of the sum of the leaves' ``exp(-sliced energy)``
    turning: bool  #: a U-turn was found inside the subtree
    diverging: bool  #: a leaf's energy error exceeded Pyro's divergence threshold
    sum_accept_probs: float  #: sum of the leaves' Metropolis acceptance probabilities
    num_proposals: int  #: number of leaves (leapfrog steps)


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
    drawing the same random numbers in the same order, but on single flat tensors with the
    energies, tree weights and acceptance probabilities as Python floats. Only multinomial
    sampling (Pyro's default) is implemented.

    The tree recursion runs in C++ (``build_tree`` of :func:`pyro_bnnlv._compiled.nuts_extension`,
    the line-for-line twin of :meth:`_build_tree_flat`) when the compiled core builds, calling the
    potential's compiled twin (:attr:`FlatPotential.compiled`) or its ``value_and_grad``; the top
    level of each draw and all of Pyro's adaptation stay in Python.

    Random numbers: without ``generator``, Pyro/torch's global generator, exactly as Pyro's
    ``NUTS`` (the same chain from the same seed). With a ``torch.Generator`` every draw of the
    chain comes from it by the same torch calls in the same order, so a generator seeded ``s``
    reproduces the global one seeded ``s``, and chains with their own generators can run in
    parallel threads without touching each other's streams.

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

    def __init__(
        self,
        potential: FlatPotential,
        compiled: bool | None = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> None:
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
            sites: torch.normal(
                torch.zeros(size, dtype=pe.dtype), torch.ones(size, dtype=pe.dtype), generator=self._generator
            )
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
                    *[torch.diag(b.sqrt()) if b.dim() == 1 else torch.linalg.cholesky(b).t() for b in blocks]
                )
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

    def _build_basetree_flat(self, q, r, g, direction, energy_current) -> TreeState:
        eps = self.step_size if direction == 1 else -self.step_size
        q, r, u, g, pe, ke = self._leaf(q, r, g, eps)
        energy_new = pe + ke
        if math.isnan(energy_new):
            energy_new = math.inf
        delta = energy_new - energy_current  # = sliced energy: log_slice = -energy_current
        accept_prob = 1.0 if delta <= 0 else math.exp(-delta)
        return TreeState(
            q, r, u, g, q, r, u, g, q, pe, g, u, -delta, False, delta > self._max_sliced_energy, accept_prob, 1
        )

    def _build_tree_flat(self, q, r, g, direction, depth, energy_current) -> TreeState:
        if depth == 0:
            return self._build_basetree_flat(q, r, g, direction, energy_current)
        half = self._build_tree_flat(q, r, g, direction, depth - 1, energy_current)
        if half.turning or half.diverging:
            return half
        if direction == 1:
            other = self._build_tree_flat(
                half.q_right, half.r_right, half.g_right, direction, depth - 1, energy_current
            )
            left, right = half, other
        else:
            other = self._build_tree_flat(half.q_left, half.r_left, half.g_left, direction, depth - 1, energy_current)
            left, right = other, half
        weight = _logaddexp(half.weight, other.weight)
        r_sum = half.r_sum + other.r_sum
        # the same draw as pyro.sample("is_other_half_tree", dist.Bernoulli(probs=p_other))
        p_other = math.exp(other.weight - weight)
        prop = other if torch.bernoulli(self._p.fill_(p_other), generator=self._generator).item() == 1 else half
        turning = other.turning or self._flat_is_turning(left.u_left, right.u_right, r_sum)
        return TreeState(
            left.q_left,
            left.r_left,
            left.u_left,
            left.g_left,
            right.q_right,
            right.r_right,
            right.u_right,
            right.g_right,
            prop.q_proposal,
            prop.pe_proposal,
            prop.g_proposal,
            r_sum,
            weight,
            turning,
            other.diverging,
            half.sum_accept_probs + other.sum_accept_probs,
            half.num_proposals + other.num_proposals,
        )

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
                return TreeState._make(
                    self._ext.build_tree(
                        self._tree_potential,
                        q,
                        r,
                        g,
                        direction,
                        depth,
                        energy_current,
                        eps,
                        max_sliced,
                        minv,
                        sqrt_inv,
                        diag,
                        self._generator,
                    )
                )
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
                    q_right, r_right, u_right, g_right = new.q_right, new.r_right, new.u_right, new.g_right
                else:
                    new = build_tree(q_left, r_left, g_left, 0, depth)
                    q_left, r_left, u_left, g_left = new.q_left, new.r_left, new.u_left, new.g_left
                sum_accept += new.sum_accept_probs
                num_proposals += new.num_proposals
                if new.diverging:
                    if self._t >= self._warmup_steps:
                        self._divergences.append(self._t - self._warmup_steps)
                    break
                if new.turning:
                    break
                depth += 1
                d = new.weight - tree_weight
                p_new = math.exp(d) if d < 700.0 else math.inf
                if self._draw_uniform(depth - 1) < p_new:
                    accepted = True
                    new_q, new_pe, new_g = new.q_proposal, new.pe_proposal, new.g_proposal
                r_sum = r_sum + new.r_sum
                if self._flat_is_turning(u_left, u_right, r_sum):
                    break
                tree_weight = _logaddexp(tree_weight, new.weight)

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
