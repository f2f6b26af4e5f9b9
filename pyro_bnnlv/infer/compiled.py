"""The compiled core of the NUTS fast path, built on first use (``_flat_nuts.cpp``); the builder
lives in the ground layer (:func:`pyro_bnnlv._compiled.nuts_extension`), these names stay.

:func:`extension` compiles ``_flat_nuts.cpp`` with ``torch.utils.cpp_extension.load`` the first
time it is needed (once per machine and source version, its duration logged at INFO level on the
``pyro_bnnlv`` logger; torch caches the build under ``$TORCH_EXTENSIONS_DIR``, by default
``~/.cache/torch_extensions``) and returns the module, or
``None`` when it cannot be built (no C++ compiler, no Python headers, ...). Every caller then
falls back to the pure-Python implementation in :mod:`pyro_bnnlv.infer.nuts`, which computes the
same quantities (the tests compare the two draw for draw), several times slower per leapfrog
step (``pyro-bnnlv bench nuts``).

Set the environment variable ``PYRO_BNNLV_COMPILED=0`` to never build or use it.

The module provides

* ``MLPPotential``: the potential of MLP regression (BNN, BNN+LV) with its hand-written gradient,
  the C++ twin of :func:`pyro_bnnlv.models.potential.mlp_regression_potential`;
* ``build_tree``: one NUTS (sub)tree, the C++ twin of ``FlatNUTS._build_tree_flat``, calling
  either an ``MLPPotential`` or any Python ``value_and_grad``.
"""

from __future__ import annotations

from .._compiled import compiled_enabled
from .._compiled import nuts_extension as extension
from .._compiled import resolve_nuts_extension as resolve_extension

__all__ = ["extension", "compiled_enabled", "resolve_extension"]
