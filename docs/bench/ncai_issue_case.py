"""Issue 37's own case, at ``compare``'s defaults, once per independence term.

    python docs/bench/ncai_issue_case.py [--terms hsic knn-mi-wide] [--out /tmp/ncai-issue-case]

The issue's ``from_arrays`` set (``sin-tanh`` of ``docs/bench/ncai_independence_diagnosis.py``:
500 points, ``y = sin(1.5 x) + (0.6 + 0.15 x) tanh(4 z) + 0.15 e``, split seed 0), run as a new
user would: :func:`~pyro_bnnlv.reproduce.ncai_compare.run_compare` with
``CompareConfig(independence=term)`` (3,000 full-batch steps, 2 restarts, one NCAI grid point),
one resumable store per term under ``--out``. Printed per term: ``compare``'s table, then every
BNN+LV fit's validation LL, test LL, KSG ``I(x; mu_z)`` on the training means and the last value
of the penalised statistic (``final_hsic_x`` or ``final_indep_x``). The MFVI and NCAI_0 fits do not
depend on the term and come out the same in every store.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from ncai_independence_diagnosis import sin_tanh_data  # noqa: E402

from pyro_bnnlv.reproduce.ncai_compare import CompareConfig, run_compare  # noqa: E402
from pyro_bnnlv.sweep import load_results  # noqa: E402

COLUMNS = ("valid_ll", "test_ll", "mi_x_z")


def fits(store: Path) -> list[tuple[str, int, dict[str, float]]]:
    """``(method, restart, figures)`` of the store's BNN+LV fits, in task order."""
    table = load_results(store)
    final = [c for c in ("final_hsic_x", "final_indep_x") if c in table.columns]
    rows = []
    for _, r in table[table["method"].str.startswith("BNN+LV")].iterrows():
        figures = {k: float(r[k]) for k in (*COLUMNS, *final) if not math.isnan(r[k])}  # NaN: not this fit's
        rows.append((r["method"], int(r["restart"]), figures))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--terms", nargs="+", default=["hsic", "knn-mi-wide"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/ncai-issue-case"))
    parser.add_argument("--steps", type=int, default=CompareConfig().steps)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = sin_tanh_data()
    for term in args.terms:
        cfg = CompareConfig(independence=term, steps=args.steps)
        table, _ = run_compare(data, cfg, progress=False, return_fits=False, out_dir=args.out / term)
        print(f"== independence={term}")
        print(table.to_string())
        for method, restart, row in fits(args.out / term):
            print(f"{method:<22} restart {restart}  " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
