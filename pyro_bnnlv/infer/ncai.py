"""Deprecated location of NCAI's constrained objective (``NCAIElbo``): :mod:`pyro_bnnlv.infer.ncai_elbo` (renamed so that module
names say their concept and do not clash). Every name of it stays importable from here."""

from __future__ import annotations

from .ncai_elbo import *  # noqa: F401,F403
from .ncai_elbo import __all__  # noqa: F401
from . import ncai_elbo as _new

globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__") and k not in globals()})
