r"""Mean-field Gaussian VI for the library's networks: ``AutoNormal`` with a start that works.

The variational family is the fully factorised Gaussian of Bayes by Backprop (Blundell,
Cornebise, Kavukcuoglu & Wierstra 2015, arXiv:1505.05424, sec. 3.2),

.. math::

    q_\phi(w) = \prod_{i=1}^{P} \mathcal N(w_i;\ \mu_i, s_i^2), \qquad \phi = (\mu, s),

fitted by maximising the ELBO ``E_q[log p(y | x, w)] - KL(q || p)`` (Foong, Li, Hernandez-Lobato
& Turner 2019, "'In-Between' Uncertainty in Bayesian Neural Networks", arXiv:1906.11537, sec. 2,
eq. 1 is its Monte Carlo form). It is Pyro's :class:`~pyro.infer.autoguide.AutoNormal`; only the
starting point differs: Pyro's defaults (``init_to_feasible``, ``init_scale=0.1``) start at the
symmetric saddle where all hidden units are identical and fit far worse (docs/design-notes.md,
'guides.mean_field').

:class:`MeanField` starts the means at a PyTorch-default random network
(:func:`~pyro_bnnlv.guides.init.init_to_network`) and every ``s_i`` at ``init_scale = 0.01``,
the recipe of Foong et al. (2019, App. D: means from a random initialisation, variances
``1e-5``) at a scale that Adam moves within a few hundred steps. For models with per-datapoint
latents (BNN+LV) it also passes the model's ``create_plates``, so minibatches subsample the
latents with the data.
"""

from __future__ import annotations

from collections.abc import Callable

from pyro.infer.autoguide import AutoNormal, init_to_feasible

from .._checks import check_seed
from ..nets import FlatNet
from ..param_names import own_param_names
from .init import check_init_scale, init_to_network

__all__ = ["MeanField"]


class MeanField(AutoNormal):
    """``AutoNormal`` (mean-field Gaussian VI) with defaults for neural networks.

    Args:
        model: a Pyro model; for the library's models (anything with a
            :class:`~pyro_bnnlv.nets.FlatNet` in ``model.net``) the weight site ``"w"`` starts at
            ``model.net.init_weights`` drawn with ``seed``.
        init_loc_fn: overrides that start (any Pyro ``init_loc_fn``, e.g.
            ``pb.init_to_network(model, weights=w_map)``). Default: ``init_to_network(model,
            seed)`` for the library's models, Pyro's ``init_to_feasible`` otherwise.
        init_scale: initial standard deviation of every factor, a positive finite number
            (default 0.01; Pyro's is 0.1).
        create_plates: as in ``AutoNormal``; default ``model.create_plates`` when the model has
            one (BNN+LV), so its latents ``z`` are subsampled with minibatches.
        seed: seed of the random network start (restarts: 0, 1, 2, ...; an integer in
            ``[0, 2**32)``, NumPy integers included; ``None``: torch's global generator).

    ``MeanField(model)`` is ``AutoNormal(model, init_loc_fn=pb.init_to_network(model, seed),
    init_scale=0.01)``, usable wherever an ``AutoNormal`` is, with its own parameter-name prefix
    (``"MeanField_3.locs.w"``, :func:`~pyro_bnnlv.param_names.own_param_names`).
    """

    def __init__(
        self,
        model: Callable,
        *,
        init_loc_fn: Callable | None = None,
        init_scale: float = 0.01,
        create_plates: Callable | None = None,
        seed: int | None = 0,
    ) -> None:
        seed = check_seed(seed)  # a non-integer seed is an ArgumentTypeError (TypeError and ValueError)
        init_scale = check_init_scale(init_scale)
        if not callable(model):
            raise TypeError(f"model must be a Pyro model (callable), got {type(model).__name__}")
        if init_loc_fn is not None and not callable(init_loc_fn):
            raise TypeError(
                f"init_loc_fn must be a Pyro init function site -> value (or None), got {type(init_loc_fn).__name__}"
            )
        if init_loc_fn is None:
            has_net = isinstance(getattr(model, "net", None), FlatNet)
            init_loc_fn = init_to_network(model, seed=seed) if has_net else init_to_feasible
        if create_plates is None:
            create_plates = getattr(model, "create_plates", None)
        self.seed = seed
        super().__init__(model, init_loc_fn=init_loc_fn, init_scale=init_scale, create_plates=create_plates)
        own_param_names(self)

    def extra_repr(self) -> str:
        return f"init_scale={self._init_scale}, seed={self.seed}"
