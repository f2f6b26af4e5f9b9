r"""A seeded family of BNN+LV problems that no result was tuned on: ``ncai-family-00`` ... ``-23``.

Issue 37: NCAI must work on data it was never tuned on, so its benchmark runs over a family of
problems, not the paper's five sets. Problem ``i`` is drawn once from a generator seeded with
``i`` (its structure); a data seed (``load_dataset(name, seed=s)``) then draws its points:

.. math::

    x \sim U[-2, 2]^D, \quad z \sim N(0, 1), \quad \epsilon \sim N(0, \sigma^2), \quad
    y = f(x) + g(x, z) + \epsilon, \qquad f(x) = \sum_{j=1}^{3} a_j \sin(\omega_j^\top x + b_j),

with random frequencies ``omega_j ~ N(0, I)`` and phases, ``f`` scaled to unit standard
deviation over ``x``, ``D`` in {1, 2}, ``N`` training points log-uniform in [200, 2000], a
validation set of ``max(100, N / 4)`` and 1,000 test points, and the latent effect ``g`` one of
(amplitude ``c ~ U[0.3, 0.8]``, ``v`` a random unit direction):

* ``additive``: ``c z`` (homoscedastic: a BNN is enough, NCAI must not hurt);
* ``heteroscedastic``: ``c (0.3 + |sin(2 v^T x)|) z``;
* ``multiplicative``: ``f(x) c tanh(z)``;
* ``multimodal``: ``2 c (1 + 0.3 tanh(v^T x)) tanh(4 z)`` (two branches, the width varying with ``x``);
* ``heavy-tailed``: ``c sinh(z)``.

Problem ``i`` has effect ``EFFECTS[i % 5]`` and ``D = 1 + (i // 5) % 2``; ``sigma ~ U[0.05, 0.2]``.

:func:`log_density` is the true ``log p(y | x)`` (the integral over ``z`` by the midpoint rule on
2,000 cells of ``[-8, 8]``, as :mod:`~pyro_bnnlv.datasets.oracle` does for the paper's sets) and
:func:`ceiling` its expectation, the best test LL any model can expect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from scipy import special

from .._checks import check_int, check_seed
from .base import Dataset, make_dataset, register
from .oracle import normal_logpdf

__all__ = ["EFFECTS", "FAMILY", "FamilyProblem", "ceiling", "family_problem", "log_density"]

EFFECTS = ("additive", "heteroscedastic", "multiplicative", "multimodal", "heavy-tailed")
#: the family's size: 24 problems, each effect in 1-D and 2-D at least twice
SIZE = 24
_TEST = 1000


class FamilyProblem(NamedTuple):
    """Problem ``index`` of the family: its structure (the data are drawn per data seed)."""

    index: int
    effect: str
    input_dim: int
    n_train: int
    noise_var: float
    amplitude: float
    omega: np.ndarray  # (3, D)
    phase: np.ndarray  # (3,)
    weight: np.ndarray  # (3,): a_j, f scaled to unit sd
    direction: np.ndarray  # (D,): v

    @property
    def name(self) -> str:
        return f"ncai-family-{self.index:02d}"

    def f(self, x: np.ndarray) -> np.ndarray:
        """``f(x)`` for ``x`` of shape ``(..., D)``."""
        return np.sin(x @ self.omega.T + self.phase) @ self.weight

    def mean(self, x: np.ndarray, z: np.ndarray) -> np.ndarray:
        """``f(x) + g(x, z)``, broadcasting ``x (..., D)`` against ``z (...)``."""
        fx, c = self.f(x), self.amplitude
        vx = x @ self.direction
        if self.effect == "additive":
            return fx + c * z
        if self.effect == "heteroscedastic":
            return fx + c * (0.3 + np.abs(np.sin(2.0 * vx))) * z
        if self.effect == "multiplicative":
            return fx * (1.0 + c * np.tanh(z))
        if self.effect == "multimodal":
            return fx + 2.0 * c * (1.0 + 0.3 * np.tanh(vx)) * np.tanh(4.0 * z)
        return fx + c * np.sinh(z)


def family_problem(index: int) -> FamilyProblem:
    """Problem ``index`` (``0 <= index < 24``), drawn from a generator seeded with ``index``."""
    index = check_int(index, "index", minimum=0)
    if index >= SIZE:
        raise ValueError(f"index must be below {SIZE} (the family's size), got {index}")
    rng = np.random.default_rng([37, index])
    D = 1 + (index // len(EFFECTS)) % 2
    omega = rng.normal(0.0, 1.0, (3, D))
    phase = rng.uniform(0.0, 2 * np.pi, 3)
    direction = rng.normal(0.0, 1.0, D)
    direction /= np.linalg.norm(direction)
    probe = rng.uniform(-2.0, 2.0, (4000, D))
    weight = rng.normal(0.0, 1.0, 3)
    weight /= np.sin(probe @ omega.T + phase).dot(weight).std()
    n_train = int(round(float(np.exp(rng.uniform(np.log(200), np.log(2000))))))
    return FamilyProblem(
        index,
        EFFECTS[index % len(EFFECTS)],
        D,
        n_train,
        float(rng.uniform(0.05, 0.2)) ** 2,
        float(rng.uniform(0.3, 0.8)),
        omega,
        phase,
        weight,
        direction,
    )


FAMILY: tuple[FamilyProblem, ...] = tuple(family_problem(i) for i in range(SIZE))


def _draw(problem: FamilyProblem, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = rng.uniform(-2.0, 2.0, (n, problem.input_dim))
    z = rng.normal(0.0, 1.0, n)
    y = problem.mean(x, z) + rng.normal(0.0, np.sqrt(problem.noise_var), n)
    return x, y, z


def log_density(problem: FamilyProblem, x: np.ndarray, y: np.ndarray, *, nodes: int = 2000) -> np.ndarray:
    """``log p(y_n | x_n)`` on the generator's scale, ``x (N, D)``, ``y (N,)``: the integral
    over ``z ~ N(0, 1)`` by the midpoint rule on ``nodes`` cells of ``[-8, 8]``."""
    x, y = np.asarray(x, dtype=float).reshape(len(y), problem.input_dim), np.asarray(y, dtype=float).reshape(-1)
    z = 8.0 * ((np.arange(nodes) + 0.5) / nodes * 2.0 - 1.0)
    log_w = -0.5 * z**2  # the N(0, 1) weights up to a constant, normalised next
    log_w -= special.logsumexp(log_w)
    out = np.empty(len(y))
    chunk = max(1, 2_000_000 // nodes)
    for s in range(0, len(y), chunk):
        xs, ys = x[s : s + chunk, None, :], y[s : s + chunk, None]
        logp = normal_logpdf(ys, problem.mean(xs, z[None, :]), np.sqrt(problem.noise_var))
        out[s : s + chunk] = special.logsumexp(logp + log_w[None, :], axis=1)
    return out


def ceiling(problem: FamilyProblem, *, num_points: int = 20_000, seed: int = 0) -> tuple[float, float]:
    """``E[log p(y | x)]`` and its Monte Carlo standard error: the best expected test LL."""
    x, y, _ = _draw(problem, np.random.default_rng([check_seed(seed), 1, problem.index]), num_points)
    logp = log_density(problem, x, y)
    return float(logp.mean()), float(logp.std(ddof=1) / np.sqrt(len(logp)))


def _loader(problem: FamilyProblem) -> Callable[..., Dataset]:
    def load(seed: int = 0, standardize: bool = False) -> Dataset:
        rng = np.random.default_rng([check_seed(seed), 0, problem.index])
        n = problem.n_train
        parts = [_draw(problem, rng, m) for m in (n, max(100, n // 4), _TEST)]
        splits = {k: (p[0], p[1]) for k, p in zip(("train", "valid", "test"), parts)}
        extras = {
            "z_train": parts[0][2],
            "z_valid": parts[1][2],
            "z_test": parts[2][2],
            "noise_std": np.array(np.sqrt(problem.noise_var)),
        }
        return make_dataset(
            problem.name,
            splits,
            standardize=standardize,
            description=f"issue 37's family, {problem.effect}, D={problem.input_dim}",
            extras=extras,
        )

    load.__doc__ = f"{problem.name}: {problem.effect} latent effect, D = {problem.input_dim}, N = {problem.n_train}"
    return load


for _problem in FAMILY:
    register(
        _problem.name,
        "synthetic",
        f"issue 37's NCAI family: {_problem.effect}, D={_problem.input_dim}, N={_problem.n_train}",
    )(_loader(_problem))
