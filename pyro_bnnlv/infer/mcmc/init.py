r"""Where NUTS starts, and which potential it evaluates: :func:`flat_potential` (a model's fast
potential, or ``None`` for the traced path), the chains' initial values (``_initial_values``:
MAP, prior draws or given values) and the check of the fast potential against Pyro's traced one
(``_check_flat_potential``).

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
:func:`~pyro_bnnlv.models.potential.mlp_regression_potential` already provides a hand-written
gradient::

    def nuts_potential(self, x, y):
        return mlp_regression_potential(self.net, x, y, prior_loc=self.prior_loc,
                                        prior_scale=self.prior_scale, noise_scale=self.noise_scale,
                                        latent_dim=self.latent_dim, latent_scale=self.latent_scale)

Site names, shapes and values are those of the Pyro model's unconstrained latent sites (here
all real-valued), ``U`` must include every constant (so the run-time check against the traced
model can compare values), and the sites are laid out in sorted name order in ``q``.

Initialisation
--------------
NUTS started far from the data (a prior draw, Pyro's default ``init_to_uniform``) spends its
warm-up in the steep region it starts in and on a BNN often never reaches the posterior bulk.
The default ``init="map"``
starts each chain at a MAP estimate from its own random network initialisation (``train_map``
for a BNN, Adam on the flat potential for other fast-path models, ``AutoDelta`` otherwise);
``init="prior"`` starts at prior draws; a dict gives explicit values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from pyro import poutine
from pyro.infer.autoguide import AutoDelta, init_to_sample
from pyro.infer.mcmc.util import initialize_model
from pyro.ops.integrator import potential_grad
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from ..._state import set_seed
from ...models.bnn import BNN
from ...models.potential import FlatPotential, mlp_classification_potential, mlp_of, mlp_regression_potential
from ..svi import fit_svi, train_map

__all__ = ["_check_flat_potential", "_initial_values", "_model_sites", "_resolve_potential", "flat_potential"]


def flat_potential(model: Callable[..., Any], x: Tensor, y: Tensor) -> FlatPotential | None:
    """The model's fast potential, or ``None`` if it has none (then NUTS traces the model).

    Resolution order: ``model.nuts_potential(x, y)`` if the model defines it; the built-in
    potential of a plain :class:`~pyro_bnnlv.models.bnn.BNN` (hand-written gradient for an
    ``MLP``: :func:`~pyro_bnnlv.models.potential.mlp_regression_potential`, or
    :func:`~pyro_bnnlv.models.potential.mlp_classification_potential` for a categorical or
    Bernoulli likelihood, each with its compiled twin; the same for a
    :class:`~pyro_bnnlv.nets.ModuleNet` with an :func:`~pyro_bnnlv.nets.equivalent_mlp`, on the
    same weight vector; autograd through ``model.f`` for any other ``FlatNet``); otherwise ``None``.
    Subclasses of ``BNN`` that override ``forward`` (BNN+LV, ...) are *not* treated as a BNN.
    """
    custom = getattr(model, "nuts_potential", None)
    if callable(custom):
        pot = custom(x, y)
        if not isinstance(pot, FlatPotential):
            raise TypeError(
                f"{type(model).__name__}.nuts_potential must return a FlatPotential, got {type(pot).__name__}"
            )
        return pot
    if not _is_plain_bnn(model):
        return None
    mlp = mlp_of(model.net)
    if model.likelihood.classification:
        if mlp is not None:
            return mlp_classification_potential(
                mlp, x, y, prior_loc=model.prior_loc, prior_scale=model.prior_scale, likelihood=model.likelihood
            )
        return _classifier_potential(model, x, y)
    sigma = torch.as_tensor(model.noise_scale).detach()
    if mlp is not None:
        return mlp_regression_potential(
            mlp, x, y, prior_loc=model.prior_loc, prior_scale=model.prior_scale, noise_scale=sigma
        )
    loc, scale = model.prior_loc.detach(), model.prior_scale.detach()
    N = x.shape[0]

    def log_density(p: dict[str, Tensor]) -> Tensor:
        w = p["w"]
        f = model.f(x, w).reshape(N, -1)
        lik = torch.distributions.Normal(f, sigma).log_prob(y.reshape(N, -1)).sum()
        return lik + torch.distributions.Normal(loc, scale).log_prob(w).sum()

    return FlatPotential.from_log_density({"w": (model.net.num_weights,)}, log_density)


def _classifier_potential(model: BNN, x: Tensor, y: Tensor) -> FlatPotential:
    """``U(w) = -log N(w; m, s^2) - sum_n log p(y_n | f(x_n; w))`` of a classifier BNN (categorical
    or Bernoulli likelihood), its gradient by autograd through ``model.f``: for the classifiers
    whose network is not an MLP (an MLP has :func:`~pyro_bnnlv.models.potential.mlp_classification_potential`)."""
    loc, scale = model.prior_loc.detach(), model.prior_scale.detach()
    labels = model._observed(y)

    def log_density(p: dict[str, Tensor]) -> Tensor:
        w = p["w"]
        lik = model.likelihood.log_prob(model.f(x, w), labels).sum()
        return lik + torch.distributions.Normal(loc, scale).log_prob(w).sum()

    return FlatPotential.from_log_density({"w": (model.net.num_weights,)}, log_density)


def _is_plain_bnn(model: Any) -> bool:
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


def _map_traced(
    model: Any, x: Tensor, y: Tensor, names: Sequence[str], steps: int, lr: float, seed: int
) -> dict[str, Tensor]:
    guide = AutoDelta(model, init_loc_fn=init_to_sample)
    fit_svi(model, guide, x, y, num_steps=steps, lr=lr, seed=seed, progress=False)
    with torch.no_grad():
        med = guide.median(x, y)
    return {k: med[k].detach().clone() for k in names}


def _initial_values(
    model: Any,
    x: Tensor,
    y: Tensor,
    init: Any,
    names: Sequence[str],
    shapes: Mapping[str, Any],
    pot: FlatPotential | None,
    num_chains: int,
    base: int,
    map_steps: int,
    map_lr: float,
) -> dict[str, Tensor]:
    """``{site: (num_chains, *shape)}`` initial values in the constrained space; chain ``c``'s
    depend only on its chain seed ``base + c``."""
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
                raise ValueError(f"init[{k!r}] must have shape {shape} or {(num_chains, *shape)}; got {tuple(v.shape)}")
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


def _check_flat_potential(
    pot: FlatPotential, traced_potential: Callable, params: dict[str, Tensor], model_name: str
) -> None:
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


def _resolve_potential(model: Any, x: Tensor, y: Tensor, potential: Any) -> FlatPotential | None:
    """The fast potential :func:`~pyro_bnnlv.infer.mcmc.nuts.run_nuts` uses for ``potential=``, or
    ``None`` for the traced path."""
    model_name = type(model).__name__
    if isinstance(potential, FlatPotential):
        pot: FlatPotential | None = potential
    elif potential in ("auto", "fast"):
        pot = flat_potential(model, x, y)
        if pot is None and potential == "fast":
            raise ValueError(
                f"{model_name} has no fast potential: define {model_name}.nuts_potential(x, y) "
                "returning a pyro_bnnlv.infer.mcmc.nuts.FlatPotential, or use potential='traced'"
            )
    elif potential == "traced":
        pot = None
    else:
        raise ValueError(f"potential must be 'auto', 'fast', 'traced' or a FlatPotential, got {potential!r}")
    return pot


def _model_sites(
    model: Any, x: Tensor, y: Tensor, pot: FlatPotential | None
) -> tuple[Callable, dict, list[str], dict[str, Any]]:
    """Pyro's view of the model: its traced potential and transforms (for the initialisation and
    the potential check), its latent sites and their shapes, checked against the fast potential's."""
    model_name = type(model).__name__
    _, traced_pot, transforms, proto = initialize_model(model, model_args=(x, y))
    latent = [
        name
        for name, site in proto.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    ]
    shapes = {k: proto.nodes[k]["value"].shape for k in latent}
    if pot is not None and sorted(latent) != list(pot.names):
        raise ValueError(
            f"the fast potential's sites {list(pot.names)} differ from {model_name}'s latent sites {sorted(latent)}"
        )
    if pot is not None:
        for k in pot.names:
            if tuple(pot.sites[k]) != tuple(shapes[k]):
                raise ValueError(
                    f"fast potential site {k!r} has shape {tuple(pot.sites[k])}, the model's has {tuple(shapes[k])}"
                )
    return traced_pot, transforms, latent, shapes
