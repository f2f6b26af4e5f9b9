r"""``Trace_ELBO`` for the library's own model/guide pairs, computed without Pyro's traces.

For a :class:`~pyro_bnnlv.models.bnn.BNN` (site ``w``) or a
:class:`~pyro_bnnlv.models.bnnlv.BNNLV` (sites ``w`` and the per-point ``z``, Yacoby, Pan &
Doshi-Velez 2022, arXiv:1911.00569, eq. 1-2 and 4-5) with an ``AutoNormal``-shaped mean-field
guide (:class:`~pyro_bnnlv.guides.MeanField`, or Pyro's ``AutoNormal``; for BNN+LV with
``create_plates=model.create_plates``), :class:`FusedTraceElbo` computes the estimator of Pyro's
``Trace_ELBO`` from the model's network and the guide's parameters directly:

.. math::

    \hat{\mathcal L} = \frac{1}{S} \sum_{s=1}^{S} \Big[ \frac{N}{B} \sum_{n \in \mathcal B}
        \big( \log p(y_n \mid x_n, z_n^{(s)}, w^{(s)}) + \log p(z_n^{(s)}) - \log q(z_n^{(s)}) \big)
        + \log p(w^{(s)}) - \log q(w^{(s)}) \Big],

with ``w^(s) = mu_w + sigma_w * eps^(s)`` (and ``z`` alike, the minibatch's rows of the guide's
``N x K`` parameters), ``log q`` evaluated at the draw as ``-eps^2 / 2 - log sigma - log(2 pi) / 2``
(the same value and the same total derivative as Pyro's ``Normal.log_prob`` of the drawn value).
The random numbers are drawn in Pyro's order, so a fused step and a traced one give the same loss
and gradients up to rounding (``tests/test_fused_elbo.py``): per particle batch (all ``S`` at
once with ``vectorize_particles=True``, else one after another) the guide's plate indices (BNN+LV:
the guide's ``create_plates`` draws ``randperm(N)[:B]`` first), the standard normals of ``w``,
then of the batch's ``z``, then (BNN: the model's data plate) the indices.

What runs traced (plain ``Trace_ELBO``, the same estimator): the first step of a (model, guide)
pair (it sets the guide up, creates its parameters, and ``fit_svi`` collects them), and any call
a fused step cannot see: another model or guide class, or one with a replaced method, forward
hooks or a ``forward`` set on the instance; a network that is not an
:class:`~pyro_bnnlv.nets.MLP`; a guide over other sites, a constrained site, or other plates;
model keyword arguments besides ``batch_size``; Pyro handlers around the call (only the
parameter-only traces of ``pyro.infer.SVI`` and :func:`~pyro_bnnlv.fit_svi` are allowed);
data off the CPU; no targets (``y=None``). Parameters are read as the guide's ``forward`` reads
them: inside a parameter-only trace (``SVI`` collects each step's parameters from it) through the
modules' ``pyro.param`` statements; otherwise (``fit_svi``'s later steps) straight from the
unconstrained tensors those statements returned, as long as Pyro's param store still holds them.
No ``torch.jit`` is involved.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import pyro
import torch
from pyro.distributions.transforms import SoftplusTransform as PyroSoftplusTransform
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import pyro_method
from pyro.poutine.runtime import _PYRO_STACK
from pyro.poutine.trace_messenger import TraceMessenger
from torch import Tensor
from torch.distributions import constraints, transform_to, transforms

from ..._checks import check_int
from ...models.bnn import BNN
from ...models.bnnlv import BNNLV
from ...nets import MLP

__all__ = ["FusedTraceElbo", "fused_pair"]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)

# the methods of BNN / BNNLV a fused step stands for: a subclass overriding any of them runs traced
_MODEL_METHODS = {
    BNN: ("forward", "_plate_f", "_likelihood", "_observed", "noise_scale_param"),
    BNNLV: ("forward", "_plate_f", "_likelihood", "_observed", "noise_scale_param", "network_input", "create_plates"),
}
_GUIDE_METHODS = ("forward", "_get_loc_and_scale", "_create_plates")


def only_param_capture_active() -> bool:
    """Whether Pyro's handler stack holds nothing but parameter-only traces (what ``SVI`` and
    :func:`~pyro_bnnlv.fit_svi` wrap a step in); any other handler acts on the sites a fused step
    never issues."""
    return all(isinstance(h, TraceMessenger) and h.param_only for h in _PYRO_STACK)


def forward_replaced(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` would run more than its class's ``forward``: forward hooks
    (the module's or global ones) or a ``forward`` assigned on the instance."""
    hooks = (
        module._forward_hooks,
        module._forward_pre_hooks,
        torch.nn.modules.module._global_forward_hooks,
        torch.nn.modules.module._global_forward_pre_hooks,
    )
    return "forward" in vars(module) or any(len(h) for h in hooks)


