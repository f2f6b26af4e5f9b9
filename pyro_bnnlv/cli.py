"""The ``pyro-bnnlv`` command.

Sub-commands:

* ``pyro-bnnlv datasets [--download [NAME ...]] [--mirror URL]``: list the data sets, which real
  ones are cached (size, source, licence), and download them;
* ``pyro-bnnlv fit --dataset NAME --model bnn --guide meanfield --steps N --seed S``: train,
  print the test metrics and, for 1-D inputs, write a PNG of the predictive mean and 95% band;
* ``pyro-bnnlv compare DATASET``: BNN and BNN+LV with mean-field VI and NCAI, one table;
* ``pyro-bnnlv bench NAME``: run a side-by-side benchmark (``svi-overhead``, ``lv-scaling``,
  ``nuts``, ...);
* ``pyro-bnnlv reproduce NAME [ARGS]``: a paper's experiment at a size for a small machine
  (``hyvi-cosine``, ``hyvi-uci``, ``in-between``, ``proj-uci``); ``ARGS`` go to the experiment
  (``pyro-bnnlv reproduce hyvi-cosine --help``);
* ``pyro-bnnlv results [--check]``: regenerate ``docs/results.md`` from ``docs/results.in.md``
  and the CSVs under ``docs/results/``, and README.md's generated blocks (``--check``: exit 1 if
  either is stale).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pyro.infer.autoguide import AutoDelta, AutoMultivariateNormal, AutoNormal

from ._platform import retain_freed_memory, skip_collection_at_exit
from ._compiled import compiled_enabled, nuts_extension
from .reproduce.bench import BENCHMARKS
from .stats._pairwise import pairwise_extension
from .datasets import default_data_dir, list_datasets, load_dataset, load_split
from .datasets.fetch import DatasetUnavailableError, dataset_status, fetch_dataset, fetchable_datasets
from .guides import init_to_network
from .infer.elbos.ncai import INDEPENDENCE_TERMS
from .infer.laplace import LinearizedLaplace
from .infer.svi import fit_svi, train_map
from .models.bnn import BNN
from .nets import MLP
from .param_names import own_param_names
from .plotting import plot_predictive_1d
from .posterior import sample_posterior
from .reproduce.ncai_compare import CompareConfig, load_compare_data, run_compare
from .reproduce.report import main as results_main
from .stats.predictive import evaluate
from .sweep import SweepLockedError, SweepStoreError
from .sweep.cli import add_sweep_arguments, check_output_file, report, sweep_options
from .sweep.snapshot import snapshot_stores
from .sweep.status import find_stores, format_status, sweep_status

__all__ = ["main"]

GUIDES = ("meanfield", "fullcov", "map", "laplace")


def _make_guide(name: str, model, seed: int):

    init = init_to_network(model, seed=seed)
    if name == "meanfield":
        return own_param_names(AutoNormal(model, init_scale=0.01, init_loc_fn=init))
    if name == "fullcov":
        return own_param_names(AutoMultivariateNormal(model, init_scale=0.01, init_loc_fn=init))
    return own_param_names(AutoDelta(model, init_loc_fn=init))


def _cmd_datasets(args: argparse.Namespace) -> int:
    known = fetchable_datasets()
    if args.download is not None:
        names = [n.strip().lower().replace("_", "-") for n in args.download] or known
        unknown = sorted(set(names) - set(known))
        if unknown:
            print(f"--download: unknown real data set(s) {unknown}; expected some of {known}", file=sys.stderr)
            return 2
        for name in names:
            try:
                fetch_dataset(name, args.data_dir, mirror=args.mirror)
            except DatasetUnavailableError as err:
                print(err, file=sys.stderr)
                return 1
    print(list_datasets().to_string())
    status = dataset_status(data_dir=args.data_dir)
    root = args.data_dir or default_data_dir()
    print(
        f"\nreal data in {root} (cached: files present with the manifest's SHA-256; "
        "`pyro-bnnlv datasets --download [NAME ...]` fetches them):"
    )
    width = int(status["source"].str.len().max())
    print(status[["cached", "size", "source"]].to_string(formatters={"source": lambda t: t.ljust(width)}))
    print("licences:")
    for licence, group in status.groupby("licence", sort=False):
        print(f"  {', '.join(group.index)}: {licence}")
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    if args.split is not None:
        data = load_split(args.dataset, args.split)
    else:
        data = load_dataset(args.dataset, seed=args.seed or 0)
    args.seed = data.seed if args.seed is None else args.seed  # the fit's seed
    net = MLP(data.input_dim, args.hidden, 1, activation=args.activation)
    model = BNN(net, prior_scale=args.prior_scale, noise_scale=args.noise_scale, learn_noise=args.learn_noise)
    if args.guide == "laplace":
        return _fit_laplace(args, data, model)
    guide = _make_guide(args.guide, model, args.seed)
    print(f"{data!r}\n{net!r}\nguide: {type(guide).__name__}, steps: {args.steps}, lr: {args.lr}")
    t0 = time.perf_counter()
    history = fit_svi(
        model,
        guide,
        data.x_train,
        data.y_train,
        num_steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=not args.quiet,
    )
    seconds = time.perf_counter() - t0
    samples = sample_posterior(model, guide, data.x_train, data.y_train, num_samples=args.num_samples, seed=args.seed)
    metrics = evaluate(model, samples, data.x_test, data.y_test, y_mean=data.y_mean, y_std=data.y_std)
    metrics["final_loss"] = history[-1]
    metrics["seconds"] = seconds
    return _report_fit(args, data, model, samples, metrics)


def _fit_laplace(args: argparse.Namespace, data: Any, model: BNN) -> int:
    """``--guide laplace``: the MAP (``--steps``, ``--lr``), then the full linearised Laplace with the
    prior precision and noise chosen by marginal likelihood."""
    print(
        f"{data!r}\n{model.net!r}\nguide: linearised Laplace (full GGN, marginal likelihood), MAP steps: "
        f"{args.steps}, lr: {args.lr}"
    )
    t0 = time.perf_counter()
    w = train_map(
        model,
        data.x_train,
        data.y_train,
        num_steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=not args.quiet,
    )
    la = LinearizedLaplace(model, w).fit(data.x_train, data.y_train)
    chosen = la.optimize_hyperparameters()
    metrics = evaluate(model, la, data)
    metrics["prior_factor"], metrics["noise_scale"] = chosen["prior_factor"], chosen["noise_scale"]
    metrics["seconds"] = time.perf_counter() - t0
    return _report_fit(args, data, la.to_model(), la, metrics)


def _report_fit(args: argparse.Namespace, data: Any, model: BNN, posterior: Any, metrics: Any) -> int:
    print(metrics.to_frame(f"{args.dataset} / bnn / {args.guide}").to_string(float_format="%.4f"))
    if data.input_dim == 1 and not args.no_plot:
        out = Path(args.output or f"{args.dataset}-bnn-{args.guide}.png")
        plot_predictive_1d(model, posterior, data, out, title=f"{args.dataset}: BNN, {args.guide}")
        print(f"wrote {out}")
    return 0


def _parse_grid(items: Sequence[str] | None) -> list[dict[str, float]] | None:
    """``["eps_T=0.01,0.0003", "lambda1=1"]`` -> the product grid as a list of dicts."""
    if not items:
        return None

    base = dict(CompareConfig().ncai_grid[0])
    axes: dict[str, list[float]] = {}
    for item in items:
        key, _, values = item.partition("=")
        if key not in base or not values:
            raise ValueError(f"--grid entries look like NAME=v1,v2 with NAME in {sorted(base)}; got {item!r}")
        axes[key] = [float(v) for v in values.split(",")]
    keys = list(axes)
    grid = []
    for combo in itertools.product(*(axes[k] for k in keys)):
        grid.append(dict(base, **dict(zip(keys, combo))))
    return grid


def _cmd_compare(args: argparse.Namespace) -> int:
    overrides = {
        k: v
        for k, v in dict(
            steps=args.steps,
            restarts=args.restarts,
            seed=args.seed,
            ncai_grid=_parse_grid(args.grid),
            independence=args.independence,
        ).items()
        if v is not None
    }
    data = load_compare_data(args.dataset, seed=overrides.get("seed", 0))
    cfg = CompareConfig.full(dataset=data.name, **overrides) if args.full else CompareConfig(**overrides)
    print(
        f"{data!r}\nsteps={cfg.steps}, restarts={cfg.restarts}, NCAI grid points="
        f"{len(cfg.ncai_grid)}, independence term={cfg.independence}, empirical Bayes={cfg.empirical_bayes}"
    )
    figure = None
    if data.input_dim == 1 and not args.no_plot:
        figure = Path(args.figure or f"compare-{data.name}.png")
        check_output_file(figure, "--figure")
    options = sweep_options(args)  # checks --output before the run
    table, _ = run_compare(data.name, cfg, progress=not args.quiet, figure=figure, return_fits=False, **options)
    print(table.to_string(index=False, float_format="%.3f"))
    if figure is not None:
        print(f"wrote {figure}")
    if args.output:
        table.to_csv(args.output, index=False)
        print(f"wrote {args.output}")
    return report(table)


def _cmd_bench(args: argparse.Namespace) -> int:
    fn, description = BENCHMARKS[args.name]
    torch.set_num_threads(args.threads)
    print(f"{args.name}: {description} (torch threads: {args.threads})")
    table = fn(steps=args.steps) if args.steps else fn()
    print(table.to_string(float_format="%.3f"))
    for key, value in table.attrs.items():
        print(f"{key}: {value}" if isinstance(value, (bool, str)) else f"{key}: {value:.2f}")
    if args.output:
        table.to_csv(args.output)
    return 0


REPRODUCTIONS = {
    "hyvi-cosine": ("pyro_bnnlv.reproduce.hyvi", ["cosine"]),
    "hyvi-uci": ("pyro_bnnlv.reproduce.hyvi", ["uci"]),
    "in-between": ("pyro_bnnlv.reproduce.in_between", []),
    "proj-uci": ("pyro_bnnlv.reproduce.projected", []),
    "proj-four-modes": ("pyro_bnnlv.reproduce.projected_toy", []),
    "ncai-family": ("pyro_bnnlv.reproduce.ncai_family", []),
    "ncai": ("pyro_bnnlv.reproduce.ncai", []),
    "classification": ("pyro_bnnlv.reproduce.classification", []),
}


def _cmd_reproduce(args: argparse.Namespace) -> int:
    module, prefix = REPRODUCTIONS[args.experiment]
    return int(importlib.import_module(module).main(prefix + list(args.args)) or 0)


def _cmd_status(args: argparse.Namespace) -> int:
    statuses, unusable = [], []
    for directory in [d for root in args.dirs for d in find_stores(root)]:
        try:
            statuses.append(sweep_status(directory))
        except SweepStoreError as err:  # damaged or not a store: said, the others still reported
            unusable.append(f"{directory} (unusable): {err}")
    if statuses:
        print(format_status(statuses, workers=args.workers))
    for line in unusable:
        print(line, file=sys.stderr)
    return 1 if unusable else 0


def _cmd_snapshot(args: argparse.Namespace) -> int:
    for snap in snapshot_stores(args.source, args.destination, overwrite=args.overwrite):
        counts = ", ".join(f"{n} {status}" for status, n in sorted(snap.counts.items()))
        print(f"{snap.destination}: {counts}")
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    if not compiled_enabled():
        print("PYRO_BNNLV_COMPILED=0 is set: nothing to build", file=sys.stderr)
        return 1
    built = {"compiled NUTS core": nuts_extension(), "compiled pairwise kernels": pairwise_extension()}
    for what, module in built.items():
        print(f"{what}: {module.__file__ if module is not None else 'unavailable (see the warning above)'}")
    return 0 if all(m is not None for m in built.values()) else 1


def _cmd_results(args: argparse.Namespace) -> int:
    return results_main(check_only=args.check, root=args.root)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pyro-bnnlv", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    ds = sub.add_parser("datasets", help="list the data sets; download the real ones (--download)")
    ds.add_argument(
        "--download",
        nargs="*",
        metavar="NAME",
        help="fetch these real data sets (all when no NAME is given) into the data directory",
    )
    ds.add_argument(
        "--mirror",
        help="base URL or directory of a mirror in the data directory's layout "
        "(default $PYRO_BNNLV_MIRROR, else the public sources)",
    )
    ds.add_argument(
        "--data-dir",
        help="data directory (default $PYRO_BNNLV_DATA, else ../shared/data in a checkout, else ~/.cache/pyro_bnnlv)",
    )
    ds.set_defaults(func=_cmd_datasets)

    _add_fit_parser(sub)
    _add_compare_parser(sub)

    b = sub.add_parser("bench", help="side-by-side benchmarks")
    b.add_argument("name", choices=sorted(BENCHMARKS))
    b.add_argument("--steps", type=int, default=None, help="timed steps per contender and round")
    b.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    b.add_argument("--output", help="write the table as CSV")
    b.set_defaults(func=_cmd_bench)

    r = sub.add_parser("reproduce", help="a paper's experiment, reduced to a small machine")
    r.add_argument("experiment", choices=sorted(REPRODUCTIONS))
    r.add_argument("args", nargs=argparse.REMAINDER, help="options of the experiment (--help)")
    r.set_defaults(func=_cmd_reproduce)

    st = sub.add_parser("status", help="progress of sweeps from their stores (read only, also while running)")
    st.add_argument("dirs", nargs="+", metavar="DIR", help="--out directories (stores below them are found)")
    st.add_argument("--workers", type=int, default=1, help="workers for the wall-time estimate (default 1)")
    st.set_defaults(func=_cmd_status)

    sn = sub.add_parser("snapshot", help="copy sweep stores consistently, also while a driver writes them")
    sn.add_argument("source", metavar="SRC", help="a --out directory (every store below it is copied)")
    sn.add_argument("destination", metavar="DEST", help="where the copies go, at the same relative paths")
    sn.add_argument("--overwrite", action="store_true", help="replace stores already at DEST")
    sn.set_defaults(func=_cmd_snapshot)

    bu = sub.add_parser(
        "build",
        help="build the C++ kernels (NUTS core, NCAI pairwise statistics) now, "
        "not on first use (once per machine, source and compiler; about a minute)",
    )
    bu.set_defaults(func=_cmd_build)

    res = sub.add_parser(
        "results", help="regenerate docs/results.md and README.md's generated blocks from the CSVs under docs/results/"
    )
    res.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1, naming the stale file, if docs/results.md or README.md is out of date",
    )
    res.add_argument("--root", help="repository root (default: the checkout pyro_bnnlv is installed from)")
    res.set_defaults(func=_cmd_results)
    return p


def _add_fit_parser(sub: argparse._SubParsersAction) -> None:
    """The ``fit`` command's options."""
    f = sub.add_parser("fit", help="train a model and print test metrics")
    f.add_argument("--dataset", required=True, help="a registered data set (pyro-bnnlv datasets lists them)")
    f.add_argument("--model", default="bnn", choices=["bnn"], help="the model (a BNN: MLP with a flat weight site)")
    f.add_argument(
        "--guide",
        default="meanfield",
        choices=GUIDES,
        help="meanfield (pb.MeanField), fullcov (AutoMultivariateNormal), map (AutoDelta), or laplace "
        "(MAP then the full linearised Laplace, prior and noise by marginal likelihood)",
    )
    f.add_argument("--steps", type=int, default=2000, help="SVI steps (laplace: MAP steps); default 2000")
    f.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate; default 0.01")
    f.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seeds the fit and, without --split, the data (a synthetic set's generator, a UCI "
        "set's validation subset: not its test set); default 0, with --split the split",
    )
    f.add_argument(
        "--split",
        type=int,
        default=None,
        help="train/test split k (pb.datasets.load_split): a UCI set's standard split k, otherwise seed k",
    )
    f.add_argument("--hidden", type=int, nargs="*", default=[50], help="hidden layer widths; default 50")
    f.add_argument(
        "--activation", default="tanh", help="the MLP's activation (tanh, relu, leaky_relu, silu, gelu, softplus, ...)"
    )
    f.add_argument("--prior-scale", type=float, default=1.0, help="prior sd of every weight; default 1")
    f.add_argument(
        "--noise-scale",
        type=float,
        default=0.1,
        help="observation noise sd on the standardised targets; default 0.1 (pb.grid_search "
        "chooses it by validation LL)",
    )
    f.add_argument("--learn-noise", action="store_true", help="learn the noise with the weights (type-II ML)")
    f.add_argument("--batch-size", type=int, default=None, help="minibatch size; default full batch")
    f.add_argument("--num-samples", type=int, default=500, help="posterior draws for the metrics; default 500")
    f.add_argument("--output", help="PNG path for 1-D data (default: DATASET-bnn-GUIDE.png)")
    f.add_argument("--no-plot", action="store_true", help="no figure (1-D data get one by default)")
    f.add_argument("--quiet", action="store_true", help="no progress bar")
    f.set_defaults(func=_cmd_fit)


