# %% [markdown]
# # Non-identifiability in BNN+LV, and Noise-Constrained Approximate Inference
#
# A runnable walk-through of Yacoby, Pan & Doshi-Velez (2022), arXiv:1911.00569:
#
# 1. the MAP of the joint posterior `p(W, Z | D)` *memorises* the data in the latent inputs
#    (sec. 4.4): the latents depend on `x`, violating the model's assumption `z ⟂ x`;
# 2. mean-field VI inherits the problem; NCAI (initialisation + constrained objective, sec. 6)
#    keeps the latents closer to white noise;
# 3. the uncertainty decomposition (eq. 6-7) into aleatoric and epistemic parts.
#
# This file is a notebook in jupytext "percent" format: open it in Jupyter (with jupytext) or
# VS Code, or run it as a script. `PYRO_BNNLV_TUTORIAL_SMALL=1` shrinks every run so the test
# suite can execute it in well under a minute; figures go to the working directory.

# %%
import os

import pandas as pd
import torch
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import AutoDelta

import pyro_bnnlv as pb
from pyro_bnnlv.reproduce.ncai_compare import CompareConfig, run_compare
from pyro_bnnlv.stats import (
    ksg_mutual_information,
    latent_means,
    plot_uncertainty_decomposition,
    uncertainty_decomposition,
)

SMALL = os.environ.get("PYRO_BNNLV_TUTORIAL_SMALL") == "1"
STEPS = 60 if SMALL else 3000
data = pb.load_dataset("heavy-tail", seed=0, standardize=True, sizes=(100, 50, 50) if SMALL else (300, 300, 300))
print(data)

# %% [markdown]
# ## 1. The joint MAP memorises the noise
#
# `AutoDelta` over `w` and all `z` gives the MAP of `p(W, Z | D)`. Theorem 1-2 of the paper
# say it prefers latents that encode `x` (and `y`): measure that with the KSG mutual
# information between `x` and the MAP latents, against the ground-truth latents' MI (which is 0
# in distribution; its estimate is near 0).

# %%
model = pb.BNNLV(pb.MLP(2, [50], 1, activation="leaky_relu"), latent_dim=1, latent_scale=0.1, noise_scale=0.3)
map_guide = AutoDelta(model, init_loc_fn=pb.init_to_network(model))
pb.fit_svi(
    model, map_guide, data.x_train, data.y_train, num_steps=STEPS, lr=0.01, loss=Trace_ELBO(), seed=0, progress=False
)
z_map = latent_means(map_guide, data.x_train, data.y_train)
mi_map = ksg_mutual_information(data.x_train.numpy(), z_map.numpy())
mi_true = ksg_mutual_information(data.x_train.numpy(), data.extras["z_train"].numpy())
print(f"I(x; z_MAP) = {mi_map:.3f}   vs   I(x; z_true) = {mi_true:.3f}")

# %% [markdown]
# ## 2. Mean-field VI vs NCAI
#
# `run_compare` trains BNN and BNN+LV with mean-field VI, NCAI with λ = 0 (initialisation only)
# and NCAI with the penalties of eq. 27, each the best of some restarts by validation
# log-likelihood, and writes Fig. 4 (predictives on top, latent means against x below).

# %%
cfg = CompareConfig(
    steps=STEPS, restarts=1 if SMALL else 2, num_samples=50 if SMALL else 500, map_steps=50 if SMALL else 2000
)
table, fits = run_compare(data, cfg, progress=not SMALL, figure="tutorial-ncai-compare.png")
print(table.to_string(index=False, float_format="%.3f"))

# %% [markdown]
# ## 3. Uncertainty decomposition (eq. 6-7, Fig. 6)
#
# Total entropy of the predictive, its expected per-weight part (aleatoric: from `z` and the
# noise) and the difference (epistemic), each estimated with k-NN entropies (k = 5).

# %%
grid = torch.linspace(float(data.x_train.min()), float(data.x_train.max()), 25 if SMALL else 80)
frames = {}
for method in ("BNN+LV (MFVI)", "BNN+LV (NCAI_lambda)"):
    fit = fits[method]
    samples = pb.sample_posterior(
        fit.model, fit.guide, data.x_train, data.y_train, num_samples=20 if SMALL else 200, seed=0
    )
    frames[method] = uncertainty_decomposition(fit.model, samples, grid.unsqueeze(-1), num_inner=30 if SMALL else 200)
plot_uncertainty_decomposition(frames, "tutorial-ncai-uncertainty.png")
summary = pd.DataFrame({m: f[["total", "aleatoric", "epistemic"]].mean() for m, f in frames.items()})
print(summary.round(3))
