"""Empirical Bayes for the prior variances (Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569,
App. F.1).

Inverse-gamma hyper-priors ``IG(alpha, beta)`` (``alpha = 3``, ``beta = 0.5``) on the prior
variances of the weights and of the latent inputs; the MAP-II updates given a mean-field guide
``q(w) = N(mu_q, diag(sigma_q^2))``, ``q(z_n) = N(mu_n, diag(sigma_n^2))`` are (eq. 29-30)

.. math::

    s_z^* = \\frac{2\\beta + \\frac1N \\sum_n [\\operatorname{tr}\\Sigma_{q_n} + \\mu_{q_n}^\\top\\mu_{q_n}]}
                 {K + 2\\alpha - 2}, \\qquad
    s_w^* = \\frac{2\\beta + \\operatorname{tr}\\Sigma_q + \\mu_q^\\top\\mu_q}{H + 2\\alpha - 2},

with ``K`` the dimension of ``z_n`` and ``H`` the number of weights. (Eq. 32 repeats eq. 30 with
``K`` in the denominator, a misprint for ``H``.) Implemented as printed. Note that the printed
update is the *mean* of the conjugate inverse-gamma posterior ``IG(alpha + H/2, beta + A/2)``,
``A = tr Sigma_q + mu_q^T mu_q``; the argmin the text announces (the posterior mode) would have
``H + 2 alpha + 2`` in the denominator. The difference is negligible for ``H`` in the hundreds. Training alternates these
closed-form updates with SVI steps (coordinate descent): pass :class:`EmpiricalBayes` as
``fit_svi(..., callback=EmpiricalBayes(model, guide))``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import check_int, check_real

__all__ = ["EmpiricalBayes", "eb_latent_variance", "eb_weight_variance"]


def eb_weight_variance(loc: Tensor, scale: Tensor, alpha: float = 3.0, beta: float = 0.5) -> Tensor:
    """``s_w^*`` of eq. 30 for ``q(w) = N(loc, diag(scale^2))``."""
    H = loc.numel()
    return (2 * beta + scale.square().sum() + loc.square().sum()) / (H + 2 * alpha - 2)


def eb_latent_variance(loc: Tensor, scale: Tensor, alpha: float = 3.0, beta: float = 0.5) -> Tensor:
    """``s_z^*`` of eq. 29 for ``q(z_n) = N(loc[n], diag(scale[n]^2))``, ``loc (N, K)``."""
    N, K = loc.shape
    return (2 * beta + (scale.square().sum() + loc.square().sum()) / N) / (K + 2 * alpha - 2)


class EmpiricalBayes:
    """``fit_svi`` callback: every ``every`` steps set the model's prior variances to eq. 29-30.

    Works with an ``AutoNormal`` guide (reads ``guide.locs``/``guide.scales``); updates the
    model's ``prior_scale`` (all weights share ``s_w``) and, for BNN+LV with
    ``update_latent=True`` (default), ``latent_scale``; pass ``update_latent=False`` where the
    latent prior variance is fixed (App. F.1 fixes it for heavy-tail, depeweg and bimodal). The
    updates write into the model's buffers in place; use an ELBO without JIT (the JIT would
    freeze the buffer values it saw when compiling), e.g. ``loss=Trace_ELBO()`` or
    ``NCAIElbo(jit=False)``.

    :attr:`prior_scale` and :attr:`latent_scale` are the current shared scales ``sqrt(s_w)`` and
    ``sqrt(s_z)`` (``history`` holds every update); the model's ``prior_scale`` buffer keeps its
    shape ``(P,)``, all entries equal.
    """

    def __init__(self, model, guide, every: int = 1, alpha: float = 3.0, beta: float = 0.5, update_latent: bool = True):
        every = check_int(every, "every")
        alpha, beta = check_real(alpha, "alpha"), check_real(beta, "beta")
        if alpha <= 1 or beta <= 0:
            raise ValueError(f"need alpha > 1 and beta > 0, got alpha={alpha}, beta={beta}")
        if not hasattr(model, "prior_scale"):
            raise TypeError(f"model must have a prior_scale to update (pb.BNN, pb.BNNLV), got {type(model).__name__}")
        self.model, self.guide, self.every = model, guide, every
        self.alpha, self.beta = alpha, beta
        self.update_latent = bool(update_latent)
        self.history: list[dict[str, float]] = []

    @torch.no_grad()
    def update(self) -> dict[str, float]:
        """Apply eq. 29-30 once; returns the new variances."""
        locs, scales = self._guide_parameters()
        s_w = eb_weight_variance(locs.w, scales.w, self.alpha, self.beta)
        self.model.prior_scale.fill_(s_w.sqrt().item())
        out = {"s_w": s_w.item()}
        if self.update_latent and hasattr(self.model, "latent_scale") and hasattr(locs, "z"):
            s_z = eb_latent_variance(locs.z, scales.z, self.alpha, self.beta)
            self.model.latent_scale.fill_(s_z.sqrt().item())
            out["s_z"] = s_z.item()
        self.history.append(out)
        return out

    def _guide_parameters(self) -> tuple:
        """The guide's ``locs`` and ``scales`` (an ``AutoNormal``'s), with the fix named when the
        guide has not created them yet or is not a mean-field guide over ``"w"``."""
        guide = self.guide
        if getattr(guide, "prototype_trace", False) is None:  # an AutoGuide that has not run yet
            raise RuntimeError(
                f"EmpiricalBayes reads the {type(guide).__name__}'s variational parameters, which exist only "
                "once the guide has run: fit the guide first (fit_svi(model, guide, x, y, callback=eb) runs it "
                "before the first update) or call the guide once, guide(x, y)"
            )
        locs, scales = getattr(guide, "locs", None), getattr(guide, "scales", None)
        if locs is None or scales is None or not hasattr(locs, "w"):
            raise TypeError(
                f"EmpiricalBayes needs a mean-field guide with locs.w and scales.w (pb.MeanField or "
                f'AutoNormal over the model\'s "w"), got {type(guide).__name__}'
            )
        return locs, scales

    @property
    def prior_scale(self) -> float:
        """The shared prior standard deviation of the weights, ``sqrt(s_w)`` (eq. 30), as a float;
        the model's value before the first update."""
        if self.history:
            return math.sqrt(self.history[-1]["s_w"])
        return float(self.model.prior_scale.reshape(-1)[0])

    @property
    def latent_scale(self) -> float | None:
        """``sqrt(s_z)`` (eq. 29) as a float; ``None`` for models without latent inputs or when the
        latent scale is not updated."""
        if self.history and "s_z" in self.history[-1]:
            return math.sqrt(self.history[-1]["s_z"])
        scale = getattr(self.model, "latent_scale", None)
        return None if scale is None else float(torch.as_tensor(scale).reshape(-1)[0])

    def __repr__(self) -> str:
        latent = "" if self.latent_scale is None else f", latent_scale={self.latent_scale:.4g}"
        return (
            f"EmpiricalBayes(prior_scale={self.prior_scale:.4g}{latent}, "
            f"updates={len(self.history)}, every={self.every})"
        )

    def __call__(self, step: int, loss: float) -> None:
        if (step + 1) % self.every == 0:
            self.update()
