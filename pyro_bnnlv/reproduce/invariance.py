r"""The invariance paper's experiments in Pyro, and its Fig. 1-2.

Kurle, Herbrich, Januschowski, Wang & Gasthaus (2022), "On the detrimental effect of invariances
in the likelihood for variational inference" (NeurIPS 2022; arXiv:2209.07157).
:mod:`pyro_bnnlv.models.linear` has the over-parametrised linear model and
:mod:`pyro_bnnlv.stats.linear_closed_forms` every closed form of the paper (sec. 3-4). This
module runs Pyro's own inference on that model and compares it with the closed forms:

* :func:`svi_invariance_experiment`: mean-field VI (``AutoNormal`` + :func:`~pyro_bnnlv.fit_svi`)
  for a sweep of ``K``; the fitted ``loc``/``scale`` against the mean-field optimum
  ``q_0(theta_0*)`` (eq. 17b, 19), and the fitted predictive variance against the closed form,
  the exact posterior's and the prior's (Fig. 2d: it reverts to the prior as ``K`` grows).
* :func:`nuts_invariance_check`: NUTS (:func:`~pyro_bnnlv.infer.mcmc.nuts.run_nuts`, fast path through
  :meth:`OverparametrisedLinear.nuts_potential`) against the exact posterior (eq. 13), with
  Monte-Carlo standard errors from the effective sample size.
* :func:`invariance_gap_table`, :func:`plot_invariance_gap`, :func:`write_invariance_gap_figure`:
  the data of Fig. 1 and Fig. 2 from the closed forms, the figure, and its PNG
  (``docs/figures/invariance-gap.png``).

Why ``theta_0*`` is the target of ``AutoNormal``. ``AutoNormal`` is the family of all diagonal
Gaussians; ``q_0(theta) = p g_0 / Z_0`` (eq. 6a) covers the diagonal Gaussians whose variances are
below the prior's, which contains the optimum. For a Gaussian posterior ``N(m_p, V_p)`` the
ELBO-optimal diagonal Gaussian is ``N(m_p, Diag(diag(V_p^{-1}))^{-1})`` (mean = posterior mean,
precisions = diagonal of the posterior precision; the paper's ref. [34]); here
``diag(V_p^{-1}) = 1/(K sigma_0^2) + N/(K^2 sigma_y^2)``, which is ``q_0(theta_0*)`` with
:func:`~pyro_bnnlv.stats.linear_closed_forms.theta_star_0` (eq. 19 with its mean corrected, see
:mod:`pyro_bnnlv.stats.linear_closed_forms`). So the SVI optimum must equal ``q_0(theta_0*)`` exactly and
any difference is optimisation error.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal, init_to_mean
from torch import Tensor

from .._figures import finish_figure
from ..infer.mcmc import run_nuts
from ..infer.svi import fit_svi
from ..models.linear import DTYPE, Gaussian, OverparametrisedLinear
from ..param_names import own_param_names
from ..stats.linear_closed_forms import (
    data_related_bound,
    elbo_terms,
    exact_posterior,
    invariance_gap,
    kl_gaussians,
    log_evidence,
    max_expected_log_likelihood,
    predictive_moments,
    prior_gaussian,
    q0,
    qmix,
    theta_star_0,
    theta_star_mix,
)

__all__ = [
    "DEFAULT_STAGES",
    "FIGURE_NOISE_SCALE",
    "fit_mean_field_linear",
    "invariance_gap_table",
    "nuts_invariance_check",
    "plot_invariance_gap",
    "svi_invariance_experiment",
    "write_invariance_gap_figure",
]

#: ``sigma_y = (2 pi e)^{-1/2}``, the noise of Fig. 1 and Fig. 2.
FIGURE_NOISE_SCALE = (2 * math.pi * math.e) ** -0.5

#: ``(lr, num_steps)`` of the Adam stages of :func:`fit_mean_field_linear`; the iterates of the
#: last stage are averaged (Polyak-Ruppert).
DEFAULT_STAGES: tuple[tuple[float, int], ...] = ((0.05, 1000), (0.01, 1000), (0.002, 2000))


def _check_stages(stages: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    out = []
    for item in stages:
        try:
            lr, n = item
        except (TypeError, ValueError):
            raise ValueError(f"stages must be a sequence of (lr, num_steps) pairs, got {stages!r}")
        if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
            raise ValueError(f"stages: learning rates must be positive, got {lr!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"stages: step counts must be positive integers, got {n!r}")
        out.append((float(lr), n))
    if not out:
        raise ValueError("stages must contain at least one (lr, num_steps) pair")
    return out


def _check_Ks(Ks: Sequence[int]) -> list[int]:
    Ks = list(Ks)
    if not Ks or any(not isinstance(K, int) or isinstance(K, bool) or K < 1 for K in Ks):
        raise ValueError(f"Ks must be a non-empty sequence of positive integers, got {Ks!r}")
    return Ks


def _check_N(N: int) -> None:
    if not isinstance(N, int) or isinstance(N, bool) or N < 1:
        raise ValueError(f"N must be a positive integer, got {N!r}")


def fit_mean_field_linear(
    model: OverparametrisedLinear,
    x: Tensor | None,
    y: Tensor,
    *,
    stages: Sequence[tuple[float, int]] = DEFAULT_STAGES,
    num_particles: int = 256,
    init_scale: float = 1.0,
    seed: int | None = 0,
) -> tuple[AutoNormal, Gaussian, dict]:
    """Mean-field VI on the linear model: ``AutoNormal`` fitted by :func:`~pyro_bnnlv.fit_svi`.

    Settings chosen so that the result is the ELBO optimum up to a small, measured optimisation
    noise (``tests/test_invariance.py``):

    * ``TraceMeanField_ELBO`` with ``num_particles`` vectorised particles: the KL to the prior
      is analytic, only the expected log-likelihood is sampled. (The JIT-compiled variant was
      many times slower per step here.) The guide starts at the prior mean (``init_to_mean``) and
      ``init_scale``.
    * Adam in ``stages`` of decreasing learning rate (one ``fit_svi`` call each, seeded
      ``seed + stage``), and Polyak-Ruppert averaging of ``loc`` and ``scale`` over the iterates
      of the last stage.

    Returns ``(guide, q, info)``: the guide (its parameters are the *last* iterate), the averaged
    ``q = N(loc, Diag(scale^2))`` as a float64 :class:`~pyro_bnnlv.models.linear.Gaussian`, and
    ``info`` with the final loss, the seconds, and ``scale_iterate_sd``: the standard deviation of
    the last stage's iterates of ``scale`` relative to their mean, averaged over coordinates
    (a measure of the optimisation noise left).
    """
    stages = _check_stages(stages)
    if not isinstance(num_particles, int) or isinstance(num_particles, bool) or num_particles < 1:
        raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}")
    if not (isinstance(init_scale, (int, float)) and init_scale > 0):
        raise ValueError(f"init_scale must be positive, got {init_scale!r}")
    guide = own_param_names(AutoNormal(model, init_loc_fn=init_to_mean, init_scale=float(init_scale)))
    loss = TraceMeanField_ELBO(num_particles=num_particles, vectorize_particles=True, max_plate_nesting=1)
    sums: dict[str, Any] = {"loc": 0.0, "scale": 0.0, "scale2": 0.0, "n": 0}
    t0 = time.perf_counter()
    history: list[float] = []
    for i, (lr, n) in enumerate(stages):
        last = i == len(stages) - 1

        def record(step: int, value: float, last: bool = last) -> None:
            if last:
                loc, scale = guide._get_loc_and_scale("w")
                sums["loc"] = sums["loc"] + loc.detach().to(DTYPE)
                sums["scale"] = sums["scale"] + scale.detach().to(DTYPE)
                sums["scale2"] = sums["scale2"] + scale.detach().to(DTYPE) ** 2
                sums["n"] += 1

        history += fit_svi(
            model,
            guide,
            x,
            y,
            num_steps=n,
            lr=lr,
            loss=loss,
            seed=None if seed is None else int(seed) + i,
            progress=False,
            callback=record,
        )
    n = sums["n"]
    loc, scale = sums["loc"] / n, sums["scale"] / n
    scale_sd = (sums["scale2"] / n - scale**2).clamp_min(0).sqrt()
    info = dict(
        final_loss=history[-1],
        seconds=time.perf_counter() - t0,
        scale_iterate_sd=float((scale_sd / scale).mean()),
        num_steps=len(history),
    )
    return guide, Gaussian(loc, torch.diag(scale**2)), info


def svi_invariance_experiment(
    Ks: Sequence[int] = tuple(range(2, 129, 2)),
    N: int = 10,
    y_value: float = 1.0,
    prior_loc: float = 0.0,
    prior_scale: float = 1.0,
    noise_scale: float = FIGURE_NOISE_SCALE,
    *,
    stages: Sequence[tuple[float, int]] = DEFAULT_STAGES,
    num_particles: int = 256,
    init_scale: float = 1.0,
    seed: int | None = 0,
    progress: bool = False,
):
    r"""Pyro's mean-field VI on the over-parametrised linear model against the closed forms.

    For each ``K`` in ``Ks``: ``OverparametrisedLinear(K, prior_loc, prior_scale, noise_scale)``
    (prior ``N(mu 1, K sigma_0^2 I)``, sec. 4), ``N`` observations ``y = y_value`` at ``x = 1``
    (Fig. 2's setting by default), ``AutoNormal`` fitted by :func:`fit_mean_field_linear`
    (``stages``, ``num_particles``, ``init_scale``, ``seed``), compared with the mean-field
    optimum ``q_0(theta_0*)`` (eq. 6a, 17b, 19; see the module docstring for why this is the
    exact target).

    Returns a :class:`pandas.DataFrame`, one row per ``K``:

    * ``loc_fit``, ``loc_star``: mean over coordinates of the fitted and optimal ``loc``;
      ``loc_err``: ``max_k |loc_k - loc*_k| / scale*_k`` (error in units of the optimal scale);
    * ``scale_fit``, ``scale_star``: mean over coordinates; ``scale_rel_err``:
      ``max_k |scale_k / scale*_k - 1|``; ``scale_mean_rel_err``: ``mean_k (scale_k/scale*_k - 1)``;
      ``scale_iterate_sd``: optimisation noise (see :func:`fit_mean_field_linear`);
    * ``pred_var_f_fit``, ``pred_var_f_star``, ``pred_var_f_post``, ``pred_var_f_prior``:
      variance of ``f* = 1^T w / K`` at ``x* = 1`` under the fitted ``q``, ``q_0(theta_0*)``, the
      exact posterior (eq. 13) and the prior (``sigma_0^2`` for every ``K``); ``pred_var_y_*``
      the same plus ``sigma_y^2``; ``pred_var_rel_err``: ``pred_var_f_fit / pred_var_f_star - 1``;
    * ``elbo_fit``, ``elbo_star`` (closed-form ELBO, eq. 2, of the fitted ``q`` and of the
      optimum) and ``elbo_gap = elbo_star - elbo_fit`` (``>= 0`` up to rounding);
      ``log_evidence``; ``gap_theta_0``, ``gap_theta_mix``: the invariance gap (eq. 10) at the two
      optima (Fig. 1);
    * ``seconds``, ``num_steps``.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    Ks = _check_Ks(Ks)
    _check_N(N)
    y = torch.full((N,), float(y_value), dtype=DTYPE)
    x = torch.ones(N, dtype=DTYPE)
    s2 = float(noise_scale) ** 2
    rows = []
    for K in tqdm(Ks, disable=not progress, desc="K", leave=False):
        model = OverparametrisedLinear(K, prior_loc, prior_scale, noise_scale)
        prior = model.prior()
        _, q_fit, info = fit_mean_field_linear(
            model, x, y, stages=stages, num_particles=num_particles, init_scale=init_scale, seed=seed
        )
        q_star = q0(prior, *theta_star_0(prior, y, noise_scale))
        post = exact_posterior(prior, y, noise_scale)
        loc, scale = q_fit.loc, q_fit.cov.diagonal().sqrt()
        loc_s, scale_s = q_star.loc, q_star.cov.diagonal().sqrt()
        var = {
            name: float(predictive_moments(q, noise_scale).var_f)
            for name, q in (("fit", q_fit), ("star", q_star), ("post", post), ("prior", prior))
        }
        e_fit = float(elbo_terms(q_fit, prior, y, noise_scale).elbo)
        e_star = float(elbo_terms(q_star, prior, y, noise_scale).elbo)
        row = dict(
            K=K,
            loc_fit=float(loc.mean()),
            loc_star=float(loc_s.mean()),
            loc_err=float(((loc - loc_s).abs() / scale_s).max()),
            scale_fit=float(scale.mean()),
            scale_star=float(scale_s.mean()),
            scale_rel_err=float((scale / scale_s - 1).abs().max()),
            scale_mean_rel_err=float((scale / scale_s - 1).mean()),
            scale_iterate_sd=info["scale_iterate_sd"],
        )
        for name, v in var.items():
            row[f"pred_var_f_{name}"] = v
        for name, v in var.items():
            row[f"pred_var_y_{name}"] = v + s2
        row.update(
            pred_var_rel_err=var["fit"] / var["star"] - 1,
            elbo_fit=e_fit,
            elbo_star=e_star,
            elbo_gap=e_star - e_fit,
            log_evidence=float(elbo_terms(post, prior, y, noise_scale).elbo),  # ELBO of the exact posterior = ln p(y)
            gap_theta_0=float(invariance_gap(prior, *theta_star_0(prior, y, noise_scale))),
            gap_theta_mix=float(invariance_gap(prior, *theta_star_mix(y, K, noise_scale))),
            seconds=info["seconds"],
            num_steps=info["num_steps"],
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _se_mean(values: Tensor) -> tuple[float, float, float]:
    """Mean, its Monte-Carlo standard error from the ESS, and the ESS; ``values (C, S)``."""
    from pyro.ops.stats import effective_sample_size

    ess = float(effective_sample_size(values.unsqueeze(-1), chain_dim=0, sample_dim=1))
    ess = max(min(ess, values.numel()), 1.0)
    return float(values.mean()), float(values.std() / math.sqrt(ess)), ess


def nuts_invariance_check(
    K: int = 4,
    N: int = 10,
    y_value: float = 1.0,
    prior_loc: float = 0.0,
    prior_scale: float = 1.0,
    noise_scale: float = FIGURE_NOISE_SCALE,
    *,
    num_samples: int = 1000,
    warmup_steps: int = 500,
    num_chains: int = 2,
    full_mass: bool = True,
    coords: Sequence[int] = (0, 1),
    seed: int | None = 0,
    progress: bool = False,
):
    r"""NUTS on the over-parametrised linear model against the exact posterior (eq. 13).

    Runs :func:`~pyro_bnnlv.infer.mcmc.nuts.run_nuts` (fast path via
    :meth:`OverparametrisedLinear.nuts_potential`, MAP initialisation, ``full_mass`` dense mass
    matrix: the posterior is a diagonal-plus-rank-one Gaussian whose long axes lie in
    ``1^perp``, poorly conditioned for a diagonal mass matrix when ``N/sigma_y^2`` is large) on
    ``N`` observations ``y = y_value`` at ``x = 1``.

    Returns ``(table, mcmc)``. ``table`` is a :class:`pandas.DataFrame` with one row per
    quantity: the mean and variance of ``f = 1^T w / K``, and for each coordinate ``k`` in
    ``coords`` the mean and variance of ``w_k``, plus the covariance of the first two ``coords``.
    Columns: ``nuts`` (estimate from all chains), ``exact``, ``se`` (Monte-Carlo standard error:
    standard deviation of the per-draw quantity -- ``f``, ``w_k``, ``(w_k - mean)^2``, ... -- over
    the square root of its effective sample size), ``ess``, and ``z = (nuts - exact) / se``.
    """
    import pandas as pd

    _check_Ks([K])
    _check_N(N)
    coords = list(coords)
    if any(not isinstance(k, int) or not 0 <= k < K for k in coords):
        raise ValueError(f"coords must be indices in [0, {K}), got {coords!r}")
    model = OverparametrisedLinear(K, prior_loc, prior_scale, noise_scale)
    x = torch.ones(N, dtype=DTYPE)
    y = torch.full((N,), float(y_value), dtype=DTYPE)
    mcmc = run_nuts(
        model,
        x,
        y,
        num_samples=num_samples,
        warmup_steps=warmup_steps,
        num_chains=num_chains,
        full_mass=full_mass,
        map_steps=500,
        map_lr=0.05,
        seed=seed,
        progress=progress,
    )
    w = mcmc.get_samples(group_by_chain=True)["w"].to(DTYPE)  # (C, S, K)
    post = exact_posterior(model.prior(), y, noise_scale)
    X = torch.full((K,), 1.0 / K, dtype=DTYPE)
    quantities: list[tuple[str, Tensor, float, float]] = []  # name, draws, exact mean, exact var
    quantities.append(("f", w @ X, float(X @ post.loc), float(X @ post.cov @ X)))
    for k in coords:
        quantities.append((f"w[{k}]", w[..., k], float(post.loc[k]), float(post.cov[k, k])))
    rows = []
    for name, draws, m_exact, v_exact in quantities:
        m, se, ess = _se_mean(draws)
        rows.append(dict(quantity=f"mean {name}", nuts=m, exact=m_exact, se=se, ess=ess))
        sq = (draws - draws.mean()) ** 2
        v, se_v, ess_v = _se_mean(sq)
        rows.append(dict(quantity=f"var {name}", nuts=v, exact=v_exact, se=se_v, ess=ess_v))
    if len(coords) >= 2:
        a, b = coords[:2]
        prod = (w[..., a] - w[..., a].mean()) * (w[..., b] - w[..., b].mean())
        c, se_c, ess_c = _se_mean(prod)
        rows.append(dict(quantity=f"cov w[{a}],w[{b}]", nuts=c, exact=float(post.cov[a, b]), se=se_c, ess=ess_c))
    table = pd.DataFrame(rows).set_index("quantity")
    table["z"] = (table.nuts - table.exact) / table.se
    return table, mcmc


def write_invariance_gap_figure(
    path: str | Path = "docs/figures/invariance-gap.png",
    Ks: Sequence[int] = tuple(range(2, 129, 2)),
    N: int = 10,
    svi: Any = None,
):
    """Fig. 1 and Fig. 2 from the closed forms, written to the PNG ``path``.

    :func:`invariance_gap_table` with the figures' settings and ``N`` observations, drawn by
    :func:`plot_invariance_gap`.

    With ``svi`` (a :func:`svi_invariance_experiment` table) the fitted ``AutoNormal``'s ELBO and
    predictive variance are overlaid as black crosses on the ELBO and predictive-variance panels.
    Returns the closed-form table.
    """
    table = invariance_gap_table(Ks=_check_Ks(Ks), N=N)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_invariance_gap(table, path, svi=svi)
    return table


def invariance_gap_table(
    Ks: Sequence[int] = tuple(range(2, 129, 2)),
    N: int = 10,
    y_value: float = 1.0,
    prior_loc: float = 0.0,
    prior_scale: float = 1.0,
    noise_scale: float = FIGURE_NOISE_SCALE,
    as_printed: bool = False,
):
    """Data of Fig. 1 and Fig. 2 as a long :class:`pandas.DataFrame`.

    Defaults are the figures' settings: ``sigma^2 = K 1`` (``sigma_0 = 1``),
    ``sigma_y^2 = 1/(2 pi e)``, ``N = 10`` identical observations ``y = 1`` at ``x = 1`` (Fig. 1
    does not state ``N``; ``N = 1`` matches its description better, see the module docstring).

    One row per ``(K, theta, approx)`` with ``theta`` in ``{"theta_0*", "theta_mix*"}`` and
    ``approx`` in ``{"q0", "qmix"}``; columns ``ell``, ``kl`` (to the prior), ``elbo``,
    ``pred_mean``, ``pred_var_f``, ``pred_var_y`` (at ``x* = 1``), and per ``(K, theta)``:
    ``gap`` (``KL[q_0(theta)||q_mix(theta)]``, Fig. 1), ``bound`` (eq. 3), ``ell_max`` (eq. 3's
    ``ELL(q*)``), ``log_evidence``, ``prior_pred_var_y``, and
    ``kl_q0_to_posterior`` (``KL[q_0(theta)||p(w|D)]``, the caption's other reading).
    ``as_printed`` uses the printed mean of eq. 19 for ``theta_0*``.
    """
    import pandas as pd

    y = torch.full((N,), float(y_value), dtype=DTYPE)
    rows = []
    for K in Ks:
        K = int(K)
        prior = prior_gaussian(K, prior_loc, prior_scale)
        post = exact_posterior(prior, y, noise_scale)
        bound = float(data_related_bound(prior, y, noise_scale))
        ell_max = float(max_expected_log_likelihood(y, noise_scale))
        logz = float(log_evidence(prior, y, noise_scale))
        prior_var_y = float(predictive_moments(prior, noise_scale).var_y)
        thetas = {
            "theta_0*": theta_star_0(prior, y, noise_scale, as_printed=as_printed),
            "theta_mix*": theta_star_mix(y, K, noise_scale),
        }
        for tname, (m, lam) in thetas.items():
            gap = float(invariance_gap(prior, m, lam))
            kl_post = float(kl_gaussians(q0(prior, m, lam), post))
            for qname, build in (("q0", q0), ("qmix", qmix)):
                q = build(prior, m, lam)
                terms = elbo_terms(q, prior, y, noise_scale)
                pm = predictive_moments(q, noise_scale)
                rows.append(
                    dict(
                        K=K,
                        theta=tname,
                        approx=qname,
                        ell=float(terms.ell),
                        kl=float(terms.kl),
                        elbo=float(terms.elbo),
                        pred_mean=float(pm.mean),
                        pred_var_f=float(pm.var_f),
                        pred_var_y=float(pm.var_y),
                        gap=gap,
                        bound=bound,
                        ell_max=ell_max,
                        log_evidence=logz,
                        prior_pred_var_y=prior_var_y,
                        kl_q0_to_posterior=kl_post,
                    )
                )
    return pd.DataFrame(rows)


def plot_invariance_gap(df, path=None, svi=None, *, axes=None):
    """Fig. 1 (gap vs ``K`` with the bound) and Fig. 2 (KL, ELL, ELBO, predictive variance)
    panels from :func:`invariance_gap_table` output. Returns the figure; writes the PNG ``path``
    when given; ``axes``: five matplotlib axes to draw into (default: a new figure).

    ``svi``: optionally a :func:`svi_invariance_experiment` table (columns
    ``K``, ``elbo_fit``, ``pred_var_y_fit``), overlaid as black crosses on the ELBO and
    predictive-variance panels."""
    import matplotlib.pyplot as plt

    colors = {"theta_0*": "tab:blue", "theta_mix*": "tab:red"}
    owned = axes is None
    if owned:
        fig, axes = plt.subplots(1, 5, figsize=(22, 4))
    else:
        axes = list(getattr(axes, "flat", axes))
        if len(axes) != 5:
            raise ValueError(
                f"axes must hold 5 matplotlib axes (gap, KL, ELL, ELBO, predictive variance), got {len(axes)}"
            )
        fig = axes[0].figure
    g = df[df.approx == "q0"]
    for tname, sub in g.groupby("theta"):
        axes[0].plot(sub.K, sub.gap, color=colors[tname], label=f"KL[q0||qmix] at {tname}")
    axes[0].plot(g.K.unique(), g.groupby("K").bound.first(), "k--", label="data-related bound")
    axes[0].set_title("Fig. 1: invariance gap")
    for ax, col, title in zip(
        axes[1:], ["kl", "ell", "elbo", "pred_var_y"], ["KL[q||p]", "ELL", "ELBO", "pred. var y*"]
    ):
        for (tname, qname), sub in df.groupby(["theta", "approx"]):
            style = dict(ls="-") if qname == "qmix" else dict(ls="none", marker=".")
            ax.plot(sub.K, sub[col], color=colors[tname], label=f"{qname}, {tname}", **style)
        ax.set_title(title)
    axes[4].plot(g.K.unique(), g.groupby("K").prior_pred_var_y.first(), "k--", label="prior")
    if svi is not None:
        axes[3].plot(svi["K"], svi["elbo_fit"], "kx", label="AutoNormal (Pyro SVI)")
        axes[4].plot(svi["K"], svi["pred_var_y_fit"], "kx", label="AutoNormal (Pyro SVI)")
    for ax in axes:
        ax.set_xlabel("K")
        ax.legend(fontsize=7)
    return finish_figure(fig, path, owned, dpi=100)
