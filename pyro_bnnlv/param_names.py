"""Guides that own their parameters in Pyro's global param store.

Pyro keeps every ``pyro.param`` in one global store, keyed by name, and a
:class:`~pyro.nn.PyroModule` (every autoguide) names its parameters after its class:
``"AutoNormal.locs.w"``. Two guides of one class therefore share names, and when a guide runs
and finds *another* tensor under its name it adopts that tensor (``PyroModule.__getattr__``,
"Update PyroModule <--- ParamStore"): ``Predictive(model_b, guide=guide_b)`` after
``Predictive(model_a, guide=guide_a)`` silently predicts with A's posterior.

Pyro's own remedy, ``pyro.settings.set(module_local_params=True)``, breaks every compiled loss
(``JitTrace_ELBO`` and this library's ``CompiledTraceElbo`` look parameters up by name in the
global store; Pyro 1.9.2) and must be set before any guide is built. So each of the library's
guides gets its own name prefix (``"MeanField_3.locs.w"``), and :func:`own_param_names` does the
same for any user guide.
"""

from __future__ import annotations

import itertools

from pyro.nn import PyroModule

__all__ = ["own_param_names", "param_fullnames"]

_instance_numbers = itertools.count(1)


def own_param_names(guide: PyroModule) -> PyroModule:
    """Give ``guide`` (any ``PyroModule``, e.g. an autoguide) parameter names no other instance has.

    Renames the guide's prefix from its class name (``"AutoNormal"``) to
    ``"<class>_<n>"`` with a process-wide counter ``n``, for the guide and all its
    ``PyroModule`` parts, so Pyro's global param store cannot hand it another guide's values.
    Call it right after building the guide, before its first use. Returns the guide.

    Raises:
        TypeError: ``guide`` is not a ``PyroModule``.
        RuntimeError: the guide has already run (its parameters exist under the old names).
    """
    if not isinstance(guide, PyroModule):
        raise TypeError(f"guide must be a pyro.nn.PyroModule (e.g. an autoguide), got {type(guide).__name__}")
    if guide._pyro_context.used or any(True for _ in guide.parameters()):
        raise RuntimeError(
            "own_param_names(guide) must be called before the guide first runs: its "
            "parameters already exist under their old names; build a new guide and rename it first"
        )
    guide._pyro_set_supermodule(f"{type(guide).__name__}_{next(_instance_numbers)}", guide._pyro_context)
    return guide


def param_fullnames(guide: PyroModule) -> dict[str, object]:
    """``{name in Pyro's param store: the guide's own unconstrained tensor}`` for a ``PyroModule``."""
    prefix = guide._pyro_name
    names = {}
    for path, p in guide.named_parameters():
        path = path.removesuffix("_unconstrained")
        names[f"{prefix}.{path}" if prefix else path] = p
    return names
