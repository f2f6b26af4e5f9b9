r"""Fused pairwise Gaussian-kernel sums with analytic gradients (the O(n^2) part of NCAI's penalties).

The Henze-Zirkler statistic (:func:`~pyro_bnnlv.stats.dependence.henze_zirkler`) and the
normalised HSIC (:func:`~pyro_bnnlv.stats.hsic.normalized_hsic`) are sums over all pairs of a
minibatch of Gaussian kernels

.. math::  E_{ij} = \exp(-\gamma \lVert y_i - y_j \rVert^2).

Written with autograd they cost about twenty ``n x n`` passes each way and keep several ``n x n``
tensors alive for backward (``pyro-bnnlv bench ncai`` measures the cost). Here each statistic is
one :class:`torch.autograd.Function` that

* builds ``E`` with **one** matrix product, using
  :math:`-\gamma\lVert y_i - y_j\rVert^2 = 2\gamma\, y_i^\top y_j + a_i + a_j` with
  :math:`a_i = -\gamma\lVert y_i\rVert^2`, i.e. ``[y, a, 1] @ [2 gamma y, 1, a]^T``, then clamps
  the exponent at 0 (round-off can make a squared distance slightly negative) and exponentiates
  in place;
* computes the gradient with respect to the points **in the forward pass** (only when one is
  needed) from the analytic formula

  .. math::

      \frac{\partial}{\partial y_i} \sum_{a,b} G_{ab} E_{ab}
          = -4\gamma \sum_j G_{ij} E_{ij} (y_i - y_j)
          = -4\gamma\big( (M\mathbf 1)_i\, y_i - (M y)_i \big),\qquad M = G \circ E,

  for a symmetric weight matrix ``G`` (``dL/dE``), i.e. one more matrix product
  ``M @ [1, y]``. Only the ``(n, k)`` gradient is kept for backward, no ``n x n`` tensor.

**Compiled kernels.** ``_pairwise.cpp`` computes the Henze-Zirkler statistic (whitening
included), the off-diagonal covariance norm and the normalised HSIC with their gradients, each
in one C++ call (pairs ``i < j`` once, in double), and all three NCAI statistics of a batch in
one call (:func:`ncai_statistics`). Built on first use (cached by torch) and used when available;
the torch functions here are the reference and the fallback (``PYRO_BNNLV_COMPILED=0`` disables
the build, as for the NUTS core).

The gradients are first-order only: Hessians through the penalties raise an error
(``create_graph=True``) rather than miss the statistics' part. In a ``torch.jit.trace`` graph
the functions are ``prim::PythonOp`` nodes run by Python at every call (bandwidths computed
inside each call, not frozen).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

from .._compiled import build_extension
from ._inputs import _as_tensor_2d, _check_same_n

__all__ = [
    "StartedStatistics",
    "centred_alignment",
    "compiled_henze_zirkler",
    "compiled_weighted_penalty",
    "gauss_gram",
    "gauss_kernel_sum",
    "henze_zirkler_beta",
    "henze_zirkler_unchecked",
    "ncai_statistics",
    "ncai_statistics_unchecked",
    "offdiag_cov_norm_unchecked",
    "pairwise_extension",
    "penalty_gradient",
    "start_ncai_statistics",
    "weighted_ncai_statistics",
]

_SOURCE = Path(__file__).with_name("_pairwise.cpp")


def pairwise_extension() -> ModuleType | None:
    """The compiled kernels of ``_pairwise.cpp`` (built on the first call, a few seconds), or
    ``None`` when disabled (``PYRO_BNNLV_COMPILED=0``) or unbuildable (warns once, not retried)."""
    return build_extension(
        "pyro_bnnlv_pairwise",
        _SOURCE,
        "compiled pairwise kernels",
        "the NCAI statistics use the pure-torch path (slower)",
    )


def _use_compiled(compiled: bool | None, *tensors: Tensor) -> ModuleType | None:
    """The kernels for a ``compiled=`` option; they read CPU memory only, so tensors on another
    device take the torch path (``compiled=True`` then raises)."""
    on_cpu = all(t.is_cpu for t in tensors if isinstance(t, Tensor))
    module = None if compiled is False or not on_cpu else pairwise_extension()
    if compiled and module is None:
        why = (
            "the tensors are not on the CPU"
            if not on_cpu
            else ("see the warning above, or PYRO_BNNLV_COMPILED=0 is set")
        )
        raise RuntimeError(f"compiled=True but the compiled pairwise kernels are unavailable ({why})")
    return module


_OPERATORS: dict[str, object] = {}


def _operator(name: str):
    """The registered operator ``torch.ops.pyro_bnnlv_pairwise.<name>`` (its one overload), looked
    up once: resolving the attribute chain and the overload costs about as much as a small tensor
    operation per call. Only called once the kernels are loaded (:func:`_use_compiled`)."""
    op = _OPERATORS.get(name)
    if op is None:
        op = _OPERATORS[name] = getattr(torch.ops.pyro_bnnlv_pairwise, name).default
    return op


def _first_order_only(ctx: object) -> None:
    """Backward with ``create_graph=True`` (a Hessian, a Hessian-vector product) would need the
    derivative of these hand-written gradients, which is not implemented: refuse it rather than
    return a curvature with the statistic's part silently missing."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            "pyro_bnnlv's Henze-Zirkler / HSIC kernels have first-order gradients only: second "
            "derivatives (create_graph=True, torch.autograd.functional.hessian, Hessian-vector "
            "products) through them are not supported"
        )


