"""The true conditional density of the NCAI synthetic sets: the test log-likelihood ceiling.

Every synthetic set of Yacoby, Pan & Doshi-Velez (2022), arXiv:1911.00569, App. G is drawn from a
known process, so its conditional density ``p(y | x)`` is known, and no model can expect a higher
per-point test log-likelihood than

.. math:: \\mathrm{LL}^\\ast = \\mathbb{E}_{x, y}[\\log p(y \\mid x)] = -\\mathbb{E}_x[H(y \\mid x)].

This puts a measured test LL on an absolute scale (how far from the best possible it is), which
the papers' tables cannot do when their levels are on another scale.

* Heteroscedastic sets (goldberg, yuan, williams: ``y = m(x) + eps``, ``eps ~ N(0, v(x))``,
  ``x ~ U[0, 1]``): ``log p(y | x) = -0.5 log(2 pi v(x)) - (y - m(x))^2 / (2 v(x))`` and
  ``LL* = -0.5 log(2 pi) - 0.5 - 0.5 \\int_0^1 log v(x) dx``, by adaptive quadrature.
* Latent-input sets (heavy-tail, depeweg, bimodal: ``y = f(x, z) + eps``,
  ``z ~ N(0, s_z^2)``, ``eps ~ N(0, s^2)``):
  ``p(y | x) = \\int N(y; f(x, z), s^2) N(z; 0, s_z^2) dz``, by the midpoint rule on ``K``
  equal cells of ``[-8 s_z, 8 s_z]`` with weights ``N(z_k; 0, s_z^2)`` normalised to sum to 1
  (accurate where ``f`` jumps in ``z``, covering the latent's tails, and giving bimodal's two
  branches exactly half the mass each). ``LL*`` is a Monte Carlo mean over points drawn by the
  data set's own generator, with its standard error.

All on the generator's raw scale (``standardize=False``, the default of these sets);
:func:`true_log_density` takes ``data=`` for a standardised set's tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import special

from .._checks import check_int, check_seed
from .base import REGISTRY, Dataset, _as_float_array, _canonical, standardized_source
from .synthetic import PROCESSES, HeteroscedasticProcess, LatentProcess

__all__ = ["ORACLE_DATASETS", "OracleLL", "expected_test_ll", "true_log_density"]

ORACLE_DATASETS: tuple[str, ...] = tuple(PROCESSES)


class OracleLL(NamedTuple):
    """``LL*`` of a data set and its standard error (0 where it is computed by quadrature)."""

    value: float
    stderr: float


def _process(name: str) -> HeteroscedasticProcess | LatentProcess:
    key = _canonical(name)
    if key not in PROCESSES:
        raise ValueError(
            f"name must be one of the synthetic sets with a known generating density "
            f"{', '.join(ORACLE_DATASETS)}; got {name!r}"
        )
    return PROCESSES[key]


def _as_1d(value, arg: str) -> np.ndarray:
    a = _as_float_array(value, arg)
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.ndim != 1:
        raise ValueError(f"{arg} must have shape (N,) or (N, 1) (one input dimension), got {a.shape}")
    return a


def normal_logpdf(y: np.ndarray, mean: np.ndarray | float, sd: np.ndarray | float) -> np.ndarray:
    """``log N(y; mean, sd^2)``, elementwise with broadcasting (``scipy.stats.norm.logpdf``'s value,
    without importing ``scipy.stats``, slow to import)."""
    return -0.5 * ((y - mean) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi)


def true_log_density(name: str, x, y, *, nodes: int = 2000, data: Dataset | None = None) -> np.ndarray:
    """``log p(y_n | x_n)`` under data set ``name``'s generating process, shape ``(N,)``.

    Args:
        name: one of :data:`ORACLE_DATASETS`.
        x, y: inputs and targets, shapes ``(N,)`` or ``(N, 1)`` and ``(N,)``: on the generator's
            raw scale, or, with ``data``, on the scale of that data set's tensors.
        nodes: ``K``, the cells of the integral over the latent input (latent-input sets only;
            even, so that no node sits on ``z = 0``, where bimodal's ``f`` jumps).
        data: the :class:`~pyro_bnnlv.datasets.Dataset` that ``x, y`` come from. For a
            standardised one (``standardize=True``) ``x, y`` are mapped back to the raw scale,
            ``x_raw = x x_std + x_mean``, ``y_raw = y y_std + y_mean``, and the result is the log
            density of the *standardised* target, ``log p(y_raw | x_raw) + log y_std`` (change of
            variables), comparable with a test LL computed on that scale (subtract
            ``log y_std`` for the raw scale).

    Raises ``ValueError`` when ``y`` is the very target tensor of a standardised data set
    (``data.y_test``) and ``data`` is not given (the numbers would be on the wrong scale), and
    where the process has no density: a heteroscedastic set whose noise variance ``v(x)`` is not
    positive at an input (goldberg's ``x + 0.5`` for ``x <= -0.5``; its generator draws ``x`` from
    ``U[0, 1]``).
    """
    proc = _process(name)
    source = standardized_source(y)
    if data is None and source is not None:
        raise ValueError(
            f"y is the {source}, but true_log_density works on the generator's raw scale: pass "
            f"data=<that data set> to get the log density of the standardised y, or load the set "
            f"with standardize=False"
        )
    x, y = _as_1d(x, "x"), _as_1d(y, "y")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
    log_jacobian = 0.0
    if data is not None:
        if not isinstance(data, Dataset):
            raise TypeError(f"data must be the pyro_bnnlv Dataset x and y come from, got {type(data).__name__}")
        if _canonical(data.name) != _canonical(name):
            raise ValueError(f"data is the data set {data.name!r} but name is {name!r}: pass the set x and y come from")
        if data.standardized:
            x = x * float(data.x_std.reshape(-1)[0]) + float(data.x_mean.reshape(-1)[0])
            y = y * float(data.y_std) + float(data.y_mean)
            log_jacobian = float(np.log(float(data.y_std)))
    if isinstance(proc, HeteroscedasticProcess):
        var = proc.var(x)
        bad = np.flatnonzero(~(var > 0))
        if bad.size:
            raise ValueError(
                f"x[{bad[0]}] = {x[bad[0]]:.6g}: the noise variance of {name!r} is not positive there "
                f"({var[bad[0]]:.3g}), so p(y | x) does not exist; its generator draws x from U[0, 1] "
                f"({bad.size} of {len(x)} inputs affected)"
            )
        return normal_logpdf(y, proc.mean(x), np.sqrt(var)) + log_jacobian
    nodes = check_int(nodes, "nodes")
    if nodes % 2:
        raise ValueError(f"nodes must be even (a rule symmetric about z = 0), got {nodes}")
    z = np.sqrt(proc.z_var) * 8.0 * ((np.arange(nodes) + 0.5) / nodes * 2.0 - 1.0)
    log_w = normal_logpdf(z, 0.0, np.sqrt(proc.z_var))
    log_w -= special.logsumexp(log_w)
    out = np.empty_like(x)
    chunk = max(1, 2_000_000 // nodes)
    for s in range(0, len(x), chunk):
        xs, ys = x[s : s + chunk, None], y[s : s + chunk, None]
        logp = normal_logpdf(ys, proc.f(xs, z[None, :]), np.sqrt(proc.noise_var))
        out[s : s + chunk] = special.logsumexp(logp + log_w[None, :], axis=1)
    return out + log_jacobian


def expected_test_ll(name: str, *, num_points: int = 100_000, seed: int = 0, nodes: int = 2000) -> OracleLL:
    """``LL* = E[log p(y | x)]``: the best expected per-point test LL of data set ``name``.

    Heteroscedastic sets: exact up to quadrature error (``stderr`` 0). Latent-input sets: the mean
    of :func:`true_log_density` over ``num_points`` test points drawn by the set's own generator
    with ``seed``, and its standard error.

    >>> round(expected_test_ll("yuan").value, 4)  # E log v(x) = E sin(2 pi x) = 0
    -1.4189
    """
    proc = _process(name)
    if isinstance(proc, HeteroscedasticProcess):
        from scipy import integrate  # scipy.integrate costs 0.3 s to import; only this branch needs it

        mean_log_var, _ = integrate.quad(lambda u: float(np.log(proc.var(np.array(u)))), 0.0, 1.0, limit=200)
        return OracleLL(float(-0.5 * np.log(2 * np.pi) - 0.5 - 0.5 * mean_log_var), 0.0)
    num_points = check_int(num_points, "num_points", minimum=2)
    data = REGISTRY[_canonical(name)].loader(seed=check_seed(seed), sizes=(1, 1, num_points))
    logp = true_log_density(name, data.x_test.double(), data.y_test.double(), nodes=nodes)
    return OracleLL(float(logp.mean()), float(logp.std(ddof=1) / np.sqrt(len(logp))))
