"""Noise-Constrained Approximate Inference (Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569,
sec. 6, App. D).

The NCAI objective, eq. 27, for a BNN+LV with mean-field guide:

.. math::

    \\mathcal L_{NCAI} = -\\mathrm{ELBO}
      + \\lambda_1 N \\exp\\big(\\mathrm{HZ}(\\{\\mu_{z_n}\\}) / \\epsilon_T\\big)
      + \\lambda_2 N \\lVert \\operatorname{offdiag} \\hat\\Sigma(\\{\\mu_{z_n}\\}) \\rVert_2
      + \\lambda_3 N \\exp\\big(\\mathrm{PC}(x, \\mu_z)/\\epsilon_x\\big)
                     \\exp\\big(\\mathrm{PC}(y, \\mu_z)/\\epsilon_y\\big),

where ``mu_z`` are the guide's variational *means* of the latent inputs of the current
(mini)batch, read from the guide trace (:func:`~pyro_bnnlv.posterior.guide_site_mean`), not samples: App. F.2 explains
that samples let the penalty be gamed by inflating variational variances.

The independence term (``independence=``). The paper's intent (sec. 6, App. D) is that the
latents carry no information about the inputs, ``I(x; z) = 0``; eq. 23-24 approximate it by the
linear correlations of ``mu_z`` with ``x`` *and with* ``y`` ("``y`` depends non-linearly on
``x``"). Measured, that proxy fails in both directions:

* it penalises the truth: the true latents of heavy-tail have ``|corr(y, z)| = 0.08-0.14``
  (``z`` is the noise that ``y`` carries), which at ``eps_y = 0.1`` costs the ground truth
  1.4-3.5 N nats above the penalty's floor (depeweg 17-50 N, bimodal 740-1,100 N);
* it can be met without independence: its gradient on each ``mu_n`` is linear in
  ``(x_n, y_n)`` and dominates the ELBO's, so Adam moves ``mu_n`` by ``-lr sign(a x_n + b y_n)``
  per step; ``I(x; mu_z)`` rises from 0 to 0.94 within 10 steps while ``|corr|`` falls to 0.003.

The default ``independence="hsic"`` penalises the normalised Hilbert-Schmidt independence
criterion of ``x`` and ``mu_z`` (:func:`~pyro_bnnlv.stats.hsic.normalized_hsic`, Gaussian kernels,
bandwidths from the samples' spread), ``lambda3 N exp(nHSIC(x, mu_z) / eps_x)``: zero in the population iff ``x`` and
``mu_z`` are independent, blind to nothing a correlation misses (``mu_z = x^2`` scores 0.35,
a sign pattern of ``x + y`` 0.61), invariant to rescaling ``mu_z`` and indifferent to ``y``, so
the truth pays almost nothing (heavy-tail: ``nHSIC(x, z_true) = 0.003-0.007``, the null's 95%
quantile is 0.015). ``independence="pc"`` keeps the printed form.

Measured on data it was not tuned on (docs/results.md, "Why the independence term missed the
dependence"), the single-bandwidth nHSIC can sit at its null while ``I(x; mu_z)`` stays large:
its one kernel width is about the spread of ``x``, and the dependence left lives at a tenth of
it. ``independence="knn-mi"`` penalises a k-NN estimate of ``I(x; mu_z)`` itself
(:func:`~pyro_bnnlv.stats.independence.knn_mutual_information`), ``"hsic-multiscale"`` nHSIC
averaged over bandwidths from 0.1 to 2 median spreads; which one is the default is decided by
the family benchmark (``pyro-bnnlv reproduce ncai-family``). These terms are penalised at
``max(T, 0)``: the mutual information is never negative, while the k-NN estimate can be pushed
far below 0 by arranging the means (minimising it alone over 120 free means takes it to -0.6 to
-1.3 nats, on fresh reference sets too; its null spread is a few hundredths). Unfloored, NCAI did
that on the family benchmark's first problems (the estimate at -0.75 to -1.14 after training, test
LL 0.14-0.34 nats below the floored term's fits on problems 0-3; docs/results.md).
Floored, the single-size estimate was still met without independence: trained at ``m = 15`` it
ended at 0 while larger neighbourhoods and KSG still saw 0.2-0.4 nats (family problem 02), so
``"knn-mi-multiscale"`` floors it at each of 4 sizes and draws its reference sets afresh each
step (:func:`~pyro_bnnlv.stats.independence.multiscale_knn_mi`). Trained at sizes up to 64, it
left dependence at coarser neighbourhoods (family problem 08: 0.08-0.10 nats at 128-256 points),
so ``"knn-mi-wide"`` doubles the sizes up to a quarter of the batch and estimates each at 128
random anchor points per step.

Readings of the printed text (documented choices):

* ``PC`` (eq. 24) is printed as a signed correlation, whose minimum -1 is perfect
  anti-dependence, not independence; we penalise its magnitude, the mean of ``|corr|`` over all
  pairs of columns (:func:`pyro_bnnlv.stats.correlation_penalty`).
* ``HZ`` is the Henze & Zirkler (1990) statistic (:func:`pyro_bnnlv.stats.henze_zirkler`, with
  their smoothing parameter; the exponent printed after eq. 25 is garbled). The statistic grows
  with the sample size (about 0.5-1 for a Gaussian sample of a few hundred points), and the
  paper's grid ``eps_T in {0.01, 0.0003}`` would make ``exp(HZ / eps_T)`` overflow even in float64
  (``exp(1 / 0.0003)``). With ``hz_normalization="per_point"`` (default) the statistic is divided
  by the number of points, which is the form under which that grid is usable; pass ``"none"``
  for the literal statistic.
* The exponentials continue linearly beyond an exponent of 30 (``exp(30) (1 + t - 30)``): the
  penalty stays finite and keeps a gradient that pushes back, instead of overflowing to ``inf``.
* The norm of the off-diagonal covariance is the Frobenius norm (both triangles).
* ``N`` is the full data size (the model's first argument's length), so the penalties keep their
  weight relative to the ELBO under minibatching.

With all lambdas 0, :class:`NCAIElbo` is exactly ``Trace_ELBO`` (tested, same seed).
"""