def gauss_gram(y: Tensor, gamma: Tensor | float) -> Tensor:
    r"""``exp(-gamma ||y_i - y_j||^2)`` for a sample ``y`` of shape ``(n, k)``: one matmul, one exp.

    The exponent is ``[y, a, 1] @ [2 gamma y, 1, a]^T`` with ``a_i = -gamma ||y_i||^2`` (the
    expansion ``||y_i||^2 + ||y_j||^2 - 2 y_i.y_j``, as the autograd version computed it),
    clamped at 0 from above. Not differentiable by itself (used inside the Functions below).
    """
    a = y.square().sum(1, keepdim=True) * (-gamma)
    ones = torch.ones_like(a)
    left = torch.cat([y, a, ones], dim=1)
    right = torch.cat([y * (2.0 * gamma), ones, a], dim=1)
    return (left @ right.T).clamp_(max=0.0).exp_()


def _grad_points(m: Tensor, y: Tensor, gamma: Tensor | float) -> tuple[Tensor, Tensor]:
    """``(-4 gamma (M1 * y - M y), M1)``: the gradient of ``sum(G * E)`` w.r.t. ``y`` for
    ``M = G * E``, and the row sums of ``M``."""
    mv = m @ torch.cat([torch.ones_like(y[:, :1]), y], dim=1)
    return (mv[:, :1] * y - mv[:, 1:]) * (-4.0 * gamma), mv[:, 0]


class _GaussKernelSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: Tensor, gamma: float) -> Tensor:
        e = gauss_gram(y, gamma)
        if not ctx.needs_input_grad[0]:
            return e.sum()
        grad, rows = _grad_points(e, y, gamma)
        ctx.save_for_backward(grad)
        return rows.sum()

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None]:
        _first_order_only(ctx)
        (grad,) = ctx.saved_tensors
        return grad_out * grad, None


def gauss_kernel_sum(y: Tensor, gamma: float) -> Tensor:
    r""":math:`\sum_{i,j=1}^n \exp(-\gamma \lVert y_i - y_j\rVert^2)` of ``y`` ``(n, k)``, differentiable in ``y``.

    Two ``n x n`` matrix products and one ``exp``; memory kept for backward is ``O(n k)``.
    ``gamma`` is fixed by the sample's shape (as the Henze-Zirkler ``beta``).
    """
    return _GaussKernelSum.apply(y, gamma)


def henze_zirkler_beta(n: int, k: int) -> float:
    r"""Smoothing parameter of the Henze-Zirkler test (Henze & Zirkler, 1990, eq. 3.6).

    .. math::  \beta = \frac{1}{\sqrt 2}\Big(\frac{n(2k+1)}{4}\Big)^{1/(k+4)}

    Yacoby, Pan & Doshi-Velez (2022), arXiv:1911.00569 (after eq. 25) print the exponent as ``-k/4``; that
    is a typesetting error: with ``-k/4`` beta would shrink to 0 as ``n`` grows, whereas Henze &
    Zirkler's choice (the optimal kernel bandwidth, ``1/(k+4)``) grows slowly with ``n``. We use
    the published ``1/(k+4)``, as pingouin and the R package MVN do.
    """
    return (1.0 / math.sqrt(2.0)) * ((n * (2 * k + 1)) / 4.0) ** (1.0 / (k + 4))


