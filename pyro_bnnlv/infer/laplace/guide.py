"""Sampled Laplace: the Laplace Gaussian as a Pyro guide on the flat weight site ``"w"``.

Foong, Li, Hernandez-Lobato & Turner (2019), "'In-Between' Uncertainty in Bayesian Neural
Networks", arXiv:1906.11537, sec. 2: the Laplace approximation
``q(w) = N(w; w_MAP, Sigma)`` can be used like any variational posterior, predicting by Monte
Carlo as in eq. (1), ``p(y* | x*, D) ~ (1/M) sum_m p(y* | x*, w_m)``, ``w_m ~ q``: "sampled
Laplace" (SL). :class:`LaplaceGuide` is that ``q`` as a ``PyroModule`` guide, so Pyro's
``Predictive``, :func:`pyro_bnnlv.sample_posterior`, :func:`pyro_bnnlv.evaluate` and
:func:`pyro_bnnlv.diagnostics.to_inference_data` take it like an ``AutoNormal``. Build it with
:meth:`pyro_bnnlv.infer.LinearizedLaplace.as_guide`.

Three covariance structures, matching the curvature structures of the Laplace fit:

* ``scale_tril`` ``(P, P)``: the full covariance ``Sigma = scale_tril scale_tril^T``
  (``MultivariateNormal``);
* ``scale`` ``(P,)``: a diagonal covariance (``Normal(...).to_event(1)``);
* ``indices`` ``(K,)`` with ``scale_tril`` ``(K, K)``: a Gaussian on the ``K`` weights of a
  subset (the last layer), every other weight fixed at ``loc`` (:class:`SubsetNormal`).

The guide has no learnable parameters (its tensors are buffers); ``state_dict`` saves it.
"""

from __future__ import annotations

from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions.torch_distribution import TorchDistribution
from pyro.nn import PyroModule
from torch import Tensor
from torch.distributions import constraints

from ..._checks import check_int, check_seed

__all__ = ["LaplaceGuide", "SubsetNormal"]


class SubsetNormal(TorchDistribution):
    """A Gaussian on a subset of the coordinates of ``w``; the others are fixed at ``loc``.

    ``w = loc + E (scale_tril @ eps)``, ``eps ~ N(0, I_K)``, with ``E`` the ``P x K`` embedding of
    the coordinates ``indices``. ``log_prob`` is the ``K``-dimensional Gaussian density of
    ``w[indices]`` (the density with respect to Lebesgue measure on the subset times a point mass
    on the fixed coordinates; values off that affine subspace are not checked).
    """

    arg_constraints = {"loc": constraints.real_vector}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, loc: Tensor, indices: Tensor, scale_tril: Tensor, validate_args: Any = None) -> None:
        if loc.dim() != 1:
            raise ValueError(f"loc must have shape (P,); got {tuple(loc.shape)}")
        K = indices.numel()
        if scale_tril.shape != (K, K):
            raise ValueError(f"scale_tril must have shape ({K}, {K}); got {tuple(scale_tril.shape)}")
        self.loc, self.indices, self.scale_tril = loc, indices.long(), scale_tril
        self._sub = dist.MultivariateNormal(loc[self.indices], scale_tril=scale_tril)
        super().__init__(torch.Size(), loc.shape, validate_args=validate_args)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        sub = self._sub.rsample(sample_shape)
        w = self.loc.expand(*sub.shape[:-1], self.loc.shape[-1]).clone()
        w[..., self.indices] = sub
        return w

    def log_prob(self, value: Tensor) -> Tensor:
        return self._sub.log_prob(value[..., self.indices])

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        var = torch.zeros_like(self.loc)
        var[self.indices] = self._sub.variance
        return var

    def entropy(self) -> Tensor:
        return self._sub.entropy()