from __future__ import annotations

import math
import os

import torch
from pyro.poutine import Trace
from pyro.poutine.messenger import Messenger
from torch import Tensor

from ..._checks import ArgumentTypeError, check_int, check_real
from ...stats.dependence import correlation_penalty, henze_zirkler, offdiag_cov_norm
from ...stats._pairwise import (
    compiled_weighted_penalty,
    henze_zirkler_unchecked,
    ncai_statistics,
    StartedStatistics,
    ncai_statistics_unchecked,
    offdiag_cov_norm_unchecked,
    penalty_gradient,
    start_ncai_statistics,
    weighted_ncai_statistics,
)
from ...stats.hsic import normalized_hsic
from ...stats.independence import independence_statistic
from .penalized import PenalizedElbo
from ...posterior import guide_site_mean

__all__ = ["INDEPENDENCE_TERMS", "NCAIElbo", "ncai_penalties", "safe_exp"]

_EXP_CAP = 30.0


def safe_exp(t: Tensor, cap: float = _EXP_CAP) -> Tensor:
    """``exp(t)`` for ``t <= cap``, continued linearly (value and slope match) beyond ``cap``.

    The exponential's argument is capped with ``where``, not ``clamp``: at ``t == cap`` torch 2.15
    gives ``clamp``'s gradient as 0 (2.13: 1), which would flatten the penalty's gradient there."""
    t = torch.as_tensor(t)
    inside = t <= cap
    capped = torch.where(inside, t, torch.full_like(t, cap))
    return torch.where(inside, torch.exp(capped), math.exp(cap) * (1.0 + t - cap))


def _safe_exp_value_and_slope(t: float, cap: float = _EXP_CAP) -> tuple[float, float]:
    """:func:`safe_exp` and its derivative at a Python float."""
    if t <= cap:
        e = math.exp(t)
        return e, e
    e = math.exp(cap)
    return e * (1.0 + t - cap), e


