"""Benchmarks that print ratios measured side by side in one run (``pyro-bnnlv bench NAME``).

Times on shared machines are noisy; ratios of interleaved measurements are not (much). Every
benchmark alternates the contenders in rounds and reports medians over steps.

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

``nuts``: NUTS per leapfrog step on the 1x50 tanh BNN (two-cluster toy): Pyro's traced
``NUTS(model, jit_compile=True)`` against the fast flat potential in Pyro's ``NUTS`` and in
``FlatNUTS``, with its compiled core and in pure Python (:func:`nuts_benchmark`); then one and
four chains of ``run_nuts`` against NumPyro's NUTS on the same model and data, ESS of ``f`` per
second (:func:`nuts_chains_benchmark`; ``nuts-boston`` runs that part on boston, 1x50).

``laplace``: GGN Laplace fit and linearised predictive (full, diagonal, last-layer) against a
plain ``torch.func`` reference (:func:`laplace_bench`).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any
from unittest.mock import patch

import pandas as pd
import pyro
import torch
from pyro.infer import MCMC, SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from torch import Tensor

from ..guides import init_to_network
from ..infer.compiled import extension
from ..infer.elbo import CompiledTraceElbo
from ..infer.nuts import (
    FlatNUTS,
    _CountingNUTS,
    chain_records,
    flat_potential,
    mlp_regression_potential,
    run_nuts,
)
from ..infer.svi import _check_positive_int, fit_svi
from ..models.bnn import BNN
from ..nets import MLP
from ..infer.laplace import LinearizedLaplace
from ..datasets import default_data_dir, load_dataset
from ..models.bnnlv import BNNLV
from ..infer.ncai_elbo import NCAIElbo
from ..guides.ncai_init import ncai_guide

__all__ = ["svi_overhead", "lv_scaling", "nuts_benchmark", "nuts_chains_benchmark", "nuts_uci_benchmark",
           "laplace_bench", "ncai_bench", "BENCHMARKS"]

_LOG2PI = math.log(2 * math.pi)


def _median_ms(fn: Callable[[], None], steps: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


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


def _fit_step_ms(model: Any, guide: Any, x: torch.Tensor, y: torch.Tensor, steps: int, **fit_kwargs: Any) -> float:
    """Median ms per ``fit_svi`` step over ``steps`` steps, stamped by its callback; the first 20
    steps (compilation, warm-up, the JIT guard's checks at steps 1 and 10) are not timed."""
    stamps: list[float] = []
    fit_svi(model, guide, x, y, num_steps=steps + 21, progress=False,
            callback=lambda step, value: stamps.append(time.perf_counter()), **fit_kwargs)  # fmt: skip
    return 1e3 * statistics.median(b - a for a, b in zip(stamps[20:], stamps[21:]))


def _ours_ms(net: MLP, x: torch.Tensor, y: torch.Tensor, steps: int, particles: int) -> float:
    """Median per-step time of ``fit_svi``'s default path, stamped by its callback."""
    model = BNN(net, prior_scale=1.0, noise_scale=0.1)
    guide = AutoNormal(model, init_scale=0.01, init_loc_fn=init_to_network(model))
    loss = None
    if particles > 1:
        loss = CompiledTraceElbo(num_particles=particles, vectorize_particles=True, max_plate_nesting=1)
    return _fit_step_ms(model, guide, x, y, steps, lr=1e-3, loss=loss)


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
        rows["hand"].append(_median_ms(_hand_bbb_step(net, x, y, 1), steps))
        rows["ours"].append(_ours_ms(net, x, y, steps, 1))
        with store.scope():
            rows["pyro"].append(_median_ms(_pyro_trace_step(net, x, y), steps))
        rows["hand32"].append(_median_ms(_hand_bbb_step(net, x, y, 32), steps))
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
    return _fit_step_ms(model, guide, x, y, steps, lr=1e-3, batch_size=batch if batch < x.shape[0] else None)


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
            hand.append(_median_ms(_hand_lv_step(net, x, y, batch), steps))
            ours.append(_ours_lv_ms(net, x, y, batch, steps))
        h, o = statistics.median(hand), statistics.median(ours)
        rows.append((N, min(batch, N), h, o, o / h))
    return pd.DataFrame(rows, columns=["N", "batch", "hand_ms", "ours_ms", "ratio"]).set_index("N")


def _ncai_step_ms(kind: str, data: Any, steps: int, seed: int) -> float:
    """Median ms per ``fit_svi`` step on heavy-tail's BNN+LV (1x50 LeakyReLU), full batch."""

    model = BNNLV(MLP(2, [50], 1, activation="leaky_relu"), latent_scale=0.1, noise_scale=math.sqrt(0.1))
    x, y = data.x_train, data.y_train
    if kind == "mfvi":
        guide = AutoNormal(model, init_scale=0.01, create_plates=model.create_plates,
                           init_loc_fn=init_to_network(model, seed=seed))  # fmt: skip
        loss = None
    else:
        guide = ncai_guide(model, x, y, num_steps=50, seed=seed)
        loss = NCAIElbo(jit=kind != "ncai-eager", independence="pc" if kind == "ncai-pc" else "hsic")
    # "ncai-torch": the statistics on their pure-torch path, as without a C++ compiler
    with patch.dict(os.environ, {"PYRO_BNNLV_COMPILED": "0"} if kind == "ncai-torch" else {}):
        return _fit_step_ms(model, guide, x, y, steps, loss=loss, seed=seed)


def ncai_bench(steps: int = 300, rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """``pyro-bnnlv bench ncai``: ms per SVI step on heavy-tail (N = 300, 1x50), NCAIElbo vs MFVI.

    Contenders, alternated in rounds: BNN+LV MFVI (``fit_svi``'s compiled default), NCAIElbo
    compiled with the HSIC term (default; its statistics in one call of the compiled pairwise
    kernels, :func:`~pyro_bnnlv.stats._pairwise.ncai_statistics`), the same with the statistics
    on their pure-torch path (``PYRO_BNNLV_COMPILED=0``, what runs without a C++ compiler), with
    the printed correlation term, and NCAIElbo eager. Per-step medians include ``fit_svi``'s JIT
    guard (checks at steps 1, 10, 100, 1,000; the step-100 check falls inside the timed window).
    """

    data = load_dataset("heavy-tail", seed=seed)
    kinds = ("mfvi", "ncai-jit", "ncai-torch", "ncai-pc", "ncai-eager")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in kinds:
            times[kind].append(_ncai_step_ms(kind, data, steps, seed + r))
    med = {k: statistics.median(v) for k, v in times.items()}
    labels = {"mfvi": "BNN+LV MFVI (compiled Trace_ELBO)", "ncai-jit": "NCAIElbo, HSIC term, JIT + guard",
              "ncai-torch": "NCAIElbo, HSIC term, JIT + guard, torch statistics (no C++)",
              "ncai-pc": "NCAIElbo, printed PC term, JIT + guard", "ncai-eager": "NCAIElbo, HSIC term, eager"}
    rows = [(labels[k], med[k], med[k] / med["mfvi"]) for k in kinds]
    table = pd.DataFrame(rows, columns=["loss", "ms_per_step", "ratio_to_mfvi"]).set_index("loss")
    table.attrs["NCAIElbo (JIT) / MFVI step, target <= 1.5"] = med["ncai-jit"] / med["mfvi"]
    return table


def _all_pairs_knn_kl(p: Tensor, q: Tensor) -> Tensor:
    """The k = 1 Perez-Cruz estimate from explicit differences over all pairs (``cdist`` without
    matrix products): the form :mod:`pyro_bnnlv.stats.knn` used before its two-pass search."""
    n, d = p.shape
    within = torch.cdist(p, p, compute_mode="donot_use_mm_for_euclid_dist")
    rho = within.masked_fill(torch.eye(n, dtype=torch.bool), math.inf).min(-1).values
    nu = torch.cdist(p, q, compute_mode="donot_use_mm_for_euclid_dist").min(-1).values
    return math.log(q.shape[0] / (n - 1)) + d * (nu.log() - rho.log()).mean()


def knn_bench(steps: int = 20, rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """``pyro-bnnlv bench knn``: ms per k-NN KL estimate, forward and backward, at NN-HyVI's UCI
    size (500 guide and 500 prior draws of boston's 751 weights): the two-pass neighbour search
    (:mod:`pyro_bnnlv.stats.knn`, "Numerics") vs explicit differences over all pairs, alternated
    in rounds of ``steps`` calls; the two estimates are printed too (equal to rounding)."""
    from ..stats.knn import knn_kl

    g = torch.Generator().manual_seed(seed)
    guide = (0.05 * torch.randn(500, 751, generator=g) + 0.3).requires_grad_()
    prior = 0.7 * torch.randn(500, 751, generator=g)
    contenders = {"two-pass search (knn_kl)": lambda: knn_kl(guide, prior),
                  "all-pairs differences": lambda: _all_pairs_knn_kl(guide, prior)}  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in contenders}
    values = {}
    for _ in range(rounds):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                value = fn()
                value.backward()
            times[name].append(1e3 * (time.perf_counter() - t0) / steps)
            values[name] = float(value.detach())
    fast = statistics.median(times["two-pass search (knn_kl)"])
    rows = [(k, statistics.median(v), statistics.median(v) / fast, values[k]) for k, v in times.items()]
    table = pd.DataFrame(rows, columns=["estimator", "ms_per_kl", "ratio_to_two_pass", "estimate"])
    table = table.set_index("estimator")
    table.attrs["all-pairs / two-pass"] = table["ratio_to_two_pass"].iloc[1]
    return table


def proj_bench(steps: int = 300, rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """``pyro-bnnlv bench proj``: ms per SVI step of proj-uci's fits on boston (1x50 ReLU, 20
    particles, minibatches of 128): the projected BNN's stage 3 (``D_z = 10``, 1x20 RBF decoder)
    with eq. 5's KL terms in closed form, fused (:class:`~pyro_bnnlv.infer.closed_form_kl.ClosedFormKLElbo`,
    the default) and traced (``fused=False``), and by Monte Carlo (``Trace_ELBO``); BbB
    (``AutoNormal`` on ``w``, closed-form KL) fused and traced. Arms alternated in rounds, medians
    of the per-step times after 20 warm-up steps; ``ratio`` is to the fit's fused arm."""
    from ..infer.closed_form_kl import ClosedFormKLElbo
    from ..infer.fge import fge
    from ..infer.projection import fit_projected_bnn, fit_projection
    from ..models.projected import PAPER_SCALE, ProjectedBNN

    data = load_dataset("boston", seed=seed)
    x, y = data.x_train, data.y_train
    net = MLP(data.input_dim, [50], 1, activation="relu")
    bnn = BNN(net, prior_scale=PAPER_SCALE, noise_scale=0.1)
    model = ProjectedBNN(net, latent_dim=10, decoder_hidden=[20])
    cands = fge(bnn, x, y, num_candidates=40, keep=20, map_steps=300, cycle_epochs=2, seed=seed, progress=False)
    projection = fit_projection(model, cands.kept, x, y, num_steps=200, seed=seed, progress=False)

    def stage3(kl: str, fused: bool, r: int, stamp) -> None:
        fit_projected_bnn(model, x, y, projection=projection, num_steps=steps + 21, batch_size=128, kl=kl,
                          fused=fused, seed=seed + r, progress=False,
                          callback=lambda step, value, guide: stamp())  # fmt: skip

    def bbb(fused: bool, r: int, stamp) -> None:
        with pyro.get_param_store().scope():
            guide = AutoNormal(bnn, init_scale=0.01)
            fit_svi(bnn, guide, x, y, num_steps=steps + 21, lr=0.001, batch_size=128, seed=seed + r, progress=False,
                    loss=ClosedFormKLElbo(("w",), num_particles=20, max_plate_nesting=1, fused=fused),
                    callback=lambda step, value: stamp())  # fmt: skip

    arms = {("Proj-BNN stage 3", "closed-form, fused"): lambda r, st: stage3("closed-form", True, r, st),
            ("Proj-BNN stage 3", "closed-form, traced"): lambda r, st: stage3("closed-form", False, r, st),
            ("Proj-BNN stage 3", "monte-carlo"): lambda r, st: stage3("monte-carlo", True, r, st),
            ("BbB", "closed-form, fused"): lambda r, st: bbb(True, r, st),
            ("BbB", "closed-form, traced"): lambda r, st: bbb(False, r, st)}  # fmt: skip
    times: dict[tuple[str, str], list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        for key, run in arms.items():
            stamps: list[float] = []
            run(r, lambda: stamps.append(time.perf_counter()))
            times[key].append(1e3 * statistics.median(b - a for a, b in zip(stamps[20:], stamps[21:])))
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [(fit, kl, v, v / med[fit, "closed-form, fused"]) for (fit, kl), v in med.items()]
    table = pd.DataFrame(rows, columns=["fit", "kl", "ms_per_step", "ratio"]).set_index(["fit", "kl"])
    table.attrs["stage 3: traced / fused step"] = med["Proj-BNN stage 3", "closed-form, traced"] / med[
        "Proj-BNN stage 3", "closed-form, fused"]
    table.attrs["stage 3: Monte-Carlo / closed-form (traced) step"] = med["Proj-BNN stage 3", "monte-carlo"] / med[
        "Proj-BNN stage 3", "closed-form, traced"]
    table.attrs["BbB: traced / fused step"] = med["BbB", "closed-form, traced"] / med["BbB", "closed-form, fused"]
    return table


def _allocator_arm(method: str, steps: int, retain: bool, seed: int = 0) -> None:
    """One arm of :func:`allocator_bench`, run in a fresh interpreter: ``steps`` SVI steps of
    hyvi-uci's ``method`` on boston split 1 (App. E's settings), prints ``{"ms": median ms per
    step, "loss": last loss}`` as JSON."""
    import json

    from .._platform import retain_freed_memory
    from ..datasets import load_split
    from ..infer import input_box
    from .hyvi import PRIOR_SCALE, _fit

    took = retain_freed_memory() if retain else False
    torch.set_num_threads(1)
    data = load_split("boston", 1, valid_fraction=0.0)
    x, y = data.x_train, data.y_train
    model = BNN(MLP(data.input_dim, [50], 1, activation="relu"), prior_scale=PRIOR_SCALE, noise_scale=0.5,
                learn_noise=True)  # fmt: skip
    stamps: list[float] = []
    losses: list[float] = []

    def record(step: int, value: float) -> None:
        stamps.append(time.perf_counter())
        losses.append(value)

    _fit(method, model, x, y, steps=steps + 11, lr=0.005, batch_size=50, seed=seed, input_dist=input_box(x),
         num_inputs=200, particles=100, kl_samples=500, num_samples=1, progress=False, callback=record)  # fmt: skip
    ms = 1e3 * statistics.median(b - a for a, b in zip(stamps[10:], stamps[11:]))
    print(json.dumps({"ms": ms, "loss": float(losses[-1]), "retained": took}))


def allocator_bench(steps: int = 60, rounds: int = 3, seed: int = 0,
                    methods: tuple[str, ...] = ("NN-HyVI", "FuNN-HyVI")) -> pd.DataFrame:
    """``pyro-bnnlv bench allocator``: ms per hyvi-uci SVI step (boston, App. E's settings) with
    glibc's default allocator settings vs :func:`~pyro_bnnlv._platform.retain_freed_memory`
    (what the sweep's workers and ``pyro-bnnlv`` use). Each arm runs in a fresh interpreter
    (the setting cannot be undone in a process), arms alternated in ``rounds``; the last losses
    must agree bitwise (``same_loss``)."""
    import json
    import subprocess
    import sys

    _check_positive_int(steps, "steps")
    rows = []
    for method in methods:
        times: dict[bool, list[float]] = {False: [], True: []}
        losses: dict[bool, set[float]] = {False: set(), True: set()}
        for _ in range(rounds):
            for retain in (False, True):
                code = ("from pyro_bnnlv.reproduce.bench import _allocator_arm; "
                        f"_allocator_arm({method!r}, {steps}, {retain}, {seed})")  # fmt: skip
                out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                if retain and not got["retained"]:
                    raise RuntimeError("retain_freed_memory() did not take (not glibc?): nothing to compare")
                times[retain].append(got["ms"])
                losses[retain].add(got["loss"])
        default, retained = statistics.median(times[False]), statistics.median(times[True])
        same = len(losses[False] | losses[True]) == 1
        rows += [(method, "glibc default", default, 1.0, same),
                 (method, "retain_freed_memory", retained, default / retained, same)]  # fmt: skip
    table = pd.DataFrame(rows, columns=["method", "allocator", "ms_per_step", "speed_up", "same_loss"])
    table = table.set_index(["method", "allocator"])
    for method in methods:
        table.attrs[f"{method} speed-up"] = float(table.loc[(method, "retain_freed_memory"), "speed_up"])
    table.attrs["losses bitwise equal"] = bool(table["same_loss"].all())
    return table


#: name -> (function, one-line description); the CLI prints the returned DataFrame.
def _fixed_tuning_run(kernel: Any, start: dict[str, Tensor], iters: int, args: tuple) -> tuple[float, int]:
    """Seconds and leapfrog steps of ``iters`` NUTS draws with adaptation off."""
    mcmc = MCMC(kernel, num_samples=iters, warmup_steps=0, initial_params=start, disable_progbar=True)
    mcmc.run(*args)
    rec = chain_records(mcmc)[0]
    return sum(rec["seconds"]), sum(rec["num_steps"])


class _FixedMass:
    """Mixin: after setup, install a given inverse mass matrix (for like-for-like timing)."""

    fixed_inverse_mass: dict | None = None

    def setup(self, warmup_steps: int, *args: Any, **kwargs: Any) -> None:
        super().setup(warmup_steps, *args, **kwargs)  # type: ignore[misc]
        if self.fixed_inverse_mass is not None:
            adapter = self.mass_matrix_adapter  # type: ignore[attr-defined]
            adapter.inverse_mass_matrix = dict(self.fixed_inverse_mass)


class _BenchCountingNUTS(_FixedMass, _CountingNUTS):
    pass


class _BenchFlatNUTS(_FixedMass, FlatNUTS):
    pass


def nuts_benchmark(
    steps: int | None = None,
    rounds: int = 3,
    num_samples: int = 200,
    warmup_steps: int = 200,
    hidden: int = 50,
    seed: int = 0,
    num_chains: int = 4,
    numpyro: bool = True,
) -> Any:
    """``pyro-bnnlv bench nuts``: NUTS on the 1x``hidden`` tanh BNN, two-cluster toy, N(0,1), sigma 0.1.

    1. *Per-step cost, side by side.* The fast path's warm-up (part 2) gives a step size, a
       diagonal mass matrix and a state in the posterior bulk. From that state, with those
       settings and adaptation off, each contender runs ``steps`` NUTS draws (default 5), in
       ``rounds`` interleaved rounds: Pyro's ``MCMC(NUTS(model, jit_compile=True))``; the fast
       potential in Pyro's stock ``NUTS(potential_fn=...)``; :class:`FlatNUTS` in pure Python
       (Python tree and potential: the fallback without a C++ compiler); :class:`FlatNUTS` with
       the compiled core (the ``run_nuts`` default). Reported: median ms per leapfrog step,
       speed-up over the traced path, leapfrog steps per draw, and the seconds of the round.
    2. *A full default run* ``run_nuts(num_samples, warmup_steps)``: wall time (MAP init +
       warm-up + sampling), leapfrog steps per draw, and the bulk ESS of ``f(x)`` at
       ``x in {-1, -0.75, 0, 0.75, 1}`` (0 lies in the gap between the clusters): the minimum
       over the inputs per second of wall time. For the other contenders the ESS per second is
       *estimated* as the run's ESS per leapfrog step times their leapfrog steps per second.
    3. *Breakdown*: the fast potential's value-and-gradient alone (microseconds per call,
       compiled and Python, in ``attrs``) and the per-step overhead of each NUTS kernel on top
       of it.
    4. *Several chains and NumPyro* (:func:`nuts_chains_benchmark`, ``num_chains > 0``): rows
       for ``run_nuts`` with one and ``num_chains`` chains and, when ``numpyro`` and NumPyro is
       importable, NumPyro's NUTS on the same model and data, with ESS of ``f`` per second with
       and without NumPyro's compilation; their ratios in ``attrs``.

    Returns a DataFrame indexed by contender. Columns: ``ms_per_leapfrog``, ``speedup_vs_traced``,
    ``leapfrog_per_draw``, ``seconds`` (one round of ``steps`` draws; for the full run its total
    wall time including the MAP initialisation), ``bulk_ess_f_per_s`` (minimum over the inputs)
    and ``ess_per_s_measured`` (False: estimated from the full run's ESS per leapfrog step,
    sampling phase only). ``attrs`` holds the headline numbers and the breakdown.
    """
    import pandas as pd

    iters = 5 if steps is None else int(steps)
    _check_positive_int(iters, "steps")
    data = load_dataset("clusters")
    x, y = data.x_train, data.y_train
    model = BNN(MLP(1, [hidden], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1)
    x_eval = torch.tensor([[-1.0], [-0.75], [0.0], [0.75], [1.0]])

    extension()  # build the compiled core (once per machine) before any clock starts
    # part 2 first: it provides the tuned settings for part 1
    mcmc = run_nuts(model, x, y, num_samples=num_samples, warmup_steps=warmup_steps, seed=seed,
                    progress=False)  # fmt: skip
    info = mcmc.run_info
    w = mcmc.get_samples(group_by_chain=True)["w"]
    f = model.f(x_eval, w.reshape(-1, w.shape[-1])).reshape(w.shape[0], w.shape[1], -1)
    ess_min = _bulk_ess_min(f.detach().numpy())
    rec = chain_records(mcmc)[0]
    steps_run = rec["num_steps"]
    per_sample = sum(steps_run) / len(steps_run)
    total_leapfrog = sum(steps_run) + sum(rec["warmup_num_steps"])
    kernel_seconds = sum(rec["seconds"]) + sum(rec["warmup_seconds"])
    ess_per_leapfrog = ess_min / sum(steps_run)

    kernel = mcmc.kernel
    eps = float(kernel.step_size)
    imm = {k: v.clone() for k, v in kernel.inverse_mass_matrix.items()}
    start_w = w[0, -1].clone()
    pot = flat_potential(model, x, y)
    assert pot is not None
    pot_py = mlp_regression_potential(model.net, x, y, prior_loc=model.prior_loc,
                                      prior_scale=model.prior_scale,
                                      noise_scale=model.noise_scale, compiled=False)  # fmt: skip
    common = dict(step_size=eps, adapt_step_size=False, adapt_mass_matrix=False)
    names = ("traced", "stock", "python", "flat")
    times: dict[str, list[float]] = {k: [] for k in names}
    counts: dict[str, list[int]] = {k: [] for k in names}
    walls: dict[str, list[float]] = {k: [] for k in names}
    pot_ms: dict[str, list[float]] = {"compiled": [], "python": []}
    from pyro.infer.autoguide import init_to_value

    for r in range(rounds):
        for name in names:
            pyro.set_rng_seed(seed + r)
            if name == "traced":
                k = _BenchCountingNUTS(
                    model, jit_compile=True,
                    init_strategy=init_to_value(values={"w": start_w}), **common,
                )  # fmt: skip
                args: tuple = (x, y)
            elif name == "stock":
                k = _BenchCountingNUTS(potential_fn=pot.potential_fn, **common)
                args = ()
            elif name == "python":
                k = _BenchFlatNUTS(pot_py, compiled=False, **common)
                args = ()
            else:
                k = _BenchFlatNUTS(pot, **common)
                args = ()
            k.fixed_inverse_mass = imm
            sec, n = _fixed_tuning_run(k, {"w": start_w}, iters, args)
            times[name].append(1e3 * sec / max(n, 1))
            counts[name].append(n)
            walls[name].append(sec)
        # the potential alone: where the time of a leapfrog step goes
        with torch.no_grad():
            q = start_w.clone()
            for key, vg in (("compiled", pot.value_and_grad), ("python", pot_py.value_and_grad)):
                for _ in range(50):
                    vg(q)
                t = time.perf_counter()
                for _ in range(1000):
                    vg(q)
                pot_ms[key].append(time.perf_counter() - t)  # seconds per 1000 calls = ms per call
    import statistics

    med = {k: statistics.median(v) for k, v in times.items()}
    pot_med = statistics.median(pot_ms["compiled"])
    pot_py_med = statistics.median(pot_ms["python"])
    core = "compiled core" if pot.compiled is not None else "compiled core UNAVAILABLE: Python"
    labels = {
        "traced": "Pyro MCMC(NUTS(model, jit_compile=True))",
        "stock": "fast potential + Pyro NUTS(potential_fn=...)",
        "python": "FlatNUTS, pure Python (fallback without a compiler)",
        "flat": f"FlatNUTS, {core} (run_nuts default)",
    }
    rows = []
    for name in names:
        rows.append({
            "contender": labels[name],
            "ms_per_leapfrog": med[name],
            "speedup_vs_traced": med["traced"] / med[name],
            "leapfrog_per_draw": statistics.median(counts[name]) / iters,
            "seconds": statistics.median(walls[name]),
            "bulk_ess_f_per_s": ess_per_leapfrog * 1e3 / med[name],
            "ess_per_s_measured": False,
        })  # fmt: skip
    rows.append({
        "contender": f"run_nuts default, full run ({warmup_steps} warm-up + {num_samples} draws)",
        "ms_per_leapfrog": 1e3 * kernel_seconds / total_leapfrog,
        "speedup_vs_traced": med["traced"] / (1e3 * kernel_seconds / total_leapfrog),
        "leapfrog_per_draw": per_sample,
        "seconds": info["total_seconds"],
        "bulk_ess_f_per_s": ess_min / info["total_seconds"],
        "ess_per_s_measured": True,
    })  # fmt: skip
    table = pd.DataFrame(rows).set_index("contender")
    table.attrs["potential_value_and_grad_us"] = 1e3 * pot_med
    table.attrs["python_potential_value_and_grad_us"] = 1e3 * pot_py_med
    table.attrs["flat_nuts_overhead_us_per_step"] = 1e3 * (med["flat"] - pot_med)
    table.attrs["python_flat_nuts_overhead_us_per_step"] = 1e3 * (med["python"] - pot_py_med)
    table.attrs["pyro_nuts_overhead_us_per_step"] = 1e3 * (med["stock"] - pot_med)
    table.attrs["compiled_core"] = pot.compiled is not None
    table.attrs["speedup_flat_vs_traced"] = med["traced"] / med["flat"]
    table.attrs["speedup_python_flat_vs_traced"] = med["traced"] / med["python"]
    table.attrs["speedup_stock_potential_fn_vs_traced"] = med["traced"] / med["stock"]
    table.attrs["full_run_seconds"] = info["total_seconds"]
    table.attrs["full_run_min_bulk_ess_f"] = ess_min
    if num_chains > 0:
        chains = nuts_chains_benchmark("clusters", num_chains, num_samples, warmup_steps, hidden, seed, numpyro)
        attrs = {**table.attrs, **chains.attrs}
        table = pd.concat([table, chains])
        table.attrs = attrs
    return table


def nuts_uci_benchmark(steps: int | None = None, data: str = "boston", **kwargs: Any) -> pd.DataFrame:
    """``pyro-bnnlv bench nuts-boston``: :func:`nuts_chains_benchmark` on a UCI set (all training
    points, 1x50 tanh BNN); ``steps`` sets the draws and warm-up iterations per chain (default
    200 each)."""
    if steps is not None:
        kwargs.setdefault("num_samples", steps)
        kwargs.setdefault("warmup_steps", steps)
    return nuts_chains_benchmark(data, **kwargs)


def _bulk_ess_min(f: Any) -> float:
    """Minimum over the evaluation inputs of the bulk ESS of ``f`` given as ``(chains, draws, E)``."""
    import arviz as az
    import numpy as np

    return float(az.ess(az.convert_to_dataset(np.asarray(f)), method="bulk").to_array().min())


def _ours_chains_run(model: BNN, x: Tensor, y: Tensor, x_eval: Tensor, num_chains: int, num_samples: int,
                     warmup_steps: int, seed: int) -> dict[str, float]:  # fmt: skip
    """``run_nuts`` with ``num_chains`` chains: wall time (MAP init included), leapfrog steps,
    kernel seconds and the minimum bulk ESS of ``f(x_eval)``."""
    mcmc = run_nuts(model, x, y, num_samples=num_samples, warmup_steps=warmup_steps, seed=seed,
                    num_chains=num_chains, progress=False)  # fmt: skip
    w = mcmc.get_samples(group_by_chain=True)["w"]
    with torch.no_grad():
        f = model.f(x_eval, w.reshape(-1, w.shape[-1])).reshape(w.shape[0], w.shape[1], -1)
    recs = chain_records(mcmc)
    steps = sum(sum(r["num_steps"]) + sum(r["warmup_num_steps"]) for r in recs)
    info = mcmc.run_info
    return {"seconds": info["total_seconds"], "sampling_seconds": info["sampling_seconds"],
            "leapfrog": steps, "ess": _bulk_ess_min(f.numpy()), "method": info["chain_method"],
            "saturated": info["max_tree_depth_share"]}  # fmt: skip


def _numpyro_runs(x: Tensor, y: Tensor, x_eval: Tensor, hidden: int, num_samples: int, warmup_steps: int,
                  seed: int, num_chains: int) -> dict[str, dict[str, float]] | None:  # fmt: skip
    """NumPyro's NUTS on the same BNN (N(0, 1) on every weight and bias, tanh, sigma 0.1), the same
    data and settings (diagonal mass matrix, target 0.8, max tree depth 10, its default
    initialisation): one chain twice in a row (the first run compiles, the second reuses the
    compiled sampler), and ``num_chains`` chains with ``chain_method="vectorized"`` and
    ``"parallel"`` (one XLA host device per chain; set before JAX starts). ``None`` when NumPyro
    is not importable (``pip install pyro-bnnlv[bench]``)."""
    import contextlib
    import io
    import sys

    if "jax" not in sys.modules:
        try:
            import numpyro
        except ImportError:
            return None
        numpyro.set_host_device_count(num_chains)
    try:
        import jax
        import jax.numpy as jnp
        import numpyro
        import numpyro.distributions as ndist
        from numpyro.infer import MCMC as NMCMC
        from numpyro.infer import NUTS as NNUTS
    except ImportError:
        return None

    X, Y, XE = (jnp.asarray(t.numpy()) for t in (x, y, x_eval))
    D = X.shape[1]

    def model(X, Y):
        normal = ndist.Normal(0.0, 1.0)
        W1 = numpyro.sample("W1", normal.expand([D, hidden]).to_event(2))
        b1 = numpyro.sample("b1", normal.expand([hidden]).to_event(1))
        W2 = numpyro.sample("W2", normal.expand([hidden, 1]).to_event(2))
        b2 = numpyro.sample("b2", normal.expand([1]).to_event(1))
        f = (jnp.tanh(X @ W1 + b1) @ W2 + b2)[:, 0]
        numpyro.sample("obs", ndist.Normal(f, 0.1), obs=Y)

    def f_eval(s: dict) -> Any:
        return jnp.tanh(XE @ s["W1"] + s["b1"][..., None, :]) @ s["W2"] + s["b2"][..., None, :]

    def one(mcmc: Any, key: int) -> dict[str, float]:
        t = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(key), X, Y, extra_fields=("num_steps",))
        s = mcmc.get_samples(group_by_chain=True)
        jax.block_until_ready(s)
        sec = time.perf_counter() - t
        f = f_eval(s)[..., 0]  # (chains, draws, E)
        # num_steps of the kept draws; the warm-up's are not returned, so the per-step time
        # counts them at the sampling phase's mean
        steps = float(mcmc.get_extra_fields()["num_steps"].sum())
        return {"seconds": sec, "leapfrog": steps * (warmup_steps + num_samples) / num_samples,
                "ess": _bulk_ess_min(f)}  # fmt: skip

    def kernel() -> Any:
        return NNUTS(model, target_accept_prob=0.8, max_tree_depth=10, dense_mass=False)

    # jit_model_args: the compiled sampler takes the data as arguments, so a second run on
    # data of the same shapes reuses it (NumPyro's documented way to pay compilation once).
    # progress_bar=True: NumPyro then compiles one NUTS iteration and loops over it in Python,
    # and that compiled iteration is cached across runs; with progress_bar=False it compiles the
    # whole loop again on every run (seconds per run on the toy; compare NumPyro's first and
    # second runs in the table of `pyro-bnnlv bench nuts`). The bars themselves
    # (tqdm on stderr) are swallowed.
    options = dict(num_warmup=warmup_steps, num_samples=num_samples, progress_bar=True, jit_model_args=True)
    out: dict[str, dict[str, float]] = {}
    with contextlib.redirect_stderr(io.StringIO()):
        single = NMCMC(kernel(), num_chains=1, **options)
        out["first"] = one(single, seed)
        out["compiled"] = one(single, seed + 1)
        for method in ("vectorized", "parallel"):
            many = NMCMC(kernel(), num_chains=num_chains, chain_method=method, **options)
            out[method + " first"] = one(many, seed + 2)
            out[method] = one(many, seed + 3)
    out["devices"] = {"seconds": float(jax.local_device_count())}
    return out


def nuts_chains_benchmark(
    data: str = "clusters",
    num_chains: int = 4,
    num_samples: int = 200,
    warmup_steps: int = 200,
    hidden: int = 50,
    seed: int = 0,
    numpyro: bool = True,
) -> pd.DataFrame:
    """Several chains and NumPyro, ESS of ``f`` per second (part of ``pyro-bnnlv bench nuts``).

    The 1x``hidden`` tanh BNN, N(0, 1) prior, sigma 0.1, on ``data`` (``"clusters"``: the
    two-cluster toy, or a UCI set such as ``"boston"``, all training points), ``warmup_steps``
    warm-up + ``num_samples`` draws per chain. Contenders: ``run_nuts`` with one chain (run once
    per seed of the ``num_chains`` chains, the row is the run with the median ESS/s) and with
    ``num_chains`` chains (in parallel threads; wall time includes the MAP initialisation of
    every chain), and, when NumPyro is importable, NumPyro's NUTS on the same model and data:
    one chain on its first run (which compiles) and on a second run (compiled), and
    ``num_chains`` chains with ``chain_method="vectorized"`` and ``"parallel"`` (after a
    compiling run). Columns: ``seconds`` (wall), ``ms_per_leapfrog`` (wall seconds of the run's
    sampling over its leapfrog steps, warm-up included; for NumPyro, whose warm-up step counts
    are not returned, the warm-up is counted at the sampling phase's mean), ``bulk_ess_f``
    (minimum over ``x in {-1, -0.75, 0, 0.75, 1}`` per input dimension, i.e. the first inputs
    of the data for UCI sets) and ``bulk_ess_f_per_s``. ``attrs`` holds the issue's ratios and
    the machine's load average (``os.getloadavg``) before and after.
    """
    import os

    loads = [os.getloadavg()]
    ds = load_dataset(data)
    x, y = ds.x_train, ds.y_train
    D = x.shape[1]
    if D == 1:
        x_eval = torch.tensor([[-1.0], [-0.75], [0.0], [0.75], [1.0]])
    else:
        x_eval = x[:5].clone()
    model = BNN(MLP(D, [hidden], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1)
    extension()
    # one chain per seed of the K chains: the one-chain figure is their median ESS/s (a single
    # chain's ESS of 200 draws varies by 2x between seeds, measured on boston: 66 to 121)
    singles = [_ours_chains_run(model, x, y, x_eval, 1, num_samples, warmup_steps, seed + c)
               for c in range(num_chains)]  # fmt: skip
    singles.sort(key=lambda r: r["ess"] / r["seconds"])
    ours1 = singles[(len(singles) - 1) // 2]  # the median run (the lower middle one for even K)
    oursk = _ours_chains_run(model, x, y, x_eval, num_chains, num_samples, warmup_steps, seed)
    rows = [(f"run_nuts, 1 chain ({data})", ours1, ours1["sampling_seconds"]),
            (f"run_nuts, {num_chains} chains, {oursk['method']} ({data})", oursk, oursk["sampling_seconds"])]  # fmt: skip
    npy = _numpyro_runs(x, y, x_eval, hidden, num_samples, warmup_steps, seed, num_chains) if numpyro else None
    if npy is not None:
        labels = {"first": "1 chain, first run with compile", "compiled": "1 chain, compiled",
                  "vectorized first": f"{num_chains} chains, vectorized, first run with compile",
                  "vectorized": f"{num_chains} chains, vectorized, compiled",
                  "parallel first": f"{num_chains} chains, parallel, first run with compile",
                  "parallel": f"{num_chains} chains, parallel, compiled"}  # fmt: skip
        rows += [(f"NumPyro, {label} ({data})", npy[k], npy[k]["seconds"]) for k, label in labels.items()]
    loads.append(os.getloadavg())
    table = pd.DataFrame([
        {"contender": name, "seconds": r["seconds"], "ms_per_leapfrog": 1e3 * run_s / r["leapfrog"],
         "leapfrog": r["leapfrog"], "bulk_ess_f": r["ess"], "bulk_ess_f_per_s": r["ess"] / r["seconds"]}
        for name, r, run_s in rows
    ]).set_index("contender")  # fmt: skip
    e1, ek = ours1["ess"] / ours1["seconds"], oursk["ess"] / oursk["seconds"]
    table.attrs[f"ours {num_chains} chains / ours 1 chain, ESS/s (target >= 1.8)"] = ek / e1
    table.attrs["ours share of saturated draws, 1 chain"] = ours1["saturated"]
    table.attrs["ours 1 chain, ESS/s of each seed"] = " ".join(
        f"{r['ess'] / r['seconds']:.2f}" for r in singles)
    if npy is not None:
        best = max(npy["vectorized"]["ess"] / npy["vectorized"]["seconds"],
                   npy["parallel"]["ess"] / npy["parallel"]["seconds"])  # fmt: skip
        table.attrs[f"ours {num_chains} chains / NumPyro's best {num_chains}-chain, ESS/s (target >= 1)"] = ek / best
        ms_npy = 1e3 * npy["compiled"]["seconds"] / npy["compiled"]["leapfrog"]
        ms_ours = 1e3 * ours1["sampling_seconds"] / ours1["leapfrog"]
        table.attrs["NumPyro compiled / ours ms per leapfrog, 1 chain (target >= 1)"] = ms_npy / ms_ours
        table.attrs["ours 1 chain / NumPyro compiled, ESS/s"] = e1 / (npy["compiled"]["ess"] / npy["compiled"]["seconds"])
        table.attrs["ours 1 chain / NumPyro first run with compile, ESS/s"] = e1 / (npy["first"]["ess"] / npy["first"]["seconds"])
        table.attrs["XLA host devices"] = npy["devices"]["seconds"]
    table.attrs["load average before (1, 5, 15 min)"] = " ".join(f"{v:.2f}" for v in loads[0])
    table.attrs["load average after (1, 5, 15 min)"] = " ".join(f"{v:.2f}" for v in loads[1])
    table.attrs["cores"] = float(os.cpu_count() or 1)
    return table


# ----------------------------------------------------------------------------------------------
# laplace: GGN Laplace fit + linearised predictive
# ----------------------------------------------------------------------------------------------
def _func_reference_laplace(net: MLP, x: torch.Tensor, xs: torch.Tensor, w: torch.Tensor,
                            sigma: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Plain ``torch.func`` full-GGN Laplace, written out: Jacobians by ``vmap(jacrev)``,
    ``H = J^T J / sigma^2 + I``, Cholesky, predictive variance ``||C^{-1} J*^T||^2 + sigma^2``."""
    from torch.func import jacrev, vmap

    def f1(xi: torch.Tensor, ww: torch.Tensor) -> torch.Tensor:
        return net(xi.unsqueeze(0), ww).squeeze(0)

    jac = vmap(jacrev(f1, argnums=1), in_dims=(0, None))
    J = jac(x, w).reshape(-1, w.shape[0])
    H = J.T @ J / sigma**2 + torch.eye(w.shape[0], dtype=w.dtype)
    C = torch.linalg.cholesky(H)
    Js = jac(xs, w).reshape(-1, w.shape[0])
    var = torch.linalg.solve_triangular(C, Js.T, upper=False).square().sum(0) + sigma**2
    return net(xs, w), var


def laplace_bench(steps: int | None = None, rounds: int = 3, seed: int = 0) -> pd.DataFrame:
    """``pyro-bnnlv bench laplace``: Laplace fit + linearised predictive of a 1x50 tanh network.

    Cases: the two-cluster toy (100 training, 200 test points, 151 weights); 1,000 training and
    200 test points of the same 1-D problem; the largest UCI set in the data directory (protein,
    standard split 0: 37,041 training, 4,573 test points, 9 inputs, 551 weights). The weights are
    a fixed random draw (the cost does not depend on them). Contenders, interleaved in ``rounds``:

    * ``torch.func reference``: :func:`_func_reference_laplace` in float64 (and float32);
    * ``LinearizedLaplace`` full / diag / last-layer, float64 (the default), and full in float32:
      ``LinearizedLaplace(model, w, structure=...).fit(x, y).predictive(xs)``.

    ``steps`` timed repetitions per contender and round (default 50 on the small cases, 3 on
    protein); medians. Columns: ``ms``, ``ratio_to_func_ref`` (to the float64 reference, same
    case), ``curvature_floats`` (stored curvature: ``P^2``, ``P`` or ``K^2``) and
    ``jacobian_chunk_floats`` (the largest Jacobian block held at once).
    """

    torch.manual_seed(seed)
    cases = []
    for n in (100, 1000):
        data = load_dataset("clusters", seed=seed, sizes=(n, 10, 200))
        cases.append((f"clusters toy, N={n}", data.x_train, data.y_train, data.x_test, 50))
    if (default_data_dir() / "uci" / "protein-tertiary-structure").exists():
        data = load_dataset("protein", split=0)
        cases.append(("protein (largest UCI), N=%d" % len(data.x_train), data.x_train, data.y_train,
                      data.x_test, 3))  # fmt: skip
    rows, attrs = [], {}
    for label, x, y, xs, default_steps in cases:
        n_steps = default_steps if steps is None else int(steps)
        net = MLP(x.shape[1], [50], 1, activation="tanh")
        w = net.init_weights(torch.Generator().manual_seed(seed))
        model = BNN(net, prior_scale=1.0, noise_scale=0.1)
        sigma = float(model.noise_scale)  # the float32 0.1 the model uses, so both sides agree
        P = net.num_weights
        x64, xs64, w64 = x.double(), xs.double(), w.double()
        contenders: dict[str, Callable[[], object]] = {
            "torch.func reference, full, float64": lambda: _func_reference_laplace(net, x64, xs64, w64, sigma),
            "torch.func reference, full, float32": lambda: _func_reference_laplace(net, x, xs, w, sigma),
            "LinearizedLaplace full (float64)": lambda: LinearizedLaplace(model, w).fit(x, y).predictive(xs),
            "LinearizedLaplace full, float32": lambda: LinearizedLaplace(
                model, w, dtype=torch.float32).fit(x, y).predictive(xs),
            "LinearizedLaplace diag (float64)": lambda: LinearizedLaplace(
                model, w, structure="diag").fit(x, y).predictive(xs),
            "LinearizedLaplace last_layer (float64)": lambda: LinearizedLaplace(
                model, w, structure="last_layer").fit(x, y).predictive(xs),
        }  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(rounds):
            for name, fn in contenders.items():
                times[name].append(_median_ms(fn, n_steps, warmup=5 if n_steps > 5 else 1))
        # equal answers: ours vs the reference
        _, v_ref = _func_reference_laplace(net, x64, xs64, w64, sigma)
        v_ours = LinearizedLaplace(model, w).fit(x, y).predictive(xs).var[:, 0]
        agree = float(((v_ours - v_ref).abs() / v_ref).max())
        ref = statistics.median(times["torch.func reference, full, float64"])
        la = LinearizedLaplace(model, w)
        K = 51
        chunk = {"full": min(len(x), la._chunk(1)) * P, "diag": min(len(x), la._chunk(1)) * P,
                 "last_layer": min(len(x), 4_000_000 // K) * K}  # fmt: skip
        for name in contenders:
            struct = "diag" if "diag" in name else "last_layer" if "last_layer" in name else "full"
            stored = {"full": P * P, "diag": P, "last_layer": K * K}[struct]
            work = len(x) * P if "reference" in name else chunk[struct]
            med = statistics.median(times[name])
            rows.append((label, name, med, med / ref, stored, work))
        attrs[f"max_rel_diff_var_vs_reference [{label}]"] = agree
    table = pd.DataFrame(rows, columns=["case", "contender", "ms", "ratio_to_func_ref",
                                        "curvature_floats", "jacobian_chunk_floats"])  # fmt: skip
    table = table.set_index(["case", "contender"])
    table.attrs.update(attrs)
    return table


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
