"""The fused NCAI statistics (pyro_bnnlv/stats/_pairwise.py and _pairwise.cpp, issue 13): the
compiled kernels and the torch path agree with each other, with the previous autograd form
(transcribed below), with pingouin's Henze-Zirkler statistic and with finite differences; the
fused call equals the separate functions; traced graphs follow their inputs without tracer
warnings."""

from __future__ import annotations

import ast
import math
import multiprocessing
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from pyro_bnnlv.stats import _pairwise
from pyro_bnnlv.stats._pairwise import ncai_statistics, pairwise_extension
from pyro_bnnlv.stats.dependence import henze_zirkler, henze_zirkler_beta, offdiag_cov_norm
from pyro_bnnlv.stats.hsic import normalized_hsic

pingouin = pytest.importorskip("pingouin")

COMPILED = pairwise_extension() is not None
PATHS = [False, pytest.param(True, marks=pytest.mark.skipif(not COMPILED, reason="no C++ compiler"))]


def _autograd_hz(x: torch.Tensor, ridge: float = 1e-12) -> torch.Tensor:
    """The previous henze_zirkler body (plain autograd over n x n tensors), as the reference."""
    n, k = x.shape
    beta2 = henze_zirkler_beta(n, k) ** 2
    xc = x - x.mean(0, keepdim=True)
    cov = xc.T @ xc / n
    cov = cov + (ridge * cov.diagonal().sum() / k + 1e-30) * torch.eye(k, dtype=x.dtype)
    y = torch.linalg.solve_triangular(torch.linalg.cholesky(cov), xc.T, upper=False).T
    d_i = y.square().sum(1)
    d_ij = (d_i[:, None] + d_i[None, :] - 2.0 * (y @ y.T)).clamp(min=0.0)
    term1 = torch.exp(-0.5 * beta2 * d_ij).sum() / n
    term2 = 2.0 * (1.0 + beta2) ** (-k / 2) * torch.exp(-beta2 / (2.0 * (1.0 + beta2)) * d_i).sum()
    return term1 - term2 + n * (1.0 + 2.0 * beta2) ** (-k / 2)


