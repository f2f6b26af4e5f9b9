"""The check shared by the fused-ELBO tests: a fused loss against its traced twin, away from the
start (a traced first step, Adam steps on the fused loss, then comparisons from one random state,
each on fresh draws and a fresh minibatch)."""

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO


def take_grads(params):
    out = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out


def compare_with_twin(model, guide, x, y, kwargs, loss, *, steps=5, checks=3, rtol=2e-6):
    """Assert the fused steps of ``loss`` equal its ``eager_twin()``'s traced ones: the same random
    numbers used, the same value (``rtol``), gradients and (a loss with a ``history``) recorded
    terms; returns ``(number of parameters, twin)``."""
    with pyro.get_param_store().scope():
        pyro.set_rng_seed(1)
        with pyro.poutine.trace(param_only=True) as capture:
            loss.loss_and_grads(model, guide, x, y, **kwargs)  # traced: creates the parameters
        params = [site["value"].unconstrained() for site in capture.trace.nodes.values()]
        opt = torch.optim.Adam(params, lr=0.05)
        for _ in range(steps):
            opt.step()
            opt.zero_grad()
            loss.loss_and_grads(model, guide, x, y, **kwargs)
        take_grads(params)
        twin = loss.eager_twin()
        for _ in range(checks):
            state = pyro.util.get_rng_state()
            fused = loss.loss_and_grads(model, guide, x, y, **kwargs)
            g_fused = take_grads(params)
            after_fused = torch.get_rng_state()
            pyro.util.set_rng_state(state)
            traced = twin.loss_and_grads(model, guide, x, y, **kwargs)
            g_traced = take_grads(params)
            assert torch.equal(torch.get_rng_state(), after_fused)  # the same random numbers used
            assert fused == pytest.approx(traced, rel=rtol)
            if hasattr(loss, "history"):  # the twin shares the history: its row follows the fused one
                assert loss.history[-2] == pytest.approx(loss.history[-1], rel=1e-5, abs=1e-7)
            for a, b in zip(g_fused, g_traced):
                assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))
    return len(params), twin


def count_traced_steps(monkeypatch) -> dict[str, int]:
    """``{"n": ...}``, counting the calls of ``Trace_ELBO._get_traces`` (one per traced step)."""
    calls = {"n": 0}
    get_traces = Trace_ELBO._get_traces

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        yield from get_traces(self, *args, **kwargs)

    monkeypatch.setattr(Trace_ELBO, "_get_traces", counting)
    return calls
