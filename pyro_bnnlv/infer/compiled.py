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

from pathlib import Path
from types import ModuleType

from .._compiled import ENV, build_extension, compiled_enabled

__all__ = ["extension", "compiled_enabled", "resolve_extension"]

_SOURCE = Path(__file__).with_name("_flat_nuts.cpp")


def extension() -> ModuleType | None:
    """The compiled module (built on the first call), or ``None`` if disabled or unbuildable.

    A failed build warns once (with the compiler's first error line) and is not retried in this
    process; see :func:`pyro_bnnlv._compiled.build_extension` (interrupted builds never hang a
    later one).
    """
    return build_extension("pyro_bnnlv_flat_nuts", _SOURCE, "compiled NUTS core",
                           "NUTS uses the pure-Python fast path (about 2.7x slower)")  # fmt: skip


def resolve_extension(compiled: bool | None) -> ModuleType | None:
    """The module for a ``compiled=`` option: ``False`` -> ``None``; ``None`` -> :func:`extension`
    (``None`` if it cannot be built); ``True`` -> :func:`extension` or a ``RuntimeError``."""
    module = None if compiled is False else extension()
    if compiled and module is None:
        raise RuntimeError(
            "compiled=True but the compiled NUTS core is unavailable (see the warning above, or "
            f"{ENV}=0 is set)"
        )
    return module
