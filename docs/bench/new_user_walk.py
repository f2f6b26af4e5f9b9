# A new user's script: own data with 3 inputs, an nn.Sequential with SiLU through NUTS and ArviZ,
# Laplace plotted; the data loader offline and from a mirror. Lines between the markers are the
# user's; the rest times them.
import sys, time

T0 = time.perf_counter()
_t = [T0]


def lap(what):
    now = time.perf_counter()
    print(f"[walk] {what}: {now - _t[0]:.1f} s", flush=True)
    _t[0] = now


MIRROR = sys.argv[1]
# --- user ---
import numpy as np
import arviz as az
from torch import nn
import pyro_bnnlv as pb
from pyro_bnnlv.plotting import plot_predicted_vs_observed, plot_calibration

# --- end user ---
lap("imports")
# --- user ---
try:
    pb.datasets.load_dataset("yacht")  # offline, no data setting
except Exception as err:
    print(type(err).__name__, str(err))
# --- end user ---
lap("offline load_dataset (fails)")
# --- user ---
yacht = pb.datasets.load_dataset("yacht", mirror=MIRROR)  # a directory in the data layout
print(yacht)
# --- end user ---
lap("mirror load_dataset")
# --- user ---
rng = np.random.default_rng(0)
x = rng.uniform(-2, 2, (300, 3))
y = np.sin(2 * x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * rng.standard_normal(300)
data = pb.datasets.from_arrays(x, y, seed=0)
net = pb.ModuleNet(nn.Sequential(nn.Linear(3, 32), nn.SiLU(), nn.Linear(32, 1)), in_features=3, out_features=1)
model = pb.BNN(net, prior_scale=pb.fan_in_prior_scale(net), noise_scale=0.1)
mcmc = pb.run_nuts(model, data.x_train, data.y_train, num_samples=300, warmup_steps=300, num_chains=2, seed=0)
# --- end user ---
lap("NUTS, first call (includes the compiled core's build on a fresh machine)")
# --- user ---
idata = pb.to_inference_data(model, mcmc, data.x_train, data.y_train)
print(az.summary(idata))
pb.diagnostics.plot_trace(idata, "trace.png")
print(pb.evaluate(model, mcmc, data))
# --- end user ---
lap("ArviZ summary, trace plot, evaluate")
# --- user ---
w = pb.train_map(model, data.x_train, data.y_train)
la = pb.LinearizedLaplace(model, w).fit(data.x_train, data.y_train)
la.optimize_hyperparameters(method="marglik")
print(pb.evaluate(model, la, data))
plot_predicted_vs_observed(model, la, data, "laplace_pred_vs_obs.png")
plot_calibration(model, la, data, "laplace_calibration.png")
# --- end user ---
lap("MAP + Laplace + two plots")
print(f"[walk] total {time.perf_counter() - T0:.1f} s")
