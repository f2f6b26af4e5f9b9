"""Deprecated location of NCAI's first step, the model-satisfying initialisation: :mod:`pyro_bnnlv.guides.ncai_init` (renamed so that module
names say their concept and do not clash). Every name of it stays importable from here."""

from __future__ import annotations

from .ncai_init import *  # noqa: F401,F403
from .ncai_init import __all__  # noqa: F401
from . import ncai_init as _new

globals().update({k: v for k, v in vars(_new).items() if not k.startswith("__") and k not in globals()})
