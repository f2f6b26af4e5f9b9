"""Deprecated location of the invariance paper's experiments: :mod:`pyro_bnnlv.reproduce.invariance`.
Every name of it stays importable from here, including what the old module had imported (e.g.
``Gaussian``): the same objects, re-exported."""

from __future__ import annotations

from .reproduce.invariance import *  # noqa: F401,F403
from .reproduce.invariance import __all__  # noqa: F401
from .reproduce import invariance as _new

globals().update({k: v for k, v in vars(_new).items() if not k.startswith("_") and k not in globals()})
