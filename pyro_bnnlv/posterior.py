"""A posterior in the flat layout every tool of the library uses (below ``stats`` and ``infer``).

``sample_posterior`` wraps ``pyro.infer.Predictive(parallel=True)`` and strips the plate
dimension Pyro puts on global sites, so ``"w"`` comes back as ``(S, P)`` and per-datapoint
latents such as ``"z"`` as ``(S, N, K)``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from pyro import poutine
from pyro.infer import Predictive
from torch import Tensor

from ._checks import check_int
from ._state import isolated_param_store, set_seed

__all__ = ["sample_posterior", "as_sample_dict", "guide_site_mean", "SelfEvaluatingPosterior"]


@runtime_checkable
class SelfEvaluatingPosterior(Protocol):
    """A posterior with a closed-form predictive that computes its own metrics, such as
    :class:`~pyro_bnnlv.infer.laplace.LinearizedLaplace` (exact Gaussian predictive): ``evaluate``
    hands it the data instead of drawing samples. Recognised by this method, so ``stats`` need
    not import ``infer``."""

    def evaluate(self, x: Tensor, y: Tensor, *, level: float, y_mean: Any, y_std: Any) -> dict[str, float]: ...


def sample_posterior(
    model: Callable,
    guide: Callable,
    *args: Any,
    num_samples: int = 1000,
    sites: Sequence[str] = ("w",),
    seed: int | None = None,
    **kwargs: Any,
) -> dict[str, Tensor]:
    """Draw ``num_samples`` joint samples of latent ``sites`` from ``guide``.

    ``args``/``kwargs`` are the model's arguments; for models with per-datapoint latents (BNN+LV)
    pass the training data, since the guide's local sites are indexed by training points.
    Returns ``{"w": (S, P), ...}`` with the data-plate dimension of global sites removed.

    ``sites`` is a sequence of site names, or one name (``sites="obs"`` is ``sites=("obs",)``).
    ``guide=None`` samples the prior.
    """
    check_int(num_samples, "num_samples")
    sites = _check_sites(sites)
    _check_model_data(model, args, kwargs)
    set_seed(seed)
    with isolated_param_store(model, guide), torch.no_grad():
        pred = Predictive(
            model, guide=guide, num_samples=num_samples, parallel=True, return_sites=list(sites)
        )
        out = pred(*args, **kwargs)
        with poutine.block():
            model_trace = poutine.trace(model).get_trace(*args, **kwargs)
        missing = [s for s in sites if s not in out]
        if missing:
            available = [name for name, site in model_trace.nodes.items() if site["type"] == "sample"]
            raise ValueError(f"sites {missing} not found in the model; available: {available}")
        shapes = {name: model_trace.nodes[name]["value"].shape for name in out}
    return {k: _drop_plate_dims(v, num_samples, shapes[k], k) for k, v in out.items()}


def _check_sites(sites: Any) -> tuple[str, ...]:
    """``sites`` as a tuple of names: one name (a ``str``) or a non-empty sequence of names."""
    if isinstance(sites, str):
        return (sites,)
    if isinstance(sites, (Mapping, set, frozenset, bytes)) or not isinstance(sites, Iterable):
        raise TypeError(f"sites must be a site name or a sequence of site names, e.g. ('w',), "
                        f"got {sites!r}")  # fmt: skip
    sites = tuple(sites)
    bad = [s for s in sites if not isinstance(s, str)]
    if bad or not sites:
        raise TypeError(f"sites must be a site name or a non-empty sequence of site names (strings), "
                        f"got {sites!r}")  # fmt: skip
    return sites


def _check_model_data(model: Any, args: tuple, kwargs: dict) -> None:
    """A library model's own data checks (``check_data``, and the dtype of ``x`` against its
    buffers) before Pyro's trace appends its shape tables to the message."""
    check = getattr(model, "check_data", None)
    if not callable(check) or not args:
        return
    accepted = inspect.signature(check).parameters
    check(*args[:2], **{k: v for k, v in kwargs.items() if k in accepted})
    dtype_check = getattr(model, "_check_dtype", None)
    if callable(dtype_check) and isinstance(args[0], Tensor):
        dtype_check(args[0])


