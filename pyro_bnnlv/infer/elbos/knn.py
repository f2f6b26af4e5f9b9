r"""ELBOs with the KL term estimated by k-nearest neighbours: NN-HyVI and FuNN-HyVI.

Reference: Pequignot et al. (2020), "Implicit variational inference: the parameter and the
predictor space", eq. 8-9 and Alg. 1-2 of the supplementary material.

:class:`KNNElbo` (NN-HyVI, eq. 8) and :class:`FunctionalKNNElbo` (FuNN-HyVI, eq. 9) minimise

.. math::

    \mathcal V(q) = \widehat{KL}(q, p) - \frac{|D|}{|B|} \sum_{(x, y) \in B}
        \mathbb E_{w \sim q} \ln p(y \mid x, w)  \;\big[- \text{other latents' ELBO terms}\big],

the estimate of the negative ELBO of the full data set. Eq. 8 and 9 print the same objective
multiplied by ``|B|/|D|`` (the KL scaled down instead of the likelihood up): the minimiser and the
gradient direction are identical; we keep Pyro's convention (the one ``Trace_ELBO`` uses with a
subsampled ``pyro.plate``), so losses are comparable across ELBOs and batch sizes.

* The expected log-likelihood is a Monte-Carlo average over ``num_particles`` guide samples
  (paper: 100), vectorised in one plate. The ``"data"`` plate's subsampling scales it by
  ``N/B``, as Pyro does.
* The KL term of the k-NN site (``"w"``) compares ``num_kl_samples`` guide samples with
  ``num_prior_samples`` prior samples (paper: 500 each, ``k = 1``):

  - :class:`KNNElbo`: in parameter space, eq. 4 (:func:`~pyro_bnnlv.stats.knn.knn_kl`);
  - :class:`FunctionalKNNElbo`: in predictor space, eq. 6
    (:func:`~pyro_bnnlv.stats.knn.functional_knn_kl`) on the function values at
    ``num_inputs`` inputs drawn from an input distribution ``nu`` (paper: one draw of ``T = 50``
    inputs per step on the toy, 200 on UCI), both sample sets evaluated at the same inputs.
    Default ``nu``: uniform on the box spanned by the training inputs (sec. 4.1).

  The gradient flows through the guide samples (the estimators are differentiable in the
  distances); the prior samples are constants.
* Any other latent site (e.g. the per-datapoint ``"z"`` of a BNN+LV, under a mean-field guide)
  contributes its usual ``log p - log q`` terms, so these ELBOs work with
  :func:`~pyro_bnnlv.guides.hypernet_lv_guide`. Guides with a density work as well: FuNN-MFVI is
  ``AutoNormal`` + :class:`FunctionalKNNElbo`.

Cost and bias: a step at the paper's settings (the defaults) costs several MFVI steps, and
:meth:`KNNElbo.fast` is cheaper, for exploring only; the k-NN KL is biased low the more so the
wider ``q`` is, so as an objective it can push the guide beyond the prior's draws
(:mod:`pyro_bnnlv.stats.knn`, "Support"; measurements: docs/design-notes.md, 'infer.elbos.knn').

``loss``, ``loss_and_grads`` and ``differentiable_loss`` all go through one differentiable
function (:meth:`KNNElbo.loss_components`), so ``SVI``, ``fit_svi`` and ``ELBOModule`` optimise
the same objective. Only reparameterised guides are supported (the library's all are).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer.elbo import ELBO
from pyro.poutine.util import prune_subsample_sites
from torch import Tensor

from ..._checks import check_int, check_real
from ...stats.knn import functional_knn_kl, input_sampler, knn_kl

__all__ = ["FunctionalKNNElbo", "KNNElbo", "input_box"]


#: what the estimators' support warning means when the first sample is the guide being fitted
_IN_AN_ELBO = (
    ". In this ELBO: part of the guide's draws lie beyond the prior's, where the k-NN KL is biased "
    "low and rewards moving further out; a fit that goes on like this tends to end over-confident "
    "(a small noise sd; module docstring, 'Bias as an objective'). Compare its test log-likelihood "
    "with MFVI's before trusting it"
)


def input_box(x: Tensor, margin: float = 0.0) -> dist.Distribution:
    """Uniform distribution on the hyper-rectangle spanned by the rows of ``x`` (sec. 4.1).

    Each feature ranges over ``[min - margin * range, max + margin * range]``. Returns a Pyro
    ``Uniform(...).to_event(1)``; ``input_box(x).sample((T,))`` is ``(T, D)``.

    As ``nu`` of :class:`FunctionalKNNElbo` it is where the guide learns to be uncertain; the
    paper's UCI setting is ``margin=0``, in 1-D pad it (``margin=1.0`` triples the range), as the
    paper's toy does with ``U[-4, 2]`` around data in ``[-1, 1]`` (docs/design-notes.md,
    'infer.elbos.knn').
    """
    if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[0] < 2:
        raise ValueError(f"x must be a (N, D) tensor with N >= 2, got {getattr(x, 'shape', type(x))}")
    if not torch.isfinite(x).all():
        raise ValueError("x contains NaN or infinite values")
    lo, hi = x.min(0).values, x.max(0).values
    span = hi - lo
    if (span <= 0).any():
        raise ValueError("x is constant along some feature: the box would be degenerate")
    return dist.Uniform(lo - margin * span, hi + margin * span).to_event(1)


class KNNElbo(ELBO):
    r"""NN-HyVI's objective (eq. 8): expected log-likelihood minus the k-NN KL in parameter space.

    Args:
        num_particles: guide samples for the expected log-likelihood (paper: 100).
        num_kl_samples: guide samples for the KL estimate (paper: 500); when equal to
            ``num_particles`` the same samples serve both terms.
        num_prior_samples: prior samples for the KL estimate (paper: 500; at least ``k + 1``).
        k: neighbour order of the estimator (paper: 1).
        site: the latent site whose KL is estimated by k-NN (``"w"``); it must be global.
        prior_sampler: optional ``n -> (n, *site shape)`` prior samples (e.g. an implicit prior);
            default: samples of the model's own distribution at ``site``.
        max_plate_nesting: as in Pyro (guessed from one run when not given).

    See the module docstring for the estimator and its scaling.
    """

    def __init__(
        self,
        num_particles: int = 100,
        num_kl_samples: int = 500,
        num_prior_samples: int = 500,
        k: int = 1,
        site: str = "w",
        prior_sampler: Callable[[int], Tensor] | None = None,
        max_plate_nesting: float = float("inf"),
    ) -> None:
        check_int(num_particles, "num_particles")
        check_int(k, "k")
        check_int(num_kl_samples, "num_kl_samples", minimum=k + 1)
        check_int(num_prior_samples, "num_prior_samples", minimum=k + 1)
        if prior_sampler is not None and not callable(prior_sampler):
            raise ValueError("prior_sampler must be a callable n -> (n, ...) samples")
        super().__init__(num_particles=num_particles, max_plate_nesting=max_plate_nesting, vectorize_particles=False)
        self.num_kl_samples = num_kl_samples
        self.num_prior_samples = num_prior_samples
        self.k = k
        self.site = site
        self.prior_sampler = prior_sampler
        self._nesting = None if max_plate_nesting == float("inf") else int(max_plate_nesting)
        self._warned: set[tuple[type, str]] = set()

    @classmethod
    def fast(cls, **overrides: Any) -> "KNNElbo":
        """A cheaper preset for exploring: ``num_particles=10``, ``num_kl_samples=100``,
        ``num_prior_samples=100`` (the paper: 100, 500, 500); ``overrides`` set any argument
        (e.g. ``FunctionalKNNElbo.fast(input_dist=nu)``). Noisier, more biased KL estimates
        (docs/design-notes.md, 'infer.elbos.knn')."""
        settings = {"num_particles": 10, "num_kl_samples": 100, "num_prior_samples": 100}
        settings.update(overrides)
        return cls(**settings)

    # -- traces ------------------------------------------------------------------------------------
    def _model_nesting(self, model, guide, args, kwargs) -> int:
        """Max plate nesting of the model and guide, from one run (no log-densities needed)."""
        if self._nesting is None:
            with poutine.block():
                guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
                model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
            dims = [
                frame.dim
                for trace in (model_trace, guide_trace)
                for site in trace.nodes.values()
                if site["type"] == "sample"
                for frame in site["cond_indep_stack"]
                if frame.vectorized
            ]
            self._nesting = -min(dims) if dims else 0
        return self._nesting

    def _particle_traces(self, model, guide, num: int, args, kwargs, with_model: bool = True):
        dim = -(self._model_nesting(model, guide, args, kwargs) + 1)
        with pyro.plate("num_particles_vectorized", num, dim=dim):
            guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
            if not with_model:
                return guide_trace, None
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(*args, **kwargs)
        return guide_trace, model_trace

    def _site_samples(self, trace, num: int) -> Tensor:
        """Flat ``(num, P)`` values of the k-NN site (its presence is checked in ``loss_components``)."""
        return trace.nodes[self.site]["value"].reshape(num, -1)

    def _prior_samples(self, model, args, kwargs) -> Tensor:
        n = self.num_prior_samples
        if self.prior_sampler is not None:
            samples = torch.as_tensor(self.prior_sampler(n))
            if samples.shape[0] != n:
                raise ValueError(f"prior_sampler({n}) returned {samples.shape[0]} samples")
            return samples.reshape(n, -1).detach()
        with poutine.block(), torch.no_grad():
            trace = poutine.trace(model).get_trace(*args, **kwargs)
        site = trace.nodes.get(self.site)
        if site is None or site["type"] != "sample":
            raise ValueError(f"the model has no sample site {self.site!r}")
        if site["cond_indep_stack"]:
            raise ValueError(f"site {self.site!r} lies in a plate: the k-NN KL needs a global site")
        return site["fn"].sample((n,)).reshape(n, -1).detach()

    def _get_trace(self, model, guide, args, kwargs):  # ELBO's abstract hook; not used here
        raise NotImplementedError("KNNElbo builds its own vectorised traces (loss_components)")

    # -- the objective --------------------------------------------------------------------------------
    def _refuse_point_mass(self, q_samples: Tensor) -> None:
        if bool((q_samples == q_samples[:1]).all()):
            raise ValueError(
                f"the guide gave {q_samples.shape[0]} identical samples of {self.site!r}: a point "
                f"mass (e.g. AutoDelta) has no k-NN KL, the term would be a constant and "
                f"{type(self).__name__} would train an unregularised MAP. Use a guide with spread "
                "(AutoNormal, HypernetGuide, ...), or pb.train_map / AutoDelta with Trace_ELBO "
                "for MAP"
            )

    def _warn_once(self, estimate: Callable[..., Tensor], *args: Any, **kwargs: Any) -> Tensor:
        """``estimate(*args, **kwargs)``, passing on each kind of warning once per ELBO.

        The estimators' sample-quality warnings (``stats.knn``: high dimension, support) hold
        measured shares that change every step; warnings differing only in their numbers are one
        kind.
        """
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = estimate(*args, **kwargs)
        for w in caught:
            kind = (w.category, re.sub(r"\d+(\.\d+)?", "#", str(w.message)))
            if kind in self._warned:
                continue
            self._warned.add(kind)
            message = (
                f"{w.message}{_IN_AN_ELBO if 'lie outside the region' in str(w.message) else ''} "
                f"[{type(self).__name__} shows each kind of warning once per instance]"
            )
            warnings.warn_explicit(message, w.category, w.filename, w.lineno)
        return value

    def kl_estimate(self, q_samples: Tensor, prior_samples: Tensor, model, args, kwargs) -> Tensor:
        """``KL(q, p)`` of the k-NN site from flat samples ``(n, P)`` (eq. 4)."""
        self._refuse_point_mass(q_samples)
        return self._warn_once(knn_kl, q_samples, prior_samples.to(q_samples.dtype), k=self.k)

    def loss_components(self, model, guide, *args, **kwargs) -> dict[str, Tensor]:
        """The objective's parts as differentiable tensors.

        ``ell``: the (minibatch-rescaled) expected log-likelihood plus the ``log p - log q``
        terms of latents other than ``site``; ``kl``: the k-NN KL estimate; ``loss = kl - ell``.
        """
        n = self.num_particles
        guide_trace, model_trace = self._particle_traces(model, guide, n, args, kwargs)
        model_trace, guide_trace = prune_subsample_sites(model_trace), prune_subsample_sites(guide_trace)

        def keep_model(name, site):
            return name != self.site

        if self.site not in model_trace.nodes or self.site not in guide_trace.nodes:
            raise ValueError(
                f"the model or guide has no site {self.site!r}; KNNElbo(site=...) "
                "names the latent whose KL is estimated by nearest neighbours"
            )
        latents = [
            name for name, site in model_trace.nodes.items() if site["type"] == "sample" and not site["is_observed"]
        ]
        only_knn_site = latents == [self.site]

        def keep_guide(name, site):
            # The k-NN site's own density (the site, an autoguide's "<site>_unconstrained", the
            # hypernet's noise) is replaced by the KL estimate; other latents keep log q.
            if only_knn_site or name in (self.site, self.site + "_unconstrained"):
                return False
            return not site["infer"].get("implicit_noise", False)

        for name, site in guide_trace.nodes.items():
            if site["type"] == "sample" and keep_guide(name, site) and not site["fn"].has_rsample:
                raise NotImplementedError(f"KNNElbo needs reparameterised guide sites; {name!r} is not")
        model_trace.compute_log_prob(site_filter=keep_model)
        guide_trace.compute_log_prob(site_filter=keep_guide)
        ell = 0.0
        for name, site in model_trace.nodes.items():
            if site["type"] == "sample" and keep_model(name, site):
                ell = ell + site["log_prob_sum"]
        for name, site in guide_trace.nodes.items():
            if site["type"] == "sample" and keep_guide(name, site):
                ell = ell - site["log_prob_sum"]
        ell = torch.as_tensor(ell) / n

        if self.num_kl_samples == n:
            q_samples = self._site_samples(guide_trace, n)
        else:
            kl_trace, _ = self._particle_traces(model, guide, self.num_kl_samples, args, kwargs, with_model=False)
            q_samples = self._site_samples(kl_trace, self.num_kl_samples)
        prior = self._prior_samples(model, args, kwargs)
        if prior.shape[1] != q_samples.shape[1]:
            raise ValueError(f"prior samples have {prior.shape[1]} coordinates, guide samples {q_samples.shape[1]}")
        kl = self.kl_estimate(q_samples, prior, model, args, kwargs)
        return {"ell": ell, "kl": kl, "loss": kl - ell}

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        return self.loss_components(model, guide, *args, **kwargs)["loss"]

    def loss(self, model, guide, *args, **kwargs) -> float:
        with torch.no_grad():
            return float(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        if loss.requires_grad:
            loss.backward(retain_graph=self.retain_graph)
        return float(loss.detach())


class FunctionalKNNElbo(KNNElbo):
    r"""FuNN-HyVI's objective (eq. 9): the KL estimated in predictor space (eq. 6).

    Args (besides :class:`KNNElbo`'s):
        input_dist: the input distribution ``nu``: a callable ``T -> (T, D)``, a torch/Pyro
            ``Distribution`` sampled as ``(T,)``, or a tensor of inputs whose rows are drawn
            uniformly. Default: :func:`input_box` of the training inputs (the model's first
            argument, the full ``x`` even when minibatching), the paper's UCI choice; with 1-D
            inputs pad it (``input_box(x, margin=1.0)``) or the fit has no reason to be uncertain
            outside the data's range (see :func:`input_box`).
        train_fraction: share of each draw's inputs taken from the training inputs instead of
            ``nu`` (a mixture, 0 by default).
        num_inputs: ``T`` (paper: 50 on the toy, 200 on UCI).
        num_input_draws: independent draws of the ``T`` inputs averaged per step (paper: 1).
        predictor: ``(x (T, D), w (S, P)) -> (S, T[, O])``; default ``model.f``.

    **Keep** ``num_kl_samples == num_prior_samples`` **(the default)**. Eq. 4 multiplies the mean
    log-distance ratio by the ambient dimension ``d = T*O``, but function values of a network with
    ``P`` weights fill at most a ``P``-dimensional manifold of R^d, and often ``T*O > P``. On a
    ``d'``-dimensional manifold the estimate is off by about ``(d/d' - 1) ln((n-1)/m)``, zero for
    ``m = n - 1`` (example figures: docs/design-notes.md, 'infer.elbos.knn').
    """

    def __init__(
        self,
        num_particles: int = 100,
        num_kl_samples: int = 500,
        num_prior_samples: int = 500,
        k: int = 1,
        input_dist: Any = None,
        train_fraction: float = 0.0,
        num_inputs: int = 50,
        num_input_draws: int = 1,
        predictor: Callable[[Tensor, Tensor], Tensor] | None = None,
        site: str = "w",
        prior_sampler: Callable[[int], Tensor] | None = None,
        max_plate_nesting: float = float("inf"),
    ) -> None:
        super().__init__(
            num_particles=num_particles,
            num_kl_samples=num_kl_samples,
            num_prior_samples=num_prior_samples,
            k=k,
            site=site,
            prior_sampler=prior_sampler,
            max_plate_nesting=max_plate_nesting,
        )
        check_int(num_inputs, "num_inputs")
        check_int(num_input_draws, "num_input_draws")
        self.num_inputs = num_inputs
        self.num_input_draws = num_input_draws
        if not 0.0 <= check_real(train_fraction, "train_fraction") <= 1.0:
            raise ValueError(f"train_fraction must lie in [0, 1], got {train_fraction!r}")
        if input_dist is not None and not (
            callable(input_dist) or isinstance(input_dist, (Tensor, torch.distributions.Distribution))
        ):
            raise ValueError("input_dist must be a callable T -> (T, D), a Distribution or a tensor")
        self.input_dist = input_dist
        self.train_fraction = float(train_fraction)
        self.predictor = predictor

    def _draw_inputs(self, x_train: Tensor | None) -> Tensor:
        T = self.num_inputs
        n_train = int(round(self.train_fraction * T))
        parts = []
        if n_train:
            if x_train is None:
                raise ValueError("train_fraction > 0 needs the training inputs as the model's first argument")
            parts.append(input_sampler(x_train)(n_train))
        n_nu = T - n_train
        if n_nu:
            nu = self.input_dist
            if nu is None:
                if x_train is None:
                    raise ValueError(
                        "the default input distribution needs the training inputs "
                        "as the model's first argument; or pass input_dist="
                    )
                nu = input_box(x_train)
            drawn = input_sampler(nu)(n_nu)
            if x_train is not None and x_train.dim() >= 1:
                width = x_train.reshape(x_train.shape[0], -1).shape[1]
                if drawn.shape[-1] != width:
                    raise ValueError(
                        f"input_dist draws inputs with {drawn.shape[-1]} columns (a draw of {n_nu} has shape "
                        f"{tuple(drawn.shape)}) but the training inputs x have {width} (shape "
                        f"{tuple(x_train.shape)}): pass an input_dist over the same {width} features, e.g. "
                        "pyro_bnnlv.infer.input_box(x, margin=1.0)"
                    )
            parts.append(drawn)
        return torch.cat(parts).to(torch.get_default_dtype() if x_train is None else x_train.dtype)

    def kl_estimate(self, q_samples: Tensor, prior_samples: Tensor, model, args, kwargs) -> Tensor:
        """``KL(q, p)`` in predictor space (eq. 6), averaged over ``num_input_draws`` draws."""
        self._refuse_point_mass(q_samples)
        predictor = self.predictor or getattr(model, "f", None)
        if predictor is None:
            raise ValueError("FunctionalKNNElbo needs predictor=(x, w) -> f, or a model with .f(x, w)")
        x_train = args[0] if args and isinstance(args[0], Tensor) else None
        f_q, f_p = [], []
        for _ in range(self.num_input_draws):
            x = self._draw_inputs(x_train)
            f_q.append(predictor(x, q_samples))
            f_p.append(predictor(x, prior_samples.to(q_samples.dtype)).detach())
        return self._warn_once(functional_knn_kl, torch.stack(f_q), torch.stack(f_p), k=self.k)
