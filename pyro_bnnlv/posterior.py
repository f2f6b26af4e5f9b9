"""A posterior in the flat layout every tool of the library uses (below ``stats`` and ``infer``).

``sample_posterior`` wraps ``pyro.infer.Predictive(parallel=True)`` and strips the plate
dimension Pyro puts on global sites, so ``"w"`` comes back as ``(S, P)`` and per-datapoint
latents such as ``"z"`` as ``(S, N, K)``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from pyro import poutine
from pyro.infer import Predictive
from torch import Tensor

from ._checks import check_int
from .protocols import ChecksData
from ._state import isolated_param_store, set_seed

__all__ = [
    "Posterior",
    "PosteriorKind",
    "SelfEvaluatingPosterior",
    "as_sample_dict",
    "guide_site_mean",
    "posterior_kind",
    "sample_posterior",
    "weight_group",
]


@runtime_checkable
class SelfEvaluatingPosterior(Protocol):
    """A posterior with a closed-form predictive that computes its own metrics, such as
    :class:`~pyro_bnnlv.infer.laplace.linearized.LinearizedLaplace` (exact Gaussian predictive): ``evaluate``
    hands it the data instead of drawing samples, and the plots of :mod:`pyro_bnnlv.plotting` its
    ``predictive(x)`` (``.mean`` and ``.var``, ``(N, L)``). Recognised by these methods, so
    ``stats`` need not import ``infer``."""

    def evaluate(self, x: Tensor, y: Tensor, *, level: float, y_mean: Any, y_std: Any) -> dict[str, float]: ...

    def predictive(self, x: Tensor) -> Any: ...


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
        pred = Predictive(model, guide=guide, num_samples=num_samples, parallel=True, return_sites=list(sites))
        try:
            out = pred(*args, **kwargs)
        except ValueError as err:
            _explain_local_latents(model, guide, args, kwargs, err)
            raise
        with poutine.block():
            model_trace = poutine.trace(model).get_trace(*args, **kwargs)
        missing = [s for s in sites if s not in out]
        if missing:
            available = [name for name, site in model_trace.nodes.items() if site["type"] == "sample"]
            raise ValueError(f"sites {missing} not found in the model; available: {available}")
        shapes = {name: model_trace.nodes[name]["value"].shape for name in out}
    return {k: _drop_plate_dims(v, num_samples, shapes[k], k) for k, v in out.items()}


def _explain_local_latents(model: Callable, guide: Callable, args: tuple, kwargs: dict, err: ValueError) -> None:
    """When sampling failed and the guide cannot even run on these inputs while the model has
    per-datapoint latent sites (a BNN+LV's ``"z"``), raise the reason: such a guide holds one
    latent per *training* point, so it runs only on the training inputs."""
    if guide is None or not args or not isinstance(args[0], Tensor):
        return
    with poutine.block(), torch.random.fork_rng(devices=[]):
        try:
            poutine.trace(guide).get_trace(*args, **kwargs)
            return  # the guide runs: the failure is something else
        except ValueError:
            pass
        try:
            model_trace = poutine.trace(model).get_trace(*args, **kwargs)
        except (ValueError, RuntimeError, TypeError):
            return
    N = args[0].shape[0]
    local = [
        name
        for name, site in model_trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and name != "obs"  # obs: y not given
        and any(f.size == N and f.name == "data" for f in site["cond_indep_stack"])
    ]
    if local:
        raise ValueError(
            f"the guide's per-datapoint latents {local} do not fit x of {N} rows: a guide of a model with "
            f"local latents (BNN+LV) holds one latent per training point, so sample_posterior needs the "
            f"training inputs (and targets), all of them, in their order; take a slice of the result "
            f"(samples['z'][:, idx]) instead of slicing x. For new inputs the latent comes from the prior: "
            f"use pb.evaluate or model.predictive_components"
        ) from err


def _check_sites(sites: Any) -> tuple[str, ...]:
    """``sites`` as a tuple of names: one name (a ``str``) or a non-empty sequence of names."""
    if isinstance(sites, str):
        return (sites,)
    if isinstance(sites, (Mapping, set, frozenset, bytes)) or not isinstance(sites, Iterable):
        raise TypeError(f"sites must be a site name or a sequence of site names, e.g. ('w',), got {sites!r}")
    sites = tuple(sites)
    bad = [s for s in sites if not isinstance(s, str)]
    if bad or not sites:
        raise TypeError(f"sites must be a site name or a non-empty sequence of site names (strings), got {sites!r}")
    return sites


def _check_model_data(model: Any, args: tuple, kwargs: dict) -> None:
    """A library model's own data checks (``check_data``, and the dtype of ``x`` against its
    buffers) before Pyro's trace appends its shape tables to the message."""
    if not isinstance(model, ChecksData) or not args:
        return
    accepted = inspect.signature(model.check_data).parameters
    model.check_data(*args[:2], **{k: v for k, v in kwargs.items() if k in accepted})
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
        raise ValueError(
            f"site {name!r}: Predictive returned shape {tuple(v.shape)}, which does "
            f"not reshape to (num_samples, *site shape) = {target}"
        )
    return v.reshape(target)


