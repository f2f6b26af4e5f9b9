"""Shape-only branches in code that ``torch.jit.trace`` records.

Under the tracer a tensor's sizes are tensors, so ``if x.shape[1] == K`` converts a tensor to a
Python boolean and warns (``TracerWarning``): the branch taken is frozen into the graph. For a
branch on *shapes* that is what is wanted, provided the graph is only reused for inputs of the same
shapes: the library's compiled losses key their graphs by the shapes of every argument and module
buffer (:meth:`pyro_bnnlv.infer.elbos.penalized.CompiledTraceElbo.elbo_and_terms`), and
:class:`~pyro_bnnlv.infer.elbos.jit_guard.JitGuard` re-checks the compiled loss against the eager one
during training. :func:`shape_branches` hides exactly that warning, only while tracing and only
around code whose branches read shapes alone; every other tracer warning stays visible (the test
suite turns them into errors).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["shape_branches"]


@contextmanager
def shape_branches() -> Iterator[None]:
    """Around code that branches on tensor shapes only: no "converting a tensor to a Python
    boolean" tracer warning for it while tracing (module docstring); nothing changes otherwise."""
    if not torch.jit.is_tracing():
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Converting a tensor to a Python boolean", category=torch.jit.TracerWarning
        )
        yield
