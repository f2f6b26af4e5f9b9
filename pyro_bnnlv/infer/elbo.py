"""A Pyro ELBO with an extra differentiable penalty, routed through one objective.

``SVI`` binds ``loss`` and ``loss_and_grads``; ``ELBO.__call__`` uses ``differentiable_loss``.
:class:`PenalizedElbo` computes the objective once, as tensors, in :meth:`loss_and_surrogate_loss`
(the ``Trace_ELBO`` estimator plus :meth:`PenalizedElbo.penalty` per particle) and derives all
three from it, so no entry point can bypass the penalty. With ``jit=True`` that function is
compiled with ``pyro.ops.jit.trace`` like ``JitTrace_ELBO`` (static model structure required).
"""

from __future__ import annotations

import weakref

import pyro.ops.jit
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.trace_elbo import _compute_log_r
from pyro.infer.util import is_identically_zero
from pyro.poutine import Trace
from torch import Tensor

__all__ = ["PenalizedElbo"]


class PenalizedElbo(Trace_ELBO):
    """``Trace_ELBO`` loss plus ``penalty(model_trace, guide_trace)``; subclasses define the penalty.

    The penalty is added to each particle's loss and therefore averaged over particles; it may
    read anything from the traces (guide parameters through ``site["fn"]``, the model's inputs
    through ``model_trace.nodes["_INPUT"]``, minibatch indices through the plate site).
    """

    def __init__(self, *args, jit: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.jit = bool(jit)
        self._compiled: dict[tuple[int, int], object] = {}

    def penalty(self, model_trace: Trace, guide_trace: Trace) -> Tensor | float:
        """Extra loss of one particle (0 in the base class)."""
        return 0.0

    def _particle(self, model_trace: Trace, guide_trace: Trace) -> tuple[Tensor, Tensor]:
        # Trace_ELBO._differentiable_loss_particle, kept as tensors (no .item(): JIT-safe)
        elbo, surrogate, log_r = 0.0, 0.0, None
        for site in model_trace.nodes.values():
            if site["type"] == "sample":
                elbo = elbo + site["log_prob_sum"]
                surrogate = surrogate + site["log_prob_sum"]
        for site in guide_trace.nodes.values():
            if site["type"] == "sample":
                _, score_function_term, entropy_term = site["score_parts"]
                elbo = elbo - site["log_prob_sum"]
                if not is_identically_zero(entropy_term):
                    surrogate = surrogate - entropy_term.sum()
                if not is_identically_zero(score_function_term):
                    if log_r is None:
                        log_r = _compute_log_r(model_trace, guide_trace)
                    term = log_r.sum_to(site["cond_indep_stack"])
                    surrogate = surrogate + (term * score_function_term).sum()
        pen = self.penalty(model_trace, guide_trace)
        return -elbo + pen, -surrogate + pen

    def _objective(self, model, guide, args, kwargs) -> tuple[Tensor, Tensor]:
        loss, surrogate = 0.0, 0.0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            lp, sp = self._particle(model_trace, guide_trace)
            loss = loss + lp / self.num_particles
            surrogate = surrogate + sp / self.num_particles
        return torch.as_tensor(loss), torch.as_tensor(surrogate)

    def loss_and_surrogate_loss(self, model, guide, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.jit:
            return self._objective(model, guide, args, kwargs)
        key = (id(model), id(guide))
        if key not in self._compiled:  # one compiled objective per (model, guide) pair
            weakself = weakref.ref(self)

            @pyro.ops.jit.trace(ignore_warnings=True, jit_options=self.jit_options)
            def compiled(*args, **kwargs):
                return weakself()._objective(model, guide, args, kwargs)

            self._compiled[key] = compiled
        return self._compiled[key](*args, **kwargs)

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        loss, surrogate = self.loss_and_surrogate_loss(model, guide, *args, **kwargs)
        return loss.detach() + (surrogate - surrogate.detach())

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        loss, surrogate = self.loss_and_surrogate_loss(model, guide, *args, **kwargs)
        if surrogate.requires_grad:
            surrogate.backward(retain_graph=self.retain_graph)
        return loss.item()

    def loss(self, model, guide, *args, **kwargs) -> float:
        with torch.no_grad():
            loss, _ = self.loss_and_surrogate_loss(model, guide, *args, **kwargs)
        return loss.item()
