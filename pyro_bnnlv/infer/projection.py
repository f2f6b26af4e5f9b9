r"""Inference for the projected BNN (Alg. 1 of ``projected-bnn-latent-weights.txt``).

Three stages, each callable on its own, and :func:`fit_projected_bnn` running all three:

1. :func:`~pyro_bnnlv.infer.fge.fge`: candidate weights ``{w_c^(r)}`` by Fast Geometric Ensembling
   on a BNN with the same network, ``N(0, 0.1)`` weight prior and noise (sec. 5.2).
2. :func:`fit_projection`: the prediction-constrained autoencoder (eq. 6), giving the point
   estimate ``phi*`` of the decoder.
3. Mean-field VI over ``z`` and ``phi`` (eq. 5) with Pyro's ``AutoNormal``: ``phi``'s variational
   mean starts at ``phi*``, ``log sigma_phi ~ N(-9, 0.1)`` (footnote 4), ``q(z)`` at random.

**Our reading of eq. 6.** As printed, eq. 6 squares ``||w - h(w)||^2 + gamma`` and *adds* the
training log-likelihood to a loss that is minimised -- which would reward reconstructions that
predict badly. The text says what is meant: ``gamma ~ N(0, 1)`` is "additional input noise"
(App. A: "additional input noise with variance 1 for robustness", a denoising autoencoder) and
the second term "encourages projections that map into weights that yield high log likelihood".
We minimise

.. math::

    \mathcal L(\theta, \phi) = \frac1R \sum_r \frac1P \big\| u_r - \hat u_r \big\|^2
        - \beta \, \frac1R \sum_r \frac1N \sum_n \log p\big(y_n \mid x_n, \hat w_r\big),
    \qquad \hat w_r = g_\phi\big(f_\theta(u_r + \gamma_r)\big),

with ``u_r = (w_r - m) / s`` the candidates standardised by their mean ``m`` and standard
deviation ``s``, ``\hat u_r = (\hat w_r - m) / s``, ``gamma_r ~ N(0, input_noise^2 I)`` drawn
afresh each step, and both terms averaged (per weight, per data point) so ``beta`` is
scale-free. The noise and the reconstruction live on the standardised scale, where "variance 1"
means "as large as the candidates' spread". The decoder outputs raw weights (the model's prior
on ``phi`` does not depend on the data); it starts with last-layer bias ``m`` and last-layer
weight rows scaled by ``s``, so its first outputs already lie among the candidates.

After training, the decoder's first (affine) layer is re-parametrised so that the candidates'
codes have mean 0 and standard deviation ``sigma_z`` per coordinate: the same function ``g``,
but the codes of good weights now sit where the prior ``p(z)`` and a random ``q(z)`` put mass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pyro
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_value
from torch import Tensor
from tqdm.auto import tqdm

from ..models.bnn import BNN
from ..models.projected import PAPER_SCALE, ProjectedBNN
from ..nets import MLP
from .fge import FGEResult, fge
from .svi import fit_svi, set_seed

__all__ = ["ProjectionFit", "fit_projection", "ProjectedFit", "fit_projected_bnn", "init_projected_guide"]


@dataclass
class ProjectionFit:
    """Output of :func:`fit_projection`: ``phi*``, the encoder and the training curves."""

    phi: Tensor
    encoder: MLP
    encoder_weights: Tensor
    reconstruction: list[float] = field(default_factory=list)
    neg_log_lik: list[float] = field(default_factory=list)
    codes: Tensor | None = None


def _recentre_first_layer(decoder: MLP, phi: Tensor, codes: Tensor, target_scale: float) -> tuple[Tensor, Tensor]:
    """Rewrite ``phi`` so the decoder applied to ``(z - mu) / s * sigma_z`` equals the old one on ``z``.

    The first layer is ``W1 z + b1``; with ``z = mu + s * z' / sigma_z`` it becomes
    ``(W1 diag(s) / sigma_z) z' + (b1 + W1 mu)``. Returns the new ``phi`` and the new codes.
    """
    mu, s = codes.mean(0), codes.std(0).clamp_min(1e-6)
    fan_in, fan_out, w_sl, b_sl = decoder.layers[0]
    phi = phi.clone()
    W1 = phi[w_sl].view(fan_out, fan_in)
    b1 = phi[b_sl]
    new_b = b1 + W1 @ mu
    new_W = W1 * (s / target_scale)
    phi[w_sl] = new_W.reshape(-1)
    phi[b_sl] = new_b
    return phi, (codes - mu) / s * target_scale


def fit_projection(
    model: ProjectedBNN,
    candidates: Tensor,
    x: Tensor,
    y: Tensor,
    *,
    beta: float = 1.0,
    input_noise: float = 1.0,
    encoder_hidden: tuple[int, ...] | None = None,
    num_steps: int = 3000,
    lr: float = 0.005,
    batch_size: int | None = 256,
    seed: int | None = None,
    progress: bool = True,
) -> ProjectionFit:
    """Stage 2: the prediction-constrained autoencoder (eq. 6, our reading in the module docstring).

    Returns ``phi*`` (re-centred, see the module docstring); ``model`` is not modified. ``encoder_hidden`` defaults to the
    decoder's hidden widths reversed; the encoder uses the decoder's activation.

    Args:
        model: the :class:`ProjectedBNN` whose decoder is trained.
        candidates: ``(R, P)`` candidate weights (e.g. ``fge(...).kept``).
        x, y: training data for the prediction term.
        beta: weight of the prediction term.
        input_noise: standard deviation of ``gamma`` on the standardised scale (paper: 1).
        num_steps, lr: Adam on encoder and decoder jointly.
        batch_size: data points per step for the prediction term (``None``: all).
    """
    if candidates.dim() != 2 or candidates.shape[1] != model.net.num_weights:
        raise ValueError(f"candidates must have shape (R, {model.net.num_weights}), got {tuple(candidates.shape)}")
    if candidates.shape[0] < 2:
        raise ValueError("fit_projection needs at least 2 candidates")
    if beta < 0 or input_noise < 0:
        raise ValueError("beta and input_noise must be non-negative")
    model.check_data(x, y)
    set_seed(seed)
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    loc, scale = candidates.mean(0), candidates.std(0)
    scale = scale.clamp_min(1e-3 * float(scale.mean()) + 1e-12)
    u = (candidates - loc) / scale
    R, P = u.shape
    hidden = list(reversed(model.decoder.hidden_sizes)) if encoder_hidden is None else list(encoder_hidden)
    encoder = MLP(P, hidden, model.latent_dim, activation=model.decoder.activation)
    theta = torch.nn.Parameter(encoder.init_weights(gen))
    phi0 = model.decoder.init_weights(gen)
    _, fan_out, w_sl, b_sl = model.decoder.layers[-1]
    phi0[w_sl] = (phi0[w_sl].view(fan_out, -1) * scale[:, None]).reshape(-1)
    phi0[b_sl] = loc
    phi = torch.nn.Parameter(phi0)
    opt = torch.optim.Adam([theta, phi], lr=lr)
    N = x.shape[0]
    y2 = y.reshape(N, -1).to(x.dtype)
    sigma = torch.as_tensor(model.noise_scale).detach()
    out = ProjectionFit(phi=phi.detach(), encoder=encoder, encoder_weights=theta.detach())
    for step in tqdm(range(num_steps), disable=not progress, desc="autoencoder", leave=False):
        noisy = u + input_noise * torch.randn(R, P)
        codes = encoder(noisy.unsqueeze(-2), theta.expand(R, -1)).squeeze(-2)     # (R, D_z)
        w_hat = model.project(codes, phi)                                        # (R, P)
        recon = ((w_hat - loc) / scale - u).pow(2).mean()
        if batch_size is None or batch_size >= N:
            xb, yb = x, y2
        else:
            idx = torch.randint(N, (batch_size,))
            xb, yb = x[idx], y2[idx]
        f = model.net(xb, w_hat)                                                 # (R, B, L)
        nll = -torch.distributions.Normal(f, sigma).log_prob(yb).sum(-1).mean()
        loss = recon + beta * nll
        if not torch.isfinite(loss):
            raise FloatingPointError(f"fit_projection: non-finite loss at step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.reconstruction.append(float(recon.detach()))
        out.neg_log_lik.append(float(nll.detach()))
    with torch.no_grad():
        codes = encoder(u.unsqueeze(-2), theta.expand(R, -1)).squeeze(-2)
        phi_star, codes = _recentre_first_layer(model.decoder, phi.detach(), codes, float(model.latent_scale))
    out.phi, out.encoder_weights, out.codes = phi_star, theta.detach(), codes
    return out


def init_projected_guide(model: ProjectedBNN, phi: Tensor | None = None, *, seed: int | None = None,
                         z_scale: float | None = None) -> AutoNormal:  # fmt: skip
    """Stage 3's mean-field guide: ``AutoNormal`` over ``z`` (and ``phi``).

    ``phi``'s mean starts at ``phi`` (a random decoder initialisation if ``None``: the one-stage
    ablation) and its scales at ``exp(N(-9, 0.1))`` (footnote 4); ``z``'s means at a draw from
    ``p(z)`` and its scales at ``z_scale`` (default half the prior's).
    """
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    z_shape = (model.latent_dim,) if model.num_tasks is None else (model.num_tasks, model.latent_dim)
    values = {"z": torch.randn(z_shape, generator=gen) * model.latent_scale}
    if model.fixed_phi is None:
        values["phi"] = model.decoder.init_weights(gen) if phi is None else phi.detach().clone()
    scale = 0.5 * float(model.latent_scale) if z_scale is None else float(z_scale)
    guide = AutoNormal(model, init_loc_fn=init_to_value(values=values), init_scale=scale)
    return guide


def _set_phi_scales(guide: AutoNormal, model: ProjectedBNN, x: Tensor, y: Tensor, seed: int | None,
                    **kwargs) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(1 if seed is None else int(seed) + 1)
    guide(x, y, **kwargs)  # create the parameters
    if model.fixed_phi is None:
        log_sd = -9.0 + 0.1 * torch.randn(model.num_phi, generator=gen)
        guide.scales.phi = log_sd.exp()


@dataclass
class ProjectedFit:
    """Output of :func:`fit_projected_bnn`."""

    model: ProjectedBNN
    guide: AutoNormal
    losses: list[float]
    fge: FGEResult | None
    projection: ProjectionFit | None
    seconds: dict[str, float]


def fit_projected_bnn(
    model: ProjectedBNN,
    x: Tensor,
    y: Tensor,
    *,
    x_valid: Tensor | None = None,
    y_valid: Tensor | None = None,
    variant: str = "full",
    candidates: Tensor | None = None,
    weight_prior_scale: float = PAPER_SCALE,
    fge_kwargs: dict[str, Any] | None = None,
    projection_kwargs: dict[str, Any] | None = None,
    num_steps: int = 3000,
    lr: float = 0.01,
    num_particles: int = 20,
    batch_size: int | None = None,
    seed: int | None = None,
    progress: bool = True,
) -> ProjectedFit:
    """Alg. 1: FGE, the prediction-constrained autoencoder, then mean-field VI over ``z`` and ``phi``.

    Args:
        model: the :class:`ProjectedBNN` (its decoder architecture, latent size and priors).
        variant: ``"full"`` (Alg. 1), ``"one-stage"`` (no FGE / autoencoder: VI from a random
            decoder, Fig. 3's ablation) or ``"qz-only"`` (``phi`` fixed at ``phi*``: only
            ``q(z)`` is learned). The linear-projection ablation is a model with
            ``decoder_hidden=[]`` and ``decoder_activation="identity"``.
        weight_prior_scale: prior standard deviation of the BNN that FGE trains (paper's
            ``N(0, 0.1)``, read as variance 0.1).
        candidates: ``(R, P)`` weight vectors to use instead of FGE's (e.g. MAP fits from random
            restarts, as for the paper's Fig. 2); stage 1 is then skipped.
        fge_kwargs, projection_kwargs: options of :func:`~pyro_bnnlv.infer.fge.fge` and
            :func:`fit_projection`.
        num_steps, lr, num_particles, batch_size: stage 3's SVI (paper: 20 reparameterisation
            samples).

    Returns a :class:`ProjectedFit`; sample it with ``pb.sample_posterior(fit.model, fit.guide, x)``.
    """
    if variant not in ("full", "one-stage", "qz-only"):
        raise ValueError(f"variant must be 'full', 'one-stage' or 'qz-only', got {variant!r}")
    if model.num_tasks is not None:
        raise ValueError("fit_projected_bnn is for single-task models (FGE trains one network); for "
                         "num_tasks=M use init_projected_guide(model) and fit_svi(..., "
                         "model_kwargs={'task': task})")
    seconds: dict[str, float] = {}
    fge_result = projection = None
    phi_star = None
    if variant != "one-stage":
        if candidates is None:
            t0 = time.perf_counter()
            sigma = torch.as_tensor(model.noise_scale).detach()
            bnn = BNN(model.net, prior_scale=weight_prior_scale, noise_scale=sigma)
            fge_result = fge(bnn, x, y, x_valid=x_valid, y_valid=y_valid, seed=seed, progress=progress,
                             **(fge_kwargs or {}))  # fmt: skip
            seconds["fge"] = time.perf_counter() - t0
            candidates = fge_result.kept
        t0 = time.perf_counter()
        projection = fit_projection(model, candidates, x, y, seed=seed, progress=progress,
                                    **(projection_kwargs or {}))  # fmt: skip
        seconds["autoencoder"] = time.perf_counter() - t0
        phi_star = projection.phi
        if variant == "qz-only":
            model.fixed_phi = phi_star.clone()
    t0 = time.perf_counter()
    with pyro.get_param_store().scope():
        guide = init_projected_guide(model, phi_star, seed=seed)
        _set_phi_scales(guide, model, x, y, seed)
        loss = Trace_ELBO(num_particles=num_particles, vectorize_particles=True)
        losses = fit_svi(model, guide, x, y, num_steps=num_steps, lr=lr, loss=loss,
                         batch_size=batch_size, seed=seed, progress=progress)  # fmt: skip
    seconds["vi"] = time.perf_counter() - t0
    return ProjectedFit(model, guide, losses, fge_result, projection, seconds)
