r"""Projected BNN (Proj-BNN): network weights generated from a low-dimensional latent code.

Reference: Pradier, Pan, Yao, Ghosh & Doshi-Velez (2018), arXiv:1811.07006 (Proj-BNN), sec. 4.1,
eq. 3, and the multi-task variant of App. B, eq. 8-9:

.. math::

    z \sim \mathcal N(0, \sigma_z^2 I_{D_z}), \quad \phi \sim \mathcal N(0, \sigma_\phi^2 I),
    \quad w = g_\phi(z), \quad y_n \sim \mathcal N(f_w(x_n), \sigma_y^2).

Multi-task (``num_tasks = M``): one code ``z_m`` per task in a ``"tasks"`` plate, a shared
``phi``, ``w_m = g_phi(z_m)``, and observation ``n`` of task ``t_n`` uses ``w_{t_n}``.

Sites: ``"z"`` (``(D_z,)``, or ``(M, D_z)``), ``"phi"`` (the decoder's flat parameters; absent
when ``phi`` is fixed, the ``q(z)``-only ablation), ``"w"`` (a ``pyro.deterministic`` site:
``(P,)`` or ``(M, P)``), ``"obs"`` in the ``"data"`` plate. Because ``"w"`` is recorded,
:func:`~pyro_bnnlv.sample_posterior`, :func:`~pyro_bnnlv.evaluate` and
:func:`~pyro_bnnlv.to_inference_data` treat a Proj-BNN like any BNN.

The decoder ``g_phi`` is an :class:`~pyro_bnnlv.nets.MLP` (``D_z -> hidden -> P``; RBF
activation and one layer of 20 units by default, sec. 5.2 and App. A) with flat parameters
``phi``. ``decoder_hidden=[]`` with ``"identity"`` activation is the linear projection of Fig. 3.

Priors default to the paper's ``N(0, 0.1)`` (sec. 5.2), read as variance 0.1 (standard deviation
``0.1 ** 0.5``) for ``z`` and ``phi``; the observation noise defaults to 0.1 (sec. 5.2 fixes
``sigma_y = 0.1`` on standardised data).
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor

from ..nets import MLP, FlatNet, as_hidden_sizes, as_positive_int
from .bnn import BNN, _positive_tensor, check_xy

__all__ = ["ProjectedBNN"]

PAPER_SCALE = math.sqrt(0.1)


class ProjectedBNN(BNN):
    """Proj-BNN (eq. 3; eq. 8-9 with ``num_tasks``): ``w = g_phi(z)``.

    Args:
        net: the predictor network (a :class:`~pyro_bnnlv.nets.FlatNet` with ``P`` weights).
        latent_dim: ``D_z``.
        decoder_hidden: hidden widths of the decoder (paper: ``[20]`` or ``[10, 10]``).
        decoder_activation: decoder activation (paper: ``"rbf"``).
        latent_scale, phi_scale: prior standard deviations of ``z`` and ``phi``.
        noise_scale, learn_noise: observation noise, as for :class:`~pyro_bnnlv.models.bnn.BNN`.
        num_tasks: ``M`` for the multi-task model (``None``: one code).
        fixed_phi: a decoder parameter vector to hold fixed (``q(z)``-only ablation): ``phi``
            is then not a latent site.
    """

    def __init__(
        self,
        net: FlatNet,
        latent_dim: int = 2,
        decoder_hidden: list[int] | tuple[int, ...] = (20,),
        decoder_activation: str = "rbf",
        latent_scale: float = PAPER_SCALE,
        phi_scale: float = PAPER_SCALE,
        noise_scale: float | Tensor = 0.1,
        learn_noise: bool = False,
        num_tasks: int | None = None,
        fixed_phi: Tensor | None = None,
    ) -> None:
        super().__init__(net, prior_scale=1.0, noise_scale=noise_scale, learn_noise=learn_noise)
        latent_dim = as_positive_int(latent_dim, "latent_dim")
        if num_tasks is not None:
            num_tasks = as_positive_int(num_tasks, "num_tasks", " or None")
        self.latent_dim = latent_dim
        self.num_tasks = num_tasks
        decoder_hidden = as_hidden_sizes(decoder_hidden, "decoder_hidden")
        self.decoder = MLP(latent_dim, list(decoder_hidden), net.num_weights, activation=decoder_activation)
        self.register_buffer("latent_scale", _positive_tensor(latent_scale, "latent_scale"))
        self.register_buffer("phi_scale", _positive_tensor(phi_scale, "phi_scale"))
        if fixed_phi is not None:
            self.decoder.check_weights(fixed_phi, "fixed_phi")
            fixed_phi = fixed_phi.detach().clone()
        self.register_buffer("fixed_phi", fixed_phi)

    @property
    def num_phi(self) -> int:
        """Number of decoder parameters (the dimension of ``phi``)."""
        return self.decoder.num_weights

    def project(self, z: Tensor, phi: Tensor) -> Tensor:
        """``w = g_phi(z)``: ``z (*B, D_z)`` and ``phi (*B, P_phi)`` (broadcast) -> ``(*B, P)``."""
        batch = torch.broadcast_shapes(z.shape[:-1], phi.shape[:-1])
        z = z.expand(*batch, z.shape[-1])
        if phi.shape[:-1].numel() == 1:
            # one decoder for every z (the decoder stage; a point estimate of phi): one matrix
            # product per layer instead of a copy of phi per z
            return self.decoder(z.unsqueeze(-2), phi.reshape(phi.shape[-1])).squeeze(-2)
        phi = phi.expand(*batch, phi.shape[-1])
        return self.decoder(z.unsqueeze(-2), phi).squeeze(-2)

    def check_data(self, x: Tensor, y: Tensor | None = None, task: Tensor | None = None) -> None:
        check_xy(x, y, self.net.in_features, self.net.out_features)
        if self.num_tasks is None:
            if task is not None:
                raise ValueError("task is only for a multi-task ProjectedBNN (num_tasks=M)")
            return
        if task is None:
            raise ValueError("a multi-task ProjectedBNN needs task=(N,) task indices")
        if task.shape != (x.shape[0],) or task.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"task must be an integer tensor of shape ({x.shape[0]},)")
        if task.min() < 0 or task.max() >= self.num_tasks:
            raise ValueError(f"task indices must lie in [0, {self.num_tasks})")

    def forward(
        self, x: Tensor, y: Tensor | None = None, batch_size: int | None = None, task: Tensor | None = None
    ) -> Tensor:
        if not torch.jit.is_tracing():
            self.check_data(x, y, task)
            self._check_dtype(x)
        y = self._observed(y)
        K = self.latent_dim
        if self.fixed_phi is None:
            phi_prior = dist.Normal(torch.zeros(self.num_phi, dtype=x.dtype), self.phi_scale)
            phi = pyro.sample("phi", phi_prior.to_event(1))
        else:
            phi = self.fixed_phi
        z_prior = dist.Normal(torch.zeros(K, dtype=x.dtype), self.latent_scale).to_event(1)
        if self.num_tasks is None:
            z = pyro.sample("z", z_prior)
            w = pyro.deterministic("w", self.project(z, phi), event_dim=1)
        else:
            with pyro.plate("tasks", self.num_tasks, dim=-1):
                z = pyro.sample("z", z_prior)
                w = pyro.deterministic("w", self.project(z, phi), event_dim=1)
        with pyro.plate("data", x.shape[0], subsample_size=batch_size) as idx:
            x_b = x if batch_size is None else x[idx]
            y_b = y if (batch_size is None or y is None) else y[idx]
            if self.num_tasks is None:
                f = self._plate_f(x_b, w)
            else:
                t_b = task if batch_size is None else task[idx]
                w_n = w[..., t_b, :]  # (*S, B, P)
                f = self.net(x_b.unsqueeze(-2), w_n).squeeze(-2)  # (*S, B, L)
            return pyro.sample("obs", self._likelihood(f), obs=y_b)

    def closed_form_priors(self, dtype: torch.dtype) -> dict[str, dist.Normal] | None:
        """The latent sites of :meth:`forward` and their priors (``phi`` unless fixed, ``z``), for
        :class:`~pyro_bnnlv.infer.elbos.closed_form_kl.ClosedFormKLElbo`'s fused steps; ``None`` for
        the multi-task model (``z`` in a plate) and for a subclass with its own ``forward``."""
        if type(self).forward is not ProjectedBNN.forward or self.num_tasks is not None:
            return None
        priors = {}
        if self.fixed_phi is None:
            priors["phi"] = dist.Normal(torch.zeros(self.num_phi, dtype=dtype), self.phi_scale)
        priors["z"] = dist.Normal(torch.zeros(self.latent_dim, dtype=dtype), self.latent_scale)
        return priors

    def weights_from_latents(self, values: dict[str, Tensor]) -> Tensor:
        """``w = g_phi(z)`` for draws ``z (S, D_z)`` and ``phi (S, P_phi)`` (or the fixed ``phi``)."""
        return self.project(values["z"], values["phi"] if self.fixed_phi is None else self.fixed_phi)

    def config(self) -> dict:
        """Constructor settings besides the state dict (see :mod:`pyro_bnnlv.serialization`).

        The scales and ``fixed_phi`` are buffers, restored by ``load_state_dict``."""
        if not isinstance(self.net, MLP):
            raise NotImplementedError(
                "saving a ProjectedBNN needs an MLP network; for a ModuleNet save the state dicts yourself"
            )
        return dict(
            net=self.net.config(),
            latent_dim=self.latent_dim,
            decoder_hidden=list(self.decoder.hidden_sizes),
            decoder_activation=self.decoder.activation,
            learn_noise=self.learn_noise,
            num_tasks=self.num_tasks,
            fixed_phi=self.fixed_phi is not None,
        )

    @classmethod
    def from_config(cls, config: dict) -> "ProjectedBNN":
        """Rebuild an (untrained) model from :meth:`config`; then load its state dict."""
        cfg = dict(config)
        net = MLP(**cfg.pop("net"))
        model = cls(net, **{k: v for k, v in cfg.items() if k != "fixed_phi"})
        if cfg["fixed_phi"]:  # a placeholder of the right shape; load_state_dict fills it
            model.fixed_phi = torch.zeros(model.num_phi)
        return model