class _WeightedPenalty(torch.autograd.Function):
    """``sum_k c_k g_k(t_k)`` of 0-dim statistics ``t_k`` in one autograd node, where
    ``g_k(t) = safe_exp(t / e_k)`` (``e_k > 0``) or ``t`` (``e_k = 0``).

    The same function as composing :func:`safe_exp` and products eagerly (about 25 tensor
    operations and their backward nodes), evaluated in double on Python floats: one node, its
    gradient ``c_k g_k'(t_k)`` computed in the forward pass. Where the compiled pairwise kernels
    are available :meth:`NCAIElbo.weigh` runs their C++ twin instead
    (:func:`~pyro_bnnlv.stats._pairwise.compiled_weighted_penalty`: the same arithmetic, no
    Python in the backward pass).
    """

    @staticmethod
    def forward(ctx, coeffs: tuple[float, ...], scales: tuple[float, ...], *terms: Tensor) -> Tensor:  # type: ignore[override]
        value, slopes = 0.0, []
        for c, e, t in zip(coeffs, scales, terms):
            if e > 0:
                g, dg = _safe_exp_value_and_slope(float(t) / e)
                value += c * g
                slopes.append(c * dg / e)
            else:
                value += c * float(t)
                slopes.append(c)
        ctx.slopes = slopes
        return torch.tensor(value, dtype=terms[0].dtype, device=terms[0].device)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return (None, None, *(grad * s for s in ctx.slopes))


#: ``independence=`` options: today's single-bandwidth nHSIC, the paper's PC, and the terms of
#: :func:`~pyro_bnnlv.stats.independence.independence_statistic`
INDEPENDENCE_TERMS = ("hsic", "pc", "knn-mi", "knn-mi-multiscale", "knn-mi-wide", "hsic-multiscale", "dcor")


def _check_options(hz_normalization: str, independence: str) -> None:
    if hz_normalization not in ("per_point", "none"):
        raise ValueError(f"hz_normalization must be 'per_point' or 'none', got {hz_normalization!r}")
    if independence not in INDEPENDENCE_TERMS:
        raise ValueError(
            f"independence must be one of {', '.join(map(repr, INDEPENDENCE_TERMS))}, got {independence!r}"
        )


def _check_batch(size: int, independence: str) -> None:
    """Refuses a batch smaller than the statistics need (``knn-mi``: its 15-point
    neighbourhoods and one more; ``knn-mi-multiscale`` and ``knn-mi-wide``: their smallest, 8
    points, and one more)."""
    need = {"knn-mi": 16, "knn-mi-multiscale": 9, "knn-mi-wide": 9}.get(independence, 3)
    if size < need:
        raise ValueError(
            f"NCAIElbo's statistics (independence={independence!r}) need at least {need} "
            f"points per step, got a batch of {size}: use batch_size >= {need} (or None for the full data)"
        )


def ncai_penalties(
    x: Tensor, y: Tensor, mu_z: Tensor, *, hz_normalization: str = "per_point", independence: str = "hsic"
) -> dict[str, Tensor]:
    """The raw constraint proxies on a batch: ``hz`` (eq. 25), ``offdiag`` (eq. 26) and, for
    ``independence="pc"``, ``pc_x``, ``pc_y`` (eq. 24), for ``"hsic"``, ``hsic_x``
    (:func:`~pyro_bnnlv.stats.hsic.normalized_hsic` of ``x`` and ``mu_z``), for the other terms
    ``indep_x`` (:func:`~pyro_bnnlv.stats.independence.independence_statistic` of that kind;
    ``"knn-mi"`` in nats). With the compiled kernels available, the ``"hsic"`` statistics come
    from one call of :func:`~pyro_bnnlv.stats._pairwise.ncai_statistics` (same values and
    gradients)."""
    _check_options(hz_normalization, independence)
    return _penalties(x, y, mu_z, hz_normalization, independence, checked=True)