def as_sample_dict(posterior: Any) -> dict[str, Tensor]:
    """Normalise posterior samples: a dict, a ``(S, P)`` weight tensor, an ``MCMC`` object or an
    ArviZ ``InferenceData`` (its ``w`` and, where present, ``z``, flat over chains)."""
    if posterior_kind(posterior) == "inference_data":
        group = weight_group(posterior, required=True)
        shapes = {k: tuple(group[k].shape[2:]) for k in ("w", "z") if k in group}
        posterior = Posterior.from_any(posterior, shapes=shapes).flat()
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
        raise ValueError(
            f"posterior_samples['w'] must be a floating-point tensor (float32 or float64), "
            f"got dtype {w.dtype}: convert it, e.g. w.float()"
        )
    if w.dim() == 3 and w.shape[1] == 1:
        out["w"] = w.squeeze(1)
    elif w.dim() == 1:
        out["w"] = w.unsqueeze(0)
    if out["w"].dim() != 2:
        raise ValueError(f"posterior_samples['w'] must have shape (S, P); got {tuple(w.shape)}")
    if out["w"].shape[0] == 0:
        raise ValueError(
            f"posterior_samples['w'] has 0 samples (shape {tuple(w.shape)}): the "
            "predictive averages over the samples, so pass at least one"
        )
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


PosteriorKind = Literal["mcmc", "inference_data", "guide", "samples"]


def posterior_kind(obj: Any) -> PosteriorKind:
    """The form a posterior comes in, the one rule every tool of the library uses:
    ``"mcmc"`` (a run ``MCMC``: ``get_samples`` and ``num_chains``), ``"inference_data"`` (ArviZ:
    ``posterior`` and ``groups``), ``"guide"`` (any other callable, sampled with
    :func:`sample_posterior`) or ``"samples"`` (a dict of draws, a weight tensor, or a list of
    either)."""
    if hasattr(obj, "get_samples") and hasattr(obj, "num_chains"):
        return "mcmc"
    if hasattr(obj, "posterior") and hasattr(obj, "groups"):
        return "inference_data"
    if callable(obj) and not isinstance(obj, (Tensor, Mapping)):
        return "guide"
    return "samples"


def weight_group(idata: Any, required: bool = False) -> Any:
    """The group of an InferenceData holding the weight draws ``w`` (and ``z``): ``posterior``
    when it has ``w`` (``to_inference_data(..., weights=True)``, or an export from elsewhere),
    else ``weights`` (:func:`~pyro_bnnlv.diagnostics.to_inference_data`'s default); ``None``, or
    with ``required`` a ``ValueError``, when neither has."""
    for name in ("posterior", "weights"):
        group = getattr(idata, name, None)
        if group is not None and "w" in group:
            return group
    if required:
        raise ValueError(
            "the InferenceData has no weight draws 'w' in its posterior or weights group; "
            "make it with pyro_bnnlv.to_inference_data (which stores them in 'weights')"
        )
    return None


def _by_chain(samples: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Tensor]:
    """``{site: (S, *shape)}`` or ``{site: (C, S, *shape)}`` -> ``{site: (C, S, *shape)}`` for the
    sites of ``shapes`` present in ``samples`` (``"w"`` required)."""
    out = {}
    for name, shape in shapes.items():
        if name not in samples:
            continue
        v = torch.as_tensor(samples[name]).detach()
        if v.dim() == len(shape) + 2 and v.shape[1] == 1 and len(shape) == 1 and v.shape[2:] == shape:
            v = v.squeeze(1)  # (S, 1, P) from Predictive(parallel=True)
        if tuple(v.shape[1:]) == shape:
            v = v.unsqueeze(0)
        elif tuple(v.shape[2:]) != shape:
            raise ValueError(f"samples[{name!r}] must have shape (S, {shape}) or (C, S, {shape}); got {tuple(v.shape)}")
        out[name] = v
    if "w" not in out:
        raise ValueError(f"the posterior samples have no 'w' site; got {sorted(samples)}")
    sizes = {v.shape[:2] for v in out.values()}
    if len(sizes) != 1:
        raise ValueError(f"sites have different numbers of chains/draws: {sizes}")
    return out


