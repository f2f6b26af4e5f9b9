r"""``pyro-bnnlv bench laplace-torch``: the categorical GGN Laplace against laplace-torch's (issue 42).

The same MAP network in both libraries, side by side in one run: :class:`~pyro_bnnlv.infer.laplace.
LinearizedLaplace` (``structure="full"`` and ``"kfac"``) against laplace-torch's ``Laplace(...,
"classification", subset_of_weights="all", hessian_structure="full"`` and ``"kron")``
(Daxberger et al. 2021, arXiv:2106.14806).

Conditions, so that both compute the same thing:

* data: a tabular classification set that ships with the package (``breast-cancer``, K = 2, and
  ``iris``, K = 3; the default stratified split, inputs standardised), fitted on the training rows,
  predicted on the test rows;
* network: ``nn.Sequential(nn.Linear(D, H, bias=False), nn.Tanh(), nn.Linear(H, K, bias=False))``
  as a :class:`~pyro_bnnlv.nets.ModuleNet` in a categorical :class:`~pyro_bnnlv.models.BNN`. The
  layers have no bias because laplace-torch keeps a layer's bias in a Kronecker block of its own
  while our K-FAC appends it to the layer's input (:mod:`pyro_bnnlv.infer.laplace.kfac`); without
  biases the two K-FACs are the same matrix. One MAP (:func:`~pyro_bnnlv.infer.svi.train_map`);
  laplace-torch gets a copy of the module with these weights (``vector_to_parameters``: the flat
  ``w`` is the module's ``parameters()`` concatenated, as :class:`ModuleNet` lays it out);
* prior: one fixed scalar prior precision in both (``1 / prior_scale^2`` of the model, 1 by
  default; the MAP was trained under it);
* laplace-torch: ``fit`` on one full batch (``DataLoader(batch_size=N)``; its Kronecker factors
  summed over several batches give the same product, checked while writing this), no
  ``temperature``, its own default backend (``CurvlinopsGGN``) and the ``BackPackGGN`` and
  ``AsdlGGN`` backends, each on a fresh copy of the module (BackPACK's ``extend`` leaves hooks
  that ASDL then refuses); in float64 (the module and the data cast with ``.double()``) and in
  float32 (the module's own dtype); ours in float64 (its default ``dtype``) and float32;
* predictive: the linearised ("glm") predictive of the logits through the softmax with the probit
  approximation (``softmax(f_k / sqrt(1 + pi/8 Var f_k))`` in both), and by Monte Carlo
  (``link_approx="mc"``, 10,000 draws each, independent streams: compared loosely, the MC noise is
  about 0.005 at this size).

Columns: ``fit_ms`` (build + fit the curvature), ``predict_ms`` (the first probit predictive of
the fitted object on the test rows: it includes any factorisation done lazily), ``total_ms``,
``ratio_to_ours`` (``total_ms`` over ours in float64, same data and structure), medians of
``steps`` repeats in each of ``rounds`` rounds, contenders alternated; ``max_dp_probit`` and
``max_dp_mc`` (max over test rows and classes of ``|p - p_ours|``, ours in float64; ours' own MC
row draws with another seed, the noise floor); ``log_marglik`` (Laplace log marginal likelihood at
the fixed prior precision) and ``d_log_marglik`` (minus ours'); ``prior_prec_opt`` and
``log_marglik_opt``: the prior precision that maximises the marginal likelihood (ours:
``optimize_hyperparameters()``, L-BFGS on ``log delta`` to convergence; laplace-torch:
``optimize_prior_precision(method="marglik", prior_structure="scalar")``, its 100 Adam steps
of learning rate 0.1 from the fixed value) and the log marginal likelihood there.

Measured (``docs/results.md``): probit probabilities within 4e-9 (full) and 3e-16 (K-FAC) of
laplace-torch's default backend in float64, log marginal likelihoods within 2e-7; BackPACK and ASDL
within 1e-15. The 1e-9 of the full structure is laplace-torch's: ``CurvlinopsGGN.full`` builds
the GGN as ``linop @ torch.eye(P)``, a float32 identity, so its float64 GGN carries float32
rounding (with a float64 identity it matches ours to 3e-15).

laplace-torch is not a dependency of pyro_bnnlv: the benchmark runs where it is importable and
otherwise exits with :data:`INSTALL_MESSAGE`. It needs no torchvision (declared by laplace-torch
and BackPACK, imported by neither at run time).
"""

from __future__ import annotations

import copy
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..datasets import load_dataset
from ..infer.laplace import LinearizedLaplace
from ..infer.svi import train_map
from ..models.bnn import BNN
from ..nets import ModuleNet

__all__ = ["INSTALL_COMMANDS", "INSTALL_MESSAGE", "import_laplace", "laplace_torch_bench"]

