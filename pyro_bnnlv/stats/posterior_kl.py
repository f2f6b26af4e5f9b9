"""KL divergences between two posteriors of one model, in parameter and in predictor space.

:func:`compare_posteriors` estimates ``KL`` in both directions between an approximation and a
reference (e.g. NUTS) with the k-NN estimators of Pequignot et al. (2020), "Implicit variational
inference: the parameter and the predictor space" (eq. 4 and 6; App. C protocol). Any posterior
form that :meth:`pyro_bnnlv.posterior.Posterior.from_any` reads is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ..protocols import RegressionModel
from .._state import set_seed
from ..posterior import Posterior, posterior_kind
from .knn import functional_knn_kl, input_sampler, knn_kl, predictor_space_samples

__all__ = ["compare_posteriors"]


def _weight_samples(post: Any, model: Any, x: Tensor | None, num_samples: int, seed: int | None) -> Tensor:
    """``(S, P)`` weight samples of any supported posterior (:meth:`Posterior.from_any`), evenly
    thinned to ``num_samples``."""
    if posterior_kind(post) == "guide" and x is None:
        raise ValueError("sampling a guide needs the model's inputs: pass x=")
    args = () if x is None else (x,)
    return Posterior.from_any(post, model, *args, num_samples=num_samples, seed=seed).weights(num_samples)


def compare_posteriors(
    approx: Any,
    reference: Any,
    model: RegressionModel,
    input_dist: Any,
    *,
    x: Tensor | None = None,
    num_samples: int = 1000,
    num_draws: int = 100,
    num_inputs: int = 200,
    k: int = 1,
    predictor: Callable[[Tensor, Tensor], Tensor] | None = None,
    seed: int | None = None,
) -> pd.DataFrame:
    r"""k-NN estimates of ``KL`` between two posteriors over the weights, in both directions.

    Follows Pequignot et al. (2020), "Implicit variational inference: the parameter and the
    predictor space", App. C (Table 4):
    ``num_samples = 1000`` samples of each posterior; in parameter space the estimator of eq. 4
    (:func:`~pyro_bnnlv.stats.knn.knn_kl`) on the weight vectors; in predictor space the
    estimator of eq. 6 (:func:`~pyro_bnnlv.stats.knn.functional_knn_kl`) on the function values
    at ``num_draws = 100`` independent draws of ``num_inputs = T = 200`` inputs from
    ``input_dist``, both posteriors evaluated at the same inputs in each draw
    (:func:`~pyro_bnnlv.stats.knn.predictor_space_samples`).

    Args:
        approx, reference: posteriors: ``MCMC`` objects, guides (pass ``x``), InferenceData,
            sample dicts or ``(S, P)`` tensors. MCMC/sample sets larger than ``num_samples``
            are thinned evenly (which also reduces autocorrelation).
        model: supplies ``f(x, w)`` (or pass ``predictor``).
        input_dist: the input distribution ``nu``: a callable ``T -> (T, D)``, a torch
            ``Distribution`` (sampled ``(T,)``), or a tensor of inputs whose rows are drawn
            uniformly with replacement.
        x: the model's inputs, needed only to sample guides.
        k: neighbour order (1 in the paper).
        predictor: ``(x (T, D), w (S, P)) -> (S, T[, O])``; default ``model.f``.
        seed: seeds guide sampling and the input draws.

    Returns:
        DataFrame indexed by ``space`` (``"parameter"``, ``"predictor"``) with columns
        ``"KL(approx||ref)"`` and ``"KL(ref||approx)"``; ``attrs`` record the protocol. The
        estimates can be negative at finite sample size; on a BNN the parameter-space ones are
        dominated by the weight symmetries, the predictor-space ones are not.
    """

    for name, v in (("num_samples", num_samples), ("num_draws", num_draws), ("num_inputs", num_inputs)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    set_seed(seed)
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    wa = _weight_samples(approx, model, x, num_samples, seed)
    wr = _weight_samples(reference, model, x, num_samples, None if seed is None else seed + 1)
    if wa.shape[1] != wr.shape[1]:
        raise ValueError(f"the posteriors have different numbers of weights: {wa.shape[1]} vs {wr.shape[1]}")
    dtype = torch.promote_types(wa.dtype, wr.dtype)
    wa, wr = wa.to(dtype), wr.to(dtype)
    if predictor is None:
        if not hasattr(model, "f"):
            raise ValueError("the model has no f(x, w); pass predictor=")

        def predictor(xx: Tensor, w: Tensor) -> Tensor:
            out = model.f(xx.to(w.dtype), w)
            return out.squeeze(-1) if out.shape[-1] == 1 else out

    sampler = input_sampler(input_dist, gen)
    with torch.no_grad():
        param = (float(knn_kl(wa, wr, k=k)), float(knn_kl(wr, wa, k=k)))
        fa, fr = predictor_space_samples(predictor, (wa, wr), sampler, num_draws, num_inputs)
        pred = (float(functional_knn_kl(fa, fr, k=k)), float(functional_knn_kl(fr, fa, k=k)))
    table = pd.DataFrame(
        [param, pred],
        index=pd.Index(["parameter", "predictor"], name="space"),
        columns=["KL(approx||ref)", "KL(ref||approx)"],
    )
    table.attrs.update(
        num_samples_approx=wa.shape[0], num_samples_ref=wr.shape[0], num_draws=num_draws, num_inputs=num_inputs, k=k
    )
    return table
