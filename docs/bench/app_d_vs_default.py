"""Issue 43 item 2: App. D's protocol for MAP and Laplace against this library's default
in-between protocol, split by split, beside the paper's Tables 1-2.

Usage: python docs/bench/app_d_vs_default.py APP_D_CSV DEFAULT_CSV [HIDDEN_LAYERS]
(e.g. docs/results/in-between-app-d-1hl.csv docs/results/in-between-uci-1hl.csv 1). Prints a
markdown table: per set, split kind and method, the mean test LL under each protocol over the
splits both have, the paired difference (App. D minus default) with its standard error, and the
paper's number. A difference within two standard errors is written as a tie.
"""

import math
import sys

import pandas as pd

from pyro_bnnlv.reproduce.in_between import PAPER_LL


def paired_table(app_d: pd.DataFrame, default: pd.DataFrame, hidden_layers: int) -> pd.DataFrame:
    key = ["dataset", "kind", "split"]
    both = app_d.merge(default, on=key, suffixes=("_app_d", "_default"))
    rows = []
    for (name, kind), g in both.groupby(["dataset", "kind"], sort=False):
        for m in ("MAP", "LL", "SL"):
            a, d = g[f"{m}_app_d"].astype(float), g[f"{m}_default"].astype(float)
            ok = a.notna() & d.notna()
            diff = (a - d)[ok]
            n = int(ok.sum())
            se = float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
            mean = float(diff.mean()) if n else math.nan
            verdict = "tie" if not abs(mean) > 2 * se else ("App. D better" if mean > 0 else "default better")
            rows.append(dict(dataset=name, kind=kind, method=m, n=n, app_d=float(a[ok].mean()),
                             default=float(d[ok].mean()), diff=mean, se=se, verdict=verdict,
                             paper=PAPER_LL[hidden_layers][kind].get(m, {}).get(name, math.nan)))  # fmt: skip
    return pd.DataFrame(rows)


def main(argv: list[str]) -> None:
    hidden_layers = int(argv[3]) if len(argv) > 3 else 1
    table = paired_table(pd.read_csv(argv[1]), pd.read_csv(argv[2]), hidden_layers)
    print("| set | splits | method | n | App. D | default | App. D - default (SE) | paper |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table.itertuples():
        print(f"| {r.dataset} | {r.kind} | {r.method} | {r.n} | {r.app_d:.2f} | {r.default:.2f} | "
              f"{r.diff:+.2f} ({r.se:.2f}), {r.verdict} | {r.paper:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv)
