"""Metrics of a Monte-Carlo posterior predictive (Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569,
App. F.2).

The posterior predictive at an input is approximated by the equal-weight Gaussian mixture

.. math::

    p(y^* \\mid x^*, \\mathcal D) \\approx \\frac1S \\sum_{s=1}^S
        \\mathcal N\\big(y^*;\\ f(x^*; w_s),\\ \\sigma_s^2 I\\big),
    \\qquad w_s \\sim q(w)\\ \\text{(or MCMC)},

(for BNN+LV the inputs carry latent draws ``z_s ~ p(z)``, eq. 34). The metrics are

* average test log-likelihood, eq. 34: ``mean_n log mean_s N(y_n; f_s(x_n), sigma^2)``, computed
  with ``logsumexp`` (never by averaging densities, which underflows);
* RMSE of the predictive mean ``mean_s f_s(x_n)`` (square root of the predictive MSE, eq. 35);
* PICP: fraction of test targets inside the central 95% interval of the predictive mixture;
* MPIW: mean width of that interval.

Interval endpoints are the exact quantiles of the Gaussian mixture, found by safeguarded Newton on
its CDF (deterministic, no extra sampling noise). With ``y_mean``/``y_std`` (standardisation
statistics) every metric is reported on the original scale of ``y``.
"""

from __future__ import annotations

from collections.abc import Iterator

import inspect
import math
import numbers
import warnings
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from .._checks import as_number_tensor, check_int, check_seed
from ..datasets.base import Dataset, standardized_source
from ..posterior import SelfEvaluatingPosterior, as_sample_dict, posterior_kind, sample_posterior
from ..protocols import LatentModel, RegressionModel
from .classification import classification_metrics

__all__ = [
    "check_level",
    "evaluate",
    "mixture_interval",
    "mixture_log_density",
    "mixture_quantile",
    "predictive_chunks",
    "predictive_metrics",
]


def mixture_log_density(y: Tensor, loc: Tensor, scale: Tensor | float) -> Tensor:
    """``log (1/S) sum_s N(y_n; loc[s, n], scale^2 I_L)`` per point: ``y (N, L)``, ``loc (S, N, L)`` -> ``(N,)``."""
    scale = torch.as_tensor(scale, dtype=loc.dtype)
    # log N(y; loc, scale^2) = -((y - loc) / scale)^2 / 2 - log scale - log(2 pi) / 2, summed over L
    comp = ((y - loc) / scale).square_().mul_(-0.5).sub_(scale.log() + 0.5 * math.log(2 * math.pi)).sum(-1)  # (S, N)
    return torch.logsumexp(comp, dim=0) - math.log(loc.shape[0])