class _HenzeZirkler(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, beta2: Tensor | float, ridge: float) -> Tensor:
        ext = _use_compiled(True)
        beta2 = beta2 if isinstance(beta2, Tensor) else torch.full((), beta2, dtype=torch.float64)
        value, grad = ext.henze_zirkler(x, beta2, ridge, ctx.needs_input_grad[0])
        ctx.save_for_backward(grad)
        return value

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None]:
        _first_order_only(ctx)
        (grad,) = ctx.saved_tensors
        return grad_out * grad, None, None


def compiled_henze_zirkler(
    x: Tensor, beta2: Tensor | float, ridge: float, compiled: bool | None = None
) -> Tensor | None:
    r"""The whole Henze-Zirkler statistic of ``x`` ``(n, k)`` in one C++ call, or ``None`` when
    the kernels are unavailable or ``compiled=False`` (the caller then runs its torch
    expression; ``compiled=True`` raises when they are unavailable).

    Same quantity as :func:`~pyro_bnnlv.stats.dependence.henze_zirkler` (centring, ML
    covariance with the ridge, Cholesky whitening, both kernel sums, in double), and its
    gradient by the chain rule through the whitening: with ``u_i = x_i - xbar``,
    ``P = S_delta^{-1}``, ``w_i = sum_j E_ij (u_i - u_j)``, ``e_i = exp(-g_2 D_i)``,

    .. math::

        h_i = -\tfrac{4 g_1}{n} w_i + 2 c_2 g_2 e_i u_i,\quad
        G_P = \tfrac12 \sum_i u_i h_i^\top,\quad
        G_C = -P G_P P + \tfrac{\delta}{k}\operatorname{tr}(-P G_P P)\, I,

        \partial \mathrm{HZ}/\partial u_i = P h_i + \tfrac2n G_C u_i,\qquad
        \partial \mathrm{HZ}/\partial x_i = \partial \mathrm{HZ}/\partial u_i
            - \tfrac1n \sum_l \partial \mathrm{HZ}/\partial u_l,

    (``g_1 = beta^2/2``, ``g_2 = beta^2 / (2(1+beta^2))``, ``c_2 = 2(1+beta^2)^{-k/2}``).
    """
    if _use_compiled(compiled, x) is None:
        return None
    return _HenzeZirkler.apply(x, beta2, ridge)


def henze_zirkler_unchecked(x: Tensor, ridge: float = 1e-12, compiled: bool | None = None) -> Tensor:
    """:func:`~pyro_bnnlv.stats.dependence.henze_zirkler` after its input checks: ``x`` a real
    ``(n, k)`` tensor with ``n > k`` and ``n >= 3``, ``ridge >= 0`` (a non-finite ``x`` gives a
    non-finite value, not an error). In one call of the compiled kernel (:func:`compiled_henze_zirkler`) where
    ``compiled`` allows it, else the torch expression."""
    n, k = x.shape
    beta2 = henze_zirkler_beta(n, k) ** 2
    fused = compiled_henze_zirkler(x, beta2, ridge, compiled)  # the same in one C++ call
    if fused is not None:
        return fused
    xd = x.to(torch.float64)
    xc = xd - xd.mean(dim=0, keepdim=True)
    cov = xc.T @ xc / n  # ML covariance, divisor n
    eye = torch.eye(k, dtype=torch.float64, device=x.device)
    cov = cov + (ridge * cov.diagonal().sum() / k + 1e-30) * eye
    chol, info = torch.linalg.cholesky_ex(cov)
    # a failed factorisation (a non-finite sample) gives NaN, as in the compiled kernel, not an error
    chol = torch.where(info == 0, chol, torch.nan)
    # whitened sample: y_i = L^{-1}(x_i - xbar), so y_i.y_j = (x_i-xbar)^T S^{-1} (x_j-xbar)
    y = torch.linalg.solve_triangular(chol, xc.T, upper=False).T
    d_i = y.square().sum(dim=1)  # D_i
    term1 = gauss_kernel_sum(y, 0.5 * beta2) / n  # fused sum over the n^2 pairs, D_ij = |y_i - y_j|^2
    term2 = 2.0 * (1.0 + beta2) ** (-k / 2) * torch.exp(-beta2 / (2.0 * (1.0 + beta2)) * d_i).sum()
    term3 = n * (1.0 + 2.0 * beta2) ** (-k / 2)
    return (term1 - term2 + term3).to(x.dtype)