def _penalties(
    x: Tensor, y: Tensor, mu_z: Tensor, hz_normalization: str, independence: str, checked: bool
) -> dict[str, Tensor]:
    """:func:`ncai_penalties`, and the one place that decides which statistics check their inputs.

    ``checked=True``: each statistic checks its inputs (HZ, the off-diagonal norm and nHSIC in one
    compiled call where available, :func:`~pyro_bnnlv.stats._pairwise.ncai_statistics`).
    ``checked=False`` (a fused step's rows, see :meth:`NCAIElbo.fused_penalty_terms`): HZ, the
    off-diagonal norm and nHSIC without their checks, compiled where available, else in torch
    (:func:`~pyro_bnnlv.stats._pairwise.ncai_statistics_unchecked` and its parts), so that a
    non-finite mean shows as a non-finite loss either way; the other independence terms check
    their inputs in both cases."""
    per_point = hz_normalization == "per_point"
    if independence == "hsic" and not checked:  # HZ per point from the statistics' own call
        hz, off, hsic = ncai_statistics_unchecked(x, mu_z, hz_per_point=per_point)
        per_point = False
    elif independence == "hsic":
        stats = ncai_statistics(x, mu_z)
        if stats is None:  # without the compiled kernel
            stats = (henze_zirkler(mu_z), offdiag_cov_norm(mu_z), normalized_hsic(x, mu_z))
        hz, off, hsic = stats
    elif checked:
        hz, off = henze_zirkler(mu_z), offdiag_cov_norm(mu_z)
    else:
        hz, off = henze_zirkler_unchecked(mu_z), offdiag_cov_norm_unchecked(mu_z)
    if per_point:
        hz = hz / mu_z.shape[0]
    out = {"hz": hz, "offdiag": off}
    if independence == "hsic":
        out["hsic_x"] = hsic
    elif independence == "pc":
        out["pc_x"] = correlation_penalty(x, mu_z)
        out["pc_y"] = correlation_penalty(y.reshape(y.shape[0], -1), mu_z)
    else:
        out["indep_x"] = independence_statistic(x, mu_z, kind=independence)
    return out


def _core_beside_the_pool() -> bool:
    """Whether a thread started beside the calling one gets a core of its own: torch runs
    independent operations side by side (``torch.get_num_interop_threads() > 1``) and its
    intra-op pool has fewer threads than this process has CPUs. When the pool has them all
    (torch's default), its threads hold the cores between parallel regions, a woken thread
    takes the caller's core, and the caller waits as long as the work takes (docs/design-notes.md,
    "infer.elbos.ncai")."""
    return torch.get_num_interop_threads() > 1 and torch.get_num_threads() < _cpus()


def _cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _check_weight(value: object, name: str, *, positive: bool) -> float:
    """A penalty weight (``positive=False``) or growth rate (``positive=True``) as a finite
    ``float`` (:func:`~pyro_bnnlv._checks.check_real`: NumPy reals too; no bools, strings,
    ``None``, NaN or infinities), the error naming ``name``."""
    kind = "positive and finite" if positive else "a finite non-negative number"
    try:
        return check_real(value, name, positive=positive, nonnegative=not positive)
    except ArgumentTypeError:
        raise ArgumentTypeError(f"{name} must be {kind}, got {value!r} of type {type(value).__name__}") from None
    except ValueError:
        raise ValueError(f"{name} must be {kind}, got {value!r}") from None