@pyro_method
def guide_locs_and_scales(guide: AutoNormal, sites: list[str]) -> list[tuple[Tensor, Tensor]]:
    """``AutoNormal``'s ``(loc, scale)`` per site, read inside the guide's Pyro context as its
    ``forward`` reads them: ``pyro.param`` statements are issued (Pyro's ``SVI`` collects the
    parameters a step touches from them) and the param store's values are the ones used."""
    return [guide._get_loc_and_scale(name) for name in sites]


@pyro_method
def _model_noise(model: BNN) -> Tensor:
    """The model's ``sigma`` as its ``forward`` reads it (a ``pyro.param`` when learned)."""
    return model.noise_scale_param()


def fused_pair(model: object, guide: object) -> bool:
    """Whether ``(model, guide)`` is a pair :class:`FusedTraceElbo` computes without traces (its
    classes, methods and network; the guide's sites are checked once it has been run)."""
    base = next((b for b in (BNNLV, BNN) if getattr(type(model), "forward", None) is b.forward), None)
    if base is None or not isinstance(model, base) or not isinstance(guide, AutoNormal):
        return False
    if any(getattr(type(model), m) is not getattr(base, m) for m in _MODEL_METHODS[base]):
        return False
    if any(getattr(type(guide), m) is not getattr(AutoNormal, m) for m in _GUIDE_METHODS):
        return False
    if forward_replaced(model) or forward_replaced(guide) or not isinstance(model.net, MLP):
        return False
    if model.likelihood.classification:  # the fused step writes the Gaussian likelihood
        return False
    if base is BNNLV:  # the guide subsamples z with the model's data plate
        return guide.create_plates == model.create_plates
    return guide.create_plates is None


# the positive-scale transforms of Pyro's constraints (exp for ``positive``, Pyro's own softplus for
# ``softplus_positive``, AutoNormal's default) and torch's softplus: elementwise, so the rows of
# the transform are the transform of the rows
_ELEMENTWISE = (transforms.ExpTransform, transforms.SoftplusTransform, PyroSoftplusTransform)


@dataclass
class _Slot:
    """One parameter as a fused step reads it: the store's name, the unconstrained tensor the
    store held when it was last read in Pyro's context, and the transform to its constrained value."""

    name: str
    unconstrained: Tensor
    transform: Any

    def value(self) -> Tensor:
        return self.transform(self.unconstrained)


@dataclass
class _Pair:
    """What a traced step of one (model, guide) pair established."""

    model: weakref.ref
    guide: weakref.ref
    latent: bool
    classes: tuple[type, type]  # the model's and guide's classes when the pair was recognised
    net: MLP
    slots: dict[str, _Slot] | None = None  # loc_w, scale_w, [loc_z, scale_z], [sigma]
    checked: tuple = field(default_factory=tuple)  # (x, y) identities and versions already checked
    priors: tuple = field(default_factory=tuple)  # the prior buffers' versions and derived constants

    def still(self, model: BNN, guide: AutoNormal) -> bool:
        """Whether the pair is still the one recognised (cheap per-step re-check: the classes,
        the network module, no hook or instance ``forward`` since)."""
        return (
            self.model() is model
            and self.guide() is guide
            and (type(model), type(guide)) == self.classes
            and model._modules.get("net") is self.net
            and not forward_replaced(model)
            and not forward_replaced(guide)
        )


def _slot(constrained: Tensor) -> _Slot | None:
    """The :class:`_Slot` of a value Pyro's param store returned (``None``: not a store value)."""
    ref = getattr(constrained, "unconstrained", None)
    unconstrained = ref() if callable(ref) else None
    store = pyro.get_param_store()
    name = store._param_to_name.get(unconstrained) if unconstrained is not None else None
    if name is None:
        return None
    transform = (
        transforms.identity_transform if unconstrained is constrained else transform_to(store._constraints[name])
    )
    return _Slot(name, unconstrained, transform)


