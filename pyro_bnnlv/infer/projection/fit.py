r"""Inference for the projected BNN (Alg. 1 of Pradier, Pan, Yao, Ghosh & Doshi-Velez 2018,
arXiv:1811.07006).

Three stages, each callable on its own, and :func:`fit_projected_bnn` running all three:

1. :func:`~pyro_bnnlv.infer.projection.fge.fge`: candidate weights ``{w_c^(r)}`` by Fast Geometric Ensembling
   on a BNN with the same network, ``N(0, 0.1)`` weight prior and noise (sec. 5.2).
2. :func:`fit_projection`: the prediction-constrained autoencoder (eq. 6), giving the point
   estimate ``phi*`` of the decoder; or (``objective="vae"`` / ``"mmd"``) a generative decoder
   of the candidates under ``p(z)`` with the prediction constraint on decoded prior draws
   (:mod:`~pyro_bnnlv.infer.projection.decoder`, issue 17: eq. 6 does not make ``g_phi(z)``,
   ``z ~ p(z)``, cover the candidates' modes, which Fig. 2 needs).
3. Mean-field VI over ``z`` and ``phi`` (eq. 5) with Pyro's ``AutoNormal``: ``phi``'s variational
   mean starts at ``phi*``, ``log sigma_phi ~ N(-9, 0.1)`` (footnote 4), ``q(z)`` at random
   (after eq. 6) or at ``p(z)`` (after a generative decoder; ``z_init``).

**Our reading of eq. 6.** As printed, eq. 6 would reward reconstructions that predict badly; we
read ``gamma ~ N(0, 1)`` as input noise of a denoising autoencoder (App. A) and the second term as
rewarding high log-likelihood (docs/design-notes.md, 'infer.projection.fit').
We minimise

.. math::

    \mathcal L(\theta, \phi) = \frac1R \sum_r \frac1P \big\| u_r - \hat u_r \big\|^2
        - \beta \, \frac1R \sum_r \frac1N \sum_n \log p\big(y_n \mid x_n, \hat w_r\big),
    \qquad \hat w_r = g_\phi\big(f_\theta(u_r + \gamma_r)\big),

with ``u_r = (w_r - m) / s`` the candidates standardised by their mean ``m`` and standard
deviation ``s``, ``\hat u_r = (\hat w_r - m) / s``, ``gamma_r ~ N(0, input_noise^2 I)`` drawn
afresh each step, and both terms averaged (per weight, per data point) so ``beta`` is
scale-free; the decoder is trained on the standardised scale, ``\hat u = g_\psi(z)``, and
``g_phi(z) = m + s * g_psi(z)`` folds ``(m, s)`` into its last layer. After training (eq. 6
only) the first affine layer is re-parametrised so that the candidates' codes have mean 0 and
sd ``sigma_z`` per coordinate (the same function ``g``, codes where ``p(z)`` puts mass).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import pyro
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_value
from torch import Tensor
from tqdm.auto import tqdm

from ..._checks import check_real
from ...models.bnn import BNN
from ...models.projected import PAPER_SCALE, ProjectedBNN
from ...nets import MLP, as_positive_int
from ...param_names import own_param_names
from ..elbos.closed_form_kl import ClosedFormKLElbo
from .fge import FGEResult, fge
from .decoder import (
    DEFAULT_BETA,
    DEFAULT_LR,
    DEFAULT_NUM_STEPS,
    GENERATIVE_OBJECTIVES,
    median_distance,
    mmd2,
    vae_terms,
)
from ..svi import fit_svi, set_seed

__all__ = ["ProjectedFit", "ProjectionFit", "fit_projected_bnn", "fit_projection", "init_projected_guide"]


@dataclass
class ProjectionFit:
    """Output of :func:`fit_projection`: ``phi*``, the encoder and the training curves.

    ``reconstruction`` holds the objective's first term per step (eq. 6's squared error, the
    VAE's Gaussian reconstruction term, or the MMD), ``neg_log_lik`` the prediction term (on
    reconstructions for eq. 6, on decoded prior draws for the generative objectives), ``kl``
    the VAE's KL term; ``codes`` are the candidates' codes (``None`` for the MMD, which has no
    encoder)."""

    phi: Tensor
    encoder: MLP
    encoder_weights: Tensor
    reconstruction: list[float] = field(default_factory=list)
    neg_log_lik: list[float] = field(default_factory=list)
    codes: Tensor | None = None
    objective: str = "autoencoder"
    kl: list[float] = field(default_factory=list)


def _recentre_first_layer(decoder: MLP, phi: Tensor, codes: Tensor, target_scale: float) -> tuple[Tensor, Tensor]:
    """Rewrite ``phi`` so the decoder applied to ``(z - mu) / s * sigma_z`` equals the old one on ``z``.

    The first layer is ``W1 z + b1``; with ``z = mu + s * z' / sigma_z`` it becomes
    ``(W1 diag(s) / sigma_z) z' + (b1 + W1 mu)``. Returns the new ``phi`` and the new codes.
    """
    mu, s = codes.mean(0), codes.std(0).clamp_min(1e-6)
    fan_in, fan_out, w_sl, b_sl = decoder.layers[0]
    phi = phi.clone()
    W1 = phi[w_sl].view(fan_out, fan_in)
    phi[b_sl] = phi[b_sl] + W1 @ mu
    phi[w_sl] = (W1 * (s / target_scale)).reshape(-1)
    return phi, (codes - mu) / s * target_scale


class _DecoderFit:
    """State of :func:`fit_projection`'s Adam steps: the candidates standardised per weight,
    ``u = (w - loc) / scale`` (``scale`` floored at 1e-3 of its mean), the encoder ``f_theta``
    (mirroring the decoder unless ``encoder_hidden``) and the decoder ``g_psi`` trained on that
    scale (module docstring), both drawn from a generator seeded by ``seed``, the data of the
    prediction term and, for the MMD, the features in ``mmd_space`` (``f(x; w)`` at 64 training
    inputs drawn from that generator, or the standardised weights), the candidates' features and
    the kernel's bandwidths in units of the candidates' median pairwise distance."""

    def __init__(
        self,
        model: ProjectedBNN,
        objective: str,
        candidates: Tensor,
        x: Tensor,
        y: Tensor,
        batch_size: int | None,
        encoder_hidden: tuple[int, ...] | None,
        mmd_space: str,
        mmd_bandwidths: tuple[float, ...],
        seed: int | None,
    ) -> None:
        gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
        self.model, self.objective, self.x, self.batch_size = model, objective, x, batch_size
        self.y2 = y.reshape(x.shape[0], -1).to(x.dtype)
        loc, scale = candidates.mean(0), candidates.std(0)
        self.loc, self.scale = loc, scale.clamp_min(1e-3 * float(scale.mean()) + 1e-12)
        self.u = (candidates - self.loc) / self.scale
        K, hidden = model.latent_dim, model.decoder.hidden_sizes[::-1] if encoder_hidden is None else encoder_hidden
        out = 2 * K if objective == "vae" else K
        self.encoder = MLP(candidates.shape[1], list(hidden), out, activation=model.decoder.activation)
        self.theta = torch.nn.Parameter(self.encoder.init_weights(gen))
        self.phi = torch.nn.Parameter(model.decoder.init_weights(gen))
        self.log_tau = torch.nn.Parameter(torch.zeros(()))
        self.mmd: tuple[Callable[[Tensor], Tensor], Tensor, Tensor] | None = None
        if objective == "mmd":
            x_feat = x[torch.randperm(x.shape[0], generator=gen)[:64]]
            features = (
                (lambda w: model.net(x_feat, w).flatten(-2))
                if mmd_space == "function"
                else (lambda w: (w - self.loc) / self.scale)
            )
            with torch.no_grad():
                target = features(candidates)
            self.mmd = features, target, median_distance(target) * torch.as_tensor(mmd_bandwidths, dtype=target.dtype)

    def encode(self, u: Tensor) -> Tensor:
        return self.encoder(u.unsqueeze(-2), self.theta).squeeze(-2)

    def decode(self, z: Tensor) -> Tensor:
        """Raw weights ``g_phi(z) = loc + scale * g_psi(z)``."""
        return self.loc + self.scale * self.model.project(z, self.phi)

    def neg_log_lik(self, w_hat: Tensor) -> Tensor:
        """Mean over weight vectors and (a minibatch of) data points of ``-log p(y_n | x_n, w)``."""
        N, B = self.x.shape[0], self.batch_size
        idx = None if B is None or B >= N else torch.randint(N, (B,))
        xb, yb = (self.x, self.y2) if idx is None else (self.x[idx], self.y2[idx])
        sigma = torch.as_tensor(self.model.noise_scale).detach()
        return -torch.distributions.Normal(self.model.net(xb, w_hat), sigma).log_prob(yb).sum(-1).mean()

    def loss(self, beta: float, input_noise: float, draws: int) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """One step's loss and its terms ``(loss, reconstruction, neg_log_lik, kl)`` (module docstring;
        :mod:`~pyro_bnnlv.infer.projection.decoder` for the generative objectives, ``draws`` of ``p(z)``)."""
        u, K, sigma_z = self.u, self.model.latent_dim, float(self.model.latent_scale)
        if self.objective == "autoencoder":
            w_hat = self.decode(self.encode(u + input_noise * torch.randn(u.shape)))  # (R, P)
            recon, nll = ((w_hat - self.loc) / self.scale - u).pow(2).mean(), self.neg_log_lik(w_hat)
            return recon + beta * nll, recon, nll, None
        w_prior = self.decode(sigma_z * torch.randn(draws, K))  # (M, P)
        nll = self.neg_log_lik(w_prior)
        if self.mmd is not None:
            features, target, bandwidths = self.mmd
            recon = mmd2(features(w_prior), target, bandwidths)
            return recon + beta * nll, recon, nll, None
        stats = self.encode(u)
        mu, log_sd = stats[..., :K], stats[..., K:].clamp(-10.0, 5.0)
        codes = mu + log_sd.exp() * torch.randn(u.shape[0], K)
        recon, kl = vae_terms(u, self.model.project(codes, self.phi), mu, log_sd, self.log_tau, sigma_z)
        return recon + kl + beta * nll, recon, nll, kl

    def phi_star(self) -> tuple[Tensor, Tensor | None]:
        """``phi`` with ``(loc, scale)`` folded into the last layer (eq. 6: and re-centred,
        :func:`_recentre_first_layer`), and the candidates' codes (``None`` for the MMD)."""
        with torch.no_grad():
            phi_star = self.phi.detach().clone()
            _, fan_out, w_sl, b_sl = self.model.decoder.layers[-1]
            phi_star[w_sl] = (phi_star[w_sl].view(fan_out, -1) * self.scale[:, None]).reshape(-1)
            phi_star[b_sl] = self.loc + self.scale * phi_star[b_sl]
            if self.objective == "mmd":
                return phi_star, None
            codes = self.encode(self.u)
            if self.objective == "vae":
                return phi_star, codes[..., : self.model.latent_dim]
            return _recentre_first_layer(self.model.decoder, phi_star, codes, float(self.model.latent_scale))


