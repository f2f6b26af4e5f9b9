"""A Pyro ELBO with extra differentiable penalties, routed through one objective.

``SVI`` binds ``loss`` and ``loss_and_grads``; ``ELBO.__call__`` uses ``differentiable_loss``.
:class:`PenalizedElbo` computes the objective once, as tensors, in :meth:`loss_and_surrogate_loss`
and derives all three from it, so no entry point can bypass the penalty. It is split in two:

* the **statistics** (:meth:`PenalizedElbo.penalty_terms`: named raw tensors such as a
  Henze-Zirkler statistic, averaged over particles) are computed with the ``Trace_ELBO``
  estimator; with ``jit=True`` this part is compiled with ``pyro.ops.jit.trace`` like
  ``JitTrace_ELBO``, the buffers of the model and guide modules (prior scales, which empirical
  Bayes rewrites between steps) being inputs of the compiled graph, not constants (a plain
  function closing over a module hides them: pass the module itself, or use ``jit=False``);
* the **weighting** (:meth:`PenalizedElbo.weigh`: weights, exponentials, warm-up ramps) runs
  eagerly outside the trace, so a weight that changes during training is never frozen into the
  compiled graph as the constant it had when it was traced.

With ``fused=True`` (a subclass that defines :meth:`PenalizedElbo.fused_penalty_terms`, such as
:class:`~pyro_bnnlv.infer.elbos.ncai.NCAIElbo`), a pair that
:class:`~pyro_bnnlv.infer.elbos.fused.FusedTraceElbo` computes without traces (the library's
BNN / BNN+LV with a mean-field guide) gets its ELBO from there and its statistics from the
guide's parameters and the step's minibatch rows: the same draws, values and gradients as the
traced objective, with no Pyro trace and no ``torch.jit`` per step; any other pair is traced.

Every training step (``loss_and_grads``) appends the ELBO loss, each raw term and the weighted
penalty to :attr:`PenalizedElbo.history`, so an inactive or dominating constraint shows at once.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import weakref

import pyro.ops.jit
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.trace_elbo import _compute_log_r
from pyro.infer.util import is_identically_zero
from pyro.poutine import Trace
from torch import Tensor

from .fused import FusedTraceElbo
from .jit_guard import plate_shape_tracer_warnings_ignored

__all__ = ["CompiledTraceElbo", "PenalizedElbo", "module_buffers"]


class PenalizedElbo(Trace_ELBO):
    """``Trace_ELBO`` loss plus ``weigh(penalty_terms(...))``; subclasses define both.

    Subclasses either override :meth:`penalty` (one term, weight 1: the simple case) or the pair
    :meth:`penalty_terms` (raw statistics from the traces; compiled when ``jit=True``) and
    :meth:`weigh` (their combination into the penalty; always eager). The terms are averaged
    over particles before they are weighed; they may read anything from the traces (guide
    parameters through ``site["fn"]``, the model's inputs through
    ``model_trace.nodes["_INPUT"]``, minibatch indices through the plate site).

    Attributes:
        history: one dict per ``loss_and_grads`` call: ``"elbo_loss"`` (negative ELBO), each raw
            term, and ``"penalty"`` (the weighted total).
        steps_taken: number of ``loss_and_grads`` calls so far (drives warm-up ramps).
    """

    def __init__(self, *args, jit: bool = False, fused: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(fused, bool):
            raise TypeError(f"fused must be True or False, got {fused!r}")
        if fused and type(self).fused_penalty_terms is PenalizedElbo.fused_penalty_terms:
            raise TypeError(
                f"{type(self).__name__} defines its penalty on traces only; fused=True needs a "
                "fused_penalty_terms method (see PenalizedElbo), or pass fused=False"
            )
        self.jit = bool(jit)
        self.fused = fused
        # the ELBO part of fused steps; a separate FusedTraceElbo with this loss's particle settings
        # (Pyro's ELBO counts the particle plate in max_plate_nesting: the fuser adds it again)
        particle_plate = self.vectorize_particles and self.num_particles > 1
        self._fuser = (
            FusedTraceElbo(
                num_particles=self.num_particles,
                vectorize_particles=self.vectorize_particles,
                max_plate_nesting=self.max_plate_nesting - particle_plate,
            )
            if fused
            else None
        )
        self._compiled: dict[tuple[int, int], object] = {}
        self._term_names: tuple[str, ...] = ()
        self.history: list[dict[str, float]] = []
        self.steps_taken = 0
        # a training step's penalty gradients that a fused step computed itself, without autograd:
        # (leaf, rows or None for all, gradient), added to the leaves' .grad after the backward pass
        self._leaf_gradients: list[tuple[Tensor, Tensor | None, Tensor]] | None = None

    def penalty(self, model_trace: Trace, guide_trace: Trace) -> Tensor | float:
        """Extra loss of one particle (0 in the base class); used by the default ``penalty_terms``."""
        return 0.0

    def penalty_terms(self, model_trace: Trace, guide_trace: Trace) -> dict[str, Tensor | float]:
        """Named raw statistics of one particle (compiled with ``jit=True``); default
        ``{"penalty": penalty(...)}``. Only tensor values count: a Python number is a constant."""
        return {"penalty": self.penalty(model_trace, guide_trace)}

    def fused_penalty_terms(
        self, model, args: tuple, params: dict[str, Tensor], batches: list[Tensor | None]
    ) -> dict[str, Tensor]:
        """The particle-averaged terms of a fused step: ``params`` the guide's constrained
        parameters by role (``loc_w``, ``scale_w``, ``loc_z``, ``scale_z``, ``sigma``: the
        ``scale_z`` rows may be absent), ``batches`` each particle round's minibatch rows
        (``None``: all). Not defined in the base class (then ``fused=True`` is refused)."""
        raise NotImplementedError

    def fused_batch_drawn(self, model, args: tuple, params: dict[str, Tensor], idx: Tensor | None) -> None:
        """Called in a fused step as soon as a particle round's minibatch rows ``idx`` are drawn,
        before its ELBO is computed (``params`` as for :meth:`fused_penalty_terms`): a subclass may
        start its statistics there, on another thread, and collect them in
        :meth:`fused_penalty_terms`. Nothing in the base class."""

    @property
    def takes_leaf_gradients(self) -> bool:
        """Whether :meth:`add_leaf_gradient` takes gradients now: in a training step
        (``loss_and_grads``), not in ``loss`` or ``differentiable_loss`` (the caller differentiates)."""
        return self._leaf_gradients is not None

    def add_leaf_gradient(self, leaf: Tensor, rows: Tensor | None, gradient: Tensor) -> None:
        """Takes the gradient of the penalty with respect to the rows ``rows`` (``None``: all) of
        the leaf tensor ``leaf``, to be added to ``leaf.grad`` after the training step's backward
        pass (only while :attr:`takes_leaf_gradients`): a fused step's penalty may then leave its
        terms out of the autograd graph. The gradient ends up as a backward pass through the graph
        would leave it: autograd sums the gradients reaching a leaf, elementwise, and so does
        adding this one to the others' sum."""
        if self._leaf_gradients is None:
            raise RuntimeError("add_leaf_gradient outside a training step (loss_and_grads)")
        self._leaf_gradients.append((leaf, rows, gradient))

    def weigh(self, terms: dict[str, Tensor], args: tuple, kwargs: dict) -> Tensor | float:
        """The penalty from the particle-averaged terms (eager); default: their sum.

        ``args``/``kwargs`` are the model's arguments (e.g. ``len(args[0])`` is the data size).
        """
        return sum(terms.values(), 0.0)

    def _elbo_particle(self, model_trace: Trace, guide_trace: Trace) -> tuple[Tensor, Tensor]:
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
        return -elbo, -surrogate

    def _objective(self, model, guide, args, kwargs) -> tuple[Tensor, ...]:
        """``(elbo_loss, elbo_surrogate, *terms)``, each averaged over particles.

        The terms are averaged over the traces: ``num_particles`` of them, or one holding every
        particle with ``vectorize_particles`` (its statistics are not divided by the particles)."""
        loss, surrogate, terms, n = 0.0, 0.0, {}, 0
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            lp, sp = self._elbo_particle(model_trace, guide_trace)
            loss = loss + lp / self.num_particles
            surrogate = surrogate + sp / self.num_particles
            n += 1
            for name, value in self.penalty_terms(model_trace, guide_trace).items():
                if isinstance(value, Tensor):
                    terms[name] = terms.get(name, 0.0) + value
        self._term_names = tuple(terms)
        return (loss, surrogate, *(value / n for value in terms.values()))

    def _fused_objective(self, model, guide, args, kwargs) -> tuple[Tensor, Tensor, dict[str, Tensor]] | None:
        """``(elbo_loss, elbo_surrogate, terms)`` of a fused step, or ``None`` if this call is
        not one (the fuser has not recognised the pair, or the call needs Pyro's traces). Terms
        started on another thread when the step's rows were drawn (:meth:`fused_batch_drawn`) run
        beside the ELBO's forward pass and are collected after it."""
        if self._fuser is None:
            return None
        pair = self._fuser._pair(model, guide, args, kwargs)
        if pair is None:
            return None
        on_batch = functools.partial(self.fused_batch_drawn, model, args)
        loss = self._fuser._fused_loss(pair, model, guide, *args, on_batch=on_batch, **kwargs)
        params, batches = self._fuser.last_batch
        terms = self.fused_penalty_terms(model, args, params, batches)
        self._term_names = tuple(terms)
        return loss, loss, terms

    def elbo_and_terms(self, model, guide, *args, **kwargs) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """``(elbo_loss, elbo_surrogate, terms)`` before weighting; fused (``fused=True``) for a
        recognised pair, else traced: compiled when ``jit=True``."""
        fused = self._fused_objective(model, guide, args, kwargs)
        return fused if fused is not None else self._traced_terms(model, guide, args, kwargs)

    def _traced_terms(self, model, guide, args: tuple, kwargs: dict) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """:meth:`elbo_and_terms` of a step that is not fused (from Pyro's traces)."""
        out = self._traced_objective(model, guide, args, kwargs)
        if self._fuser is not None:
            self._fuser._register(model, guide)  # from the next step on, fused if it is a known pair
        return out[0], out[1], dict(zip(self._term_names, out[2:]))

    def _traced_objective(self, model, guide, args: tuple, kwargs: dict) -> tuple[Tensor, ...]:
        """``(elbo_loss, elbo_surrogate, *terms)`` from Pyro's traces, compiled when ``jit=True``."""
        if not self.jit:
            out = self._objective(model, guide, args, kwargs)
        else:
            # one compiled objective per (model, guide, argument shapes and dtypes): the trace may
            # branch on shapes (Pyro's plates do), never on values; a graph records its dtypes
            shape = lambda v: (tuple(v.shape), v.dtype) if isinstance(v, Tensor) else repr(v)  # noqa: E731
            key = (
                id(model),
                id(guide),
                tuple(map(shape, args)),
                tuple((k, shape(v)) for k, v in sorted(kwargs.items())),
            )
            # the tensor state of the model and guide modules (e.g. prior scales that empirical
            # Bayes rewrites between steps) enters the trace as inputs, not as constants
            state = module_buffers(model) + module_buffers(guide)
            key = key + tuple((name, tuple(t.shape), t.dtype) for _, name, t in state)
            if key not in self._compiled:
                weakself = weakref.ref(self)
                n_args = len(args)

                @pyro.ops.jit.trace(jit_options=self.jit_options)
                def compiled(*args_and_state, **kwargs):
                    with _bound_buffers(state, args_and_state[n_args:]):
                        return weakself()._objective(model, guide, args_and_state[:n_args], kwargs)

                self._compiled[key] = compiled
                with plate_shape_tracer_warnings_ignored():
                    out = compiled(*args, *(t for _, _, t in state), **kwargs)
            else:
                out = self._compiled[key](*args, *(t for _, _, t in state), **kwargs)
        return out

    def _weighed(self, model, guide, args, kwargs) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor], Tensor | float]:
        """``(loss, surrogate, elbo_loss, terms, penalty)`` with the penalty weighed eagerly."""
        elbo_loss, surrogate, terms = self.elbo_and_terms(model, guide, *args, **kwargs)
        pen = self.weigh(terms, args, kwargs)
        total = elbo_loss + pen
        # a fused step's surrogate is its loss (no score-function terms): one sum serves both
        return total, total if surrogate is elbo_loss else surrogate + pen, elbo_loss, terms, pen

    def loss_and_surrogate_loss(self, model, guide, *args, **kwargs) -> tuple[Tensor, Tensor]:
        return self._weighed(model, guide, args, kwargs)[:2]

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        loss, surrogate = self.loss_and_surrogate_loss(model, guide, *args, **kwargs)
        return loss.detach() + (surrogate - surrogate.detach())

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        self._leaf_gradients = []  # add_leaf_gradient takes a penalty's own gradients in this call
        try:
            total, surrogate, elbo_loss, terms, pen = self._weighed(model, guide, args, kwargs)
        finally:
            leaf_gradients, self._leaf_gradients = self._leaf_gradients, None
        if surrogate.requires_grad:  # one backward pass for the ELBO and the penalty
            surrogate.backward(retain_graph=self.retain_graph)
        for leaf, rows, gradient in leaf_gradients:
            if leaf.grad is None:
                leaf.grad = torch.zeros_like(leaf)
            if rows is None:
                leaf.grad.add_(gradient)
            else:
                leaf.grad.index_put_((rows,), gradient, accumulate=True)
        return self._record(total, elbo_loss, terms, pen)

    def _record(self, total: Tensor, elbo_loss: Tensor, terms: dict[str, Tensor], pen: Tensor | float) -> float:
        """Appends a training step's row to :attr:`history`; returns the step's loss."""
        # .item() per value: exact (a float32 is a Python float without rounding) and cheaper
        # than stacking and converting them (0.8 against 12 us for five terms)
        names = ("elbo_loss", *terms, "penalty", "_total")
        values = [elbo_loss, *terms.values(), pen, total]
        record = {k: v.item() if isinstance(v, Tensor) else float(v) for k, v in zip(names, values)}
        total_value = record.pop("_total")
        self.history.append(record)
        self.steps_taken += 1
        return total_value

    def loss(self, model, guide, *args, **kwargs) -> float:
        with torch.no_grad():
            loss, _ = self.loss_and_surrogate_loss(model, guide, *args, **kwargs)
        return loss.item()

    def eager_twin(self) -> "PenalizedElbo | None":
        """A copy computing the same objective from Pyro's traces, without JIT or fusing
        (``None`` if this one is neither compiled nor fused).

        It shares :attr:`history` and continues :attr:`steps_taken` from this one, so training
        can switch to it mid-run (``fit_svi``'s JIT guard does).
        """
        if not (self.jit or self.fused):
            return None
        twin = copy.copy(self)
        twin.jit, twin._compiled, twin.fused, twin._fuser = False, {}, False, None
        return twin


