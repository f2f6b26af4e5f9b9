r"""Observation models of a BNN: what ``"obs"`` is given the network output ``f(x; w)``.

* :class:`Gaussian` (regression, the papers' model): ``y_n ~ N(f(x_n; w), sigma^2 I_L)``; the noise
  ``sigma`` belongs to the model (``noise_scale``, fixed or learned).
* :class:`Categorical` (``K >= 2`` classes): ``y_n ~ Cat(softmax(f(x_n; w)))``, ``f`` the ``K``
  logits; labels are integers ``0..K-1``.
* :class:`Bernoulli` (two classes, one output): ``y_n ~ Bernoulli(sigmoid(f(x_n; w)))``; labels 0/1.

Each object knows the targets it accepts (:meth:`Likelihood.check_targets`, errors naming the fix),
the distribution of ``"obs"`` (:meth:`Likelihood.distribution`), the log-likelihood of a batch of
outputs (:meth:`Likelihood.log_prob`) and, for the classifiers, the predictive class probabilities
(:meth:`Likelihood.probs`) and the Hessian of ``-log p(y | f)`` in ``f`` used by the Gauss-Newton
curvature of the Laplace approximation (:meth:`Likelihood.hessian`; Immer, Korzepa & Bauer 2021,
arXiv:2008.08400, eq. 4: ``Lambda_n = diag(p_n) - p_n p_n^T`` for the softmax).
"""

from __future__ import annotations

from typing import Any

import pyro.distributions as dist
import torch
from torch import Tensor

__all__ = ["LIKELIHOODS", "Bernoulli", "Categorical", "Gaussian", "Likelihood", "as_likelihood"]


class Likelihood:
    """Base class: ``name``, ``classification`` and the methods below."""

    name: str = ""
    classification: bool = False

    def check_outputs(self, out_features: int) -> None:
        """``ValueError`` unless a network with ``out_features`` outputs fits this likelihood."""

    def check_targets(self, y: Tensor, out_features: int) -> None:
        """``ValueError``/``TypeError`` naming the fix for targets this likelihood cannot take
        (``y`` already has the right number of rows)."""

    def observed(self, y: Tensor | None, out_features: int) -> Tensor | None:
        """Targets in the shape and dtype of ``"obs"``."""
        return y

    def distribution(self, f: Tensor, noise: Tensor | None = None) -> dist.Distribution:
        """The distribution of ``"obs"`` given outputs ``f (..., N, L)`` (batch shape ``(..., N)``)."""
        raise NotImplementedError

    def log_prob(self, f: Tensor, y: Tensor, noise: Tensor | None = None) -> Tensor:
        """``log p(y_n | f_n)`` per point: ``f (..., N, L)``, ``y`` as :meth:`observed` -> ``(..., N)``."""
        return self.distribution(f, noise).log_prob(y)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


class Gaussian(Likelihood):
    """``y_n ~ N(f(x_n; w), sigma^2 I_L)`` with the model's ``sigma`` (Yacoby et al. 2022,
    arXiv:1911.00569, sec. 2); a single output reads ``y (N,)``."""

    name = "gaussian"

    def observed(self, y: Tensor | None, out_features: int) -> Tensor | None:
        if y is not None and out_features == 1 and y.dim() == 2:
            return y.squeeze(-1)
        return y

    def distribution(self, f: Tensor, noise: Tensor | None = None) -> dist.Distribution:
        if f.shape[-1] == 1:  # eager code (the model's own traced site keeps to out_features)
            return dist.Normal(f.squeeze(-1), noise)
        return dist.Normal(f, noise).to_event(1)


def _check_labels(y: Tensor, num_classes: int, name: str) -> None:
    if y.dtype == torch.bool:
        return
    if y.is_floating_point() or y.is_complex():
        raise TypeError(
            f"y has dtype {y.dtype}, but the {name} likelihood takes class labels: integers 0..{num_classes - 1} "
            f"(y.long() if they are whole numbers; for real-valued targets use likelihood='gaussian')"
        )
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(
            f"y holds labels in [{int(y.min())}, {int(y.max())}] but the network has {num_classes} classes "
            f"(labels 0..{num_classes - 1}): relabel the classes, or give the network as many outputs as classes"
        )