def _weight_shape(samples: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """``{"w": (P,)}`` read off the samples' last dimension (the flat weight site)."""
    if "w" not in samples:
        raise ValueError(f"the posterior samples have no 'w' site; got {sorted(samples)}")
    return {"w": (int(torch.as_tensor(samples["w"]).shape[-1]),)}


@dataclass(frozen=True)
class Posterior:
    """Posterior draws grouped by chain, ``draws = {site: (C, S, *shape)}``: the one form the
    diagnostics read, whatever the posterior came as.

    Build it with :meth:`from_any`. Weight samples flat over chains are :meth:`weights`, every
    site flat over chains is :meth:`flat`. (:func:`as_sample_dict` is the validated flat form the
    predictive metrics take.)
    """

    draws: dict[str, Tensor]

    @property
    def num_chains(self) -> int:
        return int(self.draws["w"].shape[0])

    @property
    def num_draws(self) -> int:
        return int(self.draws["w"].shape[1])

    def flat(self) -> dict[str, Tensor]:
        """``{site: (C * S, *shape)}``."""
        C, S = self.num_chains, self.num_draws
        return {k: v.reshape(C * S, *v.shape[2:]) for k, v in self.draws.items()}

    def weights(self, max_draws: int | None = None) -> Tensor:
        """``(C * S, P)`` weight samples, evenly thinned to at most ``max_draws``."""
        w = self.flat()["w"]
        if max_draws is None or w.shape[0] <= max_draws:
            return w
        return w[torch.linspace(0, w.shape[0] - 1, max_draws).round().long()]

    @classmethod
    def from_any(
        cls,
        posterior: Any,
        model: Callable | None = None,
        *args: Any,
        shapes: Mapping[str, tuple[int, ...]] | None = None,
        num_samples: int = 1000,
        seed: int | None = None,
    ) -> "Posterior":
        """Draws of the sites in ``shapes`` (``{site: shape of one draw}``; default ``{"w": (P,)}``
        read off the samples) from any supported posterior:

        * an ``MCMC`` run (its chains), or an ArviZ ``InferenceData`` (its ``posterior`` group);
        * a fitted guide, or a list of guides (one chain each): ``num_samples`` draws each with
          :func:`sample_posterior`, called as ``model(*args)`` (the inputs, for a BNN+LV also
          ``y``), seeds ``seed``, ``seed + 1``, ...;
        * a dict of samples ``{site: (S, ...)}`` or ``(C, S, ...)``, or a list of dicts (one chain
          each), or a weight tensor ``(S, P)`` / ``(C, S, P)``.
        """
        kind = posterior_kind(posterior)
        if kind == "mcmc":
            samples = posterior.get_samples(group_by_chain=True)
            return cls(_by_chain(samples, shapes or {"w": tuple(samples["w"].shape[2:])}))
        if kind == "inference_data":
            group = weight_group(posterior, required=True)
            names = list(shapes) if shapes else ["w"]
            samples = {k: torch.as_tensor(group[k].values) for k in names if k in group}
            return cls(_by_chain(samples, shapes or {"w": tuple(samples["w"].shape[2:])}))
        is_guide = [posterior_kind(p) == "guide" for p in posterior] if isinstance(posterior, Sequence) else []
        guides = posterior if is_guide and all(is_guide) else None
        if guides is not None or kind == "guide":
            if model is None or not args:
                raise ValueError(
                    "sampling a guide needs the model and its inputs: pass model= and x= "
                    "(a BNN+LV's guide also the training targets y)"
                )
            chains = []
            for i, guide in enumerate(guides or [posterior]):
                s = sample_posterior(
                    model,
                    guide,
                    *args,
                    num_samples=num_samples,
                    sites=tuple(shapes) if shapes else ("w",),
                    seed=None if seed is None else seed + i,
                )
                chains.append(_by_chain(s, shapes or _weight_shape(s)))
            return cls({k: torch.cat([c[k] for c in chains]) for k in chains[0]})
        if isinstance(posterior, Tensor):
            posterior = {"w": posterior}
        if isinstance(posterior, Sequence) and posterior and all(isinstance(p, Mapping) for p in posterior):
            parts = [_by_chain(p, shapes or _weight_shape(p)) for p in posterior]
            return cls({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
        if isinstance(posterior, Mapping):
            return cls(_by_chain(posterior, shapes or _weight_shape(posterior)))
        raise TypeError(
            "a posterior must be an MCMC object, a guide (or a list of guides, one per chain), an "
            f"InferenceData, a dict of samples or a (S, P) weight tensor; got {type(posterior).__name__}"
        )