#: a virtualenv that sees the system's torch and pyro_bnnlv's dependencies, with laplace-torch
#: and the packages it imports, each without dependencies (so pip never replaces torch and never
#: installs torchvision, whose wheel does not import beside a CPU build of torch); the last
#: command runs the benchmark with this checkout's pyro_bnnlv
INSTALL_COMMANDS = (
    "python3 -m venv --system-site-packages /tmp/lt-venv",
    "/tmp/lt-venv/bin/pip install --no-deps laplace-torch==0.3 asdfghjkl==0.1a4 backpack-for-pytorch "
    "curvlinops-for-pytorch einops unfoldNd einconv linear_operator torchmetrics lightning-utilities",
    "PYTHONPATH=. /tmp/lt-venv/bin/python -m pyro_bnnlv.cli bench laplace-torch   # in the checkout",
)

INSTALL_MESSAGE = (
    "pyro-bnnlv bench laplace-torch needs laplace-torch (import laplace failed: {error}). It is not a "
    "dependency of pyro_bnnlv; install it beside the system's torch, without torchvision, with:\n  "
    + "\n  ".join(INSTALL_COMMANDS)
)

_STRUCTURES = (("full", "full"), ("kfac", "kron"))  # ours, laplace-torch's
_OURS = "pyro_bnnlv float64"
_MC_SAMPLES = 10_000


def import_laplace() -> Any:
    """``laplace`` (laplace-torch), or ``SystemExit`` with :data:`INSTALL_MESSAGE`."""
    try:
        import laplace
        from laplace.curvature import AsdlGGN, BackPackGGN, CurvlinopsGGN  # noqa: F401
    except ImportError as err:
        raise SystemExit(INSTALL_MESSAGE.format(error=err)) from None
    return laplace


def _their_module(net: ModuleNet, w: torch.Tensor, dtype: torch.dtype) -> nn.Module:
    """A fresh copy of the network's module holding ``w``, trainable (laplace-torch takes the
    parameters that require a gradient), in ``dtype``."""
    module = copy.deepcopy(net.module).to(dtype)
    for p in module.parameters():
        p.requires_grad_(True)
    torch.nn.utils.vector_to_parameters(w.detach().to(dtype), module.parameters())
    return module


def _contenders(
    laplace: Any, model: BNN, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, prior_precision: float
) -> dict[str, dict[str, tuple[Callable[[], Any], Callable[..., Any]]]]:
    """Per structure, per contender: ``(fit, predict)``: ``fit()`` builds and fits a Laplace
    object; ``predict(la, xs, link, seed)`` its predictive probabilities on ``xs`` (float64)."""
    from laplace.curvature import AsdlGGN, BackPackGGN

    def ours(structure: str, dtype: torch.dtype):
        def fit() -> LinearizedLaplace:
            return LinearizedLaplace(model, w, structure=structure, prior_precision=prior_precision, dtype=dtype).fit(
                x, y
            )

        def predict(la: LinearizedLaplace, xs: torch.Tensor, link: str, seed: int = 0) -> torch.Tensor:
            return la.predictive_probs(xs, link_approx=link, num_samples=_MC_SAMPLES, seed=seed).double()

        return fit, predict

    def theirs(structure: str, dtype: torch.dtype, backend: type | None):
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.to(dtype), y), batch_size=len(x))

        def fit() -> Any:
            module = _their_module(model.net, w, dtype)  # not timed apart: a deepcopy of a small module
            la = laplace.Laplace(
                module,
                "classification",
                subset_of_weights="all",
                hessian_structure=structure,
                prior_precision=prior_precision,
                backend=backend,
            )
            la.fit(loader, progress_bar=False)
            return la

        def predict(la: Any, xs: torch.Tensor, link: str, seed: int = 0) -> torch.Tensor:
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                return la(
                    xs.to(dtype), pred_type="glm", link_approx=link, n_samples=_MC_SAMPLES, generator=gen
                ).double()

        return fit, predict

    out = {}
    for ours_s, their_s in _STRUCTURES:
        out[ours_s] = {
            _OURS: ours(ours_s, torch.float64),
            "pyro_bnnlv float32": ours(ours_s, torch.float32),
            "laplace-torch default (CurvlinopsGGN) float64": theirs(their_s, torch.float64, None),
            "laplace-torch default (CurvlinopsGGN) float32": theirs(their_s, torch.float32, None),
            "laplace-torch BackPackGGN float64": theirs(their_s, torch.float64, BackPackGGN),
            "laplace-torch AsdlGGN float64": theirs(their_s, torch.float64, AsdlGGN),
        }
    return out