def _autograd_hsic(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """The previous normalized_hsic body (explicit centring, autograd), as the reference."""

    def centred_gram(v):
        h2 = v.detach().var(0, unbiased=False).sum() + eps
        sq = v.square().sum(-1)
        g = torch.exp(-(sq[:, None] + sq[None, :] - 2.0 * (v @ v.T)).clamp(min=0.0) / (2 * h2))
        return g - g.mean(0, keepdim=True) - g.mean(1, keepdim=True) + g.mean()

    kc, lc = centred_gram(a), centred_gram(b)
    return (kc * lc).sum() / torch.sqrt((kc.square().sum() + eps) * (lc.square().sum() + eps))


def _points(n: int, k: int, seed: int, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """x (n, 2) and a skewed mu (n, k) that depends on x: a non-Gaussian, dependent pair."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=gen, dtype=dtype)
    mu = torch.randn(n, k, generator=gen, dtype=dtype) ** 3 + 0.5 * x[:, :1] ** 2
    return x.requires_grad_(), mu.requires_grad_()


def _assert_same(got, ref, rel):
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=0.0, atol=rel * r.abs().max().item() + 1e-300)


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("n,k,seed", [(300, 1, 0), (57, 2, 1), (40, 3, 2), (5, 1, 3)])
def test_values_and_gradients_equal_the_autograd_form(compiled, n, k, seed):
    x, mu = _points(n, k, seed)
    w = torch.tensor([0.7, -1.3], dtype=torch.float64)
    new = [henze_zirkler(mu, compiled=compiled), normalized_hsic(x, mu, compiled=compiled)]
    old = [_autograd_hz(mu), _autograd_hsic(x, mu)]
    new_grads = torch.autograd.grad(w @ torch.stack(new), (x, mu))
    old_grads = torch.autograd.grad(w @ torch.stack(old), (x, mu))
    _assert_same(new, old, 1e-12)
    _assert_same(new_grads, old_grads, 1e-11)


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
@pytest.mark.parametrize("seed", [0, 1])
def test_compiled_and_torch_paths_agree_in_float32(seed):
    x, mu = _points(200, 1, seed, dtype=torch.float32)
    hz = [henze_zirkler(mu, compiled=c) for c in (True, False)]
    hsic = [normalized_hsic(x, mu, compiled=c) for c in (True, False)]
    assert hz[0].dtype == hsic[0].dtype == torch.float32
    g = [torch.autograd.grad(hz[i] + 3 * hsic[i], (x, mu)) for i in (0, 1)]
    # HZ runs in float64 on both paths; the HSIC of float32 inputs agrees to float32 round-off
    assert hz[0].item() == pytest.approx(hz[1].item(), rel=1e-6)
    assert hsic[0].item() == pytest.approx(hsic[1].item(), rel=1e-5)
    _assert_same(g[0], g[1], 1e-4)


@pytest.mark.parametrize("compiled", PATHS)
@pytest.mark.parametrize("kind", ["skewed", "bimodal"])
def test_hz_matches_pingouin_on_both_paths(compiled, kind):
    rng = np.random.default_rng(3)
    x = (
        rng.exponential(size=(150, 3)) ** 2
        if kind == "skewed"
        else (rng.normal(size=(150, 3)) + 3.0 * np.where(rng.random((150, 1)) < 0.5, -1.0, 1.0))
    )
    ref = pingouin.multivariate_normality(x).hz
    assert henze_zirkler(torch.from_numpy(x), compiled=compiled).item() == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("compiled", PATHS)
def test_gradients_match_finite_differences(compiled):
    """HZ and the off-diagonal norm are differentiated in full (whitening and ridge included).
    The HSIC's bandwidths carry no gradient by design, so finite differences do not apply to it;
    its gradient is checked against the autograd form above."""
    x, mu = _points(12, 2, 4)
    assert torch.autograd.gradcheck(lambda m: henze_zirkler(m, compiled=compiled), (mu,))
    if compiled:
        assert torch.autograd.gradcheck(lambda m: torch.stack(ncai_statistics(x.detach(), m)[:2]), (mu,))


@pytest.mark.parametrize("compiled", ["1", "0"], ids=["compiled", "torch"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_unchecked_statistics_with_hz_per_point_equal_dividing_hz(monkeypatch, compiled, dtype):
    """ncai_statistics_unchecked(hz_per_point=True) (NCAI's fused step; in the compiled operator,
    its hz_divisor) gives HZ / n and the gradients of that division, to the bit, on both paths."""
    monkeypatch.setenv("PYRO_BNNLV_COMPILED", compiled)
    if compiled == "1" and not COMPILED:
        pytest.skip("no C++ compiler")
    x, mu = _points(60, 1, 2, dtype=dtype)
    w = torch.tensor([0.3, 2.0, -1.5], dtype=dtype)
    per_point = _pairwise.ncai_statistics_unchecked(x.detach(), mu, hz_per_point=True)
    hz, off, hsic = _pairwise.ncai_statistics_unchecked(x.detach(), mu)
    divided = (hz / mu.shape[0], off, hsic)
    assert [v.item() for v in per_point] == [v.item() for v in divided]
    g_per_point = torch.autograd.grad(w[0] * per_point[0] + w[1] * per_point[1] + w[2] * per_point[2], mu)[0]
    g_divided = torch.autograd.grad(w[0] * divided[0] + w[1] * divided[1] + w[2] * divided[2], mu)[0]
    assert torch.equal(g_per_point, g_divided)


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("k", [1, 3])
def test_fused_call_equals_the_separate_functions(dtype, k):
    x, mu = _points(80, k, 5, dtype=dtype)
    fused = ncai_statistics(x, mu)
    separate = (henze_zirkler(mu), offdiag_cov_norm(mu), normalized_hsic(x, mu))
    w = torch.tensor([0.3, 2.0, -1.5], dtype=dtype)
    g_fused = torch.autograd.grad(w @ torch.stack(fused), (x, mu))
    g_separate = torch.autograd.grad(w @ torch.stack(separate), (x, mu))
    rel = 1e-12 if dtype == torch.float64 else 1e-5
    for f, s in zip(fused, separate):
        assert f.dtype == dtype
        assert f.item() == pytest.approx(s.item(), rel=rel, abs=rel)
    _assert_same(g_fused, g_separate, rel)
    with torch.no_grad():  # the forward without gradients gives the same values
        assert [v.item() for v in ncai_statistics(x, mu)] == [v.item() for v in fused]
    assert ncai_statistics(x, mu, compiled=False) is None
    with pytest.raises(ValueError, match="same number of rows"):
        ncai_statistics(x[:10], mu)
    with pytest.raises(ValueError, match="`mu_z` contains NaN"):
        ncai_statistics(x, mu.detach() * math.nan)


@pytest.mark.parametrize("compiled", PATHS)
def test_traced_statistics_follow_the_input_without_tracer_warnings(compiled):
    """Traced at all-equal means (the degenerate point that froze the old HZ), evaluated at a
    skewed sample: values and gradients equal the eager ones."""

    def stats(a, b):
        if compiled:
            return torch.stack(ncai_statistics(a, b))
        return torch.stack([henze_zirkler(b, compiled=False), normalized_hsic(a, b, compiled=False)])

    x, mu = _points(60, 1, 6, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(stats, (x, torch.zeros_like(mu, requires_grad=True)), check_trace=False)
    got, ref = traced(x, mu), stats(x, mu)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)
    w = torch.arange(1.0, len(ref) + 1)
    _assert_same(torch.autograd.grad(w @ got, mu), torch.autograd.grad(w @ ref, mu), 1e-5)


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
def test_reused_input_gram_is_never_stale():
    """The compiled HSIC keeps the Gram of its first sample while that sample is unchanged (x at
    every full-batch step); a sample changed in place, or another one, is recomputed."""
    x, mu = _points(50, 1, 7)
    x, mu = x.detach(), mu.detach()
    first = normalized_hsic(x, mu, compiled=True)
    assert normalized_hsic(x, mu, compiled=True).item() == first.item()  # reused: identical
    swap = lambda: x.copy_(x[torch.tensor([1, 0] + list(range(2, 50)))])  # noqa: E731  same bandwidth
    # in place: rows swapped, a non-affine map (an affine one leaves the normalised Gram as it
    # was, so it could not show a stale cache), one entry moved
    for change in (swap, lambda: x.pow_(3), lambda: x[7].add_(1.0)):
        change()
        assert normalized_hsic(x, mu, compiled=True).item() == pytest.approx(_autograd_hsic(x, mu).item(), rel=1e-12)
    other = x.clone()
    other[0, 0] = other[0, 0] + 1e-9  # one entry, by a hair
    assert normalized_hsic(other, mu, compiled=True).item() == pytest.approx(
        _autograd_hsic(other, mu).item(), rel=1e-12
    )
    assert normalized_hsic(other, mu, compiled=True).item() != normalized_hsic(x, mu, compiled=True).item()


@pytest.mark.parametrize("compiled", PATHS)
def test_second_derivatives_are_refused_not_silently_dropped(compiled):
    """The hand-written gradients are first order: a Hessian through them used to come back with
    the statistics' curvature missing (max |H| = 0 for HZ on the compiled path)."""
    from pyro_bnnlv.stats.dependence import henze_zirkler

    g = torch.Generator().manual_seed(0)
    mu = torch.randn(8, 2, dtype=torch.float64, generator=g) ** 3
    x = torch.randn(8, 1, dtype=torch.float64, generator=g)
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        torch.autograd.functional.hessian(lambda m: henze_zirkler(m, compiled=compiled), mu)
    with pytest.raises(RuntimeError, match="first-order gradients only"):
        torch.autograd.functional.hessian(lambda m: normalized_hsic(x, m, compiled=compiled), mu)
    if compiled:  # the registered operator (what a traced NCAIElbo calls)
        m = mu.clone().requires_grad_()
        (grad,) = torch.autograd.grad(ncai_statistics(x, m)[0] + (m**2).sum(), m, create_graph=False)
        assert torch.isfinite(grad).all()  # first order still works
        with pytest.raises(RuntimeError, match="first-order gradients only"):
            torch.autograd.grad(ncai_statistics(x, m)[0], m, create_graph=True)


def test_tensors_off_the_cpu_take_the_torch_path():
    meta = torch.empty(5, 1, device="meta")
    with pytest.raises(RuntimeError, match="not on the CPU"):
        _pairwise._use_compiled(True, meta)
    assert _pairwise._use_compiled(None, meta) is None


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
def test_the_float_kernels_exp_matches_torch_exp():
    """The packed float kernels' exp (exp_nonpositive, vectorised Cephes expf) is within 2.5e-7
    relative of float64 exp on [-87, 0] (torch.exp's float32 is within 1.2e-7), and 0 below."""
    t = -torch.linspace(0.0, 90.0, 900_001)
    got = pairwise_extension().exp_nonpositive(t).double()
    exact = torch.exp(t.double())
    inside = t > -87.0
    assert float(((got - exact).abs() / exact)[inside].max()) < 2.5e-7
    assert float(got[~inside].abs().max()) == 0.0
    assert float(((torch.exp(t).double() - exact).abs() / exact)[inside].max()) < 1.2e-7  # the float's rounding


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("per_point", [False, True])
def test_statistics_started_on_another_thread_equal_the_synchronous_call(dtype, per_point):
    """start_ncai_statistics + collect gives ncai_statistics_unchecked's values and gradients to
    the bit (the same C++ call, on the kernels' worker thread), with x's gradient where requested."""
    x, mu = _points(70, 2, 6, dtype=dtype)
    w = torch.tensor([0.3, 2.0, -1.5], dtype=dtype)
    sync = _pairwise.ncai_statistics_unchecked(x, mu, hz_per_point=per_point)
    started = _pairwise.start_ncai_statistics(x, mu, grads=(True, True), hz_per_point=per_point)
    collected = started.collect(x, mu)
    assert [v.item() for v in collected] == [v.item() for v in sync]
    g_sync = torch.autograd.grad(w @ torch.stack(sync), (x, mu))
    for a, b in zip(torch.autograd.grad(w @ torch.stack(collected), (x, mu)), g_sync):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="collected already"):
        started.collect(x, mu)
    # started on values only, collected on other tensors holding them: the node sits on those
    x2, mu2 = x.detach().clone(), mu.detach().clone().requires_grad_()
    started = _pairwise.start_ncai_statistics(x.detach(), mu.detach(), grads=(False, True), hz_per_point=per_point)
    (g,) = torch.autograd.grad(w @ torch.stack(started.collect(x2, mu2)), mu2)
    assert torch.equal(g, g_sync[1])


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
@pytest.mark.parametrize(
    "coeffs, scales",
    [
        ((300.0, 3000.0, 300.0), (0.01, 0.0, 0.5)),  # every term, HZ's and nHSIC's exponentials
        ((0.0, 30.0, 12.5), (0.01, 0.0, 0.002)),  # HZ left out; nHSIC past the exponent's cap of 30
        ((0.0, 0.0, 0.0), (0.01, 0.0, 0.5)),  # none: a zero penalty
    ],
)
def test_statistics_collected_with_their_weighting_equal_the_two_nodes(coeffs, scales):
    """collect_weighted's penalty, and weighted_ncai_statistics' (the same node computed on the
    calling thread), is compiled_weighted_penalty of the statistics with a nonzero coefficient,
    and the gradients of penalty plus statistics are those of the two nodes, to the bit."""
    x, mu = _points(70, 2, 6, dtype=torch.float32)
    w = torch.tensor([0.3, 2.0, -1.5])

    def two_nodes():
        stats = _pairwise.start_ncai_statistics(x, mu, grads=(True, True), hz_per_point=True).collect(x, mu)
        chosen = [(c, e, t) for c, e, t in zip(coeffs, scales, stats) if c]
        pen = _pairwise.compiled_weighted_penalty(*map(tuple, zip(*chosen))) if chosen else torch.zeros(())
        return pen, stats

    started = _pairwise.start_ncai_statistics(x, mu, grads=(True, True), hz_per_point=True)
    pen2, stats2 = two_nodes()
    grads2 = torch.autograd.grad(pen2 + w @ torch.stack(stats2), (x, mu))
    for pen, *stats in (
        started.collect_weighted(x, mu, coeffs, scales),
        _pairwise.weighted_ncai_statistics(x, mu, coeffs, scales, hz_per_point=True),  # computed now
    ):
        assert [v.item() for v in (pen, *stats)] == [v.item() for v in (pen2, *stats2)]
        for a, b in zip(torch.autograd.grad(pen + w @ torch.stack(stats), (x, mu)), grads2):
            assert torch.equal(a, b)
        if any(coeffs):
            assert pen.item() > 0 and pen.requires_grad
    with torch.no_grad():  # the operator's kernel without autograd: the same values
        out = _pairwise.weighted_ncai_statistics(x, mu, coeffs, scales, hz_per_point=True)
    assert [v.item() for v in out] == [v.item() for v in (pen2, *stats2)]


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "coeffs, scales",
    [
        ((300.0, 3000.0, 300.0), (0.01, 0.0, 0.5)),
        ((0.0, 30.0, 12.5), (0.01, 0.0, 0.002)),  # HZ left out; nHSIC past the exponent's cap of 30
    ],
)
def test_the_penalty_gradient_without_a_node_equals_the_nodes_backward_pass(dtype, coeffs, scales):
    """collect_gradient (started) and penalty_gradient (computed now) give the weighted node's
    values without gradient, and the gradient of the penalty alone with respect to mu that a
    backward pass through the node gives, to the bit; both refuse an x that needs a gradient."""
    x, mu = _points(70, 2, 6, dtype=dtype)
    x = x.detach()
    pen, *stats = _pairwise.weighted_ncai_statistics(x, mu, coeffs, scales, hz_per_point=True)
    (expected,) = torch.autograd.grad(pen, mu)
    started = _pairwise.start_ncai_statistics(x, mu, grads=(False, True), hz_per_point=True)
    for out in (
        started.collect_gradient(x, mu, coeffs, scales),
        _pairwise.penalty_gradient(x, mu, coeffs, scales, hz_per_point=True),
    ):
        assert [v.item() for v in out[:4]] == [v.item() for v in (pen, *stats)]
        assert not any(v.requires_grad for v in out)
        assert out[4].dtype == dtype and torch.equal(out[4], expected)
    x_grad = x.clone().requires_grad_()
    with pytest.raises(ValueError, match="x requires a gradient"):
        _pairwise.penalty_gradient(x_grad, mu, coeffs, scales)
    started = _pairwise.start_ncai_statistics(x_grad, mu, grads=(True, True))
    with pytest.raises(ValueError, match="x requires a gradient"):
        started.collect_gradient(x_grad, mu, coeffs, scales)
    started.collect(x_grad, mu)  # the node still takes it


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
def test_started_statistics_refuse_a_missing_gradient_and_raise_the_workers_error():
    x, mu = _points(30, 1, 7)
    started = _pairwise.start_ncai_statistics(x, mu, grads=(False, False))
    with pytest.raises(RuntimeError, match=r"started without the gradients now needed .* grads=\(True, True\)"):
        started.collect(x, mu)  # both require a gradient that was not computed
    with torch.no_grad():  # no gradient needed: fine
        _pairwise.start_ncai_statistics(x, mu, grads=(False, False)).collect(x, mu)
    bad = _pairwise.start_ncai_statistics(x[:10], mu, grads=(False, False))  # rows that do not match
    with pytest.raises(RuntimeError, match="centred_alignment: a and b must be"), torch.no_grad():
        bad.collect(x[:10], mu)  # raised by the worker, at collect
    never = _pairwise.start_ncai_statistics(x, mu, grads=(False, False))
    del never  # waited for and dropped, not left running


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
def test_started_statistics_refuse_inputs_modified_before_collection():
    x, mu = _points(30, 1, 8)
    values = mu.detach().clone()
    started = _pairwise.start_ncai_statistics(x.detach(), values, grads=(False, False))
    values.add_(1.0)  # the worker may have read either value
    with pytest.raises(RuntimeError, match="modified in place while their statistics were computed"):
        started.collect(x, mu)