def _add_compare_parser(sub: argparse._SubParsersAction) -> None:
    """The ``compare`` command's options (and the sweep's)."""
    c = sub.add_parser("compare", help="BNN vs BNN+LV (MFVI, NCAI) on one data set")
    c.add_argument("dataset")
    c.add_argument("--steps", type=int, default=None, help="SVI steps per fit (default 3000)")
    c.add_argument("--restarts", type=int, default=None, help="restarts per setting (default 2)")
    c.add_argument("--seed", type=int, default=None)
    c.add_argument(
        "--grid",
        nargs="*",
        metavar="NAME=V1,V2",
        help="NCAI grid, e.g. eps_T=0.01,0.0003 eps_y=0.1,0.5 (names: lambda1-3, eps_T, eps_x, eps_y). "
        "The noise is chosen by validation LL from its own grid: variances 1.0, 0.1 for the BNN "
        "and 0.1 for BNN+LV (--full: App. F.1's 1.0, 0.1, 0.01 and 0.1, 0.01); for your own "
        "model, pb.grid_search picks the noise (or any setting) the same way",
    )
    c.add_argument(
        "--independence",
        choices=INDEPENDENCE_TERMS,
        default=None,
        help="NCAI's independence term (pb.NCAIElbo's independence=): nHSIC(x, mu_z) (hsic, the "
        "default), the printed correlations (pc), or the terms the family benchmark compares ("
        + ", ".join(t for t in INDEPENDENCE_TERMS if t not in ("hsic", "pc"))
        + "; docs/guide.md)",
    )
    c.add_argument("--full", action="store_true", help="the paper's settings (slow)")
    c.add_argument("--output", help="write the table as CSV")
    c.add_argument("--figure", help="PNG path for 1-D data (default compare-DATASET.png)")
    c.add_argument("--no-plot", action="store_true")
    c.add_argument("--quiet", action="store_true")

    add_sweep_arguments(c)
    c.set_defaults(func=_cmd_compare)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    retain_freed_memory()  # a step's large tensors stay in the heap (bench allocator)
    skip_collection_at_exit()  # exit without collecting torch's objects
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, ConnectionError, SweepLockedError) as err:
        print(f"pyro-bnnlv: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
