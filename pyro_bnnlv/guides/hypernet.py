r"""The implicit hypernetwork guide of NN-HyVI and FuNN-HyVI.

Reference: Pequignot et al. (2020), "Implicit variational inference: the parameter and the predictor
space", sec. 3.2 and 4.3. A generative network ("hypernet") ``h_lambda`` maps Gaussian noise to
network weights,

.. math::

    \epsilon \sim \mathcal N(0, I_l), \qquad \theta = h_\lambda(\epsilon) \in \mathbb R^P,

with, by default, ``l = 5`` and two ReLU hidden layers of 20 and 40 units (sec. 4.3). The
distribution of ``theta`` is *implicit*: it can be sampled and differentiated through, but it
has no tractable density (for ``P > l`` not even absolutely continuous). So the guide records
``"w"`` with :class:`ImplicitSample`, whose ``log_prob`` raises a ``NotImplementedError`` naming
the ELBOs to use (``Trace_ELBO`` stops instead of treating ``log q(w)`` as 0): train it with
:class:`~pyro_bnnlv.infer.KNNElbo` (NN-HyVI, eq. 8) or :class:`~pyro_bnnlv.infer.FunctionalKNNElbo`
(FuNN-HyVI, eq. 9); sampling (``Predictive``, :func:`pyro_bnnlv.sample_posterior`,
:func:`pyro_bnnlv.evaluate`, :func:`pyro_bnnlv.to_inference_data`) works as for any guide.

For a BNN+LV the hypernet covers ``"w"`` only and the local ``z`` keep a mean-field guide, in
Pyro's ``AutoGuideList`` (:func:`hypernet_lv_guide`).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoGuide, AutoGuideList, AutoNormal, init_to_sample
from pyro.infer.autoguide.initialization import InitMessenger
from pyro.nn.module import to_pyro_module_
from pyro.poutine.util import site_is_subsample
from torch import Tensor, nn

from .._checks import ArgumentTypeError, check_int
from ..nets import as_positive_int
from ..param_names import own_param_names
from .init import check_init_scale

__all__ = ["HypernetGuide", "HypernetLVGuide", "ImplicitSample", "hypernet_lv_guide"]

IMPLICIT_MESSAGE = (
    "the hypernetwork guide is implicit: q(w) has no density, so log q(w) cannot be evaluated. "
    "Train it with pyro_bnnlv.infer.KNNElbo (NN-HyVI) or FunctionalKNNElbo (FuNN-HyVI), which "
    "estimate the KL term from samples; Trace_ELBO and its relatives need a density."
)


class ImplicitSample(dist.Delta):
    """A sample of an implicit distribution: the value is known, its density is not.

    Behaves like ``Delta(v, event_dim=...)`` for sampling (``rsample`` returns ``v``, so gradients
    flow to whatever produced ``v``) but ``log_prob`` raises ``NotImplementedError`` rather than
    returning the Delta's 0, which would silently turn ``Trace_ELBO`` into a wrong objective.
    """

    def log_prob(self, x: Tensor) -> Tensor:  # noqa: D102
        raise NotImplementedError(IMPLICIT_MESSAGE)

    def expand(self, batch_shape, _instance=None):  # keep the class under plates
        new = self._get_checked_instance(ImplicitSample, _instance)
        return super().expand(batch_shape, _instance=new)


def _check_hidden_sizes(value: object) -> tuple[int, ...]:
    """``hidden_sizes`` as a tuple of positive ``int`` widths: one width (an integer, as
    :class:`~pyro_bnnlv.nets.MLP` takes it) or a sequence of widths, each checked by
    :func:`~pyro_bnnlv.nets.as_positive_int` (MLP's rule for widths) and named (``hidden_sizes[1]``)."""
    if isinstance(value, Tensor):
        value = value.tolist() if value.dim() > 0 else value.item()
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        return (as_positive_int(value, "hidden_sizes"),)
    if isinstance(value, (str, bytes, set, frozenset, Mapping, bool)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(
            f"hidden_sizes must be positive integers: a sequence of layer widths (e.g. (20, 40), or () "
            f"for no hidden layer) or one width, got {value!r}"
        )
    return tuple(as_positive_int(h, f"hidden_sizes[{i}]") for i, h in enumerate(value))


def _hypernet(
    noise_dim: int, hidden_sizes: Sequence[int], out_dim: int, activation: Callable[[], nn.Module]
) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = noise_dim
    for h in hidden_sizes:
        layers += [nn.Linear(width, h), activation()]
        width = h
    layers.append(nn.Linear(width, out_dim))
    return nn.Sequential(*layers)


class HypernetGuide(AutoGuide):
    r"""Implicit guide ``theta = h_lambda(eps)``, ``eps ~ N(0, I_l)``, over the model's global latents.

    All latent sites of the model (for the library's BNN: ``"w"``) are generated jointly by one
    hypernet: its output of size ``sum_site numel`` is split and reshaped into the sites. Sites
    inside a plate (per-datapoint latents) are refused: give them a mean-field guide through
    ``AutoGuideList`` (see the module docstring and :func:`hypernet_lv_guide`).

    Args:
        model: the Pyro model (or ``poutine.block(model, expose=[...])`` of it).
        noise_dim: ``l``, the dimension of the noise (paper: 5), a positive integer.
        hidden_sizes: hidden layer widths of the hypernet (paper: 20, 40); one integer is one
            layer of that width, ``()`` none.
        activation: hidden activation module class (paper: ReLU), or the name of one in
            ``torch.nn`` (``"ReLU"``, ``"Tanh"``, ...).
        init_loc_fn: where the hypernet's output starts: its last-layer bias is set to
            ``init_loc_fn(site)`` (default ``init_to_sample``, a prior draw; for networks,
            ``pyro_bnnlv.init_to_network(model)`` is a good choice).
        init_scale: the last-layer weights are rescaled so that the initial per-coordinate
            standard deviation of ``theta`` (over ``eps``) averages ``init_scale`` (a positive
            finite number).

    Each instance names its parameters with its own prefix (:func:`~pyro_bnnlv.param_names.own_param_names`).
    The noise ``eps`` is an auxiliary site ``"_HypernetGuide_3_eps"`` (``infer``: ``is_auxiliary``,
    ``implicit_noise``), broadcast by particle and ``Predictive`` plates like any other site and
    left out of ``log q`` by the k-NN ELBOs.
    """

    def __init__(
        self,
        model: Callable,
        noise_dim: int = 5,
        hidden_sizes: Sequence[int] = (20, 40),
        activation: Callable[[], nn.Module] | str = nn.ReLU,
        init_loc_fn: Callable = init_to_sample,
        init_scale: float = 0.1,
    ) -> None:
        noise_dim = check_int(noise_dim, "noise_dim", minimum=1)
        hidden_sizes = _check_hidden_sizes(hidden_sizes)
        init_scale = check_init_scale(init_scale)
        if not callable(model):
            raise TypeError(f"model must be a Pyro model (callable), got {type(model).__name__}")
        if not callable(init_loc_fn):
            raise TypeError(f"init_loc_fn must be a Pyro init function site -> value, got {type(init_loc_fn).__name__}")
        if isinstance(activation, str):
            activation = _torch_activation(activation)
        elif not callable(activation):
            raise TypeError(
                f"activation must be a torch.nn module class (e.g. nn.ReLU) or its name ('ReLU'), got {activation!r}"
            )
        super().__init__(InitMessenger(init_loc_fn)(model))  # as Pyro's AutoNormal does
        self.noise_dim = noise_dim
        self.hidden_sizes = hidden_sizes
        self.activation = activation
        self.init_loc_fn = init_loc_fn
        self.init_scale = init_scale
        own_param_names(self)

    def config(self) -> dict:
        """Constructor arguments besides the model and ``init_loc_fn``, as plain data (see
        :mod:`pyro_bnnlv.serialization`): ``HypernetGuide(model, **guide.config())`` rebuilds the
        same architecture. A custom activation outside ``torch.nn`` cannot be named and raises."""
        act = self.activation
        if not (isinstance(act, type) and getattr(nn, act.__name__, None) is act):
            raise ValueError(
                f"activation {act!r} is not a torch.nn class, so it cannot be saved by name; "
                "use a torch.nn activation (e.g. nn.ReLU) to save this guide"
            )
        return dict(
            noise_dim=self.noise_dim,
            hidden_sizes=list(self.hidden_sizes),
            activation=act.__name__,
            init_scale=self.init_scale,
        )

    # -- set-up ------------------------------------------------------------------------------------
    def _setup_prototype(self, *args, **kwargs) -> None:
        super()._setup_prototype(*args, **kwargs)
        self._sites: dict[str, tuple[torch.Size, int]] = {}
        inits = []
        for name, site in self.prototype_trace.iter_stochastic_nodes():
            if site_is_subsample(site):
                continue
            if site["cond_indep_stack"]:
                frames = [f.name for f in site["cond_indep_stack"]]
                raise ValueError(
                    f"HypernetGuide covers global latents only; site {name!r} lies in plates "
                    f"{frames}. Give local latents a mean-field guide with AutoGuideList "
                    "(see pyro_bnnlv.guides.hypernet_lv_guide). If it is the observation site, "
                    "set the guide up with the data first: guide(x, y)."
                )
            support = site["fn"].support
            while isinstance(support, dist.constraints.independent):
                support = support.base_constraint
            if support is not dist.constraints.real:
                raise ValueError(f"HypernetGuide needs real-valued sites; {name!r} has support {site['fn'].support}")
            value = site["value"].detach()
            self._sites[name] = (value.shape, value.numel())
            inits.append(value.reshape(-1))
        if not self._sites:
            raise ValueError("the model has no latent sites for the HypernetGuide")
        dtypes = {v.dtype for v in inits}
        if len(dtypes) > 1:
            raise ValueError(
                f"HypernetGuide generates all sites with one network; the sites have dtypes "
                f"{sorted(map(str, dtypes))}: convert the model to one dtype (e.g. model.double())"
            )
        like = inits[0]  # the hypernet, its noise and its output follow the model's dtype and device
        out_dim = sum(n for _, n in self._sites.values())
        net = _hypernet(self.noise_dim, self.hidden_sizes, out_dim, self.activation)
        net.to(dtype=like.dtype, device=like.device)
        with torch.no_grad():
            last = net[-1]
            probe = net[:-1](torch.randn(1000, self.noise_dim, dtype=like.dtype, device=like.device))
            probe = probe @ last.weight.t()
            spread = probe.std(0).mean().clamp_min(1e-12)
            last.weight.mul_(self.init_scale / spread)
            last.bias.copy_(torch.cat(inits) - (probe.mean(0) * self.init_scale / spread))
        to_pyro_module_(net)
        self.hypernet = net

    @property
    def num_outputs(self) -> int:
        """Total number of values the hypernet generates (``P`` for a BNN)."""
        return sum(n for _, n in self._sites.values())

    # -- sampling ------------------------------------------------------------------------------------
    def forward(self, *args, **kwargs) -> dict[str, Tensor]:
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)
        eps = pyro.sample(
            f"_{self._pyro_name}_eps",
            dist.Normal(self._noise(None), 1.0).to_event(1),
            infer={"is_auxiliary": True, "implicit_noise": True},
        )
        values = self._split(self.hypernet(eps))
        return {
            name: pyro.sample(name, ImplicitSample(v, event_dim=len(self._sites[name][0])))
            for name, v in values.items()
        }

    def _noise(self, num_samples: int | None) -> Tensor:
        """``(num_samples, l)`` standard normal noise in the hypernet's dtype and device (those of
        the model's sites, or whatever ``guide.to(...)`` set); ``None``: the ``(l,)`` zero mean."""
        like = self.hypernet[0].weight
        if num_samples is None:
            return torch.zeros(self.noise_dim, dtype=like.dtype, device=like.device)
        return torch.randn(num_samples, self.noise_dim, dtype=like.dtype, device=like.device)

    def _split(self, theta: Tensor) -> dict[str, Tensor]:
        """Hypernet output ``(*B, sum numel)`` -> ``{site: (*B, *shape)}``."""
        batch = theta.shape[:-1]
        out, pos = {}, 0
        for name, (shape, n) in self._sites.items():
            out[name] = theta[..., pos : pos + n].reshape(batch + shape)
            pos += n
        return out

    def sample_weights(self, num_samples: int) -> dict[str, Tensor]:
        """``num_samples`` draws of every site, ``{name: (num_samples, *shape)}``, differentiable."""
        if self.prototype_trace is None:
            raise RuntimeError("call the guide once (or fit it) before sample_weights")
        return self._split(self.hypernet(self._noise(num_samples)))

    def median(self, *args, **kwargs) -> dict[str, Tensor]:
        """The implicit distribution has no closed-form median: a sample mean over 1,000 draws."""
        with torch.no_grad():
            return {k: v.mean(0) for k, v in self.sample_weights(1000).items()}


def _torch_activation(name: str) -> type[nn.Module]:
    """The ``torch.nn`` module class called ``name`` (only classes of ``torch.nn`` are looked up)."""
    cls = getattr(nn, name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"activation {name!r} is not a torch.nn module class (e.g. 'ReLU', 'Tanh')")
    return cls


class HypernetLVGuide(AutoGuideList):
    """Hypernet over ``"w"`` and mean-field ``AutoNormal`` over the local ``"z"`` of a BNN+LV:
    an ``AutoGuideList`` of ``HypernetGuide(block(model, expose=["w"]), **hypernet_kwargs)`` and
    ``AutoNormal(block(model, hide=["w"]), init_scale=0.1)``, with the model's ``create_plates``
    so minibatches subsample ``z`` together with the data."""

    def __init__(self, model: Callable, **hypernet_kwargs) -> None:
        super().__init__(model, create_plates=getattr(model, "create_plates", None))
        self.append(HypernetGuide(poutine.block(model, expose=["w"]), **hypernet_kwargs))
        self.append(AutoNormal(poutine.block(model, hide=["w"]), init_scale=0.1))
        own_param_names(self)  # the parts are renamed with it: "HypernetLVGuide_3.0.hypernet..."

    def config(self) -> dict:
        """The hypernet's :meth:`HypernetGuide.config` (see :mod:`pyro_bnnlv.serialization`)."""
        return self[0].config()


def hypernet_lv_guide(model, **hypernet_kwargs) -> HypernetLVGuide:
    """Hypernet over ``"w"`` and mean-field ``AutoNormal`` over the local ``"z"`` of a BNN+LV
    (:class:`HypernetLVGuide`). ``hypernet_kwargs`` go to :class:`HypernetGuide`."""
    return HypernetLVGuide(model, **hypernet_kwargs)
