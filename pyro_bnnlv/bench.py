"""Deprecated location of the benchmarks, beside the papers' experiments: :mod:`pyro_bnnlv.reproduce.bench` (renamed so that module
names say their concept and do not clash). Every name of it stays importable from here."""

from __future__ import annotations

from .reproduce.bench import *  # noqa: F401,F403
from .reproduce.bench import __all__  # noqa: F401
from .reproduce import bench as _new

globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__") and k not in globals()})
