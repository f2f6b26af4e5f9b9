"""``pyro-bnnlv bench NAME``: the benchmarks' registry (:data:`BENCHMARKS`) and the SVI engine's.

Each benchmark prints ratios measured side by side in one run (:mod:`.timing`). The papers'
benchmarks live in their modules (``ncai`` in :mod:`.ncai`, ``knn`` and ``allocator`` in
:mod:`.hyvi`, ``proj`` in :mod:`.projected`, ``laplace`` in :mod:`.in_between`), NUTS's in
:mod:`.nuts_bench`; this module has the SVI engine's:

``svi-overhead``: one SVI step of the 1x50 tanh BNN on 100 points, N(0, 1) prior, sigma 0.1:

* ``hand``: hand-written Bayes-by-Backprop in plain PyTorch: reparameterised sample, the same
  single-sample estimator as ``Trace_ELBO`` (log-likelihood + log prior - log q), one Adam;
* ``ours``: the library's default path, ``fit_svi(BNN, AutoNormal)`` (SVI + ``CompiledTraceElbo``),
  timed per step inside ``fit_svi`` through its callback;
* ``pyro``: idiomatic Pyro, ``SVI(BNN, AutoNormal, Adam, Trace_ELBO())``;
* the cost of 32 vectorised particles relative to 1, by hand and in our default path.

``lv-scaling``: one minibatch SVI step (batch 500; full batch at N = 100) of BNN+LV
(1x50 leaky-ReLU network, mean-field over ``w`` and all ``z``) at N = 100, 10,000 and 45,000:
our default path (``fit_svi`` with ``AutoNormal(create_plates=model.create_plates)``) against a
hand-written PyTorch step of the same estimator (sample ``w`` and the batch's ``z``, rescale the
likelihood and the latents' log-density ratio by ``N / B``, one Adam over all parameters).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import pandas as pd
import pyro
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from ..guides import init_to_network
from ..infer.elbos.penalized import CompiledTraceElbo
from ..models.bnn import BNN
from ..models.bnnlv import BNNLV
from ..nets import MLP
from .hyvi import allocator_bench, knn_bench
from .in_between import laplace_bench
from .ncai import ncai_bench
from .nuts_bench import nuts_benchmark, nuts_uci_benchmark
from .projected import proj_bench
from .timing import fit_step_ms, median_ms

__all__ = ["BENCHMARKS", "lv_scaling", "svi_overhead"]

_LOG2PI = math.log(2 * math.pi)


def _hand_bbb_step(net: MLP, x: torch.Tensor, y: torch.Tensor, particles: int) -> Callable[[], None]:
    P = net.num_weights
    loc = torch.nn.Parameter(net.init_weights(torch.Generator().manual_seed(0)))
    rho = torch.nn.Parameter(torch.full((P,), math.log(math.expm1(0.01))))
    opt = torch.optim.Adam([loc, rho], lr=1e-3)
    sigma = 0.1

    def step() -> None:
        opt.zero_grad()
        scale = torch.nn.functional.softplus(rho)
        eps = torch.randn(particles, P)
        w = loc + scale * eps
        f = net(x, w).squeeze(-1)  # (particles, N)
        ll = (-0.5 * ((y - f) / sigma) ** 2 - math.log(sigma) - 0.5 * _LOG2PI).sum(-1)
        lq = (-0.5 * eps**2 - scale.log() - 0.5 * _LOG2PI).sum(-1)
        lp = (-0.5 * w**2 - 0.5 * _LOG2PI).sum(-1)
        loss = -(ll + lp - lq).mean()
        loss.backward()
        opt.step()

    return step


def _ours_ms(net: MLP, x: torch.Tensor, y: torch.Tensor, steps: int, particles: int) -> float:
    """Median per-step time of ``fit_svi``'s default path, stamped by its callback."""
    model = BNN(net, prior_scale=1.0, noise_scale=0.1)
    guide = AutoNormal(model, init_scale=0.01, init_loc_fn=init_to_network(model))
    loss = None
    if particles > 1:
        loss = CompiledTraceElbo(num_particles=particles, vectorize_particles=True, max_plate_nesting=1)
    return fit_step_ms(model, guide, x, y, steps, lr=1e-3, loss=loss)


def _pyro_trace_step(net: MLP, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    model = BNN(net, prior_scale=1.0, noise_scale=0.1)
    guide = AutoNormal(model, init_scale=0.01, init_loc_fn=init_to_network(model))
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), Trace_ELBO())

    def step() -> None:
        svi.step(x, y)

    return step


