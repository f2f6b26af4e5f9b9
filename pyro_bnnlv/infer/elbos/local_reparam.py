r"""Mean-field VI with the local reparameterisation trick (Kingma, Salimans & Welling 2015).

Foong, Li, Hernández-Lobato & Turner (2019), arXiv:1906.11537, App. D, trains MFVI with this trick.
For a mean-field Gaussian ``q(w) = prod_i N(w_i; m_i, s_i^2)`` on the flat weights of an
:class:`~pyro_bnnlv.nets.MLP`, the pre-activations of layer ``l`` given its input ``h_n`` are
Gaussian with independent entries,

.. math::

    a_{nj} \mid h_n \sim \mathcal N\Big(\sum_i h_{ni} M_{ji} + m^b_j,\;
        \sum_i h_{ni}^2 S_{ji}^2 + (s^b_j)^2\Big),

so instead of one weight sample shared by the minibatch, every data point gets its own draw of
``a`` (equivalently, its own weight sample). Layer by layer this samples ``f(x_n; w)`` from its
exact marginal under ``q`` for every ``n``, hence

.. math::

    \mathbb E\big[\hat{\mathcal L}_{LR}\big]
    = \sum_n \mathbb E_{q}[\log p(y_n \mid x_n, w)] - \mathrm{KL}(q \,\|\, p)
    = \mathbb E\big[\hat{\mathcal L}_{\text{Trace\_ELBO}}\big]

(sec. 2's ELBO, the same in expectation as plain reparameterisation; tested), with lower variance
because the per-point terms are independent. The KL term is analytic by default
(``analytic_kl=True``) or the single-sample ``log q(w) - log p(w)`` of ``Trace_ELBO``.

Use it as the ``loss`` of :func:`~pyro_bnnlv.fit_svi` (or ``pyro.infer.SVI``) with an
``AutoNormal`` guide on a :class:`~pyro_bnnlv.models.BNN` whose network is an ``MLP``::

    guide = AutoNormal(model, init_scale=0.01, init_loc_fn=pb.init_to_network(model))
    pb.fit_svi(model, guide, x, y, num_steps=5000, loss=LocalReparamELBO(num_particles=8))

Minibatches (``batch_size=``) and a learned noise (``learn_noise=True``) work as with
``Trace_ELBO`` (read from the model's trace). For the pairs
:class:`~pyro_bnnlv.infer.elbos.fused.FusedTraceElbo` recognises on a
:class:`~pyro_bnnlv.models.BNN`, steps after the first are **fused** (no Pyro trace; the random
numbers drawn in the traced order, so values and gradients equal the traced ones);
``fused=False`` traces every step. The guide's ``"w"`` must be a diagonal Gaussian
(``Normal(loc, scale).to_event(1)``) and the model must have no latent sites besides ``"w"``.
"""

from __future__ import annotations

from typing import Any

import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer.elbo import ELBO
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from ..._mlp_kernels import mlp_local_reparam_sample
from ...nets import MLP
from .fused import FusedTraceElbo

__all__ = ["LocalReparamELBO", "local_reparam_forward"]


def local_reparam_forward(net: MLP, x: Tensor, loc: Tensor, scale: Tensor, num_particles: int = 1) -> Tensor:
    """Sample ``f(x_n; w_n)`` with independent ``w_n ~ N(loc, diag(scale^2))`` per point and
    particle by sampling pre-activations (module docstring): ``(num_particles, N, L)``."""
    if not isinstance(net, MLP):
        raise ValueError(f"the local reparameterisation needs an MLP network, got {type(net).__name__}")
    return mlp_local_reparam_sample(net.layers, net.activation_row, x, loc, scale, num_particles)


def _diag_gaussian(site: dict, name: str) -> tuple[Tensor, Tensor]:
    fn = site["fn"]
    base = fn.base_dist if isinstance(fn, dist.Independent) else fn
    if not isinstance(base, dist.Normal) or fn.event_dim != 1:
        raise ValueError(
            f"LocalReparamELBO needs a mean-field Gaussian guide on {name!r} (e.g. AutoNormal); "
            f"the guide's distribution there is {type(fn).__name__}"
        )
    return base.loc.expand(fn.event_shape), base.scale.expand(fn.event_shape)


