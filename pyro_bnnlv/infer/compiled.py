"""The compiled core of the NUTS fast path, built on first use (``_flat_nuts.cpp``).

:func:`extension` compiles ``_flat_nuts.cpp`` with ``torch.utils.cpp_extension.load`` the first
time it is needed (about 20 s, once per machine and source version; torch caches the build under
``$TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``) and returns the module, or
``None`` when it cannot be built (no C++ compiler, no Python headers, ...). Every caller then
falls back to the pure-Python implementation in :mod:`pyro_bnnlv.infer.nuts`, which computes the
same quantities (the tests compare the two draw for draw), about 2.7x slower per leapfrog step.

Set the environment variable ``PYRO_BNNLV_COMPILED=0`` to never build or use it.

The module provides

* ``MLPPotential``: the potential of MLP regression (BNN, BNN+LV) with its hand-written gradient,
  the C++ twin of :func:`pyro_bnnlv.infer.nuts.mlp_regression_potential`;
* ``build_tree``: one NUTS (sub)tree, the C++ twin of ``FlatNUTS._build_tree_flat``, calling
  either an ``MLPPotential`` or any Python ``value_and_grad``.
"""

from __future__ import annotations

import logging
import os
import re
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

__all__ = ["extension", "compiled_enabled", "resolve_extension"]

_SOURCE = Path(__file__).with_name("_flat_nuts.cpp")
_ENV = "PYRO_BNNLV_COMPILED"
_state: dict[str, ModuleType | None | bool] = {"tried": False, "module": None}
_log = logging.getLogger("pyro_bnnlv")


def compiled_enabled() -> bool:
    """False when ``PYRO_BNNLV_COMPILED`` is set to ``0``/``false``/``no``/``off``."""
    return os.environ.get(_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def extension() -> ModuleType | None:
    """The compiled module (built on the first call), or ``None`` if disabled or unbuildable.

    A failed build warns once (with the compiler's first error line) and is not retried in this
    process.
    """
    if not compiled_enabled():
        return None
    if _state["tried"]:
        return _state["module"]  # type: ignore[return-value]
    _state["tried"] = True
    try:
        from torch.utils.cpp_extension import load

        t0 = time.perf_counter()
        _log.info("pyro_bnnlv: building the compiled NUTS core (once per machine, ~20 s)")
        # the torch version in the name: a build against another torch is never picked up
        name = "pyro_bnnlv_flat_nuts_" + re.sub(r"\W", "_", torch.__version__)
        module = load(name=name, sources=[str(_SOURCE)],
                      extra_cflags=["-O3", "-fopenmp-simd"], verbose=False)  # fmt: skip
        _log.info("pyro_bnnlv: compiled NUTS core ready after %.1f s", time.perf_counter() - t0)
    except Exception as err:  # any build failure: fall back to Python
        lines = str(err).strip().splitlines()
        first = [ln for ln in lines if "error" in ln.lower() and "Error building" not in ln][:1] or lines[:1]
        warnings.warn(
            "pyro_bnnlv could not build its compiled NUTS core, so NUTS uses the pure-Python fast "
            f"path (about 2.7x slower): {first[0] if first else type(err).__name__}. "
            f"Set {_ENV}=0 to silence this.",
            RuntimeWarning,
            stacklevel=2,
        )
        module = None
    _state["module"] = module
    return module


def resolve_extension(compiled: bool | None) -> ModuleType | None:
    """The module for a ``compiled=`` option: ``False`` -> ``None``; ``None`` -> :func:`extension`
    (``None`` if it cannot be built); ``True`` -> :func:`extension` or a ``RuntimeError``."""
    module = None if compiled is False else extension()
    if compiled and module is None:
        raise RuntimeError(
            "compiled=True but the compiled NUTS core is unavailable (see the warning above, or "
            f"{_ENV}=0 is set)"
        )
    return module