def _started_in_child(x, mu, queue):
    started = _pairwise.start_ncai_statistics(x, mu, grads=(False, False))
    with torch.no_grad():
        queue.put([v.item() for v in started.collect(x, mu)])


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_forked_child_starts_its_own_statistics_worker():
    """The parent's worker thread does not exist in a forked child: the child starts its own
    (a handle of the parent's would be unknown there), instead of waiting forever."""
    x, mu = (t.detach() for t in _points(40, 1, 9))
    started = _pairwise.start_ncai_statistics(x, mu, grads=(False, False))  # the parent's worker runs
    with torch.no_grad():
        expected = [v.item() for v in started.collect(x, mu)]
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_started_in_child, args=(x, mu, queue))
    child.start()
    try:
        assert queue.get(timeout=60) == expected
    finally:
        child.join(timeout=60)


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("grads", [(True, True), (False, True), (False, False)])
def test_hz_and_hsic_side_by_side_on_the_pool_equal_one_after_the_other(dtype, grads):
    """ncai_statistics with parallel=True (HZ and the off-diagonal norm on one thread of torch's
    intra-op pool, HSIC on another; here two threads) gives the serial call's seven outputs to the
    bit, and so does the registered operator with its gradients, with the pool at one thread too."""
    module = pairwise_extension()
    x, mu = _points(90, 2, 3, dtype=dtype)
    x, mu = x.detach(), mu.detach()
    beta2 = _pairwise._beta2_tensor(*mu.shape)
    before = torch.get_num_threads()
    try:
        outputs = []
        for threads, parallel in ((2, True), (2, False), (1, True)):
            torch.set_num_threads(threads)
            outputs.append(module.ncai_statistics(x, mu, beta2, 1e-12, 1e-12, *grads, parallel=parallel))
            xs, ms = x.clone().requires_grad_(grads[0]), mu.clone().requires_grad_(grads[1])
            stats = _pairwise.ncai_statistics_unchecked(xs, ms, hz_per_point=True)
            wanted = [t for t in (xs, ms) if t.requires_grad]
            outputs[-1] += [*stats, *(torch.autograd.grad(sum(stats), wanted) if wanted else ())]
    finally:
        torch.set_num_threads(before)
    reference = outputs[1]
    assert len(reference) >= 10
    for other in (outputs[0], outputs[2]):
        assert all(torch.equal(a, b) for a, b in zip(other, reference))