class Categorical(Likelihood):
    """``y_n ~ Cat(softmax(f(x_n; w)))`` over ``K = out_features >= 2`` classes; ``y (N,)`` integer labels."""

    name = "categorical"
    classification = True

    def check_outputs(self, out_features: int) -> None:
        if out_features < 2:
            raise ValueError(
                f"the categorical likelihood needs one network output (logit) per class, K >= 2; the network has "
                f"{out_features}: build it with out_features=K, or use likelihood='bernoulli' for two classes "
                f"with one output"
            )

    def check_targets(self, y: Tensor, out_features: int) -> None:
        if y.dim() != 1:
            raise ValueError(
                f"y must be a vector of class labels (N,) for the categorical likelihood; got shape "
                f"{tuple(y.shape)} (one-hot targets: y = y_onehot.argmax(-1))"
            )
        _check_labels(y, out_features, "categorical")

    def observed(self, y: Tensor | None, out_features: int) -> Tensor | None:
        return None if y is None else y.long()

    def distribution(self, f: Tensor, noise: Tensor | None = None) -> dist.Distribution:
        return dist.Categorical(logits=f)

    def probs(self, f: Tensor) -> Tensor:
        """Class probabilities ``softmax(f)``, ``(..., K)``."""
        return torch.softmax(f, -1)

    def log_probs(self, f: Tensor) -> Tensor:
        """Log class probabilities ``log_softmax(f)``, ``(..., K)``."""
        return torch.log_softmax(f, -1)

    def hessian(self, f: Tensor) -> Tensor:
        """``d^2 (-log p(y | f)) / df^2 = diag(p) - p p^T`` per point, ``(N, K, K)`` (independent of ``y``)."""
        p = torch.softmax(f, -1)
        return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


class Bernoulli(Likelihood):
    """``y_n ~ Bernoulli(sigmoid(f(x_n; w)))``, one output; ``y (N,)`` labels 0/1 (ints, bools or 0./1.)."""

    name = "bernoulli"
    classification = True

    def check_outputs(self, out_features: int) -> None:
        if out_features != 1:
            raise ValueError(
                f"the bernoulli likelihood takes one network output (the logit of class 1); the network has "
                f"{out_features}: build it with out_features=1, or use likelihood='categorical' for K outputs"
            )

    def check_targets(self, y: Tensor, out_features: int) -> None:
        if y.dim() == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.dim() != 1:
            raise ValueError(
                f"y must be a vector of 0/1 labels (N,) for the bernoulli likelihood; got shape {tuple(y.shape)}"
            )
        if y.is_floating_point():
            if not bool(((y == 0) | (y == 1)).all()):
                raise ValueError(
                    "y must hold 0/1 labels for the bernoulli likelihood; it has other values "
                    "(for real-valued targets use likelihood='gaussian')"
                )
            return
        _check_labels(y, 2, "bernoulli")

    def observed(self, y: Tensor | None, out_features: int, dtype: torch.dtype | None = None) -> Tensor | None:
        """0/1 labels as floats (the Bernoulli's values) in ``dtype`` (the model's; default: float
        labels keep theirs, integer ones take torch's default dtype)."""
        if y is None:
            return None
        y = y.reshape(-1) if y.dim() == 2 else y
        if dtype is not None:
            return y.to(dtype)
        return y if y.is_floating_point() else y.to(torch.get_default_dtype())

    def distribution(self, f: Tensor, noise: Tensor | None = None) -> dist.Distribution:
        return dist.Bernoulli(logits=f.squeeze(-1))

    def log_prob(self, f: Tensor, y: Tensor, noise: Tensor | None = None) -> Tensor:
        return dist.Bernoulli(logits=f.squeeze(-1)).log_prob(y.to(f.dtype))

    def probs(self, f: Tensor) -> Tensor:
        """Probabilities of the two classes ``(1 - sigmoid(f), sigmoid(f))``, ``(..., 2)``."""
        return torch.cat([torch.sigmoid(-f), torch.sigmoid(f)], -1)

    def log_probs(self, f: Tensor) -> Tensor:
        """Log probabilities of the two classes, ``(..., 2)``."""
        return torch.cat([torch.nn.functional.logsigmoid(-f), torch.nn.functional.logsigmoid(f)], -1)

    def hessian(self, f: Tensor) -> Tensor:
        """``d^2 (-log p(y | f)) / df^2 = p (1 - p)``, ``(N, 1, 1)``."""
        p = torch.sigmoid(f)
        return (p * (1 - p)).unsqueeze(-1)


LIKELIHOODS: dict[str, type[Likelihood]] = {"gaussian": Gaussian, "categorical": Categorical, "bernoulli": Bernoulli}


def as_likelihood(value: Any) -> Likelihood:
    """A :class:`Likelihood` from its name (``"gaussian"``, ``"categorical"``, ``"bernoulli"``) or an instance."""
    if isinstance(value, Likelihood):
        return value
    if isinstance(value, str) and value.lower() in LIKELIHOODS:
        return LIKELIHOODS[value.lower()]()
    raise ValueError(f"likelihood must be one of {sorted(LIKELIHOODS)} (or a pyro_bnnlv Likelihood), got {value!r}")
