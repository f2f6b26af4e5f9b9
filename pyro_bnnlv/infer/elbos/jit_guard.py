"""Trust, but verify: a compiled ELBO cross-checked against its eager twin during training.

``torch.jit.trace`` records one execution path. A Python branch on a tensor's *value* (a rank
test, an ``if loss > ...``) or a Python number read at trace time (a weight, a buffer changed in
place) is frozen into the graph as the constant it had then; the compiled loss silently stops
following the code. :class:`JitGuard` recomputes the loss and its gradients eagerly at a few
checkpoints (same parameters, same random draws) and compares; on a mismatch it warns once,
naming the loss and the step, and training continues with the eager twin (:func:`~pyro_bnnlv.fit_svi`
restarts it from the initial parameters).

Only branches on *shapes* are safe in a trace whose cache is keyed by shapes, such as those of
Pyro's plate messenger (``pyro.poutine.subsample_messenger``) and of
``pyro.distributions.util.broadcast_shape``: :func:`plate_shape_tracer_warnings_ignored` hides
the tracer warnings of those two places while compiling (checked for pyro 1.9). Every other
tracer warning stays visible; the test suite turns them into errors (``pyproject.toml``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pyro.util
import torch
from pyro.infer.elbo import ELBO
from pyro.ops.jit import CompiledFunction
from torch import Tensor

__all__ = ["JitGuard", "eager_twin", "forget_compiled", "is_compiled", "plate_shape_tracer_warnings_ignored"]

#: 0-based training steps at which :class:`JitGuard` compares compiled and eager (not step 0,
#: where the trace was recorded: a frozen branch agrees with the code at its own trace point).
GUARD_STEPS = (1, 10, 100, 1000)


@contextmanager
def plate_shape_tracer_warnings_ignored() -> Iterator[None]:
    """Hide the tracer warnings of Pyro's shape checks only (module docstring): those raised in
    ``pyro.poutine.subsample_messenger``, and ``broadcast_shape``'s size comparisons in
    ``pyro.distributions.util``."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", category=torch.jit.TracerWarning, module=r"pyro\.poutine\.subsample_messenger"
        )
        warnings.filterwarnings(
            "ignore",
            message="Converting a tensor to a Python boolean",
            category=torch.jit.TracerWarning,
            module=r"pyro\.distributions\.util",
        )
        yield


def is_compiled(loss: ELBO) -> bool:
    """Whether ``loss`` compiles its objective (``jit=True`` or one of Pyro's ``Jit*`` ELBOs) or
    fuses it (``fused=True``: the same estimator computed without Pyro's traces, e.g.
    :class:`~pyro_bnnlv.infer.elbos.closed_form_kl.ClosedFormKLElbo`); either is checked against its
    eager twin."""
    if hasattr(loss, "eager_twin"):
        return bool(getattr(loss, "jit", False) or getattr(loss, "fused", False))
    return type(loss).__name__.startswith("Jit")


def eager_twin(loss: ELBO) -> ELBO | None:
    """The same ELBO without compilation (``None`` if ``loss`` is not compiled).

    Library ELBOs provide ``eager_twin()``; for Pyro's ``Jit*`` classes the twin is an instance
    of the first base class whose name does not start with ``Jit`` (``JitTrace_ELBO`` ->
    ``Trace_ELBO``) with the same settings.
    """
    if hasattr(loss, "eager_twin"):
        return loss.eager_twin()
    if not is_compiled(loss):
        return None
    base = next(c for c in type(loss).__mro__ if not c.__name__.startswith("Jit"))
    twin = base.__new__(base)
    twin.__dict__.update({k: v for k, v in vars(loss).items() if not isinstance(v, CompiledFunction)})
    return twin


def forget_compiled(loss: ELBO) -> None:
    """Drop every compiled graph ``loss`` holds, so the next call traces afresh.

    Pyro's ``JitTrace_ELBO`` compiles a closure over the *first* model and guide it sees; reused
    for another fit it would keep training those (issue: a reused JIT loss trains nothing).
    """
    for name, value in list(vars(loss).items()):
        if isinstance(value, CompiledFunction):
            setattr(loss, name, None)
    if isinstance(getattr(loss, "_compiled", None), dict):
        loss._compiled.clear()
    for value in vars(loss).values():  # an ELBO inside, e.g. the fuser of a fused PenalizedElbo
        if isinstance(value, ELBO) and value is not loss:
            forget_compiled(value)


def _flat(grads: Sequence[Tensor | None], params: Sequence[Tensor]) -> Tensor:
    parts = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
    return torch.cat([g.reshape(-1).to(torch.float64) for g in parts])


class JitGuard:
    """Compare a compiled loss with its eager twin at ``steps``; switch to eager on a mismatch.

    Args:
        steps: 0-based training steps to check.
        rtol: relative tolerance on the loss value and on the gradient (Euclidean norm of the
            difference over the norm of the eager gradient).
    """

    default_steps = GUARD_STEPS

    def __init__(self, steps: Sequence[int] = GUARD_STEPS, rtol: float = 1e-3) -> None:
        self.steps, self.rtol = frozenset(int(s) for s in steps), float(rtol)
        self.mismatch: dict | None = None

    def step(self, loss: ELBO, step: int, params: Sequence[Tensor], model, guide, args, kwargs) -> tuple[ELBO, float]:
        """One training step's ``loss_and_grads`` (gradients left in ``.grad``), checked at the
        guard's steps; returns the loss to use from now on and the step's loss value."""
        if step not in self.steps or not is_compiled(loss):
            return loss, loss.loss_and_grads(model, guide, *args, **kwargs)
        twin = eager_twin(loss)
        state = pyro.util.get_rng_state()
        eager_value = twin.differentiable_loss(model, guide, *args, **kwargs)
        eager_grads = torch.autograd.grad(eager_value, list(params), allow_unused=True)
        pyro.util.set_rng_state(state)
        value = loss.loss_and_grads(model, guide, *args, **kwargs)
        g_c = _flat([p.grad for p in params], params)
        g_e = _flat(eager_grads, params)
        v_e = eager_value.item()
        loss_gap = abs(value - v_e) / max(1.0, abs(v_e))
        grad_gap = (g_c - g_e).norm().item() / max(g_e.norm().item(), 1e-12)
        if loss_gap <= self.rtol and grad_gap <= self.rtol:
            return loss, value
        self.mismatch = dict(step=step, loss_gap=loss_gap, grad_gap=grad_gap, compiled=value, eager=v_e)
        compiled = bool(getattr(loss, "jit", not getattr(loss, "fused", False)))  # else fused
        if compiled:
            why = "the trace froze a value-dependent branch or a changing constant; continuing without JIT"
        else:
            why = "its fused computation no longer matches the traced model and guide; continuing traced"
        # fit_svi restarts with the twin from the initial parameters
        why += " (fit_svi: restarting from the initial parameters)"
        warnings.warn(
            f"the {'compiled' if compiled else 'fused'} {type(loss).__name__} disagrees "
            f"with its eager twin at step {step} (loss {value:.6g} vs {v_e:.6g}, relative gradient "
            f"difference {grad_gap:.2g}): {why}",
            RuntimeWarning,
            stacklevel=3,
        )
        if hasattr(loss, "steps_taken"):  # the compiled call above counted this step
            twin.steps_taken = loss.steps_taken
        with torch.no_grad():
            for p, g in zip(params, eager_grads):
                p.grad = None if g is None else g.detach().clone()
        return twin, v_e if math.isfinite(v_e) else value
