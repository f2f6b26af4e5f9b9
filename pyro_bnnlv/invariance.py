"""Deprecated location of the invariance paper's experiments: use :mod:`pyro_bnnlv.reproduce.invariance`.

``from pyro_bnnlv.invariance import svi_invariance_experiment`` (and the other names below) keeps
working: they are the same objects, re-exported, and so is every other public name the old
module had (including what it imported, e.g. ``Gaussian``).
"""

from __future__ import annotations

from .reproduce.invariance import (
    DEFAULT_STAGES,
    FIGURE_NOISE_SCALE,
    fit_mean_field_linear,
    nuts_invariance_check,
    svi_invariance_experiment,
    write_invariance_gap_figure,
)

from .reproduce import invariance as _new

globals().update({k: v for k, v in vars(_new).items() if not k.startswith("_") and k not in globals()})

__all__ = [
    "FIGURE_NOISE_SCALE",
    "DEFAULT_STAGES",
    "svi_invariance_experiment",
    "fit_mean_field_linear",
    "nuts_invariance_check",
    "write_invariance_gap_figure",
]
