r"""Generative objectives for the projected BNN's decoder (issue 17; an option of
:func:`~pyro_bnnlv.infer.projection.fit.fit_projection`).

Pradier, Pan, Yao, Ghosh & Doshi-Velez (2018), "Projected BNNs: avoiding weight-space pathologies by
learning latent representations of neural network weights", arXiv:1811.07006. Stage 2 of Alg. 1
trains the decoder ``g_phi`` as a prediction-constrained *autoencoder* (eq. 6): reconstructions of
the candidates must be close and must predict well. Nothing in eq. 6 asks ``g_phi(z)`` with
``z ~ p(z)`` to look like the candidates, yet that is what stage 3 relies on (mean-field ``q(z)``
starts at and is pulled towards ``p(z)``) and what the text of Fig. 2 describes: "we trained a
decoder ``g_phi`` that maps an isotropic 2-D Gaussian to weights that we sampled from the solution
set". The two objectives here make ``g_phi`` a generative model of the candidates ``{w_r}_{r=1}^R``
under the model's own prior ``p(z) = N(0, sigma_z^2 I)``, and keep eq. 6's prediction constraint,
now on *decoded prior draws*. With ``u = (w - m) / s`` the candidates standardised as in eq. 6's
reading (:mod:`~pyro_bnnlv.infer.projection.fit`) and
``pred(phi) = E_{z ~ p(z)} [ -(1/N) sum_n log p(y_n | x_n, g_phi(z)) ]`` (``M`` draws of ``z`` per
step, data minibatches):

**VAE** (``objective="vae"``; Kingma & Welling 2014, arXiv:1312.6114, eq. 3 and 10): an encoder
``q_theta(z | u) = N(mu_theta(u), diag sd_theta(u)^2)``, a Gaussian decoder
``p(u | z) = N(u; (g_phi(z) - m) / s, tau^2 I)`` with a learned scalar ``tau``, and

.. math::

    \mathcal L = \frac{1}{RP} \sum_r \Big( \mathbb E_{q_\theta(z|u_r)}
        \Big[\frac{\|u_r - \hat u(z)\|^2}{2\tau^2}\Big] + P \log\tau
        + \mathrm{KL}\big(q_\theta(z|u_r) \,\|\, \mathcal N(0, \sigma_z^2 I)\big) \Big)
        + \beta\, \mathrm{pred}(\phi),

the negative ELBO of the candidates per weight (one reparameterised draw per candidate) plus
the prediction constraint. The KL term fills ``p(z)`` with codes: the aggregate posterior of
the codes matches the prior, so prior draws decode near candidates.

**MMD** (``objective="mmd"``; Gretton et al. 2012, JMLR 13, eq. 3; as a generator objective:
Li, Swersky & Zemel 2015, arXiv:1502.02761, and Dziugaite, Roy & Ghahramani 2015,
arXiv:1505.03906): no encoder; the decoded prior draws ``a_i = phi(g_phi(z_i))`` must match
the candidates ``b_r = phi(w_r)`` in distribution,

.. math::

    \mathcal L = \widehat{\mathrm{MMD}}^2_k\big(\{a_i\}_{i=1}^M, \{b_r\}_{r=1}^R\big)
        + \beta\, \mathrm{pred}(\phi), \qquad
    \widehat{\mathrm{MMD}}^2_k = \overline{k(a, a')} + \overline{k(b, b')} - 2\,\overline{k(a, b)},

(the biased V-statistic, never negative) with the kernel a sum of Gaussians
``k(a, b) = sum_j exp(-||a - b||^2 / (2 (c_j h)^2))`` at bandwidth factors ``c_j`` times the
median pairwise distance ``h`` between candidates. The features are the standardised weights
(``space="weight"``: ``phi(w) = (w - m) / s``) or the network's outputs at (up to 64 of) the
training inputs (``space="function"``: ``phi(w) = f_w(x_{1:T})``), which does not see the
permutation copies of a solution that MAP restarts produce.

The prediction term is on prior draws so that every region of ``p(z)`` decodes to weights that
fit; the distribution-matching term stops it from sending every draw to the single best mode
(docs/design-notes.md, 'infer.projection.decoder').
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "DEFAULT_BETA",
    "DEFAULT_LR",
    "DEFAULT_NUM_STEPS",
    "GENERATIVE_OBJECTIVES",
    "gaussian_kl",
    "median_distance",
    "mmd2",
    "vae_terms",
]

#: the generative decoder objectives of :func:`~pyro_bnnlv.infer.projection.fit.fit_projection`
GENERATIVE_OBJECTIVES = ("vae", "mmd")

#: the prediction weight ``beta`` per objective when none is given: eq. 6 at 1; the generative
#: objectives at the value chosen on the four-mode toy (docs/design-notes.md, 'infer.projection.decoder')
DEFAULT_BETA = {"autoencoder": 1.0, "vae": 0.1, "mmd": 0.01}

#: the decoder stage's Adam steps and learning rate per objective when none are given: the budget
#: each ``beta`` was calibrated with (docs/design-notes.md, 'infer.projection.decoder')
DEFAULT_NUM_STEPS = {"autoencoder": 3000, "vae": 2000, "mmd": 2000}
DEFAULT_LR = {"autoencoder": 0.005, "vae": 0.01, "mmd": 0.01}


def median_distance(b: Tensor) -> Tensor:
    """Median Euclidean distance between distinct rows of ``b (R, F)`` (the bandwidth unit)."""
    d = torch.cdist(b, b, compute_mode="donot_use_mm_for_euclid_dist")
    off = d[~torch.eye(len(b), dtype=torch.bool)]
    h = off.median()
    if not torch.isfinite(h) or h <= 0:
        raise ValueError("the candidates coincide (median pairwise distance 0): the MMD needs distinct candidates")
    return h


def mmd2(a: Tensor, b: Tensor, bandwidths: Sequence[float] | Tensor) -> Tensor:
    """Biased squared MMD between samples ``a (M, F)`` and ``b (R, F)`` (Gretton et al. 2012,
    eq. 3, V-statistic) under a sum of Gaussian kernels with the given ``bandwidths``.

    Squared distances by matrix product, ``|x_i|^2 + |x_j|^2 - 2 x_i . x_j`` (clamped at 0), of
    the rows centred on their mean (distances do not change; the product form cancels badly for
    rows far from the origin): matrix products instead of the ``M R F`` exact differences of
    ``torch.cdist``, for the same MMD to about 1e-5 in single precision
    (``tests/test_projected.py``)."""
    bw = torch.as_tensor(bandwidths, dtype=a.dtype)
    if bw.dim() != 1 or len(bw) == 0 or not (bw > 0).all():
        raise ValueError(f"bandwidths must be a non-empty list of positive numbers, got {bandwidths!r}")
    x = torch.cat([a, b])
    x = x - x.mean(0).detach()  # a translation: the same distances and gradients, fewer cancellations
    sq = x.square().sum(-1)
    d2 = (sq[:, None] + sq[None, :] - 2 * x @ x.T).clamp_min(0)
    k = torch.exp(-d2[..., None] / (2 * bw.square())).sum(-1)
    M = len(a)
    return k[:M, :M].mean() + k[M:, M:].mean() - 2 * k[:M, M:].mean()


def gaussian_kl(mu: Tensor, log_sd: Tensor, prior_scale: float) -> Tensor:
    """``KL(N(mu, diag e^{2 log_sd}) || N(0, prior_scale^2 I))`` summed over the last dimension."""
    var_ratio = (2 * log_sd).exp() / prior_scale**2
    return 0.5 * (var_ratio + mu.square() / prior_scale**2 - 1 - var_ratio.log()).sum(-1)


def vae_terms(
    u: Tensor, u_hat: Tensor, mu: Tensor, log_sd: Tensor, log_tau: Tensor, prior_scale: float
) -> tuple[Tensor, Tensor]:
    """The VAE's reconstruction (Gaussian, scale ``tau``) and KL terms, each per candidate and
    per weight (the module docstring's first sum, split in two)."""
    P = u.shape[-1]
    recon = (0.5 * (u - u_hat).square().sum(-1) / (2 * log_tau).exp() + P * log_tau).mean() / P
    kl = gaussian_kl(mu, log_sd, prior_scale).mean() / P
    return recon, kl
