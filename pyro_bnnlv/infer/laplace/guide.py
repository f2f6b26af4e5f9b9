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
  subset (the last layer), every other weight fixed at ``loc`` (:class:`SubsetNormal`);
* ``kron``: independent layer blocks with Kronecker-structured covariances (K-FAC,
  :class:`KroneckerNormal`).

The guide has no learnable parameters (its tensors are buffers); ``state_dict`` saves it.
"""

from __future__ import annotations

import math
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions.torch_distribution import TorchDistribution
from pyro.nn import PyroModule
from torch import Tensor
from torch.distributions import constraints

from ..._checks import check_int, check_seed

__all__ = ["KroneckerNormal", "LaplaceGuide", "SubsetNormal"]


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


class KroneckerNormal(TorchDistribution):
    r"""A Gaussian on ``w`` made of independent layer blocks with Kronecker-factored covariances
    (the K-FAC Laplace posterior, :mod:`pyro_bnnlv.infer.laplace.kfac`).

    ``blocks``: ``[(index (out, in), U_out (out, out), U_in (in, in), scale (out, in))]``; block
    ``l`` is ``w[index] = loc[index] + U_out (scale * E) U_in^T`` with ``E`` standard normal
    ``(out, in)``, i.e. ``Cov(vec w[index]) = (U_out (x) U_in) diag(scale^2) (U_out (x) U_in)^T``
    in ``index``'s row-major order. The blocks must cover every coordinate of ``w`` exactly once.
    """

    arg_constraints = {"loc": constraints.real_vector}
    support = constraints.real_vector
    has_rsample = True

    def __init__(
        self, loc: Tensor, blocks: list[tuple[Tensor, Tensor, Tensor, Tensor]], validate_args: Any = None
    ) -> None:
        if loc.dim() != 1:
            raise ValueError(f"loc must have shape (P,); got {tuple(loc.shape)}")
        covered = torch.cat([b[0].reshape(-1) for b in blocks]).sort().values
        if not torch.equal(covered, torch.arange(loc.shape[0], device=covered.device)):
            raise ValueError("the blocks' indices must cover every coordinate of loc exactly once")
        self.loc = loc
        self.blocks = [(i.long(), uo.to(loc.dtype), ui.to(loc.dtype), s.to(loc.dtype)) for i, uo, ui, s in blocks]
        # log det of the covariance's square root: per block log|det (U_out (x) U_in)| + sum log scale
        self._half_logdet = sum(
            i.shape[1] * torch.linalg.slogdet(uo)[1] + i.shape[0] * torch.linalg.slogdet(ui)[1] + s.log().sum()
            for i, uo, ui, s in self.blocks
        )
        super().__init__(torch.Size(), loc.shape, validate_args=validate_args)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> Tensor:
        w = self.loc.expand(*sample_shape, self.loc.shape[-1]).clone()
        for index, U_out, U_in, scale in self.blocks:
            eps = torch.randn(*sample_shape, *index.shape, dtype=self.loc.dtype, device=self.loc.device)
            w[..., index] = self.loc[index] + U_out @ (scale * eps) @ U_in.T
        return w

    def log_prob(self, value: Tensor) -> Tensor:
        quad = torch.zeros(value.shape[:-1], dtype=value.dtype, device=value.device)
        for index, U_out, U_in, scale in self.blocks:
            d = value[..., index] - self.loc[index]  # (..., out, in)
            z = torch.linalg.solve(U_out, d)  # U_out^{-1} d
            z = torch.linalg.solve(U_in, z.transpose(-1, -2)).transpose(-1, -2)  # ... U_in^{-T}
            quad = quad + (z / scale).square().sum((-2, -1))
        P = self.loc.shape[-1]
        return -0.5 * (quad + P * math.log(2 * math.pi)) - self._half_logdet

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def variance(self) -> Tensor:
        var = torch.zeros_like(self.loc)
        for index, U_out, U_in, scale in self.blocks:
            var[index] = torch.einsum("ip,jq,pq->ij", U_out.square(), U_in.square(), scale.square())
        return var

    @property
    def covariance_matrix(self) -> Tensor:
        """The dense ``(P, P)`` covariance (for checks on small networks)."""
        P = self.loc.shape[0]
        cov = torch.zeros(P, P, dtype=self.loc.dtype, device=self.loc.device)
        for index, U_out, U_in, scale in self.blocks:
            U = torch.kron(U_out, U_in)
            idx = index.reshape(-1)
            cov[idx[:, None], idx[None, :]] = (U * scale.reshape(-1).square()) @ U.T
        return cov

    def entropy(self) -> Tensor:
        return 0.5 * self.loc.shape[0] * (1.0 + math.log(2 * math.pi)) + self._half_logdet


class LaplaceGuide(PyroModule):
    """Guide ``q(w) = N(loc, Sigma)`` at site ``"w"`` (sampled Laplace; see the module docstring).

    Args:
        loc: the mean ``w_MAP``, shape ``(P,)``.
        scale_tril: lower Cholesky factor of ``Sigma``: ``(P, P)``, or ``(K, K)`` with ``indices``.
        scale: per-weight standard deviations ``(P,)`` (diagonal ``Sigma``), instead of
            ``scale_tril``.
        indices: the ``K`` coordinates of ``w`` that ``scale_tril`` covers; the rest are fixed.
        kron: K-FAC layer blocks ``[(index, U_out, U_in, scale)]`` (:class:`KroneckerNormal`),
            instead of ``scale_tril`` / ``scale``.
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
        kron: list[tuple[Tensor, Tensor, Tensor, Tensor]] | None = None,
        site: str = "w",
    ) -> None:
        super().__init__()
        if loc.dim() != 1 or not torch.isfinite(loc).all():
            raise ValueError(f"loc must be a finite (P,) tensor; got shape {tuple(loc.shape)}")
        P = loc.shape[0]
        if (scale_tril is not None) + (scale is not None) + (kron is not None) != 1:
            raise ValueError("pass exactly one of scale_tril, scale and kron")
        if kron is not None:
            if indices is not None:
                raise ValueError("indices go with scale_tril, not kron")
            KroneckerNormal(loc, kron)  # checks the blocks
            self.num_blocks = len(kron)
            for k, block in enumerate(kron):
                for name, t in zip(("index", "U_out", "U_in", "scale"), block):
                    self.register_buffer(f"kron{k}_{name}", t.detach().clone())
        else:
            self.num_blocks = 0
        if scale is not None:
            if indices is not None:
                raise ValueError("indices go with scale_tril, not scale")
            if scale.shape != (P,) or not (torch.isfinite(scale).all() and (scale > 0).all()):
                raise ValueError(f"scale must be a positive finite ({P},) tensor; got {tuple(scale.shape)}")
        elif scale_tril is not None:
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
        if self.num_blocks:
            return "kron"
        if self.scale is not None:
            return "diag"
        return "full" if self.indices is None else "subset"

    def distribution(self, dtype: torch.dtype | None = None) -> dist.Distribution:
        """``q(w)`` as a Pyro distribution with event shape ``(P,)``, in ``dtype`` (default: the
        dtype of the stored ``loc``)."""
        loc = self.loc if dtype is None else self.loc.to(dtype)
        if self.num_blocks:
            blocks = [
                tuple(getattr(self, f"kron{k}_{n}") for n in ("index", "U_out", "U_in", "scale"))
                for k in range(self.num_blocks)
            ]
            return KroneckerNormal(loc, blocks)
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
        if self.num_blocks:
            return f"structure=kron, num_weights={P}, blocks={self.num_blocks}"
        return f"structure={self.structure}, num_weights={P}, gaussian_dims={K}"
