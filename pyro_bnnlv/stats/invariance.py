"""Deprecated location of the invariance gap of mean-field VI: :mod:`pyro_bnnlv.stats.invariance_gap` (renamed so that module
names say their concept and do not clash). Every name of it stays importable from here."""

from __future__ import annotations

from .invariance_gap import *  # noqa: F401,F403
from .invariance_gap import __all__  # noqa: F401
from . import invariance_gap as _new

globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__") and k not in globals()})
