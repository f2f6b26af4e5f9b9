"""The reliability probe of issue 16: what a demanding user tries, kept as a regression test.

Each case is one call at the public API on tiny data with its expected outcome: either a clean
error (the exception type and a ``match=`` on the message, which names the argument and, where
there is one, the fix) or a correct value checked against an analytic answer. The cases were
silent wrong results or cryptic errors before issue 16; the ids say which item they cover.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv.stats.dependence import ksg_mutual_information
from pyro_bnnlv.stats.knn import functional_knn_kl, knn_entropy, knn_kl

F64 = torch.float64


@dataclass
class Raises:
    """Expect ``exc`` whose message matches the regular expression ``match``."""

    exc: type[BaseException]
    match: str


@dataclass
class Value:
    """Expect ``check(result)`` to hold; ``what`` says what is checked (shown on failure)."""

    check: Callable[[Any], bool]
    what: str


@dataclass
class Warns:
    """Expect a warning of category ``category`` matching ``match`` (and a result)."""

    category: type[Warning]
    match: str


CASES: dict[str, tuple[Callable[[], Any], Raises | Value | Warns]] = {}


def case(name: str, expect: Raises | Value | Warns):
    def deco(fn: Callable[[], Any]) -> Callable[[], Any]:
        assert name not in CASES, name
        CASES[name] = (fn, expect)
        return fn

    return deco


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------
# 16.5: k-NN estimators (ties, d >> n, point-mass guides)
# ----------------------------------------------------------------------------------------------
@case("16.5 knn_kl(s, s) is 0", Value(lambda v: v.item() == 0.0, "exactly 0"))
def _():
    s = torch.randn(200, 3, generator=_gen())
    return knn_kl(s, s)


@case("16.5 duplicated rows: the distinct rows' estimate",
      Value(lambda v: abs(v[0] - v[1]) < 1e-6, "equal to the estimate without the copies"))
def _():
    g = _gen()
    s, q = torch.randn(200, 3, generator=g), 1.5 * torch.randn(300, 3, generator=g)
    return knn_kl(torch.cat([s, s]), q).item(), knn_kl(s, q).item()


@case("16.5 duplicated rows: entropy of N(0, I_2) is ln(2 pi e)",
      Value(lambda v: abs(v - math.log(2 * math.pi * math.e)) < 0.1, "within 0.1 nats"))
def _():
    s = torch.randn(4000, 2, generator=_gen(), dtype=F64)  # sd of the estimate ~0.03
    return knn_entropy(torch.cat([s, s[:1000]])).item()


@case("16.5 functional knn_kl of a sample with itself is 0", Value(lambda v: v == 0.0, "exactly 0"))
def _():
    f = torch.randn(3, 40, 8, generator=_gen())
    return functional_knn_kl(f, f).item()


@case("16.5 compare_posteriors(mcmc samples, same samples) is 0 in both spaces",
      Value(lambda v: (v.abs() < 1e-12).all().all(), "all four KLs exactly 0"))
def _():
    model = pb.BNN(pb.MLP(1, [4], 1))
    w = torch.randn(60, model.num_weights, generator=_gen())
    out = pb.compare_posteriors({"w": w}, {"w": w}, model, input_dist=torch.randn(30, 1),
                                num_samples=60, num_draws=3, num_inputs=5, seed=0)
    return out.select_dtypes("number")


@case("16.5 d >> n warns naming the ratio", Warns(UserWarning, r"d=20000 is 667 times .*n=30"))
def _():
    g = _gen()
    return knn_kl(torch.randn(30, 20_000, generator=g), 2 * torch.randn(30, 20_000, generator=g))


@case("16.5 point mass refused", Raises(ValueError, r"samples has 1 distinct rows"))
def _():
    return knn_entropy(torch.ones(50, 3))


def _knn_fit_with_autodelta(loss):
    from pyro.infer.autoguide import AutoDelta

    model = pb.BNN(pb.MLP(1, [4], 1))
    return pb.fit_svi(model, AutoDelta(model), torch.randn(10, 1), torch.randn(10), num_steps=2,
                      loss=loss, progress=False)


@case("16.5 AutoDelta with KNNElbo refused",
      Raises(ValueError, r"guide gave 8 identical samples of 'w': a point mass \(e.g. AutoDelta\)"))
def _():
    return _knn_fit_with_autodelta(pb.KNNElbo(num_particles=8, num_kl_samples=8, num_prior_samples=8))


@case("16.5 AutoDelta with FunctionalKNNElbo refused",
      Raises(ValueError, r"guide gave 8 identical samples of 'w'.*FunctionalKNNElbo"))
def _():
    return _knn_fit_with_autodelta(pb.FunctionalKNNElbo(num_particles=8, num_kl_samples=8,
                                                        num_prior_samples=8, num_inputs=5))


# ----------------------------------------------------------------------------------------------
# 16.6: KSG mutual information with ties (Gao et al. 2017)
# ----------------------------------------------------------------------------------------------
@case("16.6 KSG, discrete z = x on 3 values: ln 3",
      Value(lambda v: abs(v - math.log(3)) < 0.02, "within 0.02 of ln 3 = 1.0986"))
def _():
    x = np.random.default_rng(0).integers(0, 3, 600).astype(float)
    return ksg_mutual_information(x, x)


@case("16.6 KSG, discrete z = x with p = (.5, .3, .2): H(x)",
      Value(lambda v: abs(v - 1.0297) < 0.03, "within 0.03 of H = 1.0297"))
def _():
    x = np.random.default_rng(0).choice(3, 2000, p=[0.5, 0.3, 0.2]).astype(float)
    return ksg_mutual_information(x, x)


@case("16.6 KSG, independent discrete x, z: 0", Value(lambda v: abs(v) < 0.03, "within 0.03 of 0"))
def _():
    rng = np.random.default_rng(0)
    return ksg_mutual_information(rng.integers(0, 3, 600).astype(float),
                                  rng.integers(0, 3, 600).astype(float))


# ----------------------------------------------------------------------------------------------
# 16.3: evaluate's standardisation statistics and level
# ----------------------------------------------------------------------------------------------
def _bnn_and_samples(out: int = 1, S: int = 10):
    model = pb.BNN(pb.MLP(2, [4], out))
    return model, torch.randn(S, model.num_weights, generator=_gen())


def _evaluate(**kwargs):
    model, w = _bnn_and_samples()
    return pb.evaluate(model, w, torch.randn(7, 2), torch.randn(7), **kwargs)


@case("16.3 evaluate(y_std=x_std) refused (boston: 13 input stds)",
      Raises(ValueError, r"y_std must be a scalar or have one value per output .*got shape \(13,\)"))
def _():
    return _evaluate(y_mean=0.5, y_std=torch.rand(13) + 0.5)


@case("16.3 evaluate(y_mean of the inputs) refused", Raises(ValueError, r"y_mean must be a scalar"))
def _():
    return _evaluate(y_mean=torch.zeros(13), y_std=2.0)


@case("16.3 evaluate(level=0) refused, not a zero-width interval", Raises(ValueError, r"level must lie in"))
def _():
    return _evaluate(level=0.0)


@case("16.3 evaluate(y_std=nan) is a clean error", Raises(ValueError, r"y_std must be finite, got nan"))
def _():
    return _evaluate(y_std=float("nan"))


@case("16.3 evaluate(y_std=inf) is a clean error", Raises(ValueError, r"y_std must be finite"))
def _():
    return _evaluate(y_std=torch.tensor(math.inf))


@case("16.3 evaluate(y_mean=nan) is a clean error", Raises(ValueError, r"y_mean must be finite"))
def _():
    return _evaluate(y_mean=float("nan"), y_std=1.0)


@case("16.3 evaluate(level=95) names level and the fix",
      Raises(ValueError, r"level must lie in \(0, 1\), got 95 \(a probability: level=0.95"))
def _():
    return _evaluate(level=95)


@case("16.3 evaluate with y_std: LL shifts by -log(y_std) exactly",
      Value(lambda v: abs(v[1] - (v[0] - math.log(2.5))) < 1e-5, "test_ll(std) = test_ll - ln 2.5"))
def _():
    model, w = _bnn_and_samples()
    x, y = torch.randn(7, 2, generator=_gen(1)), torch.randn(7, generator=_gen(2))
    plain = pb.evaluate(model, w, x, y)["test_ll"]
    scaled = pb.evaluate(model, w, x, y, y_mean=np.float32(3.0), y_std=np.float64(2.5))["test_ll"]
    return plain, scaled


@case("16.3 evaluate per-output y_std (L = 2) accepted",
      Value(lambda v: math.isfinite(v), "a finite test LL"))
def _():
    model, w = _bnn_and_samples(out=2)
    return pb.evaluate(model, w, torch.randn(7, 2), torch.randn(7, 2), y_mean=torch.zeros(2),
                       y_std=torch.tensor([1.0, 3.0]))["test_ll"]


# ----------------------------------------------------------------------------------------------
# 16.4: run_nuts numeric options
# ----------------------------------------------------------------------------------------------
def _nuts(**kwargs):
    model = pb.BNN(pb.MLP(1, [3], 1))
    return pb.run_nuts(model, torch.randn(8, 1), torch.randn(8), num_samples=2, warmup_steps=0,
                       progress=False, map_steps=2, **kwargs)


@pytest.mark.parametrize("bad", [0.0, -0.1, math.nan, math.inf])
def test_run_nuts_refuses_a_non_positive_step_size(bad):
    with pytest.raises(ValueError, match=r"step_size must be a positive finite number.*repeats"):
        _nuts(step_size=bad)


@case("16.4 run_nuts(map_lr=0) refused", Raises(ValueError, r"map_lr must be a positive finite"))
def _():
    return _nuts(map_lr=0)


# ----------------------------------------------------------------------------------------------
# 16.8: MLP widths
# ----------------------------------------------------------------------------------------------
@case("16.8 MLP(2, [4.7], 1) refused, not truncated to 4",
      Raises(ValueError, r"hidden_sizes\[0\] must be a positive integer .*got 4.7"))
def _():
    return pb.MLP(2, [4.7], 1)


@case("16.8 MLP(2, '44', 1) refused, not read as hidden sizes [4, 4]",
      Raises(ValueError, r"hidden_sizes\[0\] must be a positive integer .*got '4'"))
def _():
    return pb.MLP(2, "44", 1)


@case("16.8 MLP(2.5, ...) refused", Raises(ValueError, r"in_features must be a positive integer"))
def _():
    return pb.MLP(2.5, [3], 1)


@case("16.8 MLP with numpy and integral-float widths accepted",
      Value(lambda v: v == (2 * 4 + 4) + (4 * 3 + 3) + (3 + 1), "num_weights of 2 -> 4 -> 3 -> 1"))
def _():
    return pb.MLP(np.int64(2), [np.int32(4), 3.0], torch.tensor(1)).num_weights


# ----------------------------------------------------------------------------------------------
# 16.7: BNN+LV with one data point
# ----------------------------------------------------------------------------------------------
def _bnnlv_fit(N: int):
    from pyro.infer.autoguide import AutoNormal

    model = pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=1)
    x, y = torch.randn(N, 1, generator=_gen(1)), torch.randn(N, generator=_gen(2))
    guide = AutoNormal(model, create_plates=model.create_plates)
    pb.fit_svi(model, guide, x, y, num_steps=3, progress=False, seed=0)
    return model, guide, x, y


@case("16.7 N = 1: sample_posterior keeps z as (S, N, K) = (5, 1, 1)",
      Value(lambda v: v == {"w": (5, 17), "z": (5, 1, 1), "obs": (5, 1)}, "per-site shapes"))
def _():
    model, guide, x, y = _bnnlv_fit(1)
    s = pb.sample_posterior(model, guide, x, y, num_samples=5, sites=("w", "z", "obs"), seed=0)
    return {k: tuple(v.shape) for k, v in s.items()}


@case("16.7 N = 1: reconstruction_components is (S, N, L) = (5, 1, 1)",
      Value(lambda v: v == (5, 1, 1), "shape (5, 1, 1)"))
def _():
    model, guide, x, y = _bnnlv_fit(1)
    s = pb.sample_posterior(model, guide, x, y, num_samples=5, sites=("w", "z"), seed=0)
    return tuple(model.reconstruction_components(x, s).shape)


@case("16.7 reconstruction_components with a squeezed z refused",
      Raises(ValueError, r"samples\['z'\] must have shape \(S, N, K\) = \(5, 1, 1\)"))
def _():
    model = pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=1)
    return model.reconstruction_components(torch.randn(1, 1), {"w": torch.randn(5, 17),
                                                               "z": torch.randn(5, 1)})


@case("16.7 one sample: sample_posterior(num_samples=1) keeps (1, N, K)",
      Value(lambda v: v == {"w": (1, 17), "z": (1, 3, 1)}, "per-site shapes"))
def _():
    model, guide, x, y = _bnnlv_fit(3)
    s = pb.sample_posterior(model, guide, x, y, num_samples=1, sites=("w", "z"), seed=0)
    return {k: tuple(v.shape) for k, v in s.items()}


# ----------------------------------------------------------------------------------------------
# cryptic errors made clean (or inputs accepted) in the models, evaluate, Laplace and data
# ----------------------------------------------------------------------------------------------
@case("cryptic: (N, 1) y for a single-output BNN is read as (N,): same SVI fit",
      Value(lambda v: v[0] == v[1], "identical loss curves"))
def _():
    from pyro.infer.autoguide import AutoNormal

    x, y = torch.randn(12, 1, generator=_gen(1)), torch.randn(12, generator=_gen(2))
    curves = []
    for target in (y, y.unsqueeze(-1)):
        model = pb.BNN(pb.MLP(1, [4], 1))
        curves.append(pb.fit_svi(model, AutoNormal(model), x, target, num_steps=5, seed=0,
                                 progress=False))
    return curves


@case("cryptic: (N, 1) y for BNN+LV and ProjectedBNN give the same log-likelihood",
      Value(lambda v: all(a == b for a, b in v), "identical log densities"))
def _():
    import pyro

    x, y = torch.randn(6, 1, generator=_gen(1)), torch.randn(6, generator=_gen(2))
    out = []
    for model in (pb.BNNLV(pb.MLP(2, [4], 1)), pb.ProjectedBNN(pb.MLP(1, [4], 1), latent_dim=2)):
        lps = []
        for target in (y, y.unsqueeze(-1)):
            with pyro.poutine.seed(rng_seed=0):
                lps.append(pyro.poutine.trace(model).get_trace(x, target).log_prob_sum().item())
        out.append(lps)
    return out


@case("cryptic: (N, 1) y through run_nuts, Laplace and evaluate: same results",
      Value(lambda v: all(a == b for a, b in v), "identical values"))
def _():
    model = pb.BNN(pb.MLP(1, [3], 1))
    x, y = torch.randn(8, 1, generator=_gen(1)), torch.randn(8, generator=_gen(2))
    w = torch.randn(4, model.num_weights, generator=_gen(3))
    pairs = []
    for target in (y, y.unsqueeze(-1)):
        mcmc = pb.run_nuts(model, x, target, num_samples=3, warmup_steps=2, map_steps=3, seed=0,
                           progress=False)
        la = pb.infer.LinearizedLaplace(model, w[0]).fit(x, target)
        pairs.append((mcmc.get_samples()["w"].sum().item(), la.log_marginal_likelihood().item(),
                      pb.evaluate(model, w, x, target)["test_ll"]))
    return list(zip(*pairs))


@case("cryptic: a wrong y shape still names both accepted shapes",
      Raises(ValueError, r"y must have shape \(8,\) or \(8, 1\) for out_features=1; got \(8, 2\)"))
def _():
    return pb.BNN(pb.MLP(1, [3], 1))(torch.randn(8, 1), torch.randn(8, 2))


@case("cryptic: fit_svi with N = 0 names x", Raises(ValueError, r"x has 0 rows"))
def _():
    from pyro.infer.autoguide import AutoNormal

    model = pb.BNN(pb.MLP(1, [3], 1))
    return pb.fit_svi(model, AutoNormal(model), torch.randn(0, 1), torch.randn(0), num_steps=2,
                      progress=False)


@case("cryptic: evaluate on 0 rows names x", Raises(ValueError, r"x has 0 rows"))
def _():
    model, w = _bnn_and_samples()
    return pb.evaluate(model, w, torch.randn(0, 2), torch.randn(0))


def _laplace(**kwargs):
    model = pb.BNN(pb.MLP(1, [3], 1))
    x, y = torch.randn(10, 1, generator=_gen(1)), torch.randn(10, generator=_gen(2))
    w = torch.randn(model.num_weights, generator=_gen(3))
    return pb.infer.LinearizedLaplace(model, w, **kwargs).fit(x, y)


@case("cryptic: la.predictive on 0 rows names x", Raises(ValueError, r"x has 0 rows"))
def _():
    return _laplace().predictive(torch.randn(0, 1))


@case("cryptic: Laplace fit on 0 rows names x", Raises(ValueError, r"x has 0 rows"))
def _():
    model = pb.BNN(pb.MLP(1, [3], 1))
    return pb.infer.LinearizedLaplace(model, torch.zeros(model.num_weights)).fit(
        torch.randn(0, 1), torch.randn(0))


@case("cryptic: float32 log_marginal_likelihood on a singular H names dtype and the fix",
      Raises(ValueError, r"not numerically positive definite in torch.float32.*dtype=torch.float64"))
def _():
    return _laplace(dtype=torch.float32).log_marginal_likelihood(prior_precision=1e-30)


@case("cryptic: log_marginal_likelihood(prior_precision < 0) names the argument",
      Raises(ValueError, r"prior_precision must be positive and finite"))
def _():
    return _laplace().log_marginal_likelihood(prior_precision=-1.0)


@case("cryptic: log_marginal_likelihood(noise_scale=0) names the argument",
      Raises(ValueError, r"noise_scale must be a positive finite scalar"))
def _():
    return _laplace().log_marginal_likelihood(noise_scale=0.0)


@case("Laplace: log marginal likelihood stays differentiable in its hyper-parameters",
      Value(lambda v: all(math.isfinite(g) and g != 0 for g in v), "finite non-zero gradients"))
def _():
    la = _laplace()
    p = torch.tensor(2.0, dtype=F64, requires_grad=True)
    s = torch.tensor(0.5, dtype=F64, requires_grad=True)
    la.log_marginal_likelihood(p, s).backward()
    return p.grad.item(), s.grad.item()


@case("cryptic: load_dataset('boston', split=True) names split",
      Raises(ValueError, r"split must be an integer in \[0, 20\) for boston.*got True"))
def _():
    return pb.datasets.load_dataset("boston", split=True)


@case("numpy integer split accepted", Value(lambda v: "standard split 3 of 20" in v, "split 3"))
def _():
    return pb.datasets.load_dataset("boston", split=np.int64(3)).description


@case("cryptic: run_nuts(y=None) names y", Raises(TypeError, r"y must be a tensor of targets"))
def _():
    model = pb.BNN(pb.MLP(1, [3], 1))
    return pb.run_nuts(model, torch.randn(8, 1), None, num_samples=2, warmup_steps=1)


@case("cryptic: load_dataset(3) names name", Raises(TypeError, r"name must be a data set name"))
def _():
    return pb.datasets.load_dataset(3)


@case("numpy latent_dim accepted by BNN+LV and ProjectedBNN", Value(lambda v: v == (2, 3), "(2, 3)"))
def _():
    lv = pb.BNNLV(pb.MLP(3, [4], 1), latent_dim=np.int64(2))
    proj = pb.ProjectedBNN(pb.MLP(1, [4], 1), latent_dim=np.int32(3))
    return lv.latent_dim, proj.latent_dim


@case("fractional latent_dim refused", Raises(ValueError, r"latent_dim must be a positive integer, got 1.5"))
def _():
    return pb.BNNLV(pb.MLP(3, [4], 1), latent_dim=1.5)


# ----------------------------------------------------------------------------------------------
# inputs that were already refused cleanly: kept so they stay clean
# ----------------------------------------------------------------------------------------------
def _m():
    return pb.BNN(pb.MLP(2, [4], 1))


_X, _Y = torch.randn(8, 2), torch.randn(8)
_W = torch.randn(5, 17)
ALREADY_CLEAN = {
    "evaluate: wrong number of weights": (lambda: pb.evaluate(_m(), torch.randn(5, 18), _X, _Y),
                                          ValueError, r"w must have last dimension num_weights=17"),
    "evaluate: no 'w' site": (lambda: pb.evaluate(_m(), {"v": _W}, _X, _Y), ValueError, r"no 'w' site"),
    "evaluate: x and y rows": (lambda: pb.evaluate(_m(), _W, _X, _Y[:5]), ValueError, r"different numbers of rows"),
    "evaluate: NaN y": (lambda: pb.evaluate(_m(), _W, _X, torch.full((8,), math.nan)), ValueError, r"y contains NaN"),
    "evaluate: NaN weights": (lambda: pb.evaluate(_m(), torch.full((5, 17), math.nan), _X, _Y),
                              ValueError, r"posterior_samples\['w'\] contains NaN"),
    "evaluate: y_std 0": (lambda: pb.evaluate(_m(), _W, _X, _Y, y_std=0.0), ValueError, r"y_std must be positive"),
    "evaluate: y_mean alone": (lambda: pb.evaluate(_m(), _W, _X, _Y, y_mean=1.0), ValueError, r"y_mean was given without y_std"),
    "evaluate: a list of samples": (lambda: pb.evaluate(_m(), [_W], _X, _Y), TypeError, r"posterior_samples must be"),
    "run_nuts: num_chains 0": (lambda: pb.run_nuts(_m(), _X, _Y, num_samples=2, warmup_steps=1, num_chains=0),
                               ValueError, r"num_chains must be a positive integer"),
    "run_nuts: warmup -1": (lambda: pb.run_nuts(_m(), _X, _Y, num_samples=2, warmup_steps=-1),
                            ValueError, r"warmup_steps must be an integer >= 0"),
    "run_nuts: target_accept_prob 1.5": (lambda: pb.run_nuts(_m(), _X, _Y, num_samples=2, warmup_steps=1,
                                                             target_accept_prob=1.5), ValueError, r"target_accept_prob"),
    "run_nuts: init 'bogus'": (lambda: pb.run_nuts(_m(), _X, _Y, num_samples=2, warmup_steps=1, init="bogus",
                                                   progress=False), ValueError, r"init must be 'map', 'prior'"),
    "run_nuts: init of the wrong shape": (lambda: pb.run_nuts(_m(), _X, _Y, num_samples=2, warmup_steps=1,
                                                              init={"w": torch.zeros(3)}, progress=False),
                                          ValueError, r"init\['w'\] must have shape \(17,\)"),
    "run_nuts: kernel 'x'": (lambda: pb.run_nuts(_m(), _X, _Y, num_samples=2, warmup_steps=1, kernel="x"),
                             ValueError, r"kernel must be 'flat' or 'pyro'"),
    "run_nuts: max_tree_depth 0": (lambda: pb.run_nuts(_m(), _X, _Y, num_samples=2, warmup_steps=1, max_tree_depth=0),
                                   ValueError, r"max_tree_depth must be a positive integer"),
    "sample_posterior: num_samples 0": (lambda: pb.sample_posterior(_m(), None, _X, num_samples=0),
                                        ValueError, r"num_samples must be a positive integer"),
    "MLP: unknown activation": (lambda: pb.MLP(2, [4], 1, activation="gelu"), ValueError, r"unknown activation 'gelu'"),
    "BNN: prior_scale < 0": (lambda: pb.BNN(pb.MLP(2, [4], 1), prior_scale=-1), ValueError, r"prior_scale must be positive"),
    "BNN: noise_scale 0": (lambda: pb.BNN(pb.MLP(2, [4], 1), noise_scale=0), ValueError, r"noise_scale must be positive"),
    "BNN: prior_scale shape": (lambda: pb.BNN(pb.MLP(2, [4], 1), prior_scale=torch.ones(3)),
                               ValueError, r"prior_scale must be a scalar or have shape \(17,\)"),
    "BNN: a torch.nn.Linear net": (lambda: pb.BNN(torch.nn.Linear(2, 1)), TypeError, r"net must be a pyro_bnnlv FlatNet"),
    "BNN+LV: latent_dim 0": (lambda: pb.BNNLV(pb.MLP(2, [4], 1), latent_dim=0), ValueError, r"latent_dim must be a positive"),
    "BNN+LV: latent_scale < 0": (lambda: pb.BNNLV(pb.MLP(2, [4], 1), latent_scale=-1.0), ValueError, r"latent_scale must be"),
    "BNN+LV: in_features <= latent_dim": (lambda: pb.BNNLV(pb.MLP(1, [4], 1), latent_dim=1), ValueError, r"must exceed latent_dim"),
    "BNN+LV: x with D + K columns": (lambda: pb.BNNLV(pb.MLP(2, [4], 1))(torch.randn(5, 2), torch.randn(5)),
                                     ValueError, r"x must have shape \(N, 1\)"),
    "Laplace: structure 'kron'": (lambda: pb.infer.LinearizedLaplace(_m(), _W[0], structure="kron"), ValueError, r"structure must be"),
    "Laplace: w_map (S, P)": (lambda: pb.infer.LinearizedLaplace(_m(), _W), ValueError, r"w_map must have shape \(17,\)"),
    "Laplace: predictive before fit": (lambda: pb.infer.LinearizedLaplace(_m(), _W[0]).predictive(_X), RuntimeError, r"call fit"),
    "Laplace: x with 5 columns": (lambda: pb.infer.LinearizedLaplace(_m(), _W[0]).fit(_X, _Y).predictive(torch.randn(3, 5)),
                                  ValueError, r"x has 5 columns .* in_features=2"),
    "Laplace: prior_precision 0": (lambda: pb.infer.LinearizedLaplace(_m(), _W[0], prior_precision=0.0),
                                   ValueError, r"prior_precision must be positive"),
    "Laplace: evaluate(level=95)": (lambda: pb.infer.LinearizedLaplace(_m(), _W[0]).fit(_X, _Y).evaluate(_X, _Y, level=95),
                                    ValueError, r"level must lie in \(0, 1\), got 95"),
    "Laplace: evaluate(y_std=x_std)": (lambda: pb.infer.LinearizedLaplace(_m(), _W[0]).fit(_X, _Y).evaluate(
        _X, _Y, y_std=torch.ones(13)), ValueError, r"y_std must be a scalar or have one value per output"),
    "load_dataset: unknown name": (lambda: pb.datasets.load_dataset("bostn"), ValueError, r"unknown dataset 'bostn'"),
    "load_dataset: split 25": (lambda: pb.datasets.load_dataset("boston", split=25), ValueError, r"split must be an integer in \[0, 20\)"),
    "load_dataset: unknown option": (lambda: pb.datasets.load_dataset("cosine", standardise=True), TypeError, r"standardise"),
    "KSG: k >= N": (lambda: ksg_mutual_information(np.arange(5.0), np.arange(5.0), k=5), ValueError, r"`k` must be"),
    "KSG: different N": (lambda: ksg_mutual_information(np.arange(5.0), np.arange(6.0)), ValueError, r"same number of rows"),
    "KSG: NaN": (lambda: ksg_mutual_information(np.array([1.0, np.nan, 2, 3, 4, 5, 6]), np.arange(7.0), k=2),
                 ValueError, r"`x` contains NaN"),
    "knn: integer samples": (lambda: knn_kl(torch.ones(5, 2, dtype=torch.long), torch.randn(5, 2)),
                             ValueError, r"p_samples must be float32 or float64"),
    "KNNElbo: k 0": (lambda: pb.KNNElbo(k=0), ValueError, r"k must be a positive integer"),
    "FunctionalKNNElbo: input_dist 'box'": (lambda: pb.FunctionalKNNElbo(input_dist="box"), ValueError, r"input_dist must be"),
    "input_box: one row": (lambda: pb.infer.input_box(torch.randn(1, 2)), ValueError, r"x must be a \(N, D\) tensor with N >= 2"),
}
for _name, (_fn, _exc, _match) in ALREADY_CLEAN.items():
    case("clean: " + _name, Raises(_exc, _match))(_fn)


# ----------------------------------------------------------------------------------------------
# the probe
# ----------------------------------------------------------------------------------------------
def test_numpy_integer_counts_are_accepted():
    model, w = _bnn_and_samples()
    guide = pb.infer.LinearizedLaplace(model, w[0]).fit(torch.randn(6, 2), torch.randn(6)).as_guide()
    out = pb.sample_posterior(model, guide, torch.randn(6, 2), num_samples=np.int64(3), seed=0)
    assert out["w"].shape == (3, model.num_weights)


@pytest.mark.parametrize("name", list(CASES))
def test_probe(name: str) -> None:
    torch.manual_seed(0)
    fn, expect = CASES[name]
    if isinstance(expect, Raises):
        with pytest.raises(expect.exc, match=expect.match):
            fn()
    elif isinstance(expect, Warns):
        with pytest.warns(expect.category, match=expect.match):
            fn()
    else:
        with warnings.catch_warnings():
            # a correct value comes without a warning of ours (torch's own deprecation notices,
            # filtered in pyproject.toml, stay as they are)
            warnings.simplefilter("error", UserWarning)
            warnings.simplefilter("error", RuntimeWarning)
            result = fn()
        assert expect.check(result), f"{name}: expected {expect.what}, got {result!r}"