class LocalReparamELBO(ELBO):
    """ELBO of a mean-field Gaussian guide estimated with the local reparameterisation trick.

    Args:
        num_particles: independent draws of the pre-activations per step (vectorised).
        analytic_kl: use the closed-form ``KL(q || p)`` (default) instead of the guide sample's
            ``log q(w) - log p(w)``.
        site, obs_site: names of the weight and observation sites.
        fused: compute steps of a recognised pair without Pyro's traces (module docstring).

    ``loss``, ``loss_and_grads`` and ``differentiable_loss`` all evaluate :meth:`elbo_estimate`.
    """

    def __init__(
        self,
        num_particles: int = 1,
        analytic_kl: bool = True,
        site: str = "w",
        obs_site: str = "obs",
        *,
        fused: bool = True,
    ) -> None:
        if not isinstance(num_particles, int) or num_particles < 1:
            raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}")
        if not isinstance(fused, bool):
            raise TypeError(f"fused must be True or False, got {fused!r}")
        super().__init__(num_particles=num_particles, max_plate_nesting=1)
        self.analytic_kl = bool(analytic_kl)
        self.site, self.obs_site = site, obs_site
        # recognises the pair and reads its parameters; the library's site names only
        self.fused = fused and (site, obs_site) == ("w", "obs")
        self._fuser = FusedTraceElbo() if self.fused else None

    def eager_twin(self) -> LocalReparamELBO | None:
        """The same estimator traced every step (``None`` if this one is not fused)."""
        if not self.fused:
            return None
        return LocalReparamELBO(self.num_particles, self.analytic_kl, self.site, self.obs_site, fused=False)

    def _get_trace(self, model: Any, guide: Any, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        """Model trace replayed against a guide trace (``ELBO``'s abstract hook)."""
        guide_tr = poutine.trace(guide).get_trace(*args, **kwargs)
        model_tr = poutine.trace(poutine.replay(model, trace=guide_tr)).get_trace(*args, **kwargs)
        return model_tr, guide_tr

    def elbo_estimate(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> Tensor:
        """A differentiable one-step estimate of the ELBO (average over ``num_particles``)."""
        if self._fuser is not None:
            pair = self._fuser._pair(model, guide, args, kwargs)
            if pair is not None and not pair.latent:
                return self._fused_estimate(pair, model, guide, *args, **kwargs)
        value = self._traced_estimate(model, guide, *args, **kwargs)
        if self._fuser is not None:
            self._fuser._register(model, guide)  # fused from the next step on, if it is a known pair
        return value

    def _fused_estimate(
        self, pair: Any, model: Any, guide: Any, x: Tensor, y: Tensor, batch_size: int | None = None
    ) -> Tensor:
        """:meth:`_traced_estimate` for a recognised BNN / mean-field pair, without traces."""
        fuser = self._fuser
        fuser._check_data(pair, model, x, y)
        p = fuser._parameters(pair, model, guide)
        loc, scale, sigma = p["loc_w"], p["scale_w"], p["sigma"]
        eps = torch.empty_like(loc).normal_()  # the guide's draw of w (traced: AutoNormal samples it)
        N = x.shape[0]
        idx = fuser._subsample(N, N if batch_size is None else batch_size)
        y = model._observed(y)
        x_b, y_b = (x, y) if idx is None else (x[idx], y[idx])
        log_lik = self._batch_log_lik(pair.net, x_b, y_b, loc, scale, sigma) * (N / y_b.shape[0])
        prior = dist.Normal(model._buffers["prior_loc"], model._buffers["prior_scale"])
        if self.analytic_kl:
            return log_lik - torch.distributions.kl_divergence(dist.Normal(loc, scale), prior).sum()
        w = loc + scale * eps
        return log_lik - (dist.Normal(loc, scale).log_prob(w).sum() - prior.log_prob(w).sum())

    def _batch_log_lik(self, net: MLP, x_b: Tensor, y_b: Tensor, loc: Tensor, scale: Tensor, sigma: Tensor) -> Tensor:
        """``log p(y_b | f)`` summed over the batch and averaged over ``num_particles`` draws of
        ``f`` from its local-reparameterisation marginals (:func:`local_reparam_forward`)."""
        f = local_reparam_forward(net, x_b, loc, scale, self.num_particles)  # (K, B, L)
        if f.shape[-1] == 1 and y_b.dim() == 1:
            f = f.squeeze(-1)
        return dist.Normal(f, sigma).log_prob(y_b).reshape(self.num_particles, -1).sum(-1).mean()

    def _traced_estimate(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> Tensor:
        model_tr, guide_tr = self._get_trace(model, guide, args, kwargs)
        net = getattr(model, "net", None)
        if not isinstance(net, MLP):
            raise ValueError("LocalReparamELBO needs a model with an MLP network at model.net (a pyro_bnnlv BNN)")
        latent = [
            n
            for n, s in model_tr.nodes.items()
            if s["type"] == "sample" and not s["is_observed"] and not site_is_subsample(s)
        ]
        if latent != [self.site]:
            raise ValueError(f"LocalReparamELBO handles models whose only latent site is {self.site!r}; got {latent}")
        if self.obs_site not in model_tr.nodes:
            raise ValueError(f"the model has no observation site {self.obs_site!r}")
        q_site = guide_tr.nodes.get(self.site + "_unconstrained", guide_tr.nodes[self.site])
        loc, scale = _diag_gaussian(q_site, self.site)
        obs = model_tr.nodes[self.obs_site]
        lik = obs["fn"]
        base = lik.base_dist if isinstance(lik, dist.Independent) else lik
        if not isinstance(base, dist.Normal):
            raise ValueError(f"the observation site must be Normal, got {type(base).__name__}")
        x = args[0] if args else kwargs["x"]
        idx = next(
            (s["value"] for s in model_tr.nodes.values() if s["type"] == "sample" and site_is_subsample(s)), None
        )
        x_b = x if idx is None else x[idx]
        log_lik = self._batch_log_lik(net, x_b, obs["value"], loc, scale, base.scale) * obs["scale"]
        prior = model_tr.nodes[self.site]["fn"]
        p_base = prior.base_dist if isinstance(prior, dist.Independent) else prior
        if self.analytic_kl:
            if not isinstance(p_base, dist.Normal):
                raise ValueError("analytic_kl=True needs a Normal prior on 'w'; use analytic_kl=False")
            kl = torch.distributions.kl_divergence(dist.Normal(loc, scale), p_base).sum()
        else:
            w = guide_tr.nodes[self.site]["value"]
            log_q = q_site["fn"].log_prob(q_site["value"])
            kl = log_q - prior.log_prob(w)
        return log_lik - kl

    def differentiable_loss(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> Tensor:
        return -self.elbo_estimate(model, guide, *args, **kwargs)

    def loss(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> float:
        with torch.no_grad():
            return float(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> float:
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        if loss.requires_grad:
            loss.backward()
        return float(loss.detach())
