r"""``Trace_ELBO`` with the KL terms of named Gaussian sites in closed form.

Pradier, Pan, Yao, Ghosh & Doshi-Velez (2018), arXiv:1811.07006, eq. 5: the projected BNN's ELBO
is

.. math::

    \mathcal L(\lambda) = \mathbb E_q[\log p(y \mid x, g_\phi(z))]
        - D_{KL}(q(z) \,\|\, p(z)) - D_{KL}(q(\phi) \,\|\, p(\phi)),

with the expectation estimated from reparameterised draws and, below eq. 6, "the KL-divergence
terms in Eq. (5) can be computed in closed form, as all distributions [...] are
normal-distributed". :class:`ClosedFormKLElbo` is that estimator for any model and guide: the
sites named in ``sites`` contribute ``-KL(q || p)`` by :func:`torch.distributions.kl_divergence`
instead of ``log p(v) - log q(v)`` at the particles' draws ``v``; every other site is treated
as ``Trace_ELBO`` treats it. Both estimators are unbiased for the same ELBO; the closed form has
no Monte-Carlo noise in those terms and is computed once per step rather than once per particle.

The named sites must be ``Normal`` or ``Independent(Normal)`` in both the model and the guide
(Pyro's ``AutoNormal`` and ``pyro.sample(name, dist.Normal(...).to_event(k))``), reparameterised,
and not subsampled. Particles are vectorised (``vectorize_particles=True``).

**Fused steps.** For a model of this library whose latent sites are all named here (a
:class:`~pyro_bnnlv.models.BNN`'s ``w``; a single-task
:class:`~pyro_bnnlv.models.ProjectedBNN`'s ``z`` and ``phi``: Bayes-by-Backprop and the projected
BNN's stage 3) and Pyro's ``AutoNormal`` over them, ``loss_and_grads`` computes the same
estimator without Pyro's traces,

.. math::

    \hat{\mathcal L} = \frac{1}{S} \sum_{s=1}^S \frac{N}{B} \sum_{n \in \mathcal B}
        \log p(y_n \mid x_n, w^{(s)}) - \sum_{v \in \text{sites}} D_{KL}(q(v) \,\|\, p(v)),
    \qquad w^{(s)} = \text{model.weights\_from\_latents}(\mu + \sigma \odot
        \epsilon^{(s)}),

drawing the random numbers in Pyro's order, so that a fused step and a traced one give the same
loss and gradients up to rounding. A model opts in with ``closed_form_priors(dtype)`` and
``weights_from_latents(values)``; ``fit_svi`` checks the fused steps against the traced twin
(:meth:`ClosedFormKLElbo.eager_twin`) as it checks compiled losses, and finishes traced on a
mismatch. What runs traced: :mod:`~pyro_bnnlv.infer.elbos.fused` (and a multi-task model).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import torch
import pyro.util
from pyro.distributions import Delta
from pyro.distributions.torch_distribution import MaskedDistribution
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.infer.util import torch_item
from pyro.nn import PyroModule, pyro_method
from pyro.poutine.messenger import Messenger
from torch import Tensor
from torch.distributions import Independent, Normal, constraints, kl_divergence

from ..._checks import check_int
from .fused import forward_replaced, guide_locs_and_scales, only_param_capture_active

__all__ = ["ClosedFormKLElbo"]

_PARTICLE_PLATE = "num_particles_vectorized"  # the plate Pyro's ELBO vectorises particles in
_AUX = "_unconstrained"  # AutoNormal's auxiliary site of a latent


class _MaskLogDensities(Messenger):
    """``fn.mask(False)`` at the named sites: their draws are unchanged, their log-densities are
    zero without being computed (Pyro's ``MaskedDistribution`` short-circuits ``mask=False``)."""

    def __init__(self, names: frozenset[str]) -> None:
        super().__init__()
        self.names = names

    def _pyro_sample(self, msg: dict) -> None:
        if msg["name"] in self.names:
            msg["fn"] = msg["fn"].mask(False)


def _one_particle(site: dict, role: str):
    """The distribution of a traced site without the particle plate's expansion (index 0 of that
    dim; the site lies in no subsampled plate, so all particles share its parameters)."""
    fn = site["fn"]
    while isinstance(fn, MaskedDistribution):
        fn = fn.base_dist
    frames = [f for f in site["cond_indep_stack"] if f.name == _PARTICLE_PLATE]
    if not frames:
        return fn
    return _select(fn, frames[0].dim, site["name"], role)  # dim: negative, relative to the batch shape


def _select(fn, dim: int, name: str, role: str):
    if isinstance(fn, Independent):
        base = _select(fn.base_dist, dim - fn.reinterpreted_batch_ndims, name, role)
        return Independent(base, fn.reinterpreted_batch_ndims)
    if not isinstance(fn, Normal):
        raise ValueError(
            f"ClosedFormKLElbo: site {name!r} has a {type(fn).__name__} in the {role}; the closed form "
            "is implemented for Normal and Independent(Normal) sites: leave it out of sites="
        )
    return Normal(fn.loc.select(dim, 0), fn.scale.select(dim, 0), validate_args=False)


@pyro_method
def _model_priors(model, dtype: torch.dtype) -> dict[str, Normal] | None:
    """``model.closed_form_priors(dtype)`` inside the model's Pyro context (a learned prior
    parameter is a ``pyro.param`` there, as in ``forward``)."""
    return model.closed_form_priors(dtype)


@pyro_method
def _model_log_lik(model, draws: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """``sum_n log p(y_n | x_n, w^(s))`` over the batch and the ``S`` draws, inside the model's
    Pyro context (a learned noise scale is a ``pyro.param`` there, as in ``forward``)."""
    f = model._plate_f(x, model.weights_from_latents(draws))
    return model._likelihood(f).log_prob(model._observed(y)).sum()


class ClosedFormKLElbo(Trace_ELBO):
    """``Trace_ELBO`` where the sites in ``sites`` contribute their closed-form ``-KL(q || p)``
    (module docstring; Pradier et al. 2018, arXiv:1811.07006, eq. 5).

    Args:
        sites: names of latent sites with a closed-form KL between guide and prior, e.g.
            ``("z", "phi")`` for :class:`~pyro_bnnlv.models.ProjectedBNN`.
        num_particles: reparameterised draws for the remaining expectation (vectorised).
        max_plate_nesting: as for ``Trace_ELBO``.
        fused: compute the steps of a library model with an ``AutoNormal`` guide without
            Pyro's traces (module docstring, 'Fused steps'); ``False``: always traced.

    Example::

        loss = pb.ClosedFormKLElbo(("z", "phi"), num_particles=20)
        pb.fit_svi(model, guide, x, y, loss=loss)
    """

    def __init__(
        self, sites: Sequence[str], num_particles: int = 1, max_plate_nesting: float = float("inf"), fused: bool = True
    ) -> None:
        if isinstance(sites, str) or not sites or not all(isinstance(s, str) for s in sites):
            raise ValueError(f"sites must be a non-empty sequence of site names, e.g. ('z', 'phi'); got {sites!r}")
        if not isinstance(fused, bool):
            raise TypeError(f"fused must be True or False, got {fused!r}")
        check_int(num_particles, "num_particles")
        super().__init__(num_particles=num_particles, max_plate_nesting=max_plate_nesting, vectorize_particles=True)
        self.sites = frozenset(sites)
        self.fused = fused
        # the (model, guide) pairs a traced step has set up, as weak references; a dict named
        # _compiled, so that jit_guard.forget_compiled (called by fit_svi) clears it: every fit
        # starts with a traced step, which creates the parameters fit_svi collects
        self._compiled: dict[tuple[int, int], tuple[weakref.ref, weakref.ref]] = {}

    def eager_twin(self) -> "ClosedFormKLElbo":
        """The same estimator with the same settings, always computed from Pyro's traces (what
        fused steps are checked against)."""
        twin = ClosedFormKLElbo(
            tuple(sorted(self.sites)),
            num_particles=self.num_particles,
            max_plate_nesting=self.max_plate_nesting,
            fused=False,
        )
        twin.__dict__.update({k: v for k, v in vars(self).items() if k not in ("fused", "_compiled")})
        return twin

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        """``Trace_ELBO.loss_and_grads`` with the closed-form KL terms: the loss, gradients
        accumulated in the parameters' ``.grad``; fused when possible (module docstring)."""
        plan = self._fused_plan(model, guide, args, kwargs) if self.fused else None
        if plan is None:
            value = super().loss_and_grads(model, guide, *args, **kwargs)
            if self.fused and isinstance(guide, torch.nn.Module) and isinstance(model, torch.nn.Module):
                for key, (m, g) in list(self._compiled.items()):  # forget pairs no longer alive
                    if m() is None or g() is None:
                        del self._compiled[key]
                self._compiled[id(model), id(guide)] = (weakref.ref(model), weakref.ref(guide))
            return value
        return self._fused_loss_and_grads(model, guide, *plan, *args, **kwargs)

    def _fused_plan(self, model, guide, args, kwargs) -> tuple[list[str], dict[str, Normal]] | None:
        """The guide's sites in its order and the model's priors of them if the next step can be
        fused, else ``None`` (then the step runs traced, which also raises Pyro's own errors on
        bad input)."""
        refs = self._compiled.get((id(model), id(guide)))
        if refs is None or refs[0]() is not model or refs[1]() is not guide:
            return None  # no traced step of this pair yet (or ids reused by new objects)
        if not only_param_capture_active():
            return None  # a poutine handler around the call (mask, scale, condition, ...) acts on sites
        if len(args) != 2 or not all(isinstance(a, torch.Tensor) for a in args) or set(kwargs) - {"batch_size"}:
            return None
        x, y = args
        batch_size = kwargs.get("batch_size")
        if x.device.type != "cpu" or (batch_size is not None and not 0 < batch_size <= len(x)):
            return None  # Pyro's minibatch draw on another device; a batch size Pyro refuses
        if not isinstance(guide, AutoNormal) or not isinstance(model, PyroModule) or guide.create_plates is not None:
            return None  # create_plates: the guide draws the minibatch before the latents
        if any(forward_replaced(m) for m in (model, guide)):
            return None
        if type(guide).forward is not AutoNormal.forward:
            return None
        priors_of = getattr(model, "closed_form_priors", None)
        if not callable(priors_of) or not callable(getattr(model, "weights_from_latents", None)):
            return None
        priors = _model_priors(model, x.dtype)
        if priors is None or set(priors) != self.sites:
            return None
        names = []
        for name, site in guide.prototype_trace.iter_stochastic_nodes():
            support = site["fn"].support
            while isinstance(support, constraints.independent):
                support = support.base_constraint
            if type(support) is not type(constraints.real) or any(f.vectorized for f in site["cond_indep_stack"]):
                return None  # a constrained site (a transform in the guide) or one inside a plate
            names.append(name)
        return (names, priors) if set(names) == self.sites else None

    def _fused_loss_and_grads(
        self,
        model,
        guide: AutoNormal,
        sites: list[str],
        priors: dict[str, Normal],
        x: Tensor,
        y: Tensor,
        batch_size: int | None = None,
    ) -> float:
        model.check_data(x, y)  # what forward checks first (clear errors on bad data)
        if callable(getattr(model, "_check_dtype", None)):
            model._check_dtype(x)
        S = self.num_particles
        draws, qs = {}, {}
        for name, (loc, scale) in zip(sites, guide_locs_and_scales(guide, sites)):
            # the guide's order, S draws each: AutoNormal's rsample inside the particle plate
            qs[name] = Normal(loc, scale, validate_args=False)  # the scale is positive by its constraint
            draws[name] = qs[name].rsample((S,))
        N = x.shape[0]
        if batch_size is None or batch_size >= N:  # pyro.plate's subsample: all of it, or randperm[:B]
            x_b, y_b, factor = x, y, 1.0
        else:
            idx = torch.randperm(N, device=x.device)[:batch_size].clone()
            x_b, y_b, factor = x[idx], y[idx], N / batch_size
        log_lik = _model_log_lik(model, draws, x_b, y_b)
        kl = sum(kl_divergence(qs[name], priors[name]).sum() for name in sites)
        loss = kl - factor * log_lik / S
        if loss.requires_grad:  # as Trace_ELBO: nothing to differentiate (no_grad, frozen parameters)
            loss.backward(retain_graph=self.retain_graph)
        value = torch_item(loss)
        pyro.util.warn_if_nan(value, "loss")
        return value

    def _get_trace(self, model, guide, args, kwargs):
        guide_sites = self.sites | {name + _AUX for name in self.sites}
        return super()._get_trace(
            _MaskLogDensities(self.sites)(model), _MaskLogDensities(guide_sites)(guide), args, kwargs
        )

    def _guide_site(self, guide_trace, name: str) -> dict:
        """The guide's density of ``name``: the site itself, or for Pyro's ``AutoNormal`` (a Delta
        at ``name`` over an auxiliary Normal ``name + "_unconstrained"``) the auxiliary site,
        provided the transform between them is the identity (a real-valued site)."""
        site = guide_trace.nodes[name]
        fn = site["fn"]
        while isinstance(fn, MaskedDistribution):
            fn = fn.base_dist
        if not isinstance(fn, Delta):
            return site
        aux = guide_trace.nodes.get(name + _AUX)
        if aux is None or not torch.equal(aux["value"], site["value"]):
            raise ValueError(
                f"ClosedFormKLElbo: the guide's site {name!r} is a point mass (Delta) with no Normal "
                f"{name + _AUX!r} behind it by the identity (AutoNormal on a real-valued site); a "
                "constrained or point-mass site has no closed-form KL here: leave it out of sites="
            )
        return aux

    def kl_terms(self, model_trace, guide_trace) -> dict[str, Tensor]:
        """``{site: KL(q || p)}`` (summed over the site's batch and event dims) from two traces."""
        out = {}
        for name in sorted(self.sites):
            if model_trace.nodes.get(name, {}).get("is_observed"):
                raise ValueError(f"ClosedFormKLElbo: site {name!r} is observed in the model; name latent sites only")
            if name not in guide_trace.nodes or name not in model_trace.nodes:
                raise ValueError(
                    f"ClosedFormKLElbo: the model or guide has no sample site {name!r} (sites={sorted(self.sites)})"
                )
            g, m = self._guide_site(guide_trace, name), model_trace.nodes[name]
            for site, role in ((g, "guide"), (m, "model")):
                if site["scale"] is not None and not (isinstance(site["scale"], (int, float)) and site["scale"] == 1.0):
                    raise ValueError(
                        f"ClosedFormKLElbo: site {name!r} is scaled or subsampled in the {role}; "
                        "its closed-form KL would need the same scale"
                    )
            q, p = _one_particle(g, "guide"), _one_particle(m, "model")
            if not q.has_rsample:
                raise ValueError(f"ClosedFormKLElbo: the guide's site {name!r} is not reparameterised")
            kl = kl_divergence(q, p)
            other_plates = math.prod(f.size for f in g["cond_indep_stack"] if f.name != _PARTICLE_PLATE)
            if kl.numel() != other_plates:  # the particle dim not found: Pyro renamed its plate?
                raise RuntimeError(
                    f"ClosedFormKLElbo: site {name!r}'s KL has {kl.numel()} terms where its plates give "
                    f"{other_plates}: the vectorised particle plate {_PARTICLE_PLATE!r} of this Pyro "
                    "version was not recognised; pin pyro-ppl or update pyro_bnnlv.infer.elbos.closed_form_kl"
                )
            out[name] = kl.sum()
        return out

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        loss, surrogate = super()._differentiable_loss_particle(model_trace, guide_trace)
        # one vectorised "particle" holds all num_particles draws; the caller divides by num_particles
        kl = sum(self.kl_terms(model_trace, guide_trace).values()) * self.num_particles
        return loss + torch_item(kl), surrogate + kl

    def loss(self, model, guide, *args, **kwargs) -> float:
        with torch.no_grad():
            return torch_item(self.differentiable_loss(model, guide, *args, **kwargs))