def offdiag_cov_norm_unchecked(z: Tensor, correction: int = 0) -> Tensor:
    """:func:`~pyro_bnnlv.stats.dependence.offdiag_cov_norm` after its input checks: ``z`` a
    real ``(n, k)`` tensor with ``n > correction``, ``correction`` 0 or 1."""
    n = z.shape[0]
    zc = z - z.mean(dim=0, keepdim=True)
    cov = zc.T @ zc / (n - correction)
    off = cov - torch.diag_embed(torch.diagonal(cov))
    return torch.linalg.vector_norm(off)


def compiled_weighted_penalty(
    coeffs: tuple[float, ...], scales: tuple[float, ...], terms: tuple[Tensor, ...]
) -> Tensor | None:
    """NCAI's weighting ``sum_k c_k g_k(t_k)`` of 0-dim statistics (``g_k(t) = safe_exp(t / e_k)``
    for ``e_k > 0``, else ``t``) as one C++ autograd node of the compiled kernels
    (``torch.ops.pyro_bnnlv_pairwise.weighted_penalty``: the arithmetic of
    ``infer.elbos.ncai._WeightedPenalty``, same value and gradients to the bit, no Python in the
    backward pass), or ``None`` where the kernels are unavailable (the caller runs the Python one)."""
    if _use_compiled(None, *terms) is None:
        return None
    return _operator("weighted_penalty")(list(terms), list(coeffs), list(scales))


def _centre(k: Tensor) -> Tensor:
    """``H K H`` of a symmetric ``K`` (``H = I - 11^T/n``): two passes over ``K``."""
    r = k.mean(1)
    return (k - r[:, None]) - (r[None, :] - r.mean())


def _bandwidth_gamma(a: Tensor, eps: float) -> Tensor:
    """``1 / (2 h^2)`` with ``h^2 = sum_d Var(a_d) + eps`` (divisor ``n``), without gradient."""
    return 0.5 / (a.detach().var(0, unbiased=False).sum() + eps)