def mixture_quantile(loc: Tensor, scale: Tensor | float, q: float, iters: int = 60) -> Tensor:
    """``q``-quantile of the mixture ``(1/S) sum_s N(loc[s, ...], scale^2)``, elementwise over ``loc[0]``.

    Solves ``F(m) = (1/S) sum_s Phi((m - loc_s) / scale_s) = q`` by Newton's method
    (``F'(m) = (1/S) sum_s phi((m - loc_s) / scale_s) / scale_s > 0``) inside a bisection bracket,
    starting from ``[min loc - 12 scale, max loc + 12 scale]`` and the moment-matched Gaussian's
    quantile: a Newton step that leaves the bracket is replaced by its midpoint, and every
    evaluation of ``F`` shrinks the bracket (the safeguarded Newton of Numerical Recipes' ``rtsafe``).
    Stops when every step is below ``1e-12`` of the bracket's initial width or after ``iters``
    evaluations; a few evaluations suffice where plain bisection needed 60.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must lie in (0, 1), got {q}")
    return _mixture_quantiles(loc, scale, (q,), iters)[0]


def mixture_interval(loc: Tensor, scale: Tensor | float, level: float = 0.95) -> tuple[Tensor, Tensor]:
    """The central ``level`` interval of the mixture ``(1/S) sum_s N(loc[s, ...], scale^2)``: its
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles (:func:`mixture_quantile`, both found in
    one pass over the components), each of the shape of ``loc[0]``."""
    check_level(level)
    alpha = (1.0 - level) / 2
    lower, upper = _mixture_quantiles(loc, scale, (alpha, 1.0 - alpha), 60)
    return lower, upper


def _mixture_quantiles(loc: Tensor, scale: Tensor | float, qs: tuple[float, ...], iters: int) -> list[Tensor]:
    """:func:`mixture_quantile` at each level of ``qs``, sharing the bracket and the moment match.

    With ``t = (m - loc) / (sqrt(2) scale)``: ``F(m) = 1/2 + mean_s erf(t_s) / 2`` and
    ``F'(m) = mean_s exp(-t_s^2) / (sqrt(2 pi) scale_s)``; ``scale`` stays in its broadcast shape
    (a scalar noise scale costs no pass over the components).
    """
    loc = loc.double()
    scale = torch.as_tensor(scale, dtype=torch.float64)
    c = (scale * math.sqrt(2.0)).reciprocal()  # 1 / (sqrt(2) scale), broadcast shape
    lower = (loc - 12 * scale).amin(0)
    upper = (loc + 12 * scale).amax(0)
    tol = 1e-12 * (upper - lower)
    mean = loc.mean(0)
    sd = (loc.var(0, unbiased=False) + scale.square().expand_as(loc).mean(0)).sqrt()
    out = []
    for q in qs:
        lo, hi = lower, upper
        m = mean + sd * math.sqrt(2.0) * torch.special.erfinv(torch.tensor(2 * q - 1, dtype=torch.float64))
        m = m.clamp(lo, hi)
        for _ in range(iters):
            t = (m - loc).mul_(c)
            F = torch.special.erf(t).mean(0).mul_(0.5).add_(0.5 - q)
            density = t.square_().neg_().exp_()  # exp(-t^2), in t's memory
            dF = (density.mean(0) * c if c.dim() == 0 else (density * c).mean(0)) / math.sqrt(math.pi)
            lo = torch.where(F < 0, m, lo)
            hi = torch.where(F < 0, hi, m)
            step = F / dF
            newton = m - step
            small = step.abs() <= tol  # converged: m - step may sit on a bracket end by rounding
            bad = ~small & (~torch.isfinite(newton) | (newton <= lo) | (newton >= hi))
            m = torch.where(bad, 0.5 * (lo + hi), newton)
            if bool(small.all()):
                break
        out.append(m)
    return out


def check_level(level: float) -> None:
    """``ValueError`` unless ``level`` is a probability in (0, 1) (a percentage gets a hint)."""
    real = isinstance(level, numbers.Real) and not isinstance(level, bool)
    if not real or not 0.0 < level < 1.0:
        hint = (
            f" (a probability: level={level / 100:g} for a {level:g}% interval)"
            if (real and 1.0 < level < 100.0)
            else ""
        )
        raise ValueError(f"level must lie in (0, 1), got {level!r}{hint}")


def _target_statistic(value: Any, name: str, num_outputs: int, dtype: torch.dtype) -> Tensor:
    """``y_mean``/``y_std`` as a tensor that broadcasts over the ``L`` outputs only.

    A scalar, or one value per output (shape ``(L,)`` or ``(1, L)``); anything else (e.g. the
    inputs' ``x_std`` passed by mistake, which would broadcast ``y`` to ``(N, D)``) is refused.
    """
    t = as_number_tensor(value, name, dtype, "a number or one number per output (a tensor or array)")
    if t.numel() not in (1, num_outputs) or t.dim() > 2 or (t.dim() == 2 and t.shape[0] != 1):
        raise ValueError(
            f"{name} must be a scalar or have one value per output (shape ({num_outputs},)); "
            f"got shape {tuple(t.shape)} (is it the inputs' statistic, e.g. data.x_std instead "
            f"of data.{name}?)"
        )
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} must be finite, got {value!r}")
    return t.reshape(-1)


def predictive_metrics(
    y: Tensor,
    loc: Tensor,
    scale: Tensor | float,
    *,
    level: float = 0.95,
    y_mean: Tensor | float | None = None,
    y_std: Tensor | float | None = None,
    intervals: bool = True,
) -> pd.Series:
    """Metrics of the Gaussian-mixture predictive ``loc (S, N, L)``, ``scale`` for targets ``y (N, L)``.

    ``y_mean``/``y_std``: standardisation statistics; targets and predictive are mapped back to
    the original scale (``y * std + mean``) before every metric. ``intervals=False`` skips PICP
    and MPIW (NaN): their quantiles are the costly part with many mixture components.
    """
    metrics = _metrics(y, loc, scale, level=level, y_mean=y_mean, y_std=y_std, intervals=intervals)
    return pd.Series(metrics, name="metrics")


def _metrics(
    y: Tensor, loc: Tensor, scale: Tensor | float, *, level: float, y_mean: Any, y_std: Any, intervals: bool
) -> dict[str, float]:
    """:func:`predictive_metrics` as a dict (what :func:`evaluate` adds up over its chunks)."""
    if loc.dim() != 3:
        raise ValueError(f"loc must have shape (S, N, L); got {tuple(loc.shape)}")
    check_level(level)
    y = y.reshape(loc.shape[1], -1).to(loc.dtype)
    if y.shape[-1] != loc.shape[-1]:
        raise ValueError(f"y has {y.shape[-1]} outputs but the predictive has {loc.shape[-1]}")
    scale = torch.as_tensor(scale, dtype=loc.dtype)
    if y_std is not None:
        L = loc.shape[-1]
        std = _target_statistic(y_std, "y_std", L, loc.dtype)
        mean = _target_statistic(0.0 if y_mean is None else y_mean, "y_mean", L, loc.dtype)
        if (std <= 0).any():
            raise ValueError(f"y_std must be positive, got {y_std}")
        y, loc, scale = y * std + mean, loc * std + mean, scale * std
    elif y_mean is not None:
        raise ValueError("y_mean was given without y_std")
    ll = mixture_log_density(y, loc, scale)
    pred_mean = loc.mean(0)
    picp = mpiw = math.nan
    if intervals:
        lower, upper = (bound.to(loc.dtype) for bound in mixture_interval(loc, scale, level))
        picp = ((y >= lower) & (y <= upper)).to(loc.dtype).mean().item()
        mpiw = (upper - lower).mean().item()
    return {
        "test_ll": ll.mean().item(),
        "rmse": (y - pred_mean).square().mean().sqrt().item(),
        "picp": picp,
        "mpiw": mpiw,
    }


def _is_dataset(obj: Any) -> bool:
    return isinstance(obj, Dataset)


def posterior_sample_dict(
    model: RegressionModel,
    posterior: Any,
    x: Tensor,
    *,
    train_data: tuple[Tensor, Tensor] | None = None,
    num_samples: int = 1000,
    seed: int | None = None,
) -> dict[str, Tensor]:
    """``{"w": (S, P), ...}`` from samples, an ``MCMC`` run, an ``InferenceData`` or a fitted guide (``num_samples``
    draws of ``"w"``; a guide with per-datapoint latents needs ``train_data``, the points it is
    indexed by; a global-only guide is called with ``x``)."""
    if posterior_kind(posterior) == "guide":
        if isinstance(model, LatentModel) and train_data is None:
            raise ValueError(
                f"{type(model).__name__} has per-datapoint latents, so its guide is indexed by the "
                "training points: pass train_data=(x_train, y_train), or a Dataset"
            )
        args = tuple(train_data) if train_data is not None else (x,)
        posterior = sample_posterior(model, posterior, *args, num_samples=num_samples, seed=seed)
    if posterior_kind(posterior) == "inference_data":  # ArviZ stores every draw as float64: back to the data's dtype
        return {k: v.to(x.dtype) for k, v in as_sample_dict(posterior).items()}
    return as_sample_dict(posterior)


def _check_sample_dtype(w: Tensor, x: Any) -> None:
    """The weight samples must come in the dtype of the data (and so of the model, whose buffers
    ``x`` was checked against): a ``ValueError`` naming both dtypes and the conversion."""
    if not isinstance(x, Tensor) or w.dtype == x.dtype:
        return
    method = {torch.float32: "float()", torch.float64: "double()"}
    to_samples = (
        f"the model and data to {w.dtype} (model.{method[w.dtype]}, x.{method[w.dtype]})" if w.dtype in method else ""
    )
    raise ValueError(
        f"posterior_samples['w'] has dtype {w.dtype} but the model and x are {x.dtype}: convert the "
        f"samples (w.to({x.dtype}))" + (f" or {to_samples}" if to_samples else "")
    )


def _dataset_split(data: Any, y: Any, split: str, y_mean: Any, y_std: Any, train_data: Any) -> tuple:
    """``(x, y, y_mean, y_std, train_data)`` of :func:`evaluate` called with a data set: its
    ``split``, its target statistics for a standardised regression set (unless given) and its
    training split (unless given)."""
    if y is not None:
        raise ValueError("evaluate(model, posterior, data) takes no y: the targets come from data")
    if split not in ("test", "valid"):
        raise ValueError(f"split must be 'test' or 'valid', got {split!r}")
    x, y = getattr(data, f"x_{split}"), getattr(data, f"y_{split}")
    if x.shape[0] == 0:
        raise ValueError(
            f"split={split!r}: the data set {data.name!r} has no {split} points (sizes "
            f"{data.sizes}); evaluate another split, or make the data set with more rows or "
            f"a larger {split}_fraction"
        )
    if data.standardized and y_mean is None and y_std is None and data.num_classes is None:
        y_mean, y_std = data.y_mean, data.y_std
    return x, y, y_mean, y_std, (data.x_train, data.y_train) if train_data is None else train_data


def _warn_if_standardized(y: Tensor, y_mean: Tensor | float | None, y_std: Tensor | float | None) -> None:
    """:func:`evaluate`'s warning (attributed to its caller) when ``y`` is a standardised data set's
    target and neither ``y_mean`` nor ``y_std`` is given."""
    if y_std is None and y_mean is None:
        source = standardized_source(y)
        if source is not None:
            warnings.warn(
                f"evaluate: y is the {source} but y_mean/y_std were not given, so the metrics are "
                "on the standardised scale; pass y_mean=data.y_mean, y_std=data.y_std (or call "
                "evaluate(model, posterior, data)); y_mean=0, y_std=1 keeps the standardised scale "
                "without this warning",
                UserWarning,
                stacklevel=3,
            )


def evaluate(
    model: RegressionModel,
    posterior: Any,
    x: Tensor | Any,
    y: Tensor | None = None,
    *,
    level: float = 0.95,
    y_mean: Tensor | float | None = None,
    y_std: Tensor | float | None = None,
    seed: int | None = None,
    num_samples: int = 1000,
    split: str = "test",
    train_data: tuple[Tensor, Tensor] | None = None,
    latent_draws: int | None = None,
    intervals: bool = True,
) -> pd.Series:
    """Test log-likelihood (eq. 34), RMSE, PICP and MPIW of a posterior on ``(x, y)``; for a
    classifier (``likelihood="categorical"``/``"bernoulli"``) test log-likelihood, accuracy, Brier
    score and ECE of the predictive class probabilities
    (:func:`~pyro_bnnlv.stats.classification.classification_metrics`).

    Call as ``evaluate(model, posterior, x_test, y_test, y_mean=..., y_std=...)`` or, with a
    :class:`~pyro_bnnlv.datasets.Dataset`, ``evaluate(model, posterior, data)``: its test split
    (``split="valid"`` for the validation split) and, for a standardised set, its ``y_mean`` and
    ``y_std``, so the metrics are on the original scale.

    Args:
        model: a library model (exposes ``check_data`` and ``predictive_components``).
        posterior: samples ``{"w": (S, P), ...}`` or a ``(S, P)`` tensor; an ``MCMC`` object; a
            fitted guide (``num_samples`` draws by :func:`~pyro_bnnlv.sample_posterior`); or a
            fitted :class:`~pyro_bnnlv.infer.LinearizedLaplace` (its exact Gaussian predictive,
            :meth:`~pyro_bnnlv.infer.LinearizedLaplace.evaluate`).
        x, y: test inputs ``(N, D)`` and targets ``(N,)``/``(N, L)``; or ``x`` a ``Dataset`` and
            no ``y``.
        level: central interval probability for PICP/MPIW (0.95 in the papers).
        y_mean, y_std: standardisation statistics of ``y`` (e.g. ``dataset.y_mean``,
            ``dataset.y_std``); metrics are then on the original scale. A ``UserWarning`` says
            so when ``y`` is a standardised data set's target and they are missing (pass
            ``y_mean=0, y_std=1`` to ask for the standardised scale on purpose).
        seed: seeds any sampling (the guide's draws; prior draws of latent inputs for BNN+LV).
        num_samples: draws from a guide.
        split: the ``Dataset`` split to evaluate on, ``"test"`` or ``"valid"``.
        train_data: ``(x_train, y_train)`` to sample a guide with per-datapoint latents (BNN+LV);
            taken from the ``Dataset`` when one is given.
        latent_draws: for a model whose predictive integrates latent inputs over their prior
            (BNN+LV, eq. 34): latents per weight sample and test input (default
            ``DEFAULT_LATENT_DRAWS = 64``, a randomly shifted quasi-random set; see
            :meth:`~pyro_bnnlv.BNNLV.predictive_components`); one i.i.d. draw per weight sample
            underestimates the test LL wherever ``f`` is steep in ``z``, and each draw costs one
            more network evaluation. Other models take none.
        intervals: ``False`` skips PICP and MPIW (returned as NaN), e.g. for a validation LL.

    The points are evaluated in chunks (:func:`predictive_chunks`), which changes nothing but memory.
    """
    seed = check_seed(seed)
    if _is_dataset(x):
        x, y, y_mean, y_std, train_data = _dataset_split(x, y, split, y_mean, y_std, train_data)
    elif y is None:
        raise ValueError(
            "evaluate needs targets: evaluate(model, posterior, x, y) or "
            "evaluate(model, posterior, data) with a pyro_bnnlv Dataset"
        )
    _warn_if_standardized(y, y_mean, y_std)
    classifier = _classification_likelihood(model)
    if classifier is not None and (y_mean is not None or y_std is not None):
        raise ValueError(
            f"y_mean/y_std standardise regression targets; a {classifier.name} model's targets are "
            "class labels: leave them out"
        )
    if isinstance(posterior, SelfEvaluatingPosterior):  # LinearizedLaplace: its exact predictive
        if classifier is not None:
            return posterior.evaluate(x, y)
        return posterior.evaluate(x, y, level=level, y_mean=y_mean, y_std=y_std)
    if not isinstance(model, RegressionModel):
        raise TypeError(
            f"evaluate needs a pyro_bnnlv model (with check_data, f and predictive_components), "
            f"got {type(model).__name__}"
        )
    model.check_data(x, y)
    if callable(getattr(model, "_check_dtype", None)):
        model._check_dtype(x)  # x against the model's buffers before the samples against both
    samples = posterior_sample_dict(model, posterior, x, train_data=train_data, num_samples=num_samples, seed=seed)
    if classifier is not None:
        return _classification_evaluate(model, classifier, samples, x, y, seed=seed)
    return _regression_evaluate(
        model,
        samples,
        x,
        y,
        level=level,
        y_mean=y_mean,
        y_std=y_std,
        seed=seed,
        latent_draws=latent_draws,
        intervals=intervals,
    )


def _regression_evaluate(
    model: RegressionModel,
    samples: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    *,
    level: float,
    y_mean: Any,
    y_std: Any,
    seed: int | None,
    latent_draws: int | None,
    intervals: bool,
) -> pd.Series:
    """:func:`evaluate`'s regression metrics: :func:`predictive_metrics` per chunk of test points
    (:func:`predictive_chunks`), averaged over the points (RMSE: its square)."""
    N = x.shape[0]  # N >= 1: model.check_data rejects an empty x
    totals = {"test_ll": 0.0, "rmse": 0.0, "picp": 0.0, "mpiw": 0.0}
    for rows, loc, scale in predictive_chunks(
        model, samples, x, latent_draws=latent_draws, seed=seed, outputs=y.reshape(N, -1).shape[1]
    ):
        part = _metrics(y[rows], loc, scale, level=level, y_mean=y_mean, y_std=y_std, intervals=intervals)
        n = rows.stop - rows.start
        for key in ("test_ll", "picp", "mpiw"):
            totals[key] += n * part[key]
        totals["rmse"] += n * part["rmse"] ** 2
    totals = {k: v / N for k, v in totals.items()}
    totals["rmse"] = math.sqrt(totals["rmse"])
    return pd.Series(totals, name="metrics")


def _classification_likelihood(model: Any) -> Any:
    """The model's likelihood if it is a classifier's (:mod:`pyro_bnnlv.models.likelihoods`), else ``None``."""
    likelihood = getattr(model, "likelihood", None)
    return likelihood if getattr(likelihood, "classification", False) else None


def _classification_evaluate(
    model: Any, likelihood: Any, samples: dict[str, Tensor], x: Tensor, y: Tensor, *, seed: int | None
) -> pd.Series:
    """Test LL (the log of the Bayesian model average ``(1/S) sum_s p(y_n | x_n, w_s)``, by ``logsumexp``),
    accuracy, Brier score and ECE (:func:`~pyro_bnnlv.stats.classification.classification_metrics`)."""
    N, K = x.shape[0], max(2, model.net.out_features)
    log_probs = torch.empty(N, K, dtype=torch.float64)
    for rows, logits, _ in predictive_chunks(model, samples, x, seed=seed, outputs=K):
        log_p = likelihood.log_probs(logits.double())  # (S, n, K)
        log_probs[rows] = torch.logsumexp(log_p, 0) - math.log(log_p.shape[0])
    return classification_metrics(y, log_probs=log_probs).rename("metrics")


#: Latent draws per weight sample and test input of a BNN+LV's predictive in :func:`evaluate`.
DEFAULT_LATENT_DRAWS = 64
# mixture components x test points x widest layer per chunk of evaluate (4 MiB in float32)
_CHUNK_ELEMENTS = 2**20


def predictive_chunks(
    model: RegressionModel,
    samples: dict[str, Tensor],
    x: Tensor,
    *,
    latent_draws: int | None = None,
    seed: int | None = None,
    outputs: int = 1,
) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """The predictive mixture at ``x`` in row chunks, as :func:`evaluate` computes it: yields
    ``(rows, loc, scale)`` with ``loc`` and ``scale`` of ``model.predictive_components`` for
    ``x[rows]`` (``(S', n, L)``: a component per weight sample, times ``latent_draws`` latent draws
    for a BNN+LV), each chunk holding at most about ``2**20`` components x points x widest layer (or one point).
    One generator seeded with ``seed`` draws the latents of every chunk in turn."""
    _check_sample_dtype(samples["w"], x)
    draws = _latent_draws_option(model, latent_draws)
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    S, N = samples["w"].shape[0], x.shape[0]
    chunk = max(1, _CHUNK_ELEMENTS // (S * draws.get("latent_draws", 1) * _widest_layer(model, outputs)))
    with torch.no_grad():
        for start in range(0, N, chunk):
            rows = slice(start, min(start + chunk, N))
            loc, scale = model.predictive_components(x[rows], samples, generator=gen, **draws)
            yield rows, loc, scale


def _widest_layer(model: Any, outputs: int) -> int:
    """The most values per point and component the model's network holds at once (its widest
    layer, :meth:`~pyro_bnnlv.nets.FlatNet.values_per_point`, or the outputs), for sizing evaluate's chunks."""
    values = getattr(getattr(model, "net", None), "values_per_point", None)
    return max(outputs, int(values())) if callable(values) else outputs


def _latent_draws_option(model: Any, latent_draws: int | None) -> dict[str, int]:
    """``{"latent_draws": M}`` for a model whose ``predictive_components`` takes it, else ``{}``
    (then ``latent_draws`` must be ``None`` or 1)."""
    takes = "latent_draws" in inspect.signature(model.predictive_components).parameters
    if takes:
        M = DEFAULT_LATENT_DRAWS if latent_draws is None else check_int(latent_draws, "latent_draws", minimum=1)
        return {"latent_draws": M}
    if latent_draws is not None and latent_draws != 1:
        raise ValueError(
            f"latent_draws={latent_draws!r}: {type(model).__name__}'s predictive has no latent "
            "inputs to integrate over their prior (only BNN+LV's has); leave latent_draws out"
        )
    return {}