def _optimised(la: Any, prior_precision: float) -> tuple[float, float]:
    """The marginal-likelihood optimum of a scalar prior precision and the log marginal
    likelihood there (each library's own optimiser; module docstring)."""
    if isinstance(la, LinearizedLaplace):
        la.optimize_hyperparameters()
        return float(la.prior_precision[0]), float(la.log_marginal_likelihood())
    la.optimize_prior_precision(
        method="marglik", pred_type="glm", prior_structure="scalar", init_prior_prec=prior_precision
    )
    return float(la.prior_precision.reshape(-1)[0]), float(la.log_marginal_likelihood())


def laplace_torch_bench(
    steps: int | None = None,
    rounds: int = 3,
    seed: int = 0,
    *,
    data_sets: tuple[str, ...] = ("breast-cancer", "iris"),
    hidden: int = 50,
    prior_scale: float = 1.0,
    map_steps: int = 2000,
) -> pd.DataFrame:
    """``pyro-bnnlv bench laplace-torch`` (module docstring): per data set, structure and
    contender, timings and agreement with ours (float64); ``steps`` timed repeats per contender
    and round (default 3) after one untimed one."""
    laplace = import_laplace()
    n_steps = 3 if steps is None else int(steps)
    prior_precision = 1.0 / prior_scale**2
    rows, attrs = [], {}
    for name in data_sets:
        data = load_dataset(name, seed=seed)
        x, y, xs = data.x_train, data.y_train, data.x_test
        D, K = x.shape[1], data.num_classes
        torch.manual_seed(seed)
        seq = nn.Sequential(nn.Linear(D, hidden, bias=False), nn.Tanh(), nn.Linear(hidden, K, bias=False))
        net = ModuleNet(seq, D, K)
        model = BNN(net, prior_scale=prior_scale, likelihood="categorical")
        w = train_map(model, x, y, num_steps=map_steps, seed=seed, progress=False)
        with torch.no_grad():  # the copy computes the same function as the ModuleNet
            same = float((_their_module(net, w, torch.float64)(xs.double()) - net(xs.double(), w.double())).abs().max())
        label = f"{name} (N={len(x)}, test {len(xs)}, D={D}, K={K}, P={net.num_weights})"
        attrs[f"{label}: max |logits of laplace-torch's module - ModuleNet| at w_map"] = f"{same:.1e}"
        with warnings.catch_warnings():  # BackPACK / ASDL hooks and laplace-torch's notes, every repeat
            warnings.simplefilter("ignore")
            for structure, contenders in _contenders(laplace, model, w, x, y, prior_precision).items():
                times: dict[str, list[tuple[float, float]]] = {k: [] for k in contenders}
                for fit, predict in contenders.values():  # warm-up
                    predict(fit(), xs, "probit")
                for _ in range(rounds):
                    for key, (fit, predict) in contenders.items():
                        for _ in range(n_steps):
                            t0 = time.perf_counter()
                            la = fit()
                            t1 = time.perf_counter()
                            predict(la, xs, "probit")
                            times[key].append((t1 - t0, time.perf_counter() - t1))
                fit0, pred0 = contenders[_OURS]
                ref = fit0()
                p_ref, mc_ref = pred0(ref, xs, "probit"), pred0(ref, xs, "mc", 0)
                ref_total = statistics.median(a + b for a, b in times[_OURS])
                ref_lml = float(ref.log_marginal_likelihood())
                for key, (fit, predict) in contenders.items():
                    la = fit()
                    dp = float((predict(la, xs, "probit") - p_ref).abs().max())
                    dmc = float((predict(la, xs, "mc", 1) - mc_ref).abs().max())
                    lml = float(la.log_marginal_likelihood())
                    opt, lml_opt = _optimised(la, prior_precision)
                    fit_ms = 1e3 * statistics.median(a for a, _ in times[key])
                    pred_ms = 1e3 * statistics.median(b for _, b in times[key])
                    total = 1e3 * statistics.median(a + b for a, b in times[key])
                    rows.append(
                        (
                            name,
                            structure,
                            key,
                            fit_ms,
                            pred_ms,
                            total,
                            total / (1e3 * ref_total),
                            dp,
                            dmc,
                            lml,
                            lml - ref_lml,
                            opt,
                            lml_opt,
                        )
                    )
                    if key.startswith("laplace-torch default") and key.endswith("float64"):
                        attrs[
                            f"{label}, {structure}: max |p_ours - p_laplace-torch| probit (default backend, "
                            f"float64), target <= 1e-3"
                        ] = f"{dp:.2e}"
    columns = [
        "data",
        "structure",
        "contender",
        "fit_ms",
        "predict_ms",
        "total_ms",
        "ratio_to_ours",
        "max_dp_probit",
        "max_dp_mc",
        "log_marglik",
        "d_log_marglik",
        "prior_prec_opt",
        "log_marglik_opt",
    ]
    table = pd.DataFrame(rows, columns=columns).set_index(["data", "structure", "contender"])
    table.attrs.update(attrs)
    return table
