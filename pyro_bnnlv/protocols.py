"""What a model provides, as small public ``typing.Protocol`` s (checked with ``isinstance``).

The functions that need something of a model say which capability, instead of probing
attributes one by one (``pb.protocols``):

* :class:`ChecksData`: ``check_data(x, y)``, clear errors before Pyro traces anything;
* :class:`HasNetwork`: a :class:`~pyro_bnnlv.nets.FlatNet` ``net`` with a flat weight vector;
* :class:`HasLatents`: ``latent_dim`` latent inputs per datapoint or per code;
* :class:`RegressionModel`: a Pyro model ``model(x, y=None)`` with a flat weight site ``"w"``,
  ``check_data``, ``f(x, w)`` (the network output for a batch of weight samples) and
  ``predictive_components(x, samples)`` (the predictive mean and scale per sample): BNN,
  BNN+LV, projected BNN, the linear model;
* :class:`NetworkModel`: a regression model on a :class:`~pyro_bnnlv.nets.FlatNet` ``net``
  (BNN, BNN+LV, projected BNN);
* :class:`LatentModel`: a regression model with latent variables besides ``w``
  (``latent_dim``: the per-datapoint inputs ``z`` of a BNN+LV, the code ``z`` of a projected
  BNN), for which a MAP or a Laplace fit of ``w`` alone is not the model's.

A model of your own that provides these members is treated like ours.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from .nets import FlatNet

__all__ = ["ChecksData", "HasLatents", "HasNetwork", "LatentModel", "NetworkModel", "RegressionModel"]


@runtime_checkable
class ChecksData(Protocol):
    """A model that checks its data (shapes, dtypes, NaN) and raises errors naming the fix."""

    def check_data(self, x: Tensor, y: Tensor | None = None, **kwargs: Any) -> None: ...


@runtime_checkable
class HasNetwork(Protocol):
    """A model on a network with one flat weight vector (``net``)."""

    net: FlatNet


@runtime_checkable
class HasLatents(Protocol):
    """A model with ``latent_dim`` latent variables besides the weights."""

    latent_dim: int


@runtime_checkable
class RegressionModel(Protocol):
    """A regression model of the library (see the module docstring)."""

    def __call__(self, x: Tensor, y: Tensor | None = None, **kwargs: Any) -> Any: ...

    def check_data(self, x: Tensor, y: Tensor | None = None, **kwargs: Any) -> None: ...

    def f(self, x: Tensor, w: Tensor) -> Tensor: ...

    def predictive_components(self, x: Tensor, samples: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class NetworkModel(RegressionModel, Protocol):
    """A regression model on a network with a flat weight vector (``net``)."""

    net: FlatNet


@runtime_checkable
class LatentModel(RegressionModel, Protocol):
    """A regression model with latent variables besides the weights (``latent_dim`` of them per
    datapoint or per code)."""

    latent_dim: int