class LaplaceGuide(PyroModule):
    """Guide ``q(w) = N(loc, Sigma)`` at site ``"w"`` (sampled Laplace; see the module docstring).

    Args:
        loc: the mean ``w_MAP``, shape ``(P,)``.
        scale_tril: lower Cholesky factor of ``Sigma``: ``(P, P)``, or ``(K, K)`` with ``indices``.
        scale: per-weight standard deviations ``(P,)`` (diagonal ``Sigma``), instead of
            ``scale_tril``.
        indices: the ``K`` coordinates of ``w`` that ``scale_tril`` covers; the rest are fixed.
        site: the latent site's name.

    Call as ``guide(*args, **kwargs)`` with the model's arguments (ignored); returns
    ``{"w": sample}``.
    """

    def __init__(
        self,
        loc: Tensor,
        *,
        scale_tril: Tensor | None = None,
        scale: Tensor | None = None,
        indices: Tensor | None = None,
        site: str = "w",
    ) -> None:
        super().__init__()
        if loc.dim() != 1 or not torch.isfinite(loc).all():
            raise ValueError(f"loc must be a finite (P,) tensor; got shape {tuple(loc.shape)}")
        P = loc.shape[0]
        if (scale_tril is None) == (scale is None):
            raise ValueError("pass exactly one of scale_tril and scale")
        if scale is not None:
            if indices is not None:
                raise ValueError("indices go with scale_tril, not scale")
            if scale.shape != (P,) or not (torch.isfinite(scale).all() and (scale > 0).all()):
                raise ValueError(f"scale must be a positive finite ({P},) tensor; got {tuple(scale.shape)}")
        else:
            K = P if indices is None else indices.numel()
            if scale_tril.shape != (K, K) or not torch.isfinite(scale_tril).all():
                raise ValueError(f"scale_tril must be a finite ({K}, {K}) tensor; got {tuple(scale_tril.shape)}")
            if not (scale_tril.diagonal() > 0).all():
                raise ValueError("scale_tril must have a positive diagonal")
            if indices is not None and (indices.min() < 0 or indices.max() >= P):
                raise ValueError(f"indices must lie in [0, {P}); got range [{indices.min()}, {indices.max()}]")
        self.site = site
        self.register_buffer("loc", loc.detach().clone())
        self.register_buffer("scale_tril", None if scale_tril is None else scale_tril.detach().clone())
        self.register_buffer("scale", None if scale is None else scale.detach().clone())
        self.register_buffer("indices", None if indices is None else indices.detach().long().clone())

    @property
    def structure(self) -> str:
        if self.scale is not None:
            return "diag"
        return "full" if self.indices is None else "subset"

    def distribution(self, dtype: torch.dtype | None = None) -> dist.Distribution:
        """``q(w)`` as a Pyro distribution with event shape ``(P,)``, in ``dtype`` (default: the
        dtype of the stored ``loc``)."""
        loc = self.loc if dtype is None else self.loc.to(dtype)
        if self.scale is not None:
            return dist.Normal(loc, self.scale.to(loc.dtype)).to_event(1)
        tril = self.scale_tril.to(loc.dtype)
        if self.indices is None:
            return dist.MultivariateNormal(loc, scale_tril=tril)
        return SubsetNormal(loc, self.indices, tril)

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Sample ``w``. ``args``/``kwargs`` are the model's; the draw takes the dtype of the first
        floating-point tensor among them (the data ``x``), since a library model only accepts
        weights in the dtype of its data (``as_guide()`` of a float64 model then still works)."""
        data = [a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.is_floating_point()]
        dtype = data[0].dtype if data else None
        return {self.site: pyro.sample(self.site, self.distribution(dtype))}

    def sample_weights(self, num_samples: int, seed: int | None = None) -> Tensor:
        """``(num_samples, P)`` draws of ``w`` outside Pyro (seeded by ``seed`` if given)."""
        num_samples = check_int(num_samples, "num_samples")
        seed = check_seed(seed)
        if seed is not None:
            pyro.set_rng_seed(seed)
        with torch.no_grad():
            return self.distribution().sample((num_samples,))

    def extra_repr(self) -> str:
        P = self.loc.shape[0]
        K = P if self.indices is None else self.indices.numel()
        return f"structure={self.structure}, num_weights={P}, gaussian_dims={K}"