def _centred_alignment_torch(
    a: Tensor, b: Tensor, eps: float, want: tuple[bool, bool]
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    gamma_a, gamma_b = _bandwidth_gamma(a, eps), _bandwidth_gamma(b, eps)
    k, l_ = gauss_gram(a, gamma_a), gauss_gram(b, gamma_b)
    kc, lc = _centre(k), _centre(l_)
    kc_flat, lc_flat = kc.reshape(-1), lc.reshape(-1)
    num = kc_flat @ lc_flat
    skk, sll = kc_flat @ kc_flat + eps, lc_flat @ lc_flat + eps
    root = torch.sqrt(skk * sll)
    grads: list[Tensor | None] = []
    # dV/dL = Kc / sqrt(P) - V Lc / (sLL + eps), P = (sKK + eps)(sLL + eps); same for K
    for needed, own_c, other_c, own_s, gram, pts, gamma in (
        (want[0], kc, lc, skk, k, a, gamma_a),
        (want[1], lc, kc, sll, l_, b, gamma_b),
    ):
        if needed:
            g = torch.addcmul(other_c, own_c, num / own_s, value=-1.0)
            grads.append(_grad_points(g.mul_(gram), pts, gamma)[0] / root)
        else:
            grads.append(None)
    return num / root, grads[0], grads[1]


class _CentredAlignment(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, eps: float, compiled: bool | None) -> Tensor:
        want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        ext = _use_compiled(compiled, a, b)
        if ext is not None:
            value, ga, gb = ext.centred_alignment(a, b, eps, *want)
        else:
            value, ga, gb = _centred_alignment_torch(a, b, eps, want)
        ctx.save_for_backward(ga if want[0] else None, gb if want[1] else None)
        return value

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        _first_order_only(ctx)
        ga, gb = ctx.saved_tensors
        return None if ga is None else grad_out * ga, None if gb is None else grad_out * gb, None, None


def centred_alignment(a: Tensor, b: Tensor, eps: float, *, compiled: bool | None = None) -> Tensor:
    r"""Centred kernel alignment of Gaussian Grams ``K = exp(-gamma_a D^a)``, ``L = exp(-gamma_b D^b)``:

    .. math::  \frac{\operatorname{tr}(\tilde K \tilde L)}
                    {\sqrt{(\lVert\tilde K\rVert_F^2 + \epsilon)(\lVert\tilde L\rVert_F^2 + \epsilon)}},
               \qquad \tilde K = HKH,

    with ``gamma = 1 / (2 (sum_d Var(a_d) + eps))`` (treated as a constant: the bandwidths carry
    no gradient), differentiable in ``a`` and ``b`` (same dtype). With ``V`` the value and ``P``
    the denominator squared,
    :math:`\partial V/\partial L = \tilde K/\sqrt P - V \tilde L/(\lVert\tilde L\rVert_F^2 + \epsilon)`
    (symmetric), fed to the pairwise-gradient formula of the module doc. ``compiled``: ``None``
    uses the compiled kernel when available, ``True`` requires it, ``False`` uses torch.
    """
    return _CentredAlignment.apply(a, b, eps, compiled)


def ncai_statistics(
    x: Tensor, mu_z: Tensor, *, ridge: float = 1e-12, eps: float = 1e-12, compiled: bool | None = None
) -> tuple[Tensor, Tensor, Tensor] | None:
    """``(henze_zirkler(mu_z), offdiag_cov_norm(mu_z), normalized_hsic(x, mu_z))`` in one call of
    the compiled kernel, or ``None`` when it is unavailable or ``compiled=False``.

    The three statistics NCAI's default objective reads from a batch (``ncai_penalties`` with
    ``independence="hsic"``; the same values and gradients to round-off), in one registered
    operator (``torch.ops.pyro_bnnlv_pairwise.ncai_statistics``) with a C++ autograd node, which a
    ``torch.jit.trace`` graph calls without entering Python. Same input checks and errors as the
    separate functions; :func:`ncai_statistics_unchecked` is the call after them.
    """
    if _use_compiled(compiled, x, mu_z) is None:
        return None
    if torch.jit.is_tracing():
        mu = mu_z.reshape(mu_z.shape[0], -1)
    else:
        mu = _as_tensor_2d("mu_z", mu_z)
        _check_same_n("x", x, "mu_z", mu)
        if mu.shape[0] < 3:
            raise ValueError(f"`mu_z` must have at least 3 rows (datapoints), got {mu.shape[0]}")
    return _kernel_statistics(x, mu, ridge, eps)


def ncai_statistics_unchecked(
    x: Tensor, mu: Tensor, *, ridge: float = 1e-12, eps: float = 1e-12, hz_per_point: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """The three statistics of :func:`ncai_statistics` without its input checks, for a caller that
    has made them (a training step's rows of data checked once and of the guide's means; a
    non-finite mean then shows as a non-finite statistic, hence loss): ``mu`` a real ``(n, k)``
    tensor with ``n > k`` and ``n >= 3``, ``x`` ``n`` rows. In one call of the compiled kernel
    where :func:`ncai_statistics` would make it, else by the torch expressions of the three
    statistics (:func:`henze_zirkler_unchecked`, :func:`offdiag_cov_norm_unchecked`,
    :func:`centred_alignment`), never ``None``. ``hz_per_point``: HZ divided by ``n`` (NCAI's
    default normalisation; in the compiled operator, the same division and gradient)."""
    n = mu.shape[0]
    if _use_compiled(None, x, mu) is not None:
        return _kernel_statistics(x, mu, ridge, eps, n if hz_per_point else 1)
    x2 = x.reshape(n, -1).to(mu.dtype)
    hz = henze_zirkler_unchecked(mu, ridge, compiled=False)
    return (
        hz / n if hz_per_point else hz,
        offdiag_cov_norm_unchecked(mu),
        centred_alignment(x2, mu, eps, compiled=False),
    )


def weighted_ncai_statistics(
    x: Tensor,
    mu: Tensor,
    coeffs: tuple[float, float, float],
    scales: tuple[float, float, float],
    *,
    hz_per_point: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """``(penalty, hz, offdiag, hsic)``: :func:`ncai_statistics_unchecked` of ``x`` and ``mu``
    (same conditions) after NCAI's weighted penalty of them, as
    :meth:`StartedStatistics.collect_weighted` returns it, computed now on the calling thread (HZ
    and HSIC side by side on torch's intra-op pool) as one autograd node; ``None`` where the
    compiled kernels are unavailable."""
    if _use_compiled(None, x, mu) is None:
        return None
    n, k = mu.shape
    op = _operator("ncai_statistics_weighted")
    return op(
        _rows_like(x, mu), mu, _beta2_tensor(n, k), 1e-12, 1e-12, n if hz_per_point else 1, list(coeffs), list(scales)
    )


def penalty_gradient(
    x: Tensor,
    mu: Tensor,
    coeffs: tuple[float, float, float],
    scales: tuple[float, float, float],
    *,
    hz_per_point: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor] | None:
    """``(penalty, hz, offdiag, hsic, grad_mu)``: :func:`weighted_ncai_statistics`'s values, without
    gradient, and the penalty's gradient with respect to ``mu`` (:meth:`StartedStatistics.collect_gradient`,
    computed now); ``None`` where the compiled kernels are unavailable."""
    _check_no_x_gradient(x)
    module = _use_compiled(None, x, mu)
    if module is None:
        return None
    n, k = mu.shape
    divisor = n if hz_per_point else 1
    return module.ncai_penalty_gradient(
        _rows_like(x, mu), mu, _beta2_tensor(n, k), 1e-12, 1e-12, divisor, coeffs, scales, -1
    )


def _check_no_x_gradient(x: Tensor) -> None:
    """The penalty's gradient comes back for ``mu`` only: refuse an ``x`` that needs one too."""
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "x requires a gradient, and only mu's gradient of the penalty is returned here: "
            "use the autograd node (collect_weighted / weighted_ncai_statistics) instead"
        )


#: the unused tensor argument of a collected call (its statistics were started with their inputs)
_EMPTY = torch.empty(0, dtype=torch.float64)


def _rows_like(x: Tensor, mu: Tensor) -> Tensor:
    """``x`` as the kernels read it beside ``mu``: ``(n, d)`` rows in ``mu``'s dtype."""
    return x if x.dim() == 2 and x.dtype == mu.dtype else x.reshape(x.shape[0], -1).to(mu.dtype)


class StartedStatistics:
    """The three statistics of :func:`ncai_statistics_unchecked` computing on another thread
    (:func:`start_ncai_statistics`). :meth:`collect` waits for them and returns them as that
    function would on ``x`` and ``mu``: the values, and the gradients as one autograd node on
    those tensors (``torch.ops.pyro_bnnlv_pairwise.ncai_statistics_collect``). Collected at most
    once; one never collected is waited for and dropped when garbage-collected."""

    def __init__(self, module: ModuleType, x: Tensor, mu: Tensor, grads: tuple[bool, bool], hz_divisor: int) -> None:
        self._module, self._grads, self._hz_divisor = module, grads, hz_divisor
        self._inputs = (x, mu, x._version, mu._version)  # read by the worker until collected
        self._handle: int | None = None
        self._handle = module.ncai_statistics_start(x, mu, _beta2_tensor(*mu.shape), 1e-12, 1e-12, *grads)

    def collect(self, x: Tensor, mu: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The statistics, as outputs of ``x`` and ``mu``: the tensors they were started on, or
        the same values computed again (the node then sits where a synchronous call would)."""
        return self.collect_weighted(x, mu, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0))[1:]

    def collect_weighted(
        self, x: Tensor, mu: Tensor, coeffs: tuple[float, float, float], scales: tuple[float, float, float]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(penalty, hz, offdiag, hsic)``: :meth:`collect`'s statistics after NCAI's weighted
        penalty of them, ``sum_k c_k g_k(t_k)`` over the statistics with ``c_k != 0`` (in order,
        as :func:`compiled_weighted_penalty` computes it on those), all outputs of one autograd
        node: the same values and gradients as the two nodes, in one."""
        handle = self._take(x, mu)
        op = _operator("ncai_statistics_collect")
        return op(_rows_like(x, mu), mu, handle, self._hz_divisor, list(coeffs), list(scales))

    def collect_gradient(
        self, x: Tensor, mu: Tensor, coeffs: tuple[float, float, float], scales: tuple[float, float, float]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``(penalty, hz, offdiag, hsic, grad_mu)``: :meth:`collect_weighted`'s values, without
        gradient, and the penalty's gradient with respect to ``mu`` as a tensor: the same bits
        as the node's backward pass from the penalty, for a caller that adds it to ``mu``'s
        gradient itself (NCAI's fused training step). Needs statistics started with ``mu``'s
        gradient, and no gradient with respect to ``x``."""
        _check_no_x_gradient(x)
        handle = self._take(x, mu)
        return self._module.ncai_penalty_gradient(x, mu, _EMPTY, 0.0, 0.0, self._hz_divisor, coeffs, scales, handle)

    def _take(self, x: Tensor, mu: Tensor) -> int:
        """The handle to collect, once the inputs are checked unchanged and the gradients now
        needed were started (the handle is discarded, waited for, otherwise)."""
        if self._handle is None:
            raise RuntimeError("these statistics were collected already")
        handle, self._handle = self._handle, None
        x0, mu0, x_version, mu_version = self._inputs
        if (x0._version, mu0._version) != (x_version, mu_version):
            self._module.ncai_statistics_discard(handle)
            raise RuntimeError(
                "x or mu was modified in place while their statistics were computed on another thread: "
                "start them on tensors that stay unchanged until collected"
            )
        wanted = [t.requires_grad and torch.is_grad_enabled() for t in (x, mu)]
        if any(w and not g for w, g in zip(wanted, self._grads)):
            self._module.ncai_statistics_discard(handle)
            raise RuntimeError(
                f"the statistics were started without the gradients now needed (grads={self._grads}, "
                f"x and mu requiring one: {tuple(wanted)}): start them with grads={tuple(wanted)}"
            )
        return handle

    def __del__(self) -> None:
        if self._handle is not None:
            self._module.ncai_statistics_discard(self._handle)


def start_ncai_statistics(
    x: Tensor, mu: Tensor, *, grads: tuple[bool, bool], hz_per_point: bool = False
) -> StartedStatistics | None:
    """:func:`ncai_statistics_unchecked` (the same inputs and numbers) started on the compiled
    kernels' worker thread on the values of ``x`` and ``mu``, so that the caller computes something else
    meanwhile (NCAI's fused step: the ELBO), or ``None`` where the compiled kernels are
    unavailable. Returns at once; ``x`` and ``mu`` must not be modified in place until the
    statistics are collected (:meth:`StartedStatistics.collect` raises if they were). ``grads``:
    whether to compute the gradients with respect to ``x`` and ``mu`` (for the tensors
    :meth:`StartedStatistics.collect` receives)."""
    module = _use_compiled(None, x, mu)
    if module is None:
        return None
    return StartedStatistics(module, _rows_like(x, mu).detach(), mu.detach(), grads, mu.shape[0] if hz_per_point else 1)


def _kernel_statistics(
    x: Tensor, mu: Tensor, ridge: float, eps: float, hz_divisor: int = 1
) -> tuple[Tensor, Tensor, Tensor]:
    """The compiled operator's call on checked inputs (``mu`` ``(n, k)``): HZ divided by
    ``hz_divisor``, the off-diagonal norm and nHSIC."""
    n, k = mu.shape
    x2 = _rows_like(x, mu)
    if isinstance(n, int) and isinstance(k, int):
        beta2 = _beta2_tensor(n, k)
    else:  # sizes traced as tensors
        beta2 = henze_zirkler_beta(n, k) ** 2
        beta2 = beta2 if isinstance(beta2, Tensor) else torch.full((), beta2, dtype=torch.float64)
    return _operator("ncai_statistics")(x2, mu, beta2, ridge, eps, hz_divisor)


@functools.lru_cache(maxsize=64)
def _beta2_tensor(n: int, k: int) -> Tensor:
    """``henze_zirkler_beta(n, k)^2`` as the 0-dim double tensor the kernel reads (one per batch
    shape: the kernel only reads it)."""
    return torch.full((), henze_zirkler_beta(n, k) ** 2, dtype=torch.float64)
