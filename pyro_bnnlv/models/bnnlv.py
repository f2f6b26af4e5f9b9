"""Bayesian neural network with per-datapoint latent inputs (BNN+LV).

Generative model (Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569, eq. 1-2; Depeweg et al. 2018):

.. math::

    w \\sim \\mathcal N(0, \\operatorname{diag}(s^2)), \\quad
    z_n \\sim \\mathcal N(0, \\sigma_z^2 I_K), \\quad
    y_n = f([x_n, z_n]; w) + \\epsilon_n, \\ \\epsilon_n \\sim \\mathcal N(0, \\sigma^2 I_L).

Sites: ``"w"`` (flat weights), ``"z"`` (``(N, K)``, inside the ``"data"`` plate, subsampled
with the observations), ``"obs"``. The network's input is the concatenation ``[x, z]``, so the
network has ``in_features = D + K``.

Prediction (eq. 3): for a *new* input the latent is drawn from the prior, never taken from the
training points' variational posteriors: ``p(y*|x*) = E_{q(w)} E_{p(z*)} N(y*; f([x*, z*]; w),
sigma^2)``, as :meth:`BNNLV.predictive_components` and :func:`pyro_bnnlv.evaluate` compute it.
``pyro.infer.Predictive(model, guide)`` replays the guide's training ``z``: right for
reconstructing the *training* targets (eq. 33), not for test inputs.

Mean-field VI over ``w`` and ``z`` (eq. 4-5) is ``AutoNormal(model,
create_plates=model.create_plates)``; ``create_plates`` makes the guide subsample ``z`` together
with the model's data plate, so minibatch SVI touches only the batch's latents.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor
from torch.quasirandom import SobolEngine

from ..nets import MLP, FlatNet, as_positive_int
from .bnn import BNN, _positive_tensor, check_xy
from .potential import FlatPotential, mlp_of, mlp_regression_potential

__all__ = ["BNNLV"]


class BNNLV(BNN):
    """BNN+LV: ``y = f([x, z]; w) + eps`` with ``z ~ N(0, latent_scale^2 I_K)`` per data point.

    Args:
        net: a :class:`~pyro_bnnlv.nets.FlatNet` with ``in_features = D + latent_dim``.
        latent_dim: ``K``, the dimension of each latent input ``z_n``.
        latent_scale: prior standard deviation ``sigma_z`` of ``z``.
        prior_scale, noise_scale, learn_noise: as for :class:`~pyro_bnnlv.models.bnn.BNN`.
    """

    def __init__(
        self,
        net: FlatNet,
        latent_dim: int = 1,
        latent_scale: float = 1.0,
        prior_scale: float | Tensor = 1.0,
        noise_scale: float | Tensor = 0.1,
        learn_noise: bool = False,
    ) -> None:
        super().__init__(net, prior_scale=prior_scale, noise_scale=noise_scale, learn_noise=learn_noise)
        latent_dim = as_positive_int(latent_dim, "latent_dim")
        if net.in_features <= latent_dim:
            raise ValueError(
                f"net.in_features={net.in_features} must exceed latent_dim={latent_dim}: the "
                "network takes the concatenation [x, z]"
            )
        self.latent_dim = latent_dim
        scale = _positive_tensor(latent_scale, "latent_scale")
        if scale.dim() != 0:
            raise ValueError(f"latent_scale must be a scalar, got shape {tuple(scale.shape)}")
        self.register_buffer("latent_scale", scale)

    @property
    def input_dim(self) -> int:
        """``D``: the width of the observed inputs ``x``."""
        return self.net.in_features - self.latent_dim

    def check_data(self, x: Tensor, y: Tensor | None = None) -> None:
        """``x`` must be ``(N, D)`` with ``D = net.in_features - latent_dim``; ``y`` as for BNN."""
        check_xy(x, y, self.input_dim, self.net.out_features)

    def create_plates(self, x: Tensor, y: Tensor | None = None, batch_size: int | None = None):
        """The data plate, for ``AutoNormal(model, create_plates=model.create_plates)``."""
        return pyro.plate("data", x.shape[0], subsample_size=batch_size)

    def latent_weight_mask(self) -> Tensor:
        """Boolean mask of the first-layer weights that multiply the latent inputs ``z``."""
        if not isinstance(self.net, MLP):
            raise NotImplementedError("latent_weight_mask needs an MLP network")
        mask = torch.zeros(self.net.num_weights, dtype=torch.bool)
        fan_in, fan_out, w_sl, _ = self.net.layers[0]
        first = mask[w_sl].view(fan_out, fan_in)
        first[:, self.input_dim :] = True
        mask[w_sl] = first.reshape(-1)
        return mask

    def network_input(self, x: Tensor, z: Tensor) -> Tensor:
        """``[x, z]`` with ``x`` broadcast over the batch dims of ``z`` (``(*S, N, K)``)."""
        return torch.cat([x.expand(*z.shape[:-1], x.shape[-1]), z], dim=-1)

    def predictive_components(
        self, x: Tensor, samples: dict[str, Tensor], generator: torch.Generator | None = None, latent_draws: int = 1
    ) -> tuple[Tensor, Tensor]:
        r"""Posterior-predictive mixture components at new inputs (eq. 3, eq. 34).

        The predictive density integrates the latent input over its prior,
        :math:`p(y \mid x) = \mathbb E_{q(w)} \int \mathcal N(y; f([x, z]; w), \sigma^2)\,
        \mathcal N(z; 0, \sigma_z^2 I)\, dz` (Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569,
        eq. 34), independently of the training latents.

        Args:
            latent_draws: ``M`` latents ``z*`` per weight sample and input: a randomly shifted
                quasi-random set, the first ``M`` points ``v_m`` of the (unscrambled) Sobol
                sequence in ``[0, 1)^K`` shifted by one uniform ``U_{s,n}`` modulo 1 and mapped
                through the normal quantile function, ``z*_{s,n,m} = sigma_z Phi^{-1}((v_m +
                U_{s,n}) mod 1)`` (a Cranley-Patterson rotation; for ``K = 1`` and ``M`` a power
                of 2 a systematic sample of ``M`` equally spaced prior quantiles). ``M = 1``
                (``v_1 = 0``) is one i.i.d. draw ``z* ~ p(z)`` per weight sample and input. The
                uniforms are drawn input by input (the first inputs' draws do not depend on how
                many follow). Each point is marginally ``N(0, sigma_z^2 I)``, so the mixture's
                density stays an unbiased estimate of the ``z`` integral, with far less variance
                than ``M`` independent draws where ``f`` is steep in ``z``. Rows ``s * M ..
                s * M + M - 1`` of ``loc`` ``(S * M, N, L)`` belong to weight sample ``s``.
        """
        self._check_dtype(x)
        M = as_positive_int(latent_draws, "latent_draws")
        w = samples["w"]
        S, N, K = w.shape[0], x.shape[0], self.latent_dim
        scale = torch.as_tensor(self.noise_scale).detach()
        base = SobolEngine(K, scramble=False).draw(M, dtype=x.dtype)  # (M, K); its first point is 0
        # one uniform shift per input and weight sample, drawn input-major: the draws of the
        # first n inputs do not depend on how many follow (evaluate's chunks give the same numbers)
        shift = torch.rand(N, S, K, generator=generator, dtype=x.dtype).permute(1, 0, 2)  # (S, N, K)
        u = torch.remainder(base[None, :, None, :] + shift[:, None], 1.0)  # (S, M, N, K)
        tiny = torch.finfo(x.dtype).eps
        z = torch.special.ndtri(u.clamp(tiny, 1.0 - tiny)) * self.latent_scale
        # the M draws ride along the data axis (no copies of the weights): (S, M * N, D + K)
        xm = x.unsqueeze(0).expand(M, *x.shape).reshape(M * N, x.shape[-1])
        loc = self.net.forward_in_blocks(self.network_input(xm, z.reshape(S, M * N, K)), w)  # (S, M * N, L)
        return loc.reshape(S * M, N, loc.shape[-1]), scale

    def reconstruction_components(self, x: Tensor, samples: dict[str, Tensor]) -> Tensor:
        """``f([x_n, z_n]; w)`` with the *posterior* latents of the training points: ``(S, N, L)``.

        ``samples["z"]`` is ``(S, N, K)`` (from :func:`pyro_bnnlv.sample_posterior` with
        ``sites=("w", "z")``); used for the reconstruction MSE (eq. 33).
        """
        if "z" not in samples:
            raise ValueError(
                "samples has no 'z': draw it with pb.sample_posterior(model, guide, x, y, sites=('w', 'z'))"
            )
        w, z = samples["w"], samples["z"]
        expected = (w.shape[0], x.shape[0], self.latent_dim)
        if w.dim() != 2 or tuple(z.shape) != expected:
            raise ValueError(
                f"samples['z'] must have shape (S, N, K) = {expected} for samples['w'] of shape "
                f"(S, P) and x of N = {x.shape[0]} rows; got z {tuple(z.shape)}, w {tuple(w.shape)}"
            )
        return self.net(self.network_input(x, z), w)

    def forward(self, x: Tensor, y: Tensor | None = None, batch_size: int | None = None) -> Tensor:
        if not torch.jit.is_tracing():
            self.check_data(x, y)
            self._check_dtype(x)
        y = self._observed(y)
        w = pyro.sample("w", dist.Normal(self.prior_loc.clone(), self.prior_scale.clone()).to_event(1))
        z_prior = dist.Normal(torch.zeros(self.latent_dim, dtype=x.dtype), self.latent_scale)
        with pyro.plate("data", x.shape[0], subsample_size=batch_size) as idx:
            if batch_size is None:
                x_b, y_b = x, y
            else:
                x_b, y_b = x[idx], (None if y is None else y[idx])
            z = pyro.sample("z", z_prior.to_event(1))
            f = self._plate_f(self.network_input(x_b, z), w)
            return pyro.sample("obs", self._likelihood(f), obs=y_b)

    def nuts_potential(self, x: Tensor, y: Tensor):
        """The fast NUTS potential over ``w`` and every ``z_n`` (no Pyro tracing per leapfrog step).

        ``U(w, z) = -log p(y | x, z, w) - log p(w) - log p(z)`` with all constants, on the
        flat vector ``[w, z]`` (:class:`~pyro_bnnlv.models.potential.FlatPotential`). An
        :class:`~pyro_bnnlv.nets.MLP` (or a :class:`~pyro_bnnlv.nets.ModuleNet` with an
        :func:`~pyro_bnnlv.nets.equivalent_mlp`) gets the hand-written gradient of
        :func:`~pyro_bnnlv.models.potential.mlp_regression_potential`; any other network goes through
        autograd on ``self.net``. :func:`~pyro_bnnlv.infer.mcmc.nuts.run_nuts` checks it against
        Pyro's traced potential before sampling.
        """
        self.check_data(x, y)
        sigma = torch.as_tensor(self.noise_scale).detach()
        mlp = mlp_of(self.net)  # an MLP, or a ModuleNet's equivalent MLP (same weights)
        if mlp is not None:
            return mlp_regression_potential(
                mlp,
                x,
                y,
                prior_loc=self.prior_loc,
                prior_scale=self.prior_scale,
                noise_scale=sigma,
                latent_dim=self.latent_dim,
                latent_scale=self.latent_scale,
            )
        N, K = x.shape[0], self.latent_dim
        loc, scale = self.prior_loc.detach(), self.prior_scale.detach()
        zscale = self.latent_scale.detach()
        normal = torch.distributions.Normal

        def log_density(p: dict[str, Tensor]) -> Tensor:
            w, z = p["w"], p["z"]
            f = self.net(self.network_input(x, z), w).reshape(N, -1)
            return (
                normal(f, sigma).log_prob(y.reshape(N, -1)).sum()
                + normal(loc, scale).log_prob(w).sum()
                + normal(0.0, zscale).log_prob(z).sum()
            )

        return FlatPotential.from_log_density({"w": (self.net.num_weights,), "z": (N, K)}, log_density)

    def config(self) -> dict:
        return dict(super().config(), latent_dim=self.latent_dim)

    @classmethod
    def from_config(cls, config: dict) -> "BNNLV":
        return cls(MLP(**config["net"]), latent_dim=config["latent_dim"], learn_noise=config["learn_noise"])