def module_buffers(obj: object) -> list[tuple[torch.nn.Module, str, Tensor]]:
    """``(owner module, name, tensor)`` of every buffer of ``obj`` if it is a ``torch.nn.Module``."""
    if not isinstance(obj, torch.nn.Module):
        return []
    return [(module, name, buf) for module in obj.modules() for name, buf in module._buffers.items() if buf is not None]


@contextlib.contextmanager
def _bound_buffers(state: list[tuple[torch.nn.Module, str, Tensor]], values: tuple[Tensor, ...]):
    """Temporarily set each buffer of ``state`` to the matching tensor of ``values`` (the traced
    inputs standing for them), restoring the originals afterwards."""
    for (module, name, _), value in zip(state, values):
        module._buffers[name] = value
    try:
        yield
    finally:
        for module, name, original in state:
            module._buffers[name] = original


class CompiledTraceElbo(PenalizedElbo):
    """``Trace_ELBO`` compiled with the JIT, safe to reuse: :class:`PenalizedElbo` with no penalty
    and ``jit=True`` (``fit_svi``'s default loss).

    Unlike Pyro's ``JitTrace_ELBO`` it compiles one graph per model, guide and argument shapes
    (Pyro's compiles a closure over the first model and guide it is called with, and keys it by
    the number of arguments only), and tracer warnings are not silenced.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(jit=True, **kwargs)