def test_a_worker_thread_is_started_only_beside_a_pool_short_of_the_cpus(monkeypatch):
    """NCAI's fused step starts its statistics on another thread only where one gets a core:
    more than one inter-op thread and fewer intra-op threads than the process's CPUs."""
    from pyro_bnnlv.infer.elbos import ncai

    for interop, intraop, cpus, free in ((4, 2, 2, False), (4, 1, 2, True), (1, 1, 2, False), (8, 4, 16, True)):
        monkeypatch.setattr(torch, "get_num_interop_threads", lambda: interop)
        monkeypatch.setattr(torch, "get_num_threads", lambda: intraop)
        monkeypatch.setattr(ncai, "_cpus", lambda: cpus)
        assert ncai._core_beside_the_pool() is free, (interop, intraop, cpus)
    monkeypatch.undo()
    assert ncai._cpus() >= 1


def test_openmp_only_with_gcc(monkeypatch):
    """The builds use -fopenmp with GCC (torch's GNU OpenMP runs the kernels' parallel_for) and
    -fopenmp-simd with any other compiler (the parallel_for chunks run one after another)."""
    from pyro_bnnlv import _compiled

    for line, flag in (
        ("/usr/bin/x86_64-linux-gnu-g++-12 (x86_64-linux-gnu-g++-12 (Debian 12.2.0-14) 12.2.0)", "-fopenmp"),
        ("/usr/bin/g++ (g++ (GCC) 13.2.1 20231205)", "-fopenmp"),
        ("/usr/bin/clang++-15 (Debian clang version 15.0.6)", "-fopenmp-simd"),
        ("/usr/bin/c++ (Apple clang version 15.0.0 (clang-1500.1.0.2.5))", "-fopenmp-simd"),
        ("icpx (?)", "-fopenmp-simd"),
    ):
        monkeypatch.setattr(_compiled, "toolchain", lambda: line)
        assert flag in _compiled.flags() and "-O3" in _compiled.flags(), line


_RUNTIMES = """
import torch
from pathlib import Path
from pyro_bnnlv.stats import _pairwise
torch.set_num_threads(2)
x, mu = torch.randn(40, 2, dtype=torch.float64), torch.randn(40, 2, dtype=torch.float64)
_pairwise.pairwise_extension().ncai_statistics(x, mu, _pairwise._beta2_tensor(40, 2), 1e-12, 1e-12, False, True)
maps = Path("/proc/self/maps").read_text().splitlines()
print(sorted({l.split()[-1] for l in maps if any(n in l for n in ("libgomp", "libomp", "libiomp"))}))
"""


@pytest.mark.skipif(not COMPILED, reason="no C++ compiler")
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_the_kernels_bring_no_second_openmp_runtime():
    """With -fopenmp the kernels' OpenMP calls resolve to the runtime torch has loaded: in a
    fresh process (this one may hold other libraries' runtimes, e.g. scikit-learn's) that loads
    them and runs their parallel_for, one OpenMP library is mapped: torch's."""
    out = subprocess.run([sys.executable, "-c", _RUNTIMES], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    runtimes = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert len(runtimes) <= 1, runtimes  # torch's own (a wheel's torch/lib/libgomp.so.1 here)
