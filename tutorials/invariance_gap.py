# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Invariances and the invariance gap of mean-field VI
#
# Kurle, Herbrich, Januschowski, Wang & Gasthaus (2022), arXiv:2209.07157, explain why mean-field VI
# of over-parametrised models reverts to the prior: the likelihood is invariant under translations
# of the weights (sec. 4, eq. 12; sec. 5, eq. 20-22), a mean-field Gaussian cannot represent that
# invariance, and the ELBO charges the difference, the *invariance gap* `KL[q_0 || q_mix]` (eq. 10),
# against the data-related bound on the KL (eq. 3, 11). This tutorial
#
# 1. draws Fig. 1 and Fig. 2 from the closed forms of the over-parametrised linear model
#    (`pyro_bnnlv.stats.linear_closed_forms`);
# 2. runs Pyro's mean-field VI (`AutoNormal` + `pb.fit_svi`) on the same model for a sweep of
#    `K` and checks that it lands on the closed-form mean-field optimum `q_0(theta_0*)`, whose
#    predictive variance reverts to the prior as `K` grows;
# 3. runs NUTS on the model and checks it against the exact posterior (eq. 13);
# 4. applies the sec. 5 construction to a trained mean-field BNN: the first-layer
#    invariance-abiding distribution (eq. 23) per training input, and the invariance gap per
#    hidden unit (`pyro_bnnlv.stats.first_layer_invariance_gap`);
# 5. extends it to every layer of a 2-hidden-layer BNN (eq. 25-26,
#    `pb.stats.invariance_gap_by_layer`).
#
# Set `PYRO_BNNLV_TUTORIAL_SMALL=1` for a quick run (the test suite does this). The full size
# runs the sweep `K in {2, 4, ..., 128}` at the default SVI settings (about 10 minutes
# on one core). Figures go to `$PYRO_BNNLV_TUTORIAL_OUT` (default: the current directory).

# %%
import os
import time
from pathlib import Path

import pandas as pd
import torch
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.reproduce.invariance import (
    DEFAULT_STAGES,
    invariance_gap_table,
    nuts_invariance_check,
    svi_invariance_experiment,
    write_invariance_gap_figure,
)
from pyro_bnnlv.stats import first_layer_invariance_gap, plot_first_layer_invariance_gap

SMALL = os.environ.get("PYRO_BNNLV_TUTORIAL_SMALL", "0") == "1"
OUT = Path(os.environ.get("PYRO_BNNLV_TUTORIAL_OUT", "."))
OUT.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)
pd.set_option("display.width", 140)

size = dict(
    Ks_svi=[2, 8, 32] if SMALL else list(range(2, 129, 2)),
    svi_stages=((0.05, 300), (0.01, 300), (0.002, 600)) if SMALL else DEFAULT_STAGES,
    svi_particles=64 if SMALL else 256,
    nuts_Ks=[4] if SMALL else [4, 32],
    nuts_samples=500 if SMALL else 2000,
    nuts_warmup=300 if SMALL else 1000,
    bnn_widths=[10, 30] if SMALL else [10, 50, 200],
    bnn_steps=800 if SMALL else 5000,
    mixture_samples=200 if SMALL else 2000,
    deep_width=10 if SMALL else 50,
    activation_samples=16 if SMALL else 64,
)
size

# %% [markdown]
# ## 1. Fig. 1 and Fig. 2 from the closed forms
#
# `K` weights, prior `N(0, K sigma_0^2 I)` (the same prior over `f = 1^T w / K` for every `K`),
# `N = 10` observations `y = 1` at `x = 1`, noise `sigma_y^2 = 1/(2 pi e)`. Two parameter
# settings of the likelihood approximation `g_0`: `theta_mix*` (eq. 18, where `q_mix` is the
# exact posterior) and `theta_0*` (eq. 19 with the mean corrected, the best mean-field `q_0`).
# The gap at `theta_mix*` grows linearly in `K` and soon exceeds the data-related bound (eq. 3),
# so mean-field VI cannot reach it; at `theta_0*` it stays bounded, and the predictive variance
# of `q_0(theta_0*)` reverts to the prior's.

# %%
closed = invariance_gap_table(Ks=range(2, 129, 2), N=10)
q0_opt = closed[(closed.theta == "theta_0*") & (closed.approx == "q0")].set_index("K")
mix_opt = closed[(closed.theta == "theta_mix*") & (closed.approx == "qmix")].set_index("K")
print(
    pd.DataFrame(
        {
            "gap at theta_0*": q0_opt.gap,
            "gap at theta_mix*": mix_opt.gap,
            "bound (eq. 3)": q0_opt.bound,
            "pred var y, q0(theta_0*)": q0_opt.pred_var_y,
            "pred var y, exact": mix_opt.pred_var_y,
            "prior pred var y": q0_opt.prior_pred_var_y,
        }
    )
    .loc[[2, 8, 32, 64, 128]]
    .round(4)
    .to_string()
)

# %% [markdown]
# ## 2. The same experiment with Pyro's mean-field VI
#
# `AutoNormal` is the family of all diagonal Gaussians, so its ELBO optimum is
# `q_0(theta_0*)` exactly (for a Gaussian posterior the best diagonal Gaussian has the
# posterior mean and the diagonal of the posterior precision). `svi_invariance_experiment` fits
# it with `pb.fit_svi` (`TraceMeanField_ELBO` with many vectorised particles, Adam in stages of
# decreasing learning rate, iterate averaging in the last stage) and compares.

