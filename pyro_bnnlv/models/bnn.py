"""Bayesian neural network regression (and classification) as a Pyro model.

Generative model (Yacoby, Pan & Doshi-Velez 2022, arXiv:1911.00569, sec. 2, "A Bayesian Neural
Network"):

.. math::

    w \\sim \\mathcal N(0, \\operatorname{diag}(s^2)), \\qquad
    y_n \\mid x_n, w \\sim \\mathcal N(f(x_n; w), \\sigma^2 I_L), \\quad n = 1..N,

with all network weights in one flat latent site ``"w"`` (event shape ``(P,)``) and the
observations at site ``"obs"`` inside ``pyro.plate("data", N, subsample_size=batch_size)``.

Shapes. ``x`` is ``(N, D)``; ``y`` is ``(N,)`` for a single-output network (an ``(N, 1)`` column
is read as ``(N,)``) or ``(N, L)``. Under vectorised particles or ``Predictive(parallel=True)``
``w`` has batch shape ``(S, 1)`` and ``"obs"`` batch shape ``(S, N)``, never ``(S, S, N)``.

Classification (``likelihood="categorical"`` or ``"bernoulli"``, :mod:`pyro_bnnlv.models.likelihoods`)
replaces the Gaussian by ``y_n ~ Cat(softmax(f(x_n; w)))`` over ``K = out_features`` classes (or a
Bernoulli on one logit); ``y`` is then ``(N,)`` integer labels and the model has no noise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroParam
from torch import Tensor
from torch.distributions import constraints

from .._checks import POSITIVE_NUMBERS, as_number_tensor, check_real
from ..nets import FlatNet, MLP
from .likelihoods import Likelihood, as_likelihood

__all__ = ["BNN", "as_tensor_args", "check_xy", "fan_in_prior_scale"]


def fan_in_prior_scale(net: FlatNet, omega: float = 4.0, bias_scale: float = 1.0) -> Tensor:
    """Per-weight prior scales ``omega / sqrt(H)`` for weights and ``bias_scale`` for biases.

    Foong, Li, Hernández-Lobato & Turner (2019), "'In-Between' Uncertainty in Bayesian Neural
    Networks", arXiv:1906.11537, App. D: independent ``N(0, 1)`` priors on the biases and
    ``N(0, omega^2 / H)`` on the weights, ``H`` the fan-in of the weight matrix (the scaling under
    which the GP limit exists), with ``omega = 4``.

    ``net``: an :class:`~pyro_bnnlv.nets.MLP`, or a :class:`~pyro_bnnlv.nets.ModuleNet` whose
    parameters all belong to ``nn.Linear`` / ``nn.Conv*`` layers (their fan-ins are read from the
    layers; a ``ValueError`` names any other parameter).
    """
    omega = check_real(omega, "omega", positive=True)
    bias_scale = check_real(bias_scale, "bias_scale", positive=True)
    if not (hasattr(net, "layer_fan_in") and hasattr(net, "bias_mask")):
        raise TypeError(
            f"fan_in_prior_scale needs a network that knows its layers' fan-ins (pyro_bnnlv.MLP or "
            f"ModuleNet); got {type(net).__name__}"
        )
    fan_in = net.layer_fan_in()
    scale = torch.full((net.num_weights,), float(bias_scale))
    weights = ~net.bias_mask()
    scale[weights] = omega / fan_in[weights].sqrt()
    return scale


def _positive_tensor(value: Any, name: str, shape: tuple[int, ...] | None = None) -> Tensor:
    """``value`` (a number, NumPy scalar or array, or tensor) as a tensor of the default dtype;
    strings, bools and other non-numbers are refused naming ``name``, as are NaN, infinite and
    non-positive entries."""
    t = as_number_tensor(value, name, torch.get_default_dtype(), POSITIVE_NUMBERS).clone()
    if not torch.isfinite(t).all() or (t <= 0).any():
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    if shape is not None and t.dim() > 0 and t.shape != shape:
        raise ValueError(f"{name} must be a scalar or have shape {shape}, got {tuple(t.shape)}")
    return t


def as_tensor_args(x: Any, w: Any, dtype: torch.dtype) -> tuple[Any, Tensor]:
    """``x`` and ``w`` of a model's ``f`` as tensors: a NumPy array becomes a tensor of the other
    argument's dtype when that one is a floating tensor, else of ``dtype`` (the model's); a
    tensor (or ``None`` for ``x``) is returned as is; anything else is a ``TypeError`` naming
    the argument."""

    def convert(value: Any, name: str, other: Any) -> Any:
        if isinstance(value, np.ndarray):
            like = other.dtype if isinstance(other, Tensor) and other.is_floating_point() else dtype
            return torch.as_tensor(value, dtype=like)
        if isinstance(value, Tensor) or (value is None and name == "x"):
            return value
        raise TypeError(f"{name} must be a torch.Tensor or a NumPy array, got {type(value).__name__}")

    return convert(x, "x", w), convert(w, "w", x)


def check_xy(
    x: Tensor, y: Tensor | None, in_features: int, out_features: int, likelihood: Likelihood | None = None
) -> None:
    """Validate data: finite ``x (N, in_features)``; for regression ``y (N, out_features)``, or
    ``(N,)`` when ``out_features`` is 1; for a classification ``likelihood`` the labels it takes
    (:meth:`~pyro_bnnlv.models.likelihoods.Likelihood.check_targets`); ``ValueError`` naming the
    argument otherwise."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != in_features:
        raise ValueError(f"x must have shape (N, {in_features}) (in_features={in_features}); got {tuple(x.shape)}")
    if x.shape[0] == 0:
        raise ValueError("x has 0 rows: the data must have at least one point")
    if not torch.isfinite(x).all():
        raise ValueError("x contains NaN or infinite values")
    if y is None:
        return
    if not isinstance(y, Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if y.dim() == 0 or y.shape[0] != x.shape[0]:
        rows = "a 0-d tensor" if y.dim() == 0 else y.shape[0]
        raise ValueError(f"x and y have different numbers of rows: {x.shape[0]} vs {rows}")
    if likelihood is not None and likelihood.classification:
        likelihood.check_targets(y, out_features)
        return
    L = out_features
    N = x.shape[0]
    if y.shape != (N, L) and (L != 1 or y.shape != (N,)):
        expected = f"({N},) or ({N}, 1)" if L == 1 else f"({N}, {L})"
        raise ValueError(f"y must have shape {expected} for out_features={L}; got {tuple(y.shape)}")
    if not torch.isfinite(y).all():
        raise ValueError("y contains NaN or infinite values")


class BNN(PyroModule):
    """Bayesian neural network ``y = f(x; w) + eps`` with a flat weight site ``"w"``.

    Args:
        net: a :class:`~pyro_bnnlv.nets.FlatNet` (e.g. :class:`~pyro_bnnlv.nets.MLP`).
        prior_scale: standard deviation of the zero-mean Gaussian prior on ``w``: a positive
            scalar, a per-weight tensor of shape ``(P,)``, or
            :func:`fan_in_prior_scale` ``(net, omega)`` for the ``N(0, omega^2/H)`` prior.
        noise_scale: observation noise standard deviation ``sigma`` (positive; default 0.1).
            Gaussian likelihood only.
        learn_noise: if ``True``, ``sigma`` is a positive :class:`~pyro.nn.PyroParam` initialised at
            ``noise_scale`` and learned by SVI (type-II maximum likelihood); otherwise fixed.
        likelihood: ``"gaussian"`` (regression, default), ``"categorical"`` (``K = out_features``
            logits, integer labels ``0..K-1``) or ``"bernoulli"`` (one logit, labels 0/1); or a
            :class:`~pyro_bnnlv.models.likelihoods.Likelihood`.

    Call as ``model(x, y=None, batch_size=None)``. Without ``y`` the model samples ``"obs"``
    (prior or posterior predictive, depending on the guide it is replayed against).
    ``batch_size`` subsamples the data plate (minibatch SVI; the likelihood is rescaled by
    ``N / batch_size`` by Pyro).
    """

    def __init__(
        self,
        net: FlatNet,
        prior_scale: float | Tensor = 1.0,
        noise_scale: float | Tensor | None = None,
        learn_noise: bool = False,
        likelihood: str | Likelihood = "gaussian",
    ) -> None:
        super().__init__()
        if not isinstance(net, FlatNet):
            raise TypeError(f"net must be a pyro_bnnlv FlatNet, got {type(net).__name__}")
        self.net = net
        self.likelihood = as_likelihood(likelihood)
        self.likelihood.check_outputs(net.out_features)
        P = net.num_weights
        scale = _positive_tensor(prior_scale, "prior_scale", (P,)).expand(P).clone()
        self.register_buffer("prior_loc", torch.zeros(P))
        self.register_buffer("prior_scale", scale)
        if self.likelihood.classification:
            if noise_scale is not None or learn_noise:
                raise ValueError(
                    f"the {self.likelihood.name} likelihood has no observation noise: leave out "
                    f"noise_scale and learn_noise"
                )
            self.learn_noise = False
            return
        if noise_scale is None:
            noise_scale = 0.1
        sigma = _positive_tensor(noise_scale, "noise_scale")
        if sigma.dim() != 0:
            raise ValueError(f"noise_scale must be a scalar, got shape {tuple(sigma.shape)}")
        self.learn_noise = bool(learn_noise)
        if self.learn_noise:
            self.noise_scale = PyroParam(sigma, constraint=constraints.positive)
        else:
            # a buffer named like the property below (register_buffer would refuse the name)
            self._buffers["noise_scale"] = sigma

    @property
    def noise_scale(self) -> Tensor:
        """The observation noise ``sigma`` as a 0-d tensor without gradient history, to read
        (``float(model.noise_scale)``) or pass on. With ``learn_noise=True`` it is the current value
        of the learned :class:`~pyro.nn.PyroParam` (Pyro's parameter ``"noise_scale"``, in the
        active param store); the model's own likelihood uses the live, differentiable parameter
        (:meth:`noise_scale_param`). Assigning a ``PyroParam`` replaces the learned parameter."""
        return self.noise_scale_param().detach()

    def noise_scale_param(self) -> Tensor:
        """``sigma`` as the model uses it: the differentiable learned parameter with
        ``learn_noise=True`` (a ``pyro.param`` statement inside a trace), else the fixed buffer."""
        if "noise_scale" in self.__dict__.get("_pyro_params", {}):
            return PyroModule.__getattr__(self, "noise_scale")
        buffers = self.__dict__.get("_buffers", {})
        if "noise_scale" in buffers:
            return buffers["noise_scale"]
        if getattr(self, "likelihood", None) is not None and self.likelihood.classification:
            raise AttributeError(
                f"a {self.likelihood.name} {type(self).__name__} has no noise_scale (no observation noise)"
            )
        raise AttributeError(f"{type(self).__name__} has no noise_scale yet")

    def extra_repr(self) -> str:
        scale = self.prior_scale
        if bool((scale == scale.reshape(-1)[0]).all()):
            prior = f"prior_scale={float(scale.reshape(-1)[0]):.4g} (shared by all {scale.numel()} weights)"
        else:
            prior = f"prior_scale=per-weight in [{float(scale.min()):.4g}, {float(scale.max()):.4g}]"
        if self.likelihood.classification:
            return f"{prior}, likelihood={self.likelihood.name!r}"
        noise = "learned" if self.learn_noise else "fixed"
        return f"{prior}, noise_scale={float(self.noise_scale):.4g} ({noise})"

    @property
    def num_weights(self) -> int:
        return self.net.num_weights

    def f(self, x: Tensor | np.ndarray, w: Tensor | np.ndarray) -> Tensor:
        """Network output ``f(x; w)``: ``w (*B, P)`` -> ``(*B, N, L)`` (see :class:`FlatNet`).

        NumPy arrays are converted (see :func:`as_tensor_args`)."""
        x, w = as_tensor_args(x, w, self.prior_loc.dtype)
        return self.net(x, w)

    def check_data(self, x: Tensor, y: Tensor | None = None) -> None:
        """Raise ``ValueError`` for inputs the model cannot take (see :func:`check_xy`)."""
        check_xy(x, y, self.net.in_features, self.net.out_features, self.likelihood)

    def _check_dtype(self, x: Tensor) -> None:
        """The model's forward needs ``x`` in the dtype of its buffers (tools such as
        :class:`~pyro_bnnlv.infer.LinearizedLaplace` that convert the data themselves do not)."""
        if x.dtype != self.prior_loc.dtype:
            to_model = f"x.to({self.prior_loc.dtype})"
            method = {torch.float32: "model.float()", torch.float64: "model.double()"}.get(x.dtype)
            if method is None:  # integer or half x: only converting the data makes sense
                fix = f"convert the data ({to_model})"
            else:
                fix = f"convert the data ({to_model}) or the model (model.to({x.dtype}), e.g. {method})"
            raise ValueError(
                f"x has dtype {x.dtype} but {type(self).__name__}'s buffers are {self.prior_loc.dtype}: {fix}"
            )

    def predictive_components(
        self, x: Tensor, samples: dict[str, Tensor], generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Mixture components of the posterior predictive at ``x``: ``loc (S, N, L)`` and the noise scale
        (for a classifier: the logits ``(S, N, K)`` and ``None``).

        ``samples["w"]`` is ``(S, P)``; used by :func:`pyro_bnnlv.evaluate`.
        """
        self._check_dtype(x)
        f = self.net.forward_in_blocks(*as_tensor_args(x, samples["w"], self.prior_loc.dtype))  # self.f's values
        if self.likelihood.classification:
            return f, None
        return f, torch.as_tensor(self.noise_scale).detach()

    def _plate_f(self, x: Tensor, w: Tensor) -> Tensor:
        """``f`` for a ``w`` sampled inside the model, aligned with the data plate at dim -1.

        ``w`` is global, so its batch dim -1 can only be the data plate's singleton (batch shape
        ``(*S, 1)``: vectorised particles, ``vectorize``) or a sample dim (batch shape ``(S,)``:
        ``Predictive(parallel=True)`` replays guide samples that way). A trailing singleton is
        dropped; the remaining batch dims are sample dims and ``f`` comes out ``(*S, N, L)``, so
        ``"obs"`` gets batch shape ``(*S, N)``, never ``(*S, S, N)``.
        """
        if w.dim() > 1:  # squeeze(-2) drops dim -2 only if it is 1: no branch on a (traced) size
            w = w.squeeze(-2)
        return self.net(x, w)

    def _observed(self, y: Tensor | None) -> Tensor | None:
        """Targets in the shape of ``"obs"``: a single-output ``(N, 1)`` column becomes ``(N,)``;
        class labels as the classification likelihood's distribution takes them."""
        if self.likelihood.name == "bernoulli":  # 0/1 labels as the model's floats
            return self.likelihood.observed(y, self.net.out_features, dtype=self.prior_loc.dtype)
        return self.likelihood.observed(y, self.net.out_features)

    def _likelihood(self, f: Tensor) -> dist.Distribution:
        if self.likelihood.classification:
            return self.likelihood.distribution(f)
        sigma = self.noise_scale_param()  # the Gaussian, branching on the int out_features (trace-safe)
        if self.net.out_features == 1:
            return dist.Normal(f.squeeze(-1), sigma)
        return dist.Normal(f, sigma).to_event(1)

    def forward(self, x: Tensor, y: Tensor | None = None, batch_size: int | None = None) -> Tensor:
        if not torch.jit.is_tracing():  # under the JIT the checks would be frozen constants
            self.check_data(x, y)
            self._check_dtype(x)
        y = self._observed(y)
        w = pyro.sample("w", dist.Normal(self.prior_loc.clone(), self.prior_scale.clone()).to_event(1))
        with pyro.plate("data", x.shape[0], subsample_size=batch_size) as idx:
            if batch_size is None:
                x_b, y_b = x, y
            else:
                x_b, y_b = x[idx], (None if y is None else y[idx])
            f = self._plate_f(x_b, w)
            return pyro.sample("obs", self._likelihood(f), obs=y_b)

    def closed_form_priors(self, dtype: torch.dtype) -> dict[str, dist.Normal] | None:
        """The latent sites of :meth:`forward` and their priors, for
        :class:`~pyro_bnnlv.infer.elbos.closed_form_kl.ClosedFormKLElbo`'s fused steps: ``{"w":
        Normal(prior_loc, prior_scale)}`` (independent coordinates); ``None`` for a subclass
        with its own ``forward``, which these may not describe."""
        if type(self).forward is not BNN.forward:
            return None
        return {"w": dist.Normal(self.prior_loc.to(dtype), self.prior_scale.to(dtype))}

    def weights_from_latents(self, values: dict[str, Tensor]) -> Tensor:
        """The network weights ``w`` given draws ``(S, ...)`` of :meth:`closed_form_priors`' sites."""
        return values["w"]

    def config(self) -> dict:
        """Constructor settings besides the state dict (see :mod:`pyro_bnnlv.serialization`)."""
        if not isinstance(self.net, MLP):
            raise NotImplementedError(
                "saving a BNN needs an MLP network; for a ModuleNet save the state dicts yourself"
            )
        if self.likelihood.classification:
            return dict(net=self.net.config(), learn_noise=False, likelihood=self.likelihood.name)
        return dict(net=self.net.config(), learn_noise=self.learn_noise)

    @classmethod
    def from_config(cls, config: dict) -> "BNN":
        """Rebuild an (untrained) model from :meth:`config`; then load its state dict."""
        likelihood = config.get("likelihood", "gaussian")
        if likelihood != "gaussian":
            return cls(MLP(**config["net"]), likelihood=likelihood)
        return cls(MLP(**config["net"]), learn_noise=config["learn_noise"])
