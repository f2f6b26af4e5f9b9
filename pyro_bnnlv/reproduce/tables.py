"""Cells and tables of ``docs/results.md`` (:mod:`.report`): the formatting every paper's table
builder shares.

Rounding follows the tables the README showed before they moved to the results page: our values
to 2 decimals, the papers' log-likelihoods and RMSEs rounded half-up to 2 decimals, their ``I``
and ``HZ`` values as printed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Decimal

import pandas as pd
from scipy import special

__all__ = [
    "as_printed",
    "auto",
    "best",
    "bold",
    "by_method",
    "listing",
    "mean_se",
    "num",
    "paired",
    "paired_cell",
    "paired_text",
    "paired_verdict",
    "paper_value",
    "share",
    "table",
    "with_paper",
]


def num(value: float, decimals: int = 2) -> str:
    """``value`` to ``decimals`` places; empty for NaN; no ``-0.00``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{float(value):.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def paper_value(value: float, decimals: int = 2) -> str:
    """A paper's printed decimal rounded half-up (-1.055 -> -1.06, as on paper, not -1.05 as
    binary floating point rounds it); empty for NaN."""
    if value is None or math.isnan(value):
        return ""
    return str(Decimal(str(value)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))


def as_printed(value: float) -> str:
    """A paper's value as printed: up to 3 decimals, at least 2 (0.036, 4.70, 0.243)."""
    text = f"{value:.3f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"


def auto(value) -> str:
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


def bold(text: str, on: bool) -> str:
    return f"**{text}**" if on and text else text


def listing(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def best(values: Sequence[float], *, largest: bool) -> int | None:
    """Index of the strictly best finite value (None on a tie or without values)."""
    finite = [(v, i) for i, v in enumerate(values) if v is not None and not math.isnan(v)]
    if not finite:
        return None
    ranked = sorted(finite, reverse=largest)
    if len(ranked) > 1 and ranked[0][0] == ranked[1][0]:
        return None
    return ranked[0][1]


def with_paper(cell: str, paper: float, printed: bool = False) -> str:
    if not cell or math.isnan(paper):
        return cell
    return f"{cell} ({as_printed(paper) if printed else paper_value(paper)})"


def mean_se(mean: float, se: float) -> str:
    if abs(mean) >= 100:
        return f"{mean:.0f}±{se:.0f}"
    return f"{num(mean)}±{num(se)}"


def share(value: float) -> str:
    """A share as ``0``, ``1`` or ``.37``."""
    text = num(value)
    return text if not text else ("0" if float(text) == 0 else "1" if float(text) == 1 else text.lstrip("0"))


def paired(a: pd.Series, b: pd.Series) -> tuple[float, float, int]:
    """``(mean, SE, n)`` of the differences ``a - b`` paired by index (split or seed), over the
    indices where both have a value: ``SE = sd / sqrt(n)`` (``ddof = 1``), NaN for ``n < 2``."""
    d = (a - b).dropna()
    n = len(d)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return (float(d.mean()) if n else math.nan), se, n


def paired_verdict(
    mean: float, se: float, n: int, above: str = "higher", below: str = "lower", within: float | None = None
) -> str:
    """The verdict of a paired t-test at the 5% level on ``n`` differences with mean ``mean`` and
    standard error ``se``: "tie" where it does not reject equality (``|mean| < t_{0.975, n-1}
    SE``), else ``above`` (the difference is positive) or ``below``; "n/a" without two
    differences or with ``SE = 0``. An ordering of two means over a few splits is a claim only
    with this (Student 1908; paired form: e.g. Wasserman (2004), *All of Statistics*, sec. 10.5).
    ``within``: the rule of the classification tables instead, "tie" for ``|mean| <= within SE``
    ("n/a" only for a mean or SE that is not finite)."""
    if within is not None:
        if not (math.isfinite(mean) and math.isfinite(se)):
            return "n/a"
        return "tie" if abs(mean) <= within * se else above if mean > 0 else below
    if n < 2 or not se > 0 or not math.isfinite(mean):
        return "n/a"
    if abs(mean) < special.stdtrit(n - 1, 0.975) * se:  # Student t quantile
        return "tie"
    return above if mean > 0 else below


def paired_text(
    mean: float,
    se: float,
    n: int,
    above: str = "higher",
    below: str = "lower",
    decimals: int = 2,
    *,
    style: str = "({se})",
    within: float | None = None,
) -> str:
    """The cell of a paired difference already summarised: ``"mean (SE), verdict"``
    (:func:`paired_verdict` with ``above``, ``below`` and ``within``); ``style="± {se}"`` writes
    ``"mean ± SE, verdict"``, ``style="+"`` ``"+mean (SE), verdict"`` (signed, NaN as ``nan``)."""
    if style == "+":
        spread = f"{mean:+.{decimals}f} ({se:.{decimals}f})"
    else:
        spread = f"{num(mean, decimals)} {style.format(se=num(se, decimals))}"
    return f"{spread}, {paired_verdict(mean, se, n, above, below, within)}"


def paired_cell(
    a: pd.Series, b: pd.Series, above: str = "higher", below: str = "lower", decimals: int = 2, **style
) -> str:
    """:func:`paired_text` of ``a - b`` paired by index (:func:`paired`); empty without a common
    index. ``style``: :func:`paired_text`'s ``style`` and ``within``."""
    mean, se, n = paired(a, b)
    return paired_text(mean, se, n, above, below, decimals, **style) if n else ""


def by_method(block: pd.DataFrame, index: str, columns: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Per column of the long table ``block``, a frame of ``index`` (split or seed) x method, so
    that two of its columns are paired by ``index`` (:func:`paired_cell`)."""
    return {col: block.pivot_table(index=index, columns="method", values=col) for col in columns}
