"""``pyro-bnnlv bench nuts`` and ``nuts-boston``: NUTS per leapfrog step on the 1x50 tanh BNN
(two-cluster toy): Pyro's traced ``NUTS(model, jit_compile=True)`` against the fast flat
potential in Pyro's ``NUTS`` and in ``FlatNUTS``, with its compiled core and in pure Python
(:func:`nuts_benchmark`); then one and four chains of ``run_nuts`` against NumPyro's NUTS on the
same model and data, ESS of ``f`` per second (:func:`nuts_chains_benchmark`; ``nuts-boston`` runs
that part on boston, 1x50).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import pandas as pd
import pyro
import torch
from pyro.infer import MCMC
from pyro.infer.autoguide import init_to_value
from torch import Tensor

from .._checks import check_int
from .._compiled import nuts_extension as extension
from ..datasets import load_dataset
from ..infer.mcmc import FlatNUTS, chain_records, flat_potential, mlp_regression_potential, run_nuts
from ..infer.mcmc.kernel import CountingNUTS
from ..models.bnn import BNN
from ..nets import MLP

__all__ = ["nuts_benchmark", "nuts_chains_benchmark", "nuts_uci_benchmark"]


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


class _BenchCountingNUTS(_FixedMass, CountingNUTS):
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
) -> pd.DataFrame:
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
    iters = 5 if steps is None else int(steps)
    check_int(iters, "steps")
    x, y, x_eval, model = _bench_problem("clusters", hidden)
    extension()  # build the compiled core (once per machine) before any clock starts
    # part 2 first: it provides the tuned settings for part 1
    mcmc, ess_min = _nuts_run(model, x, y, x_eval, 1, num_samples, warmup_steps, seed)
    pot = flat_potential(model, x, y)
    assert pot is not None
    pot_py = mlp_regression_potential(
        model.net,
        x,
        y,
        prior_loc=model.prior_loc,
        prior_scale=model.prior_scale,
        noise_scale=model.noise_scale,
        compiled=False,
    )
    start_w = mcmc.get_samples(group_by_chain=True)["w"][0, -1].clone()
    timed = _timing_rounds(model, x, y, mcmc.kernel, start_w, (pot, pot_py), iters, rounds, seed)
    table = _step_table(*timed, mcmc, ess_min, iters, pot.compiled is not None, num_samples, warmup_steps)
    if num_chains > 0:
        chains = nuts_chains_benchmark("clusters", num_chains, num_samples, warmup_steps, hidden, seed, numpyro)
        attrs = {**table.attrs, **chains.attrs}
        table = pd.concat([table, chains])
        table.attrs = attrs
    return table


_CONTENDERS = ("traced", "stock", "python", "flat")


def _timing_rounds(
    model: BNN,
    x: Tensor,
    y: Tensor,
    tuned: Any,
    start_w: Tensor,
    potentials: tuple[Any, Any],
    iters: int,
    rounds: int,
    seed: int,
) -> tuple[dict[str, list], dict[str, list]]:
    """Parts 1 and 3 of :func:`nuts_benchmark` from the ``tuned`` kernel's settings: per contender and
    round the seconds and leapfrog steps of ``iters`` draws; per round ms per potential call."""
    pot, pot_py = potentials
    imm = {k: v.clone() for k, v in tuned.inverse_mass_matrix.items()}
    common = dict(step_size=float(tuned.step_size), adapt_step_size=False, adapt_mass_matrix=False)
    runs: dict[str, list[tuple[float, int]]] = {k: [] for k in _CONTENDERS}
    pot_ms: dict[str, list[float]] = {"compiled": [], "python": []}
    for r in range(rounds):
        for name in _CONTENDERS:
            pyro.set_rng_seed(seed + r)
            if name == "traced":
                init = init_to_value(values={"w": start_w})
                k, args = _BenchCountingNUTS(model, jit_compile=True, init_strategy=init, **common), (x, y)
            elif name == "stock":
                k, args = _BenchCountingNUTS(potential_fn=pot.potential_fn, **common), ()
            elif name == "python":
                k, args = _BenchFlatNUTS(pot_py, compiled=False, **common), ()
            else:
                k, args = _BenchFlatNUTS(pot, **common), ()
            k.fixed_inverse_mass = imm
            runs[name].append(_fixed_tuning_run(k, {"w": start_w}, iters, args))
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
    return runs, pot_ms


def _step_table(
    runs: dict[str, list],
    pot_ms: dict[str, list],
    mcmc: Any,
    ess_min: float,
    iters: int,
    compiled: bool,
    num_samples: int,
    warmup_steps: int,
) -> pd.DataFrame:
    """Parts 1 to 3 of :func:`nuts_benchmark` as its table: the medians over rounds per contender,
    the full run ``mcmc`` (chain 0's steps and seconds, ``ess_min``) and the breakdown in ``attrs``."""
    info, rec = mcmc.run_info, chain_records(mcmc)[0]
    steps_run = rec["num_steps"]
    total_leapfrog = sum(steps_run) + sum(rec["warmup_num_steps"])
    kernel_seconds = sum(rec["seconds"]) + sum(rec["warmup_seconds"])
    ess_per_leapfrog = ess_min / sum(steps_run)
    med = {k: statistics.median(1e3 * sec / max(n, 1) for sec, n in v) for k, v in runs.items()}
    pot_med = statistics.median(pot_ms["compiled"])
    pot_py_med = statistics.median(pot_ms["python"])
    core = "compiled core" if compiled else "compiled core UNAVAILABLE: Python"
    labels = {
        "traced": "Pyro MCMC(NUTS(model, jit_compile=True))",
        "stock": "fast potential + Pyro NUTS(potential_fn=...)",
        "python": "FlatNUTS, pure Python (fallback without a compiler)",
        "flat": f"FlatNUTS, {core} (run_nuts default)",
    }
    rows = []
    for name in _CONTENDERS:
        rows.append(
            {
                "contender": labels[name],
                "ms_per_leapfrog": med[name],
                "speedup_vs_traced": med["traced"] / med[name],
                "leapfrog_per_draw": statistics.median(n for _, n in runs[name]) / iters,
                "seconds": statistics.median(sec for sec, _ in runs[name]),
                "bulk_ess_f_per_s": ess_per_leapfrog * 1e3 / med[name],
                "ess_per_s_measured": False,
            }
        )
    rows.append(
        {
            "contender": f"run_nuts default, full run ({warmup_steps} warm-up + {num_samples} draws)",
            "ms_per_leapfrog": 1e3 * kernel_seconds / total_leapfrog,
            "speedup_vs_traced": med["traced"] / (1e3 * kernel_seconds / total_leapfrog),
            "leapfrog_per_draw": sum(steps_run) / len(steps_run),
            "seconds": info.total_seconds,
            "bulk_ess_f_per_s": ess_min / info.total_seconds,
            "ess_per_s_measured": True,
        }
    )
    table = pd.DataFrame(rows).set_index("contender")
    table.attrs["potential_value_and_grad_us"] = 1e3 * pot_med
    table.attrs["python_potential_value_and_grad_us"] = 1e3 * pot_py_med
    table.attrs["flat_nuts_overhead_us_per_step"] = 1e3 * (med["flat"] - pot_med)
    table.attrs["python_flat_nuts_overhead_us_per_step"] = 1e3 * (med["python"] - pot_py_med)
    table.attrs["pyro_nuts_overhead_us_per_step"] = 1e3 * (med["stock"] - pot_med)
    table.attrs["compiled_core"] = compiled
    table.attrs["speedup_flat_vs_traced"] = med["traced"] / med["flat"]
    table.attrs["speedup_python_flat_vs_traced"] = med["traced"] / med["python"]
    table.attrs["speedup_stock_potential_fn_vs_traced"] = med["traced"] / med["stock"]
    table.attrs["full_run_seconds"] = info.total_seconds
    table.attrs["full_run_min_bulk_ess_f"] = ess_min
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


def _bench_problem(data: str, hidden: int) -> tuple[Tensor, Tensor, Tensor, BNN]:
    """Training data, inputs of ``f`` (``{-1, -0.75, 0, 0.75, 1}`` in 1-D, else the first 5 training
    inputs) and the 1x``hidden`` tanh BNN, N(0, 1) prior, sigma 0.1."""
    ds = load_dataset(data)
    x, y = ds.x_train, ds.y_train
    x_eval = torch.tensor([[-1.0], [-0.75], [0.0], [0.75], [1.0]]) if x.shape[1] == 1 else x[:5].clone()
    return x, y, x_eval, BNN(MLP(x.shape[1], [hidden], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1)


def _nuts_run(
    model: BNN, x: Tensor, y: Tensor, x_eval: Tensor, num_chains: int, num_samples: int, warmup_steps: int, seed: int
) -> tuple[MCMC, float]:
    """``run_nuts`` with ``num_chains`` chains and the minimum over ``x_eval`` of the bulk ESS of ``f``."""
    mcmc = run_nuts(
        model,
        x,
        y,
        num_samples=num_samples,
        warmup_steps=warmup_steps,
        seed=seed,
        num_chains=num_chains,
        progress=False,
    )
    w = mcmc.get_samples(group_by_chain=True)["w"]
    with torch.no_grad():
        f = model.f(x_eval, w.reshape(-1, w.shape[-1])).reshape(w.shape[0], w.shape[1], -1)
    return mcmc, _bulk_ess_min(f.numpy())


def _ours_chains_run(
    model: BNN, x: Tensor, y: Tensor, x_eval: Tensor, num_chains: int, num_samples: int, warmup_steps: int, seed: int
) -> dict[str, float]:
    """``run_nuts`` with ``num_chains`` chains: wall time (MAP init included), leapfrog steps,
    kernel seconds and the minimum bulk ESS of ``f(x_eval)``."""
    mcmc, ess = _nuts_run(model, x, y, x_eval, num_chains, num_samples, warmup_steps, seed)
    recs = chain_records(mcmc)
    steps = sum(sum(r["num_steps"]) + sum(r["warmup_num_steps"]) for r in recs)
    info = mcmc.run_info
    return {
        "seconds": info.total_seconds,
        "sampling_seconds": info.sampling_seconds,
        "leapfrog": steps,
        "ess": ess,
        "method": info.chain_method,
        "saturated": info.max_tree_depth_share,
    }


def _numpyro_runs(
    x: Tensor, y: Tensor, x_eval: Tensor, hidden: int, num_samples: int, warmup_steps: int, seed: int, num_chains: int
) -> dict[str, dict[str, float]] | None:
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
        return {"seconds": sec, "leapfrog": steps * (warmup_steps + num_samples) / num_samples, "ess": _bulk_ess_min(f)}

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
    x, y, x_eval, model = _bench_problem(data, hidden)
    extension()
    # one chain per seed of the K chains: the one-chain figure is their median ESS/s (a single
    # chain's ESS of 200 draws varies by 2x between seeds, measured on boston: 66 to 121)
    singles = [_ours_chains_run(model, x, y, x_eval, 1, num_samples, warmup_steps, seed + c) for c in range(num_chains)]
    singles.sort(key=lambda r: r["ess"] / r["seconds"])
    ours1 = singles[(len(singles) - 1) // 2]  # the median run (the lower middle one for even K)
    oursk = _ours_chains_run(model, x, y, x_eval, num_chains, num_samples, warmup_steps, seed)
    rows = [
        (f"run_nuts, 1 chain ({data})", ours1, ours1["sampling_seconds"]),
        (f"run_nuts, {num_chains} chains, {oursk['method']} ({data})", oursk, oursk["sampling_seconds"]),
    ]
    npy = _numpyro_runs(x, y, x_eval, hidden, num_samples, warmup_steps, seed, num_chains) if numpyro else None
    if npy is not None:
        labels = {
            "first": "1 chain, first run with compile",
            "compiled": "1 chain, compiled",
            "vectorized first": f"{num_chains} chains, vectorized, first run with compile",
            "vectorized": f"{num_chains} chains, vectorized, compiled",
            "parallel first": f"{num_chains} chains, parallel, first run with compile",
            "parallel": f"{num_chains} chains, parallel, compiled",
        }
        rows += [(f"NumPyro, {label} ({data})", npy[k], npy[k]["seconds"]) for k, label in labels.items()]
    loads.append(os.getloadavg())
    table = pd.DataFrame(
        [
            {
                "contender": name,
                "seconds": r["seconds"],
                "ms_per_leapfrog": 1e3 * run_s / r["leapfrog"],
                "leapfrog": r["leapfrog"],
                "bulk_ess_f": r["ess"],
                "bulk_ess_f_per_s": r["ess"] / r["seconds"],
            }
            for name, r, run_s in rows
        ]
    ).set_index("contender")
    e1, ek = ours1["ess"] / ours1["seconds"], oursk["ess"] / oursk["seconds"]
    table.attrs[f"ours {num_chains} chains / ours 1 chain, ESS/s (target >= 1.8)"] = ek / e1
    table.attrs["ours share of saturated draws, 1 chain"] = ours1["saturated"]
    table.attrs["ours 1 chain, ESS/s of each seed"] = " ".join(f"{r['ess'] / r['seconds']:.2f}" for r in singles)
    if npy is not None:
        best = max(
            npy["vectorized"]["ess"] / npy["vectorized"]["seconds"], npy["parallel"]["ess"] / npy["parallel"]["seconds"]
        )
        table.attrs[f"ours {num_chains} chains / NumPyro's best {num_chains}-chain, ESS/s (target >= 1)"] = ek / best
        ms_npy = 1e3 * npy["compiled"]["seconds"] / npy["compiled"]["leapfrog"]
        ms_ours = 1e3 * ours1["sampling_seconds"] / ours1["leapfrog"]
        table.attrs["NumPyro compiled / ours ms per leapfrog, 1 chain (target >= 1)"] = ms_npy / ms_ours
        table.attrs["ours 1 chain / NumPyro compiled, ESS/s"] = e1 / (
            npy["compiled"]["ess"] / npy["compiled"]["seconds"]
        )
        table.attrs["ours 1 chain / NumPyro first run with compile, ESS/s"] = e1 / (
            npy["first"]["ess"] / npy["first"]["seconds"]
        )
        table.attrs["XLA host devices"] = npy["devices"]["seconds"]
    table.attrs["load average before (1, 5, 15 min)"] = " ".join(f"{v:.2f}" for v in loads[0])
    table.attrs["load average after (1, 5, 15 min)"] = " ".join(f"{v:.2f}" for v in loads[1])
    table.attrs["cores"] = float(os.cpu_count() or 1)
    return table