def _drop_plate_dims(v: Tensor, num_samples: int, shape: torch.Size, name: str) -> Tensor:
    """``(S, *plate singletons, *shape)`` -> ``(S, *shape)``.

    A global site sampled under ``Predictive(parallel=True)`` carries a singleton for each
    plate the model declares (``"w"``: ``(S, 1, P)``); local sites already have ``(S, N, ...)``.
    The site's shape in one trace of the model tells which is which, so a data set of one point
    (``"z"`` of shape ``(S, 1, K)``) is not mistaken for a global site.
    """
    target = (num_samples, *shape)
    if v.shape == target:
        return v
    if v.numel() != math.prod(target):
        raise ValueError(f"site {name!r}: Predictive returned shape {tuple(v.shape)}, which does "
                         f"not reshape to (num_samples, *site shape) = {target}")
    return v.reshape(target)


def as_sample_dict(posterior: Any) -> dict[str, Tensor]:
    """Normalise posterior samples: a dict, a ``(S, P)`` weight tensor, or an ``MCMC`` object."""
    if hasattr(posterior, "get_samples"):
        posterior = posterior.get_samples()
    if isinstance(posterior, Tensor):
        posterior = {"w": posterior}
    if not isinstance(posterior, Mapping):
        raise TypeError(
            "posterior_samples must be a dict of site samples, a (S, P) tensor of weights or an "
            f"MCMC object; got {type(posterior).__name__}"
        )
    if "w" not in posterior:
        raise ValueError(f"posterior_samples has no 'w' site; got sites {sorted(posterior)}")
    out = dict(posterior)
    w = out["w"]
    if not isinstance(w, Tensor):
        raise TypeError(f"posterior_samples['w'] must be a torch.Tensor of shape (S, P), got {type(w).__name__}")
    if not w.is_floating_point():
        raise ValueError(f"posterior_samples['w'] must be a floating-point tensor (float32 or float64), "
                         f"got dtype {w.dtype}: convert it, e.g. w.float()")  # fmt: skip
    if w.dim() == 3 and w.shape[1] == 1:
        out["w"] = w.squeeze(1)
    elif w.dim() == 1:
        out["w"] = w.unsqueeze(0)
    if out["w"].dim() != 2:
        raise ValueError(f"posterior_samples['w'] must have shape (S, P); got {tuple(w.shape)}")
    if out["w"].shape[0] == 0:
        raise ValueError(f"posterior_samples['w'] has 0 samples (shape {tuple(w.shape)}): the "
                         "predictive averages over the samples, so pass at least one")  # fmt: skip
    if not torch.isfinite(out["w"]).all():
        raise ValueError("posterior_samples['w'] contains NaN or infinite values")
    return out


def guide_site_mean(guide_trace: Any, name: str) -> Tensor:
    """Mean of the guide's distribution of a real-valued site, shaped like the site's value.

    Pyro's autoguides sample ``name + "_unconstrained"`` from the variational Gaussian and record
    ``name`` itself as a ``Delta`` at the (transformed) sample, whose "mean" is that sample; the
    variational mean lives on the unconstrained site. For real-valued sites (identity
    transform) it is the mean of ``name``. Guides that sample ``name`` directly are read as is.
    """
    if name not in guide_trace.nodes:
        raise ValueError(f"the guide has no site {name!r}")
    value = guide_trace.nodes[name]["value"]
    site = guide_trace.nodes.get(name + "_unconstrained", guide_trace.nodes[name])
    try:
        mean = site["fn"].mean
    except NotImplementedError as err:
        raise ValueError(
            f"the guide's distribution at {name!r} has no mean; use a Gaussian guide such as AutoNormal"
        ) from err
    return mean.expand_as(value)