def fit_projection(
    model: ProjectedBNN,
    candidates: Tensor,
    x: Tensor,
    y: Tensor,
    *,
    objective: str = "autoencoder",
    beta: float | None = None,
    input_noise: float = 1.0,
    encoder_hidden: tuple[int, ...] | None = None,
    num_steps: int | None = None,
    lr: float | None = None,
    batch_size: int | None = 256,
    num_prior_draws: int = 64,
    mmd_space: str = "weight",
    mmd_bandwidths: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0),
    seed: int | None = None,
    progress: bool = True,
) -> ProjectionFit:
    """Stage 2: train the decoder ``g_phi`` on the candidates.

    ``objective="autoencoder"`` (default): the prediction-constrained autoencoder (eq. 6, our
    reading in the module docstring); ``phi*`` is re-centred (module docstring).
    ``objective="vae"`` / ``"mmd"``: a generative decoder of the candidates under the model's
    ``p(z)`` with the prediction constraint on decoded prior draws
    (:mod:`~pyro_bnnlv.infer.projection.decoder` gives the maths); ``phi*`` is not re-centred,
    the objective already puts the candidates' codes under ``p(z)``.
    ``model`` is not modified. ``encoder_hidden`` defaults to the decoder's hidden widths
    reversed; the encoder uses the decoder's activation.

    Args:
        model: the :class:`ProjectedBNN` whose decoder is trained.
        candidates: ``(R, P)`` candidate weights (e.g. ``fge(...).kept``).
        x, y: training data for the prediction term.
        objective: ``"autoencoder"`` (eq. 6), ``"vae"`` or ``"mmd"``.
        beta: weight of the prediction term; ``None``:
            :data:`~pyro_bnnlv.infer.projection.decoder.DEFAULT_BETA` (its notes say why).
        input_noise: standard deviation of ``gamma`` on the standardised scale (paper: 1;
            autoencoder only: the generative objectives never read it).
        num_steps, lr: Adam on encoder and decoder jointly; ``None``:
            :data:`~pyro_bnnlv.infer.projection.decoder.DEFAULT_NUM_STEPS` and
            :data:`~pyro_bnnlv.infer.projection.decoder.DEFAULT_LR` (eq. 6: 3,000 steps at 0.005;
            the generative objectives: the budget ``beta`` was calibrated with).
        batch_size: data points per step for the prediction term (``None``: all).
        num_prior_draws: ``M``, draws of ``z ~ p(z)`` per step (generative objectives).
        mmd_space: ``"weight"`` or ``"function"``, the MMD's features.
        mmd_bandwidths: the MMD kernel's bandwidths, in units of the candidates' median
            pairwise distance.
    """
    if objective not in ("autoencoder", *GENERATIVE_OBJECTIVES):
        raise ValueError(f"objective must be 'autoencoder' (eq. 6), 'vae' or 'mmd', got {objective!r}")
    if mmd_space not in ("weight", "function"):
        raise ValueError(f"mmd_space must be 'weight' or 'function', got {mmd_space!r}")
    if candidates.dim() != 2 or candidates.shape[1] != model.net.num_weights:
        raise ValueError(f"candidates must have shape (R, {model.net.num_weights}), got {tuple(candidates.shape)}")
    if candidates.shape[0] < 2:
        raise ValueError("fit_projection needs at least 2 candidates")
    beta = DEFAULT_BETA[objective] if beta is None else beta
    num_steps = DEFAULT_NUM_STEPS[objective] if num_steps is None else as_positive_int(num_steps, "num_steps")
    lr = DEFAULT_LR[objective] if lr is None else check_real(lr, "lr", positive=True)
    if beta < 0 or input_noise < 0:
        raise ValueError("beta and input_noise must be non-negative")
    num_prior_draws = as_positive_int(num_prior_draws, "num_prior_draws")
    model.check_data(x, y)
    set_seed(seed)
    dec = _DecoderFit(model, objective, candidates, x, y, batch_size, encoder_hidden, mmd_space, mmd_bandwidths, seed)
    params = [dec.phi] if objective == "mmd" else [dec.theta, dec.phi]
    opt = torch.optim.Adam(params + ([dec.log_tau] if objective == "vae" else []), lr=lr)
    out = ProjectionFit(phi=dec.phi.detach(), encoder=dec.encoder, encoder_weights=dec.theta, objective=objective)
    for step in tqdm(range(num_steps), disable=not progress, desc=objective, leave=False):
        loss, recon, nll, kl = dec.loss(beta, input_noise, num_prior_draws)
        if kl is not None:
            out.kl.append(float(kl.detach()))
        if not torch.isfinite(loss):
            raise FloatingPointError(f"fit_projection: non-finite loss at step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.reconstruction.append(float(recon.detach()))
        out.neg_log_lik.append(float(nll.detach()))
    (out.phi, out.codes), out.encoder_weights = dec.phi_star(), dec.theta.detach()
    return out


def init_projected_guide(
    model: ProjectedBNN,
    phi: Tensor | None = None,
    *,
    seed: int | None = None,
    z_scale: float | None = None,
    z_init: str = "random",
) -> AutoNormal:
    """Stage 3's mean-field guide: ``AutoNormal`` over ``z`` (and ``phi``).

    ``phi``'s mean starts at ``phi`` (a random decoder if ``None``: the one-stage ablation) and its
    scales at ``z``'s (:func:`fit_projected_bnn` then sets them to ``exp(N(-9, 0.1))``, footnote 4).
    ``z_init="random"`` (the paper's "initialized randomly"): ``z``'s means at a draw from ``p(z)``,
    scales ``z_scale`` (default half the prior's); ``"prior"``: ``q(z)`` at ``p(z)`` (scales
    default the prior's), the start for a generative decoder.
    """
    if z_init not in ("random", "prior"):
        raise ValueError(f"z_init must be 'random' or 'prior', got {z_init!r}")
    gen = torch.Generator().manual_seed(0 if seed is None else int(seed))
    z_shape = (model.latent_dim,) if model.num_tasks is None else (model.num_tasks, model.latent_dim)
    z0 = torch.randn(z_shape, generator=gen) * model.latent_scale
    values = {"z": z0 if z_init == "random" else torch.zeros(z_shape)}
    if model.fixed_phi is None:
        values["phi"] = model.decoder.init_weights(gen) if phi is None else phi.detach().clone()
    default = 0.5 if z_init == "random" else 1.0
    scale = default * float(model.latent_scale) if z_scale is None else float(z_scale)
    return own_param_names(AutoNormal(model, init_loc_fn=init_to_value(values=values), init_scale=scale))


def _stage3_guide(
    model: ProjectedBNN, projection: ProjectionFit | None, z_init: str | None, x: Tensor, y: Tensor, seed: int | None
) -> AutoNormal:
    """Stage 3's guide (:func:`init_projected_guide` from ``projection.phi``), ``phi``'s scales at ``exp(N(-9, 0.1))``
    (footnote 4); ``z_init=None``: ``"prior"`` after a generative decoder objective, else ``"random"``."""
    if z_init is None:
        generative = projection is not None and projection.objective in GENERATIVE_OBJECTIVES
        z_init = "prior" if generative else "random"
    guide = init_projected_guide(model, None if projection is None else projection.phi, seed=seed, z_init=z_init)
    gen = torch.Generator().manual_seed(1 if seed is None else int(seed) + 1)
    guide(x, y)  # create the parameters
    if model.fixed_phi is None:
        guide.scales.phi = (-9.0 + 0.1 * torch.randn(model.num_phi, generator=gen)).exp()
    return guide


def _stage3_elbo(model: ProjectedBNN, variant: str, kl: str, num_particles: int, fused: bool) -> Trace_ELBO:
    """Stage 3's ELBO (``kl``: :func:`fit_projected_bnn`), without ``phi``'s KL when ``phi`` is fixed. The
    model's only plate is "data" (dim -1): said, not guessed (Pyro logs every guess)."""
    if kl not in ("closed-form", "monte-carlo"):
        raise ValueError(f"kl must be 'closed-form' (the paper's) or 'monte-carlo', got {kl!r}")
    if not isinstance(fused, bool):
        raise TypeError(f"fused must be True or False, got {fused!r}")
    if kl == "monte-carlo":
        return Trace_ELBO(num_particles=num_particles, vectorize_particles=True, max_plate_nesting=1)
    sites = ("z",) if variant == "qz-only" or model.fixed_phi is not None else ("z", "phi")
    return ClosedFormKLElbo(sites, num_particles=num_particles, max_plate_nesting=1, fused=fused)


@dataclass
class ProjectedFit:
    """Output of :func:`fit_projected_bnn`."""

    model: ProjectedBNN
    guide: AutoNormal
    losses: list[float]
    fge: FGEResult | None
    projection: ProjectionFit | None
    seconds: dict[str, float]


def _fit_stage3(
    model: ProjectedBNN,
    projection: ProjectionFit | None,
    loss: Trace_ELBO,
    x: Tensor,
    y: Tensor,
    z_init: str | None,
    num_steps: int,
    lr: float,
    batch_size: int | None,
    callback: Callable[[int, float, AutoNormal], None] | None,
    seed: int | None,
    progress: bool,
) -> tuple[AutoNormal, list[float]]:
    """Stage 3 of :func:`fit_projected_bnn`: mean-field VI over ``z`` and ``phi`` from
    :func:`_stage3_guide`'s start, in a parameter-store scope of its own; the guide and the losses."""
    with pyro.get_param_store().scope():
        guide = _stage3_guide(model, projection, z_init, x, y, seed)
        losses = fit_svi(
            model,
            guide,
            x,
            y,
            num_steps=num_steps,
            lr=lr,
            loss=loss,
            batch_size=batch_size,
            seed=seed,
            progress=progress,
            callback=None if callback is None else lambda step, value: callback(step, value, guide),
        )
    return guide, losses


def fit_projected_bnn(
    model: ProjectedBNN,
    x: Tensor,
    y: Tensor,
    *,
    x_valid: Tensor | None = None,
    y_valid: Tensor | None = None,
    variant: str = "full",
    candidates: Tensor | None = None,
    projection: ProjectionFit | None = None,
    weight_prior_scale: float = PAPER_SCALE,
    fge_kwargs: dict[str, Any] | None = None,
    projection_kwargs: dict[str, Any] | None = None,
    num_steps: int = 3000,
    lr: float = 0.01,
    num_particles: int = 20,
    batch_size: int | None = None,
    z_init: str | None = None,
    kl: str = "closed-form",
    fused: bool = True,
    callback: Callable[[int, float, AutoNormal], None] | None = None,
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
        projection: a :func:`fit_projection` result for this model to reuse (stages 1 and 2 are
            skipped; e.g. several stage-3 step sizes on one decoder). Its ``objective`` picks the
            default ``z_init``.
        fge_kwargs, projection_kwargs: options of :func:`~pyro_bnnlv.infer.projection.fge.fge` and
            :func:`fit_projection` (e.g. ``projection_kwargs={"objective": "mmd"}``).
        num_steps, lr, num_particles, batch_size: stage 3's SVI (paper: 20 reparameterisation
            samples).
        z_init: ``q(z)``'s start (:func:`init_projected_guide`); ``None``: ``"prior"`` after a
            generative decoder objective (``projection_kwargs={"objective": "vae"}`` or
            ``"mmd"``), ``"random"`` otherwise.
        kl: stage 3's KL terms of ``z`` and ``phi``: ``"closed-form"`` (the paper, below eq. 6:
            "the KL-divergence terms in Eq. (5) can be computed in closed form";
            :class:`~pyro_bnnlv.infer.elbos.closed_form_kl.ClosedFormKLElbo`) or ``"monte-carlo"``
            (``Trace_ELBO``: ``log p - log q`` at the particles' draws).
        fused: the closed-form steps without Pyro's traces (the same estimator and draws;
            :mod:`~pyro_bnnlv.infer.elbos.closed_form_kl`); ``False``: traced.
        callback: ``callback(step, loss, guide)`` after every step of stage 3 (raise
            ``StopIteration`` to stop, e.g. early stopping on validation data).

    Returns a :class:`ProjectedFit`; sample it with ``pb.sample_posterior(fit.model, fit.guide, x)``.
    """
    if variant not in ("full", "one-stage", "qz-only"):
        raise ValueError(f"variant must be 'full', 'one-stage' or 'qz-only', got {variant!r}")
    loss = _stage3_elbo(model, variant, kl, num_particles, fused)
    if model.num_tasks is not None:
        raise ValueError(
            "fit_projected_bnn is for single-task models (FGE trains one network); for num_tasks=M "
            "use init_projected_guide(model) and fit_svi(..., model_kwargs={'task': task})"
        )
    seconds: dict[str, float] = {}
    fge_result = None
    if projection is not None:
        if variant == "one-stage":
            raise ValueError("projection= gives a trained decoder; variant='one-stage' starts from a random one")
        model.decoder.check_weights(projection.phi, "projection.phi")
    elif variant != "one-stage":
        if candidates is None:
            t0 = time.perf_counter()
            sigma = torch.as_tensor(model.noise_scale).detach()
            bnn = BNN(model.net, prior_scale=weight_prior_scale, noise_scale=sigma)
            fge_result = fge(
                bnn, x, y, x_valid=x_valid, y_valid=y_valid, seed=seed, progress=progress, **(fge_kwargs or {})
            )
            seconds["fge"] = time.perf_counter() - t0
            candidates = fge_result.kept
        t0 = time.perf_counter()
        projection = fit_projection(model, candidates, x, y, seed=seed, progress=progress, **(projection_kwargs or {}))
        seconds["autoencoder"] = time.perf_counter() - t0
    if variant == "qz-only":
        model.fixed_phi = projection.phi.clone()
    t0 = time.perf_counter()
    guide, losses = _fit_stage3(
        model, projection, loss, x, y, z_init, num_steps, lr, batch_size, callback, seed, progress
    )
    seconds["vi"] = time.perf_counter() - t0
    return ProjectedFit(model, guide, losses, fge_result, projection, seconds)