class _PlateIndexRecorder(Messenger):
    """Remembers the subsample indices of the plate named ``name`` (``None``: no subsampling)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.indices = name, None

    def _pyro_post_sample(self, msg) -> None:
        if msg["name"] == self.name and msg["type"] == "sample":
            self.indices = msg["value"]


class NCAIElbo(PenalizedElbo):
    """``Trace_ELBO`` plus the NCAI penalties of eq. 27; use with ``SVI`` like any Pyro ELBO.

    Args:
        lambda1, lambda2, lambda3: weights of the HZ, off-diagonal-covariance and independence
            penalties (App. F.1 grid: ``lambda2 = 10``; ``lambda1 = lambda3 = 1`` by default).
        eps_T, eps_x, eps_y: growth rates of the exponential penalties (App. F.1 grids
            ``{0.01, 0.0003}``, ``{0.5, 1.0}``, ``{0.1, 0.5}``; the first of each by default).
            ``eps_y`` is used only with ``independence="pc"``.
        independence: ``"hsic"`` (default): ``lambda3 N exp(nHSIC(x, mu_z) / eps_x)``;
            ``"pc"``: the printed ``lambda3 N exp(PC(x, mu_z)/eps_x) exp(PC(y, mu_z)/eps_y)``;
            ``"knn-mi"``, ``"hsic-multiscale"``, ``"dcor"``: ``lambda3 N exp(T(x, mu_z) / eps_x)``
            with ``T`` that statistic, floored at 0 (``"knn-mi"``: a k-NN estimate of
            ``I(x; mu_z)`` in nats, so ``eps_x`` reads as the paper's constraint
            ``I(x; z) <= eps_x``; it needs batches of at least 16 points). See the module
            docstring.
        warmup_steps: the lambdas are ramped linearly from 0 to their values over the first
            ``warmup_steps`` training steps (0: no ramp). The ramp is applied outside any JIT
            trace.
        latent_site: name of the latent-input site (``"z"``).
        plate_name: name of the data plate (``"data"``), whose value holds minibatch indices.
        hz_normalization: ``"per_point"`` (HZ / batch size, default) or ``"none"``; see module doc.
        fused: compute a step of the library's BNN+LV with a mean-field guide without Pyro's
            traces (:class:`~pyro_bnnlv.infer.elbos.fused.FusedTraceElbo` for the ELBO, the
            statistics from the guide's means of the minibatch rows): the same draws, value and
            gradients as the traced objective. Default: ``True`` unless ``jit=True``.
        **kwargs: ``Trace_ELBO`` options (``num_particles``, ``vectorize_particles``, ...) and
            ``jit=True`` to compile the statistics of traced steps.

    Every training step appends the ELBO loss, the raw statistics and the weighted penalty to
    :attr:`history` (see :class:`~pyro_bnnlv.infer.elbos.penalized.PenalizedElbo`).
    """

    def __init__(
        self,
        lambda1: float = 1.0,
        lambda2: float = 10.0,
        lambda3: float = 1.0,
        eps_T: float = 0.01,
        eps_x: float = 0.5,
        eps_y: float = 0.1,
        *,
        independence: str = "hsic",
        warmup_steps: int = 0,
        latent_site: str = "z",
        plate_name: str = "data",
        hz_normalization: str = "per_point",
        fused: bool | None = None,
        **kwargs,
    ) -> None:
        kwargs.setdefault("max_plate_nesting", 1)
        if kwargs.get("jit", False) and str(independence).startswith("knn-mi"):
            raise ValueError(
                f"independence={independence!r} cannot be compiled with jit=True: its neighbourhoods are "
                f"data-dependent, which torch.jit.trace would freeze; use the fused default (jit=False)"
            )
        if fused is None:
            fused = not kwargs.get("jit", False)
        lambdas = tuple(
            _check_weight(v, f"lambda{i}", positive=False) for i, v in enumerate((lambda1, lambda2, lambda3), start=1)
        )
        eps = tuple(
            _check_weight(v, name, positive=True) for name, v in (("eps_T", eps_T), ("eps_x", eps_x), ("eps_y", eps_y))
        )
        _check_options(hz_normalization, independence)
        warmup_steps = check_int(warmup_steps, "warmup_steps", minimum=0)
        if fused is True and (latent_site, plate_name) != ("z", "data"):
            fused = False  # the fused step knows the library's site and plate names only
        super().__init__(fused=fused, **kwargs)
        self.lambdas = lambdas
        self.eps_T, self.eps_x, self.eps_y = eps
        self.independence, self.warmup_steps = independence, warmup_steps
        self.latent_site, self.plate_name = latent_site, plate_name
        self.hz_normalization = hz_normalization
        self._started: list[StartedStatistics] = []  # a fused step's statistics (fused_batch_drawn)
        self._weighed_terms: tuple[dict[str, Tensor], Tensor] | None = None  # (terms, their penalty)

    def latent_means(self, guide_trace: Trace) -> Tensor:
        """Variational means of the batch's latents, ``(B, K)`` (:func:`guide_site_mean`)."""
        mu = guide_site_mean(guide_trace, self.latent_site)
        return mu.reshape(-1, *mu.shape[-2:])[0]  # the same means for every particle

    def batch_data(self, model_trace: Trace) -> tuple[Tensor, Tensor, int]:
        """``(x_batch, y_batch, N)`` of the current step, from the model trace."""
        x = model_trace.nodes["_INPUT"]["args"][0]
        y = model_trace.nodes["obs"]["value"]
        if not model_trace.nodes["obs"]["is_observed"]:
            raise ValueError("NCAIElbo needs observed targets: call the model with y")
        idx = model_trace.nodes["_INPUT"].get("batch_indices")  # set by _get_trace
        x_b = x if idx is None else x[idx]
        return x_b, y, x.shape[0]  # observed values are never expanded over particles

    def _get_trace(self, model, guide, args, kwargs):
        # Trace_ELBO prunes the subsample site of the data plate, which holds the minibatch
        # indices the correlation penalty needs: record them on the model trace's input node.
        recorder = _PlateIndexRecorder(self.plate_name)
        model_trace, guide_trace = super()._get_trace(recorder(model), guide, args, kwargs)
        model_trace.nodes["_INPUT"]["batch_indices"] = recorder.indices
        return model_trace, guide_trace

    def penalty_terms(self, model_trace: Trace, guide_trace: Trace) -> dict[str, Tensor]:
        """The raw statistics of :func:`ncai_penalties` on the current batch (compiled part)."""
        if self.lambdas == (0.0, 0.0, 0.0):
            return {}
        x_b, y_b, _ = self.batch_data(model_trace)
        return self._statistics(x_b, y_b, self.latent_means(guide_trace))

    def fused_penalty_terms(
        self, model, args: tuple, params: dict[str, Tensor], batches: list[Tensor | None]
    ) -> dict[str, Tensor]:
        """The statistics of a fused step: :meth:`penalty_terms` on each particle round's
        minibatch rows of ``x``, the observed ``y`` and the guide's means ``loc_z``, averaged.

        HZ, the off-diagonal norm and nHSIC skip their input checks here, compiled or in torch
        (:func:`_penalties`): the data passed the model's checks when the fused step set up (and
        again whenever they change), the rows match by construction, and a non-finite mean makes
        the loss non-finite, which ``fit_svi`` reports with the step."""
        started, self._started, self._weighed_terms = self._started, [], None
        if self.lambdas == (0.0, 0.0, 0.0):
            return {}
        x, loc_z = args[0], params["loc_z"]
        collected = len(started) == len(batches)  # started by fused_batch_drawn
        coeffs = self._coefficients(len(x))
        # one node for the statistics and their weighting: collected, or computed now in C++
        weighted = len(batches) == 1 and any(coeffs) and (collected or self.independence == "hsic")
        terms: dict[str, Tensor] = {}
        for k, idx in enumerate(batches):
            x_b, mu = (x, loc_z) if idx is None else (x[idx], loc_z[idx])
            out = (
                self._weighted_statistics(started[k] if collected else None, x_b, mu, coeffs, loc_z, idx)
                if weighted
                else None
            )
            if out is not None:
                pen, *values = out
                stats = dict(zip(("hz", "offdiag", "hsic_x"), values))
                self._weighed_terms = (stats, pen)  # weigh's result for these terms
            elif collected:
                stats = dict(zip(("hz", "offdiag", "hsic_x"), started[k].collect(x_b, mu)))
            else:  # the torch statistics need the observed y (the compiled ones do not)
                y = model._observed(args[1])
                stats = self._statistics(x_b, y if idx is None else y[idx], mu, checked=False)
            if len(batches) == 1:
                return stats  # the weighted terms are this dict itself
            for name, value in stats.items():
                terms[name] = value if name not in terms else terms[name] + value
        return {name: value / len(batches) for name, value in terms.items()}

    def _weighted_statistics(
        self,
        started: StartedStatistics | None,
        x_b: Tensor,
        mu: Tensor,
        coeffs: tuple[float, float, float],
        loc_z: Tensor,
        rows: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """``(penalty, hz, offdiag, hsic)`` of a round's rows ``mu = loc_z[rows]`` (``rows``
        ``None``: all): the ``started`` statistics collected, else the ``"hsic"`` term's computed
        now by the compiled kernels (:func:`~pyro_bnnlv.stats._pairwise.weighted_ncai_statistics`;
        ``None`` without them). In a training step, where ``loc_z`` is the leaf the optimiser
        updates, without autograd: the penalty's gradient goes to :meth:`add_leaf_gradient`
        (:meth:`~pyro_bnnlv.stats._pairwise.StartedStatistics.collect_gradient`, the same bits
        as the node's backward pass), else as one autograd node."""
        scales = (self.eps_T, 0.0, self.eps_x)
        if started is None:
            _check_batch(mu.shape[0], self.independence)
        leaf_gradient = (
            self.takes_leaf_gradients
            and torch.is_grad_enabled()
            and loc_z.is_leaf
            and loc_z.requires_grad
            and not x_b.requires_grad
        )
        if leaf_gradient:
            out = (
                started.collect_gradient(x_b, mu, coeffs, scales)
                if started is not None
                else penalty_gradient(x_b, mu, coeffs, scales, hz_per_point=self.hz_normalization == "per_point")
            )
            if out is not None:
                self.add_leaf_gradient(loc_z, rows, out[4])
                return out[:4]
        if started is not None:
            return started.collect_weighted(x_b, mu, coeffs, scales)
        return weighted_ncai_statistics(x_b, mu, coeffs, scales, hz_per_point=self.hz_normalization == "per_point")

    def fused_batch_drawn(self, model, args: tuple, params: dict[str, Tensor], idx: Tensor | None) -> None:
        """Starts the ``"hsic"`` statistics of a fused step's minibatch rows on another thread
        (:func:`~pyro_bnnlv.stats._pairwise.start_ncai_statistics`) while the ELBO is computed,
        when a core is free of torch's intra-op pool (:func:`_core_beside_the_pool`) and the
        compiled kernels are available: the same numbers as computing them after the ELBO, where
        the kernels compute HZ and HSIC side by side on the pool's threads instead."""
        if self.independence != "hsic" or self.lambdas == (0.0, 0.0, 0.0) or not _core_beside_the_pool():
            return
        x, loc_z = args[0], params["loc_z"]
        x_b, mu = x, loc_z
        if idx is not None:
            with torch.no_grad():  # the values only: collecting attaches them to the rows' graph
                x_b, mu = x[idx], loc_z[idx]
        _check_batch(mu.shape[0], self.independence)
        grad = torch.is_grad_enabled()
        grads = (grad and x.requires_grad, grad and loc_z.requires_grad)
        started = start_ncai_statistics(x_b, mu, grads=grads, hz_per_point=self.hz_normalization == "per_point")
        if started is not None:
            self._started.append(started)

    def _statistics(self, x_b: Tensor, y_b: Tensor, mu: Tensor, checked: bool = True) -> dict[str, Tensor]:
        """:func:`ncai_penalties` of a batch; ``checked=False``: HZ, the off-diagonal norm and
        nHSIC without their input checks (the fused step's call, see :meth:`fused_penalty_terms`
        and :func:`_penalties`)."""
        if not torch.jit.is_tracing():
            _check_batch(mu.shape[0], self.independence)
        return _penalties(x_b, y_b, mu, self.hz_normalization, self.independence, checked=checked)

    def ramp(self) -> float:
        """Warm-up factor of the lambdas at the current step, ``min(1, steps_taken / warmup_steps)``."""
        return 1.0 if self.warmup_steps == 0 else min(1.0, self.steps_taken / self.warmup_steps)

    def _coefficients(self, N: int) -> tuple[float, float, float]:
        """Eq. 27's coefficients ``lambda_k ramp N`` of the three terms at this step (0: left out)."""
        ramp = self.ramp()
        l1, l2, l3 = (lam * ramp for lam in self.lambdas)
        return l1 * N, l2 * N, l3 * N

    def weigh(self, terms: dict[str, Tensor], args: tuple, kwargs: dict) -> Tensor | float:
        """Eq. 27's penalties from the raw statistics (eager: lambdas and ramp never traced); for
        the terms a fused step collected with their weighting (:meth:`fused_penalty_terms`), that."""
        if not terms:
            return 0.0
        weighed, self._weighed_terms = self._weighed_terms, None
        if weighed is not None and weighed[0] is terms:
            return weighed[1]
        c1, c2, c3 = self._coefficients(len(args[0]))
        coeffs, scales, stats = [], [], []
        if c1:
            coeffs.append(c1), scales.append(self.eps_T), stats.append(terms["hz"])
        if c2:
            coeffs.append(c2), scales.append(0.0), stats.append(terms["offdiag"])
        if c3:
            if self.independence == "pc":
                exponent = terms["pc_x"] / self.eps_x + terms["pc_y"] / self.eps_y
                coeffs.append(c3), scales.append(1.0), stats.append(exponent)
            else:
                # I(x; z) >= 0: an estimate below 0 is the estimator's noise, and a slope there
                # rewards arranging mu_z to push the estimate down (module docstring)
                stat = terms["hsic_x"] if self.independence == "hsic" else terms["indep_x"].clamp_min(0.0)
                coeffs.append(c3), scales.append(self.eps_x), stats.append(stat)
        if not stats:
            return 0.0
        compiled = compiled_weighted_penalty(tuple(coeffs), tuple(scales), tuple(stats))  # the same in C++
        return compiled if compiled is not None else _WeightedPenalty.apply(tuple(coeffs), tuple(scales), *stats)