def svi_overhead(steps: int = 300, rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """Median ms per SVI step of each contender and ratios to the hand-written step."""
    torch.manual_seed(seed)
    x = torch.linspace(-1, 1, 100).unsqueeze(-1)
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(100)
    net = MLP(1, [50], 1, activation="tanh")
    rows: dict[str, list[float]] = {k: [] for k in ("hand", "ours", "pyro", "hand32", "ours32")}
    store = pyro.get_param_store()
    for _ in range(rounds):
        rows["hand"].append(median_ms(_hand_bbb_step(net, x, y, 1), steps))
        rows["ours"].append(_ours_ms(net, x, y, steps, 1))
        with store.scope():
            rows["pyro"].append(median_ms(_pyro_trace_step(net, x, y), steps))
        rows["hand32"].append(median_ms(_hand_bbb_step(net, x, y, 32), steps))
        rows["ours32"].append(_ours_ms(net, x, y, steps, 32))
    med = {k: statistics.median(v) for k, v in rows.items()}
    table = pd.DataFrame(
        [
            ("hand-written BbB step (1 particle)", med["hand"], 1.0),
            ("pyro_bnnlv default: fit_svi (SVI + CompiledTraceElbo)", med["ours"], med["ours"] / med["hand"]),
            ("idiomatic Pyro: SVI + Trace_ELBO", med["pyro"], med["pyro"] / med["hand"]),
            ("hand-written, 32 vectorised particles", med["hand32"], med["hand32"] / med["hand"]),
            ("pyro_bnnlv default, 32 vectorised particles", med["ours32"], med["ours32"] / med["hand"]),
        ],
        columns=["contender", "ms_per_step", "ratio_to_hand"],
    ).set_index("contender")
    table.attrs["particles_32_vs_1_hand"] = med["hand32"] / med["hand"]
    table.attrs["particles_32_vs_1_ours"] = med["ours32"] / med["ours"]
    return table


def _hand_lv_step(net: MLP, x: torch.Tensor, y: torch.Tensor, batch: int) -> Callable[[], None]:
    N, P = x.shape[0], net.num_weights
    loc_w = torch.nn.Parameter(net.init_weights(torch.Generator().manual_seed(0)))
    rho_w = torch.nn.Parameter(torch.full((P,), math.log(math.expm1(0.01))))
    loc_z = torch.nn.Parameter(torch.zeros(N, 1))
    rho_z = torch.nn.Parameter(torch.full((N, 1), math.log(math.expm1(0.01))))
    opt = torch.optim.Adam([loc_w, rho_w, loc_z, rho_z], lr=1e-3)
    sigma, B = 0.3, min(batch, N)

    def step() -> None:
        opt.zero_grad()
        idx = torch.randperm(N)[:B] if B < N else torch.arange(N)
        sw = torch.nn.functional.softplus(rho_w)
        ew = torch.randn(P)
        w = loc_w + sw * ew
        sz = torch.nn.functional.softplus(rho_z[idx])
        ez = torch.randn(B, 1)
        z = loc_z[idx] + sz * ez
        f = net(torch.cat([x[idx], z], -1), w).squeeze(-1)
        ll = (-0.5 * ((y[idx] - f) / sigma) ** 2 - math.log(sigma) - 0.5 * _LOG2PI).sum()
        lz = (-0.5 * z**2 - 0.5 * _LOG2PI).sum() - (-0.5 * ez**2 - sz.log() - 0.5 * _LOG2PI).sum()
        lw = (-0.5 * w**2 - 0.5 * _LOG2PI).sum() - (-0.5 * ew**2 - sw.log() - 0.5 * _LOG2PI).sum()
        loss = -((N / B) * (ll + lz) + lw)
        loss.backward()
        opt.step()

    return step


def _ours_lv_ms(net: MLP, x: torch.Tensor, y: torch.Tensor, batch: int, steps: int) -> float:
    model = BNNLV(net, latent_dim=1, noise_scale=0.3)
    guide = AutoNormal(model, init_scale=0.01, create_plates=model.create_plates,
                       init_loc_fn=init_to_network(model))  # fmt: skip
    return fit_step_ms(model, guide, x, y, steps, lr=1e-3, batch_size=batch if batch < x.shape[0] else None)


def lv_scaling(steps: int = 200, rounds: int = 3, batch: int = 500, seed: int = 0) -> pd.DataFrame:
    """Median ms per BNN+LV SVI step, ours vs hand-written, at N = 100, 10,000, 45,000."""
    torch.manual_seed(seed)
    net = MLP(2, [50], 1, activation="leaky_relu")
    rows = []
    for N in (100, 10_000, 45_000):
        x = torch.randn(N, 1)
        y = torch.sin(x[:, 0]) + 0.3 * torch.randn(N)
        hand, ours = [], []
        for _ in range(rounds):
            hand.append(median_ms(_hand_lv_step(net, x, y, batch), steps))
            ours.append(_ours_lv_ms(net, x, y, batch, steps))
        h, o = statistics.median(hand), statistics.median(ours)
        rows.append((N, min(batch, N), h, o, o / h))
    return pd.DataFrame(rows, columns=["N", "batch", "hand_ms", "ours_ms", "ratio"]).set_index("N")


BENCHMARKS: dict[str, tuple[Callable[..., pd.DataFrame], str]] = {
    "svi-overhead": (svi_overhead, "SVI step cost of the default path vs hand-written PyTorch"),
    "lv-scaling": (lv_scaling, "BNN+LV minibatch SVI step cost against N, vs hand-written"),
    "nuts": (nuts_benchmark, "NUTS per-leapfrog cost: fast path vs Pyro's traced model; ESS/s; "
             "4 chains; NumPyro"),
    "nuts-boston": (nuts_uci_benchmark, "NUTS on boston (1x50): 1 and 4 chains vs NumPyro, ESS/s of f"),
    "laplace": (laplace_bench, "GGN Laplace fit + linearised predictive vs a plain torch.func reference"),
    "ncai": (ncai_bench, "NCAIElbo step (JIT + guard) vs the BNN+LV MFVI step on heavy-tail"),
    "knn": (knn_bench, "k-NN KL of 500 x 751 draws, forward + backward: two-pass search vs all pairs"),
    "proj": (proj_bench, "proj-uci's SVI steps on boston: fused vs traced closed-form KL, and Monte Carlo"),
    "allocator": (allocator_bench, "hyvi-uci step on boston: glibc's default allocator vs retain_freed_memory"),
}
