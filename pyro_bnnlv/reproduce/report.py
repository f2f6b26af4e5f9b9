"""``docs/results.md``, generated from the committed CSVs (``pyro-bnnlv results``).

The template ``docs/results.in.md`` holds the prose: what each experiment ran, the command that
reproduces it and what its numbers mean. Each table in it is a marker, one line::

    <!-- table: NAME PATH [PATH ...] [KEY=VALUE ...] -->

which :func:`render` replaces by the markdown table that the builder ``NAME`` (see
:data:`TABLES`) makes from the CSVs ``PATH`` (relative to the repository root). So the tables
say what the CSVs say, and ``pyro-bnnlv results --check`` (a test runs it) fails when someone
reruns an experiment and commits its CSV without regenerating the page.

Usage::

    pyro-bnnlv results            # rewrite docs/results.md
    pyro-bnnlv results --check    # exit 1, naming the stale file and table, if it is out of date

Rounding follows the tables the README showed before they moved here: our values to 2 decimals
(the sd-like columns of the cosine toy to 3, KLs to integers), the papers' log-likelihoods and
RMSEs rounded half-up to 2 decimals, their ``I`` and ``HZ`` values as printed.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from decimal import ROUND_HALF_UP, Decimal
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from .in_between import METHODS as IN_BETWEEN_METHODS
from .in_between import summary as in_between_summary
from .ncai import PAPER
from .ncai import summary as ncai_summary

__all__ = ["TEMPLATE", "OUTPUT", "TABLES", "HYVI_PAPER", "default_root", "render", "build", "check", "main"]

TEMPLATE = "docs/results.in.md"
OUTPUT = "docs/results.md"

_MARKER = re.compile(r"^<!--\s*table:(?P<body>.*?)-->\s*$")

#: Pequignot et al. (2020), "Implicit variational inference: the parameter and the predictor space",
#: App. D, Table 5 (UCI, 10 splits): mean test RMSE and log predictive probability per method
#: and data set, as printed.
HYVI_PAPER = {
    "rmse": {
        "MFVI": {"boston": 3.696, "concrete": 5.425, "energy": 0.46, "wine": 0.645, "yacht": 0.791},
        "NN-HyVI": {"boston": 3.729, "concrete": 4.48, "energy": 0.452, "wine": 0.721, "yacht": 0.652},
        "FuNN-HyVI": {"boston": 4.33, "concrete": 4.779, "energy": 0.437, "wine": 0.82, "yacht": 0.863},
    },
    "test_ll": {
        "MFVI": {"boston": -2.969, "concrete": -3.121, "energy": -0.666, "wine": -0.981, "yacht": -3.348},
        "NN-HyVI": {"boston": -4.342, "concrete": -3.165, "energy": -0.611, "wine": -1.342, "yacht": -0.976},
        "FuNN-HyVI": {"boston": -10.631, "concrete": -3.463, "energy": -0.811, "wine": -2.167, "yacht": -2.056},
    },
}  # fmt: skip


# --------------------------------------------------------------------------- formatting


def _num(value: float, decimals: int = 2) -> str:
    """``value`` to ``decimals`` places; empty for NaN; no ``-0.00``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{float(value):.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def _paper(value: float, decimals: int = 2) -> str:
    """A paper's printed decimal rounded half-up (-1.055 -> -1.06, as on paper, not -1.05 as
    binary floating point rounds it); empty for NaN."""
    if value is None or math.isnan(value):
        return ""
    return str(Decimal(str(value)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))


def _printed(value: float) -> str:
    """A paper's value as printed: up to 3 decimals, at least 2 (0.036, 4.70, 0.243)."""
    text = f"{value:.3f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"


def _auto(value) -> str:
    """A benchmark cell: about 3 significant digits, integers with thousands separators."""
    if isinstance(value, (bool, str)):
        return str(value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    value = float(value)
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _bold(text: str, on: bool) -> str:
    return f"**{text}**" if on and text else text


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _best(values: Sequence[float], *, largest: bool) -> int | None:
    """Index of the strictly best finite value (None on a tie or without values)."""
    finite = [(v, i) for i, v in enumerate(values) if v is not None and not math.isnan(v)]
    if not finite:
        return None
    ranked = sorted(finite, reverse=largest)
    if len(ranked) > 1 and ranked[0][0] == ranked[1][0]:
        return None
    return ranked[0][1]


# --------------------------------------------------------------------------- NCAI


#: the order of ``ncai.PAPER``'s tuples
_NCAI_ORDER = ("BNN (MFVI)", "BNN+LV (MFVI)", "BNN+LV (NCAI_0)", "BNN+LV (NCAI_lambda)")

_NCAI_LABELS = {
    "BNN (MFVI)": "BNN MFVI",
    "BNN+LV (MFVI)": "BNN+LV MFVI",
    "BNN+LV (NCAI_0)": "BNN+LV NCAI_0",
    "BNN+LV (NCAI_lambda)": "BNN+LV NCAI_lambda",
}


def _ncai_paper(dataset: str, method: str) -> tuple[float, float, float]:
    """The NCAI paper's (test LL, I(x; mu_z), HZ(mu_z)) for one method; NaN where it has none."""
    nan = float("nan")
    ll = PAPER["test_ll"].get(dataset)
    ll = ll[_NCAI_ORDER.index(method)] if ll and method in _NCAI_ORDER else nan
    pos = {"BNN+LV (MFVI)": 0, "BNN+LV (NCAI_lambda)": 1}.get(method)
    mi = PAPER["mi_x_z"].get(dataset, (nan, nan))[pos] if pos is not None else nan
    hz = PAPER["hz_z"].get(dataset, (nan, nan))[pos] if pos is not None else nan
    return ll, mi, hz


def _with_paper(cell: str, paper: float, printed: bool = False) -> str:
    if not cell or math.isnan(paper):
        return cell
    return f"{cell} ({_printed(paper) if printed else _paper(paper)})"


def _ncai_compare(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv compare DATASET --output CSV``: one row per method (best restart of split 0);
    further CSVs (the ``--independence pc`` run) add their NCAI_lambda row. Bold: the best test LL
    among the BNN+LV rows, and NCAI_lambda's I and HZ where no other BNN+LV row is lower."""
    dataset = options.get("dataset") or Path(paths[0]).stem.removeprefix("compare-").removesuffix("-pc")
    rows: list[tuple[str, str, pd.Series, bool]] = []  # label, method, row, with paper values
    for i, (frame, path) in enumerate(zip(frames, paths)):
        term = "printed PC term (`--independence pc`)" if Path(path).stem.endswith("-pc") else "HSIC term"
        for _, row in frame.iterrows():
            method = row["method"]
            if i > 0 and method != "BNN+LV (NCAI_lambda)":
                continue
            label = _NCAI_LABELS.get(method, method)
            if method == "BNN+LV (NCAI_lambda)" and len(frames) > 1:
                label += f", {term}"
            rows.append((label, method, row, i == 0))
    lv = [k for k, (_, m, _, _) in enumerate(rows) if m.startswith("BNN+LV")]
    best_ll = _best([rows[k][2]["test_ll"] for k in lv], largest=True)
    best_ll = lv[best_ll] if best_ll is not None else None
    lowest = {}
    for col in ("mi_x_z", "hz_z"):
        k = _best([rows[j][2][col] for j in lv], largest=False)
        lowest[col] = lv[k] if k is not None and rows[lv[k]][1] == "BNN+LV (NCAI_lambda)" else None
    out = []
    for k, (label, method, row, paper) in enumerate(rows):
        ll_p, mi_p, hz_p = _ncai_paper(dataset, method) if paper else (float("nan"),) * 3
        out.append([
            label,
            _with_paper(_bold(_num(row["test_ll"]), k == best_ll), ll_p),
            _with_paper(_bold(_num(row["mi_x_z"]), k == lowest["mi_x_z"]), mi_p, printed=True),
            _with_paper(_bold(_num(row["hz_z"]), k == lowest["hz_z"]), hz_p, printed=True),
        ])  # fmt: skip
    header = [f"{dataset}, split 0", "test LL (paper Table 4)", "`I(x; mu_z)` (paper Table 2)",
              "`HZ(mu_z)` (paper Table 3)"]  # fmt: skip
    return _table(header, out)


def _setting_label(selected: str) -> str:
    """``"noise_var=0.1, eps_T=0.01, eps_x=1"`` -> ``"eps_T 0.01, eps_x 1"``."""
    if selected == "lambda=0":
        return "lambda = 0"
    parts = [p.strip().replace("=", " ") for p in str(selected).split(",") if not p.strip().startswith("noise_var")]
    return ", ".join(parts)


def _ncai_protocol(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv reproduce ncai --output CSV``: mean over the evaluation splits per data set
    and method (the test LL's sd in brackets), then the paper's value in brackets. Bold: the best
    test LL per data set, and NCAI_lambda's I and HZ where no other BNN+LV method is lower. In
    italics under each set: its test-LL ceiling, the expected LL of the true conditional density
    (:func:`pyro_bnnlv.reproduce.ncai.true_test_ll`)."""
    table = pd.concat(frames, ignore_index=True)
    summ = ncai_summary(table)
    selected = table.groupby(["dataset", "method"], sort=False)["selected"].first()
    splits = sorted(set(summ["splits"]))
    out = []
    for dataset in summ.index.get_level_values(0).unique():
        block = summ.loc[dataset]
        methods = list(block.index)
        best_ll = _best(list(block["test_ll_mean"]), largest=True)
        lv = [i for i, m in enumerate(methods) if m.startswith("BNN+LV")]
        lowest = {}
        for col in ("mi_x_z", "hz_z"):
            k = _best([block[f"{col}_mean"].iloc[i] for i in lv], largest=False)
            lowest[col] = lv[k] if k is not None and methods[lv[k]] == "BNN+LV (NCAI_lambda)" else None
        for i, method in enumerate(methods):
            r = block.loc[method]
            ll_p, mi_p, hz_p = _ncai_paper(dataset, method)
            label = _NCAI_LABELS.get(method, method)
            if method == "BNN+LV (NCAI_lambda)":
                label += f" ({_setting_label(selected[(dataset, method)])})"
            if i == 0:
                label = f"**{dataset}** {label}"

            def cell(col: str, paper: float, bold: bool, printed: bool, sd: bool = False) -> str:
                mean = _num(r[f"{col}_mean"])
                if not mean:
                    return ""
                text = _bold(mean, bold) + (f" ({_num(r[f'{col}_std'])})" if sd else "")
                return _with_paper(text, paper, printed)

            out.append([
                label,
                cell("test_ll", ll_p, i == best_ll, False, sd=True),
                cell("mi_x_z", mi_p, i == lowest["mi_x_z"], True),
                cell("hz_z", hz_p, i == lowest["hz_z"], True),
            ])  # fmt: skip
        ceiling = _num(block["true_test_ll"].iloc[0])  # "" for a set without a known density
        if ceiling:
            out.append(["*ceiling: the true density*", f"*{ceiling}*", "", ""])
    n = ", ".join(str(s) for s in splits)
    header = [f"{n} splits, mean", "test LL (sd) (paper)", "`I(x; mu_z)` (paper)", "`HZ(mu_z)` (paper)"]
    return _table(header, out)


# --------------------------------------------------------------------------- HyVI


def _hyvi_cosine(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv reproduce hyvi-cosine --output CSV``. Bold: the method with the smallest
    predictor-space KL (sum of both directions)."""
    (t,) = frames
    kl = lambda row, space: (  # noqa: E731
        "" if math.isnan(row[f"kl_{space}_q_nuts"])
        else f"{row[f'kl_{space}_q_nuts']:.0f} / {row[f'kl_{space}_nuts_q']:.0f}")  # fmt: skip
    best = _best(list(t["kl_predictor_q_nuts"] + t["kl_predictor_nuts_q"]), largest=False)
    out = []
    for i, row in t.iterrows():
        out.append([_bold(row["method"], i == best), _num(row["sd_data"], 3), _num(row["sd_gap"]),
                    _num(row["sd_far"]), _num(row["test_ll"]), kl(row, "parameter"),
                    _bold(kl(row, "predictor"), i == best)])  # fmt: skip
    header = ["method", "sd data", "sd gap", "sd far", "test LL", "KL param (q‖NUTS / NUTS‖q)",
              "KL pred (q‖NUTS / NUTS‖q)"]  # fmt: skip
    return _table(header, out)


def _hyvi_uci(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv reproduce hyvi-uci --output CSV``: RMSE / test LL / AUROC per data set and
    method (mean over the splits in the CSV, with its standard error ``± se`` when there are
    several, as Table 5 reports), the paper's Table 5 in brackets. The ``splits`` column counts
    the finished fits per method (a CSV of a sweep under way, ``--stop-after``, has ``pending``
    rows; failed and pending fits do not enter the means); "(k capped)": fits that reached the
    step cap before the learning-rate schedule ran out."""
    t = pd.concat(frames, ignore_index=True)
    planned = t.groupby("dataset", sort=False)["split"].nunique() if "split" in t else None
    if "status" in t:
        t = t[t["status"] == "done"]
    cols = ["rmse", "test_ll", "auroc_ood"]
    groups = t.groupby(["dataset", "method"], sort=False)[cols]
    agg, se = groups.mean(), groups.std() / groups.count().pow(0.5)
    several = groups.count()["rmse"] > 1

    def value(key, col: str) -> str:
        return _num(agg.loc[key, col]) + (f" ± {_num(se.loc[key, col])}" if several.loc[key] else "")

    methods = list(t["method"].drop_duplicates())
    out = []
    for dataset in t["dataset"].drop_duplicates():
        counts = [int(groups.count().loc[(dataset, m), "rmse"]) if (dataset, m) in agg.index else 0 for m in methods]
        of = f" of {planned.loc[dataset]}" if planned is not None else ""
        capped = int(t.loc[t["dataset"] == dataset, "capped"].astype(bool).sum()) if "capped" in t else 0
        of += f" ({capped} capped)" if capped else ""
        cells = [dataset, (str(counts[0]) if len(set(counts)) == 1 else " / ".join(map(str, counts))) + of]
        for m in methods:
            if (dataset, m) not in agg.index:
                cells.append("")
                continue
            key = (dataset, m)
            rmse_p = HYVI_PAPER["rmse"].get(m, {}).get(dataset, float("nan"))
            ll_p = HYVI_PAPER["test_ll"].get(m, {}).get(dataset, float("nan"))
            cells.append(f"{_with_paper(value(key, 'rmse'), rmse_p)} / {_with_paper(value(key, 'test_ll'), ll_p)}"
                         f" / {value(key, 'auroc_ood')}")  # fmt: skip
        out.append(cells)
    return _table(["data set", "splits"] + [f"{m} RMSE / LL / AUROC" for m in methods], out)


def _knn_presets(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``python docs/bench/knn_elbo_presets.py``: cost per step and the cosine-toy fit."""
    (t,) = frames
    out = [[row["setting"], _num(row["ms_per_step"], 1), _num(row["cost_vs_mfvi"], 1), _num(row["sd_data"], 3),
            _num(row["sd_gap"]), _num(row["sd_far"]), _num(row["test_ll"])] for _, row in t.iterrows()]  # fmt: skip
    return _table(["setting", "ms / step", "cost vs MFVI", "sd data", "sd gap", "sd far", "test LL"], out)


# --------------------------------------------------------------------------- in-between


_IB_LABELS = {"MAP": "MAP", "MFVI": "MFVI", "LL": "linearised Laplace", "LL-valid": "LL, validation hyper-params",
              "SL": "sampled Laplace"}  # fmt: skip


def _mean_se(mean: float, se: float) -> str:
    if abs(mean) >= 100:
        return f"{mean:.0f}±{se:.0f}"
    return f"{_num(mean)}±{_num(se)}"


def _in_between(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv reproduce in-between --output CSV``: mean ± standard error of the test LL over
    the splits, the paper's Tables 1-2 in brackets (``hidden_layers=2``: its 2HL rows). One table
    per split kind; a CSV with a single method gives one table with a row per kind."""
    hidden = int(options.get("hidden_layers", 1))
    t = pd.concat(frames, ignore_index=True)
    summ = in_between_summary(t, hidden)
    datasets = list(summ["dataset"].drop_duplicates())
    methods = [m for m in IN_BETWEEN_METHODS if m in set(summ["method"])]
    kinds = list(summ["kind"].drop_duplicates())
    idx = summ.set_index(["kind", "method", "dataset"])

    def cell(kind: str, method: str, dataset: str) -> str:
        if (kind, method, dataset) not in idx.index:
            return ""
        r = idx.loc[(kind, method, dataset)]
        return _with_paper(_mean_se(r["mean"], r["se"]), r["paper"])

    def counts(kind: str) -> str:
        n = summ[(summ["kind"] == kind)].drop_duplicates("dataset").set_index("dataset")["n_splits"]
        return ", ".join(f"{d} {int(n[d])}" for d in datasets if d in n.index)

    if len(methods) == 1:
        (m,) = methods
        rows = []
        for kind in kinds:
            ns = set(summ[summ["kind"] == kind]["n_splits"])
            label = f"{kind} ({ns.pop()} splits)" if len(ns) == 1 else kind
            rows.append([label] + [cell(kind, m, d) for d in datasets])
        return f"splits: {'; '.join(f'{k} ({counts(k)})' for k in kinds)}\n\n" + _table(
            [f"{_IB_LABELS.get(m, m)}"] + datasets, rows)  # fmt: skip
    parts = []
    for kind in kinds:
        rows = [[_IB_LABELS.get(m, m)] + [cell(kind, m, d) for d in datasets] for m in methods]
        parts.append(f"{kind} splits ({counts(kind)})\n\n" + _table([""] + datasets, rows))
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- projected BNN


def _proj_uci(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """``pyro-bnnlv reproduce proj-uci --output CSV``: per data set, split scheme and method the
    test LL (``values=test_ll``, the default; bold: the best per row), the test RMSE
    (``values=rmse``; bold: the smallest) or what validation selected (``values=selected``: the
    step size and latent size ``D_z`` as ``lr / D_z``), all on the standardised scale. A CSV of a
    sweep under way (``--stop-after``): a cell picked from a partly finished grid is marked ``*``
    (status ``partial``), a cell without a finished fit is empty."""
    values_of = options.get("values", "test_ll")
    if values_of not in ("test_ll", "rmse", "selected"):
        raise ValueError(f"values={values_of!r}; choose values=test_ll, values=rmse or values=selected")
    t = pd.concat(frames, ignore_index=True)
    methods = list(t["method"].drop_duplicates())
    partial = set()
    if "status" in t:
        t = t[t["status"].isin(["done", "partial"])]
        partial = {tuple(k) for k in t.loc[t["status"] == "partial", ["dataset", "scheme", "method"]].to_numpy()}
    selected = values_of == "selected"
    if selected:
        for column in ("lr", "latent_dim"):
            if column not in t:
                raise KeyError(f"values=selected needs column {column!r}, which {', '.join(paths)} lacks")
        t = t.assign(selected=[" / ".join(f"{v:g}" for v in pair if not pd.isna(v))
                               for pair in zip(t["lr"], t["latent_dim"])])  # fmt: skip
    wide = t.pivot_table(index=["dataset", "scheme"], columns="method", values=values_of,
                         aggfunc="first" if selected else "mean")  # fmt: skip
    out = []
    for (dataset, scheme), row in wide.sort_index().iterrows():
        values = [row.get(m, float("nan")) for m in methods]
        texts = [v if isinstance(v, str) else "" for v in values] if selected else [_num(v) for v in values]
        best = None if selected else _best(values, largest=values_of == "test_ll")
        cells = [_bold(text, i == best) + ("*" if (dataset, scheme, m) in partial else "")
                 for i, (m, text) in enumerate(zip(methods, texts))]  # fmt: skip
        out.append([dataset, scheme] + cells)
    return _table(["data set", "split"] + methods, out)


def _share(value: float) -> str:
    """A share as ``0``, ``1`` or ``.37``."""
    text = _num(value)
    return text if not text else ("0" if float(text) == 0 else "1" if float(text) == 1 else text.lstrip("0"))


def _proj_four_modes(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """The four-mode toy's census (``pyro-bnnlv reproduce proj-four-modes --output CSV``), one CSV
    per seed: each cell lists the seeds' values in the order given ("a / b / c"); the
    missed-bump shares are the first seed's. Bold: a fit whose samples cover at least two modes
    in every seed."""
    missing = [p for f, p in zip(frames, paths) if "modes" not in f.columns or "fit" not in f.columns]
    if missing:
        raise ValueError(f"{missing} are not proj-four-modes censuses (columns fit, modes, ...)")
    tables = [f.set_index("fit") for f in frames]

    def cell(fit: str, column: str, decimals: int) -> str:
        values = [t.loc[fit, column] if fit in t.index else float("nan") for t in tables]
        texts = [_num(v, decimals) for v in values]
        return "" if not any(texts) else " / ".join(t or "-" for t in texts)

    shares = [c for c in tables[0].columns if c.startswith("miss ")]
    rows = []
    for fit in tables[0].index:
        covers = all(fit in t.index and t.loc[fit, "modes"] >= 2 for t in tables)
        share = "/".join(_share(tables[0].loc[fit, c]) for c in shares)
        rows.append([_bold(str(fit), covers and fit != "candidates"), cell(fit, "prior_fits_three", 2),
                     cell(fit, "prior_modes", 0), cell(fit, "fits_three", 2), cell(fit, "modes", 0), share,
                     cell(fit, "test_ll", 2)])  # fmt: skip
    header = ["fit", "prior draws fitting 3", "prior modes", "samples fitting 3", "modes",
              "missed-bump shares (" + " / ".join(s.removeprefix("miss ") for s in shares) + "; first seed)", "test LL"]
    return _table(header, rows)


# --------------------------------------------------------------------------- benchmarks


def _bench(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """Any ``pyro-bnnlv bench NAME --output CSV``: every column that has a value, about three
    significant digits. ``columns=a,b`` keeps those columns (after the first)."""
    (t,) = frames
    t = t.dropna(axis=1, how="all")
    if "columns" in options:
        keep = options["columns"].split(",")
        missing = [c for c in keep if c not in t.columns]
        if missing:
            raise ValueError(f"{paths[0]} has no column(s) {missing}; it has {list(t.columns)}")
        t = t[[t.columns[0]] + keep]
    rows = [[_auto(v) for v in row] for row in t.itertuples(index=False)]
    return _table([str(c) for c in t.columns], rows)


def _bench_runs(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """Several runs of one benchmark side by side: ``column=NAME`` from each CSV, one column per
    run (named by the file), rows (the first column) where the first run has a value."""
    col = options.get("column")
    if not col:
        raise ValueError("the bench-runs table needs column=NAME")
    key = frames[0].columns[0]
    series = []
    for frame, path in zip(frames, paths):
        if col not in frame.columns:
            raise ValueError(f"{path} has no column {col!r}; it has {list(frame.columns)}")
        series.append(frame.set_index(key)[col])
    rows_index = [k for k in series[0].index if not pd.isna(series[0][k])]
    rows = [[str(k)] + [_auto(s.get(k, float("nan"))) for s in series] for k in rows_index]
    return _table([key] + [Path(p).stem for p in paths], rows)


Builder = Callable[[list[pd.DataFrame], list[str], dict[str, str]], str]

#: marker name -> builder(frames, paths, options) returning the markdown table
TABLES: dict[str, Builder] = {
    "ncai-compare": _ncai_compare,
    "ncai-protocol": _ncai_protocol,
    "hyvi-cosine": _hyvi_cosine,
    "hyvi-uci": _hyvi_uci,
    "knn-elbo-presets": _knn_presets,
    "in-between": _in_between,
    "proj-uci": _proj_uci,
    "proj-four-modes": _proj_four_modes,
    "bench": _bench,
    "bench-runs": _bench_runs,
}


# --------------------------------------------------------------------------- rendering


def default_root() -> Path:
    """The checkout this package was installed from (editable install), else the working
    directory."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if (checkout / TEMPLATE).exists() else Path.cwd()


def _parse_marker(body: str, where: str) -> tuple[str, list[str], dict[str, str]]:
    tokens = shlex.split(body)
    if not tokens:
        raise ValueError(f"{where}: empty table marker; write <!-- table: NAME PATH.csv -->")
    name, rest = tokens[0], tokens[1:]
    if name not in TABLES:
        raise ValueError(f"{where}: unknown table {name!r}; known: {sorted(TABLES)}")
    paths = [t for t in rest if "=" not in t]
    options = dict(t.split("=", 1) for t in rest if "=" in t)
    if not paths:
        raise ValueError(f"{where}: table {name!r} names no CSV; write <!-- table: {name} docs/results/FILE.csv -->")
    return name, paths, options


def _segments(template: str, root: Path, template_name: str = TEMPLATE) -> list[tuple[list[str], str]]:
    """The rendered page as segments ``(csv paths, text)``: static text has no paths."""
    segments: list[tuple[list[str], str]] = []
    for lineno, line in enumerate(template.splitlines(keepends=True), 1):
        match = _MARKER.match(line.strip())
        if not match:
            segments.append(([], line))
            continue
        where = f"{template_name}:{lineno}"
        name, paths, options = _parse_marker(match.group("body"), where)
        frames = []
        for path in paths:
            file = root / path
            if not file.is_file():
                raise FileNotFoundError(f"{where}: table {name!r} reads {path}, which does not exist under {root}")
            frames.append(pd.read_csv(file))
        try:
            text = TABLES[name](frames, paths, options)
        except (KeyError, ValueError) as err:
            raise ValueError(f"{where}: table {name!r} from {', '.join(paths)}: {err}") from err
        source = " ".join(paths)
        segments.append((paths, f"<!-- generated from {source}: edit the CSV or {template_name} -->\n{text}\n"))
    return segments


_BANNER = ("<!-- GENERATED by `pyro-bnnlv results` from {template} and the CSVs under docs/results/;"
           " do not edit by hand: edit {template} and rerun. -->\n\n")  # fmt: skip


def render(template: str, root: str | Path = ".", template_name: str = TEMPLATE) -> str:
    """The page: ``template`` with every table marker replaced by its table."""
    body = "".join(text for _, text in _segments(template, Path(root), template_name))
    return _BANNER.format(template=template_name) + body


def build(root: str | Path | None = None) -> str:
    """``docs/results.md`` as the template and CSVs under ``root`` give it."""
    root = Path(root) if root is not None else default_root()
    template = root / TEMPLATE
    if not template.is_file():
        raise FileNotFoundError(f"no template {TEMPLATE} under {root} (pass --root, the repository root)")
    return render(template.read_text(), root)


def check(root: str | Path | None = None) -> tuple[bool, str]:
    """``(True, "")`` when ``docs/results.md`` is what :func:`build` gives, else ``(False,
    message)`` naming the stale file and the CSVs whose tables differ."""
    root = Path(root) if root is not None else default_root()
    out = root / OUTPUT
    template = root / TEMPLATE
    if not template.is_file():
        raise FileNotFoundError(f"no template {TEMPLATE} under {root} (pass --root, the repository root)")
    segments = _segments(template.read_text(), root)
    expected = _BANNER.format(template=TEMPLATE) + "".join(text for _, text in segments)
    if not out.is_file():
        return False, f"{OUTPUT} is missing; run `pyro-bnnlv results`"
    current = out.read_text()
    if current == expected:
        return True, ""
    stale = [", ".join(paths) for paths, text in segments if paths and text not in current]
    what = (f"the table(s) from {'; '.join(stale)} differ" if stale
            else f"its text differs from {TEMPLATE}")  # fmt: skip
    diff = list(difflib.unified_diff(current.splitlines(), expected.splitlines(), f"{OUTPUT} (committed)",
                                     f"{OUTPUT} (from the CSVs)", n=0, lineterm=""))  # fmt: skip
    shown = "\n".join(diff[:12]) + ("\n..." if len(diff) > 12 else "")
    return False, f"{OUTPUT} is stale: {what}; run `pyro-bnnlv results` and commit it\n{shown}"


def main(check_only: bool = False, root: str | Path | None = None) -> int:
    """Write ``docs/results.md`` (or, with ``check_only``, report whether it is up to date)."""
    root = Path(root) if root is not None else default_root()
    if check_only:
        ok, message = check(root)
        if not ok:
            import sys

            print(message, file=sys.stderr)
            return 1
        print(f"{OUTPUT} is up to date")
        return 0
    text = build(root)
    (root / OUTPUT).write_text(text)
    print(f"wrote {root / OUTPUT}")
    return 0