class FusedTraceElbo(Trace_ELBO):
    """``Trace_ELBO`` computed without Pyro's traces for the library's BNN and BNN+LV with a
    mean-field guide (module docstring); any other pair gets ``Trace_ELBO`` itself.

    Args:
        num_particles: draws per step (a positive integer).
        max_plate_nesting, vectorize_particles, **kwargs: as for ``Trace_ELBO``.
        fused: ``False`` computes every step traced (for comparisons).

    ``fit_svi``'s default loss for a recognised pair (:func:`fused_pair`); for 32 vectorised
    particles pass ``loss=pb.FusedTraceElbo(num_particles=32, vectorize_particles=True)``.
    """

    def __init__(
        self,
        num_particles: int = 1,
        max_plate_nesting: float = float("inf"),
        vectorize_particles: bool = False,
        *,
        fused: bool = True,
        **kwargs,
    ) -> None:
        check_int(num_particles, "num_particles")
        if not isinstance(fused, bool):
            raise TypeError(f"fused must be True or False, got {fused!r}")
        super().__init__(
            num_particles=num_particles,
            max_plate_nesting=max_plate_nesting,
            vectorize_particles=vectorize_particles,
            **kwargs,
        )
        self.fused = fused
        # the pairs a traced step has set up; named _compiled so that jit_guard.forget_compiled
        # (called by fit_svi) clears it: every fit starts with a traced step
        self._compiled: dict[tuple[int, int], _Pair] = {}

    def eager_twin(self) -> Trace_ELBO:
        """Pyro's ``Trace_ELBO`` with the same settings (what fused steps are checked against)."""
        twin = Trace_ELBO.__new__(Trace_ELBO)
        twin.__dict__.update({k: v for k, v in vars(self).items() if k not in ("fused", "_compiled")})
        return twin

    # ------------------------------------------------------------------ entry points
    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        pair = self._pair(model, guide, args, kwargs)
        if pair is None:
            value = super().loss_and_grads(model, guide, *args, **kwargs)
            self._register(model, guide)
            return value
        loss = self._fused_loss(pair, model, guide, *args, **kwargs)
        if loss.requires_grad:  # as Trace_ELBO: nothing to differentiate (no_grad, frozen parameters)
            loss.backward(retain_graph=self.retain_graph)
        value = loss.item()
        pyro.util.warn_if_nan(value, "loss")
        return value

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        pair = self._pair(model, guide, args, kwargs)
        if pair is None:
            value = super().differentiable_loss(model, guide, *args, **kwargs)
            self._register(model, guide)
            return value
        return self._fused_loss(pair, model, guide, *args, **kwargs)

    def loss(self, model, guide, *args, **kwargs) -> float:
        with torch.no_grad():
            pair = self._pair(model, guide, args, kwargs)
            if pair is None:
                value = super().loss(model, guide, *args, **kwargs)
                self._register(model, guide)
                return value
            value = self._fused_loss(pair, model, guide, *args, **kwargs).item()
        pyro.util.warn_if_nan(value, "loss")
        return value

    # ------------------------------------------------------------------ recognition
    def _register(self, model, guide) -> None:
        """After a traced step: remember a recognised pair whose guide has exactly the sites a
        fused step draws (``w``, or ``w`` then ``z``), real-valued, in the expected plates."""
        if not self.fused or not fused_pair(model, guide) or guide.prototype_trace is None:
            return
        for key, pair in list(self._compiled.items()):  # forget pairs no longer alive
            if pair.model() is None or pair.guide() is None:
                del self._compiled[key]
        latent = isinstance(model, BNNLV)
        sites = [(name, site) for name, site in guide.prototype_trace.iter_stochastic_nodes()]
        if [name for name, _ in sites] != (["w", "z"] if latent else ["w"]):
            return
        for name, site in sites:
            if site["fn"].support is not constraints.real and not (
                isinstance(site["fn"].support, constraints.independent)
                and site["fn"].support.base_constraint is constraints.real
            ):
                return
            plates = [f.name for f in site["cond_indep_stack"] if f.vectorized]
            if plates != ([] if name == "w" else ["data"]) or guide._event_dims[name] != 1:
                return
        self._compiled[id(model), id(guide)] = _Pair(
            weakref.ref(model), weakref.ref(guide), latent, (type(model), type(guide)), model.net
        )

    def _pair(self, model, guide, args, kwargs) -> _Pair | None:
        """The registered pair if this call can be fused, else ``None`` (then it runs traced,
        which also raises Pyro's own errors on bad input)."""
        if not self.fused:
            return None
        pair = self._compiled.get((id(model), id(guide)))
        if pair is None or not pair.still(model, guide) or not only_param_capture_active():
            return None
        if len(args) != 2 or not all(isinstance(a, Tensor) for a in args) or set(kwargs) - {"batch_size"}:
            return None
        x, _ = args
        batch_size = kwargs.get("batch_size")
        if x.device.type != "cpu" or (batch_size is not None and not 0 < batch_size <= len(x)):
            return None  # Pyro's minibatch draw on another device; a batch size Pyro handles its way
        if self.vectorize_particles and self.num_particles > 1 and self.max_plate_nesting != 2:
            return None  # the particle plate elsewhere than next to the data plate
        return pair

    # ------------------------------------------------------------------ the estimator
    def _parameters(self, pair: _Pair, model: BNN, guide: AutoNormal) -> dict[str, Tensor]:
        """The constrained parameters by role (``loc_w``, ``scale_w``, ``loc_z``, ``scale_z``,
        ``sigma``), read through Pyro inside a parameter capture (or when the store no longer
        holds the remembered tensors), else from the remembered unconstrained tensors."""
        store = pyro.get_param_store()._params
        slots = pair.slots
        if not _PYRO_STACK and slots is not None and all(store.get(s.name) is s.unconstrained for s in slots.values()):
            # scale_z: only the minibatch's rows are transformed (_fused_loss)
            values = {role: s.value() for role, s in slots.items() if role != "scale_z"}
        else:
            values, slots = {}, {}
            sites = ["w", "z"] if pair.latent else ["w"]
            for name, (loc, scale) in zip(sites, guide_locs_and_scales(guide, sites)):
                values["loc_" + name], values["scale_" + name] = loc, scale
            if model.learn_noise:
                values["sigma"] = _model_noise(model)
            for role, value in values.items():
                slot = _slot(value)
                if slot is None or (
                    role.startswith("scale")
                    and slot.transform is not transforms.identity_transform
                    and not isinstance(slot.transform, _ELEMENTWISE)
                ):
                    slots = None  # read through Pyro every step
                    break
                slots[role] = slot
            pair.slots = slots
        if not model.learn_noise:
            values["sigma"] = model._buffers["noise_scale"]
        return values

    def _check_data(self, pair: _Pair, model: BNN, x: Tensor, y: Tensor) -> None:
        """What ``forward`` checks first (clear errors on bad data), once per data tensors and
        their in-place versions."""
        key = (id(x), x._version, id(y), y._version, x.dtype)
        if pair.checked != key:
            model.check_data(x, y)
            model._check_dtype(x)
            pair.checked = key

    def _fused_loss(
        self,
        pair: _Pair,
        model: BNN,
        guide: AutoNormal,
        x: Tensor,
        y: Tensor,
        batch_size: int | None = None,
        *,
        on_batch: Callable[[dict[str, Tensor], Tensor | None], None] | None = None,
    ) -> Tensor:
        """The negative ELBO estimate of the module docstring, in Pyro's order of random draws;
        ``on_batch(params, idx)`` is called as soon as each particle round's minibatch rows are
        drawn, before that round's network runs (a penalty can start on them meanwhile).

        Written as few autograd nodes: with ``r = y - f``, ``u = (w - m) / s_p`` and ``c`` the
        terms without gradient (the draws' ``eps^2``, the prior's ``log s_p``, a fixed ``sigma``'s
        normaliser), ``-ELBO = (1 / S) [ (N / B) (|r|^2 / (2 sigma^2) + |z / sigma_z|^2 / 2 - sum
        log sigma_z(rows)) + |u|^2 / 2 - S' sum log sigma_w ] + c`` (``S'`` the draws per round)."""
        self._check_data(pair, model, x, y)
        p = self._parameters(pair, model, guide)
        buffers = model._buffers
        y = model._observed(y)
        N, S = x.shape[0], self.num_particles
        B = N if batch_size is None else batch_size
        factor = N / B
        vectorized = self.vectorize_particles and S > 1
        rounds, s = (1, S) if vectorized else (S, 1)
        draws = (s,) if vectorized else ()  # one draw per round: no particle dimension (2-D matmuls)
        loc_w, scale_w, sigma = p["loc_w"], p["scale_w"], p["sigma"]
        inv_prior, prior_loc, const_prior = self._prior_constants(pair, buffers, s)
        net = pair.net
        dtype = loc_w.dtype
        learned_sigma = sigma.requires_grad
        if not learned_sigma:  # a fixed sigma: its normaliser and 1 / sigma^2 are numbers
            sigma_value = float(sigma)
            half_inv_var = 0.5 / (sigma_value * sigma_value)
            log_sigma = math.log(sigma_value)
        total = 0.0
        self.last_batch = (p, [])  # the parameters and each round's minibatch rows (None: all)
        for _ in range(rounds):
            idx = self._subsample(N, B) if pair.latent else None
            eps_w = torch.empty((*draws, loc_w.shape[-1]), dtype=dtype).normal_()
            w = torch.addcmul(loc_w, eps_w, scale_w)
            const = const_prior - 0.5 * float(eps_w.square().sum())  # log q(w)'s eps term, log p(w)'s log s_p
            local = None
            if pair.latent:
                loc_z, scale_z = p["loc_z"], self._rows(pair, p, idx)
                if idx is not None:
                    loc_z = loc_z[idx]
                eps_z = torch.empty((*draws, *loc_z.shape), dtype=dtype).normal_()
                z = torch.addcmul(loc_z, eps_z, scale_z)
                zscale = float(buffers["latent_scale"])
                # -(log p(z) - log q(z)) up to the terms without gradient (into const)
                local = 0.5 / (zscale * zscale) * z.square().sum() - s * scale_z.log().sum()
                const += factor * (s * z.shape[-2] * z.shape[-1] * math.log(zscale) - 0.5 * float(eps_z.square().sum()))
            else:
                idx = self._subsample(N, B)
            self.last_batch[1].append(idx)
            if on_batch is not None:
                on_batch(p, idx)
            x_b, y_b = (x, y) if idx is None else (x[idx], y[idx])
            f = net(model.network_input(x_b, z) if pair.latent else x_b, w)  # (s, B, L); (B, L) for one draw
            resid_sq = (f - (y_b.unsqueeze(-1) if y_b.dim() == 1 else y_b)).square().sum()
            count = f.numel()
            if learned_sigma:
                nll = 0.5 * resid_sq / sigma.square() + count * sigma.log()
                const += factor * count * _HALF_LOG_2PI
            else:
                nll = half_inv_var * resid_sq
                const += factor * count * (log_sigma + _HALF_LOG_2PI)
            if local is not None:
                nll = nll + local
            u = w if prior_loc is None else w - prior_loc
            term = factor * nll + 0.5 * (u * inv_prior).square().sum() - s * scale_w.log().sum() + const
            total = term if rounds == 1 else total + term
        return total if S == 1 else total / S

    def _prior_constants(self, pair: _Pair, buffers: dict, s: int) -> tuple[Tensor, Tensor | None, float]:
        """``1 / prior_scale``, ``prior_loc`` (``None`` when all zero) and ``s * sum log
        prior_scale``, recomputed only when a prior buffer is replaced or changed in place
        (empirical Bayes rewrites ``prior_scale`` between steps)."""
        loc, scale = buffers["prior_loc"], buffers["prior_scale"]
        key = (id(loc), loc._version, id(scale), scale._version, s)
        if not pair.priors or pair.priors[0] != key:
            zero = not bool(loc.any())
            pair.priors = (key, (scale.reciprocal(), None if zero else loc, s * float(scale.log().sum())))
        return pair.priors[1]

    @staticmethod
    def _subsample(N: int, B: int) -> Tensor | None:
        """``pyro.plate``'s subsample: all rows (no draw) or ``randperm(N)[:B]``."""
        return None if B >= N else torch.randperm(N)[:B].clone()

    @staticmethod
    def _rows(pair: _Pair, p: dict[str, Tensor], idx: Tensor | None) -> Tensor:
        """Rows ``idx`` (``None``: all) of ``z``'s scales: read through Pyro (``p``), or the
        elementwise transform of the remembered unconstrained rows (the same values, without
        transforming all ``N`` rows)."""
        scale = p.get("scale_z")
        if scale is None:
            slot = pair.slots["scale_z"]
            return slot.transform(slot.unconstrained if idx is None else slot.unconstrained[idx])
        return scale if idx is None else scale[idx]
