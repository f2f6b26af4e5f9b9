"""NCAI step 1: the model-satisfying initialisation (Yacoby, Pan & Doshi-Velez 2022,
arXiv:1911.00569, sec. 6).

"We initialize the variational means of the weights (except for weights associated with the
input noise) with those of a deterministic neural network trained on the same data [...]. We
then initialize the variational means of the latent noise to 0 [...]. Lastly, we initialize all
variational variances randomly." App. F.1 adds that the weights on the latent inputs start
from Xavier initialisation (Glorot & Bengio 2010: ``N(0, 2 / (fan_in + fan_out))``).

:func:`ncai_init_loc_fn` trains the deterministic network (the BNN+LV's network with its latent
inputs held at 0, by maximum likelihood with the model's noise scale) and returns an
``init_loc_fn`` for ``AutoNormal``: ``"w"`` at the trained weights with Xavier-normal
latent-input weights, ``"z"`` drawn from the prior ``N(0, sigma_z^2)`` (default
``z_init="prior"``) or at 0 (``z_init="zero"``, the paper's literal wording).

Why not 0: a sample of all-equal latent means makes the Henze-Zirkler penalty spike after
Adam's first step and stall the latents (docs/design-notes.md, 'guides.ncai_init').

:func:`ncai_guide` builds the ``MeanField`` (``AutoNormal``) and randomises its initial scales, so that
``NCAI_{lambda=0}`` is ``fit_svi(model, ncai_guide(model, x, y), x, y, ...)`` and
``NCAI_lambda`` adds ``loss=NCAIElbo(...)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from pyro.infer.autoguide import init_to_value
from torch import Tensor

from .._checks import check_real, check_seed
from ..infer.svi import isolated_param_store, train_map
from ..models.bnn import BNN
from ..models.bnnlv import BNNLV
from ..nets import MLP
from .mean_field import MeanField

__all__ = ["ncai_guide", "ncai_init_loc_fn", "ncai_init_weights"]


def _ncai_seed(seed: object) -> int:
    """The NCAI seed as an ``int`` (:func:`~pyro_bnnlv._checks.check_seed`); ``None``: one drawn
    from torch's global generator (so ``torch.manual_seed`` still fixes the run)."""
    seed = check_seed(seed)
    return int(torch.randint(0, 2**31, ()).item()) if seed is None else seed


def _check_targets(y: object) -> None:
    if y is None:
        raise TypeError(
            "y must be a tensor of targets: the NCAI initialisation trains a deterministic network on (x, y), got None"
        )


def _deterministic_twin(model: BNNLV) -> tuple[BNN, Tensor]:
    """A BNN on ``x`` alone with the BNN+LV's architecture minus the latent input columns."""
    net = model.net
    if not isinstance(net, MLP):
        raise NotImplementedError("the NCAI initialisation needs an MLP network")
    twin = MLP(model.input_dim, list(net.hidden_sizes), net.out_features, activation=net.activation)
    keep = ~model.latent_weight_mask()  # the twin's weights are the BNN+LV's minus z columns
    return BNN(twin, prior_scale=1.0, noise_scale=model.noise_scale.detach()), keep


def ncai_init_weights(
    model: BNNLV,
    x: Tensor,
    y: Tensor,
    *,
    num_steps: int = 2000,
    lr: float = 0.01,
    latent_weight_scale: float | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> Tensor:
    """Weights of a deterministic network trained on ``(x, y)``, embedded into the BNN+LV's flat
    vector, with the weights on the latent inputs drawn from ``N(0, latent_weight_scale^2)``
    (default ``None``: Xavier, ``latent_weight_scale^2 = 2 / (fan_in + fan_out)`` of the first
    layer, App. F.1)."""
    if not isinstance(model, BNNLV):
        raise TypeError(f"the NCAI initialisation needs a BNN+LV model (pb.BNNLV), got {type(model).__name__}")
    _check_targets(y)
    seed = _ncai_seed(seed)
    latent_weight_scale = check_real(latent_weight_scale, "latent_weight_scale", nonnegative=True, allow_none=True)
    model.check_data(x, y)
    twin, keep = _deterministic_twin(model)
    w_twin = train_map(
        twin, x, y, num_steps=num_steps, lr=lr, batch_size=batch_size, use_prior=False, seed=seed, progress=progress
    )
    if latent_weight_scale is None:
        fan_in, fan_out = model.net.layers[0][:2]
        latent_weight_scale = math.sqrt(2.0 / (fan_in + fan_out))
    gen = torch.Generator().manual_seed(seed + 1)
    w = torch.randn(model.num_weights, generator=gen) * latent_weight_scale
    w[keep] = w_twin
    return w


def ncai_init_loc_fn(model: BNNLV, x: Tensor, y: Tensor, *, z_init: str = "prior", seed: int = 0, **kwargs) -> Callable:
    """``init_loc_fn`` for NCAI step 1: ``"w"`` from :func:`ncai_init_weights`; ``"z"`` drawn from
    the prior ``N(0, latent_scale^2)`` (``z_init="prior"``, seeded) or 0 (``"zero"``)."""
    if z_init not in ("prior", "zero"):
        raise ValueError(f"z_init must be 'prior' or 'zero', got {z_init!r}")
    seed = _ncai_seed(seed)
    w = ncai_init_weights(model, x, y, seed=seed, **kwargs)
    z = torch.zeros(x.shape[0], model.latent_dim, dtype=w.dtype)
    if z_init == "prior":
        gen = torch.Generator().manual_seed(seed + 3)
        scale = model.latent_scale.detach().to(w.dtype)
        z = torch.randn(z.shape, generator=gen, dtype=w.dtype) * scale
    return init_to_value(values={"w": w, "z": z})


def ncai_guide(
    model: BNNLV,
    x: Tensor,
    y: Tensor,
    *,
    init_scale: float = 0.01,
    scale_jitter: float = 0.5,
    z_init: str = "prior",
    seed: int = 0,
    **kwargs,
) -> MeanField:
    """Mean-field guide (a :class:`~pyro_bnnlv.guides.mean_field.MeanField`, an ``AutoNormal``)
    over ``w`` and ``z`` initialised as NCAI step 1.

    Initial standard deviations are random, ``init_scale * U(1 - scale_jitter, 1 + scale_jitter)``
    elementwise ("we initialize all variational variances randomly"). ``z_init``: see
    :func:`ncai_init_loc_fn`. ``kwargs`` go to :func:`ncai_init_weights` (``num_steps``, ``lr``,
    ``latent_weight_scale``, ...). ``seed``: an integer in ``[0, 2**32)`` seeding the twin's
    training and every random start (``None``: one drawn from torch's global generator).
    """
    if not 0 <= check_real(scale_jitter, "scale_jitter") < 1:
        raise ValueError(f"scale_jitter must lie in [0, 1), got {scale_jitter!r}")
    if not isinstance(model, BNNLV):
        raise TypeError(f"the NCAI initialisation needs a BNN+LV model (pb.BNNLV), got {type(model).__name__}")
    _check_targets(y)
    seed = _ncai_seed(seed)
    init = ncai_init_loc_fn(model, x, y, z_init=z_init, seed=seed, **kwargs)
    guide = MeanField(model, init_loc_fn=init, init_scale=init_scale)  # its own param names
    with isolated_param_store(model, guide), torch.no_grad():
        guide(x, y)  # create the parameters
    gen = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name in ("w", "z"):
            scale = getattr(guide.scales, name)
            u = torch.rand(scale.shape, generator=gen) * 2 * scale_jitter + (1 - scale_jitter)
            setattr(guide.scales, name, scale * u)
    return guide