# %%
t0 = time.perf_counter()
svi = svi_invariance_experiment(
    Ks=size["Ks_svi"], stages=size["svi_stages"], num_particles=size["svi_particles"], seed=0
)
svi_seconds = time.perf_counter() - t0
cols = [
    "K",
    "loc_err",
    "scale_rel_err",
    "pred_var_f_fit",
    "pred_var_f_star",
    "pred_var_f_post",
    "pred_var_f_prior",
    "pred_var_rel_err",
    "elbo_gap",
    "gap_theta_0",
    "gap_theta_mix",
]
print(f"{len(svi)} fits in {svi_seconds:.0f} s")
print(svi[cols].round(4).to_string())

# %%
write_invariance_gap_figure(OUT / "invariance-gap.png", Ks=range(2, 129, 2), N=10, svi=svi)

# %% [markdown]
# ## 3. NUTS against the exact posterior
#
# `run_nuts` uses the model's fast potential (`OverparametrisedLinear.nuts_potential`) and a
# dense mass matrix (the posterior is a diagonal-plus-rank-one Gaussian with correlated
# weights). `z` is the error in units of the Monte-Carlo standard error.

# %%
nuts_tables = {}
for K in size["nuts_Ks"]:
    table, mcmc = nuts_invariance_check(
        K=K, num_samples=size["nuts_samples"], warmup_steps=size["nuts_warmup"], num_chains=2, seed=0
    )
    nuts_tables[K] = table
    print(f"K = {K}: {mcmc.run_info.path}, {mcmc.run_info.total_seconds:.1f} s")
    print(table.round(4).to_string())

# %% [markdown]
# ## 4. The invariance gap of a mean-field BNN's first layer (sec. 5)
#
# At a single input `x`, hidden unit `j` of the first layer depends on its weights (and bias)
# only through `w_j^T [x, 1]`: the likelihood of that input is invariant under translations
# along `[x, 1]^perp` (eq. 22). `first_layer_invariance_gap` reads the fitted `AutoNormal` as
# `q_0 = p g_0` (eq. 6a), builds the invariance-abiding `q_mix(w_j | x)` of eq. 23 for every
# training input and reports per unit the gap `KL[q_0 || q_mix]` averaged over inputs, next to
# the unit's whole KL to the prior. See its docstring for the assumptions. The fraction of the
# KL that is invariance gap is the share of the regulariser that mean-field VI pays for not
# representing the invariance.

# %%
data = pb.load_dataset("cosine")
x, y = data.x_train, data.y_train
gap_tables, totals = {}, []
for H in size["bnn_widths"]:
    model = pb.BNN(pb.MLP(1, [H], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1)
    guide = AutoNormal(model, init_scale=0.01, init_loc_fn=pb.init_to_network(model, seed=0))
    pb.fit_svi(model, guide, x, y, num_steps=size["bnn_steps"], lr=0.01, seed=0, progress=False)
    df = first_layer_invariance_gap(model, guide, x, num_samples=size["mixture_samples"], seed=0)
    gap_tables[H] = df
    totals.append(
        dict(
            width=H,
            total_gap=df.gap_mean.sum(),
            total_gap_mixture=df.gap_mixture.sum(),
            first_layer_kl=df.kl_to_prior.sum(),
            collapsed_units=int((df.kl_to_prior < 0.1).sum()),
        )
    )
    plot_first_layer_invariance_gap(df, OUT / f"invariance-gap-bnn-{H}.png")
totals = pd.DataFrame(totals).set_index("width")
print(totals.round(3).to_string())
H = size["bnn_widths"][-1]
print(gap_tables[H].sort_values("gap_mean", ascending=False).head(8).round(4).to_string())

# %% [markdown]
# ## 5. Every layer of a deeper BNN (eq. 25-26)
#
# Unit `j` of layer `l` sees only the previous layer's activations `z_{l-1}`, so eq. 25 is
# eq. 23 with `[x, 1]` replaced by `[z_{l-1}, 1]`, averaged over `z ~ P(z_{l-1})`.
# `invariance_gap_by_layer` draws `activation_samples` activations per training input from `P`
# through `q_mix` of the earlier layers (eq. 24, 26; `activations="q0"` uses the fitted
# mean-field `q_0`: assumption 9 in the docstring of `pyro_bnnlv.stats.invariance_gap`) and reports every unit of
# every layer (layer 2 is the output unit). Per layer: total gap, total KL to the prior and the
# share of that KL which is invariance gap.

# %%
Hd = size["deep_width"]
deep = pb.BNN(pb.MLP(1, [Hd, Hd], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1)
deep_guide = AutoNormal(deep, init_scale=0.01, init_loc_fn=pb.init_to_network(deep, seed=0))
pb.fit_svi(deep, deep_guide, x, y, num_steps=size["bnn_steps"], lr=0.01, seed=0, progress=False)
by_layer = pb.stats.invariance_gap_by_layer(
    deep, deep_guide, x, seed=0, num_activation_samples=size["activation_samples"]
)
layer_totals = by_layer.groupby("layer").agg(
    units=("unit", "size"),
    gap_mean_per_unit=("gap_mean", "mean"),
    total_gap=("gap_mean", "sum"),
    total_kl=("kl_to_prior", "sum"),
    collapsed_units=("kl_to_prior", lambda kl: int((kl < 0.1).sum())),
)
layer_totals["gap_fraction"] = layer_totals.total_gap / layer_totals.total_kl
print(layer_totals.round(4).to_string())
