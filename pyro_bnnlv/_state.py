"""Ground layer: Pyro's and torch's global state, handled in one place.

* :func:`set_seed` seeds Python, NumPy and torch (through ``pyro.set_rng_seed``): same seed, same
  numbers;
* :func:`isolated_param_store` runs a block in a private scope of Pyro's global parameter store,
  so a fit or a check that builds throw-away guides leaves the user's store as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pyro
import torch
from torch import Tensor

from ._checks import check_seed

__all__ = ["isolated_param_store", "set_seed"]


def set_seed(seed: int | None, name: str = "seed") -> None:
    """Seed Python, NumPy and torch through ``pyro.set_rng_seed`` (no-op for ``None``); a seed
    that is not an integer in ``[0, 2**32)`` is a ``ValueError`` naming ``name``."""
    seed = check_seed(seed, name)
    if seed is not None:
        pyro.set_rng_seed(seed)


@contextmanager
def isolated_param_store(*modules: object) -> Iterator[None]:
    """Run a block in a fresh param-store scope when every object is a ``torch.nn.Module``.

    Parameters that do not belong to any of the modules (bare ``pyro.param`` statements) are
    merged back into the outer store at exit, so nothing a user declared is lost.
    """
    if not all(isinstance(m, torch.nn.Module) for m in modules):
        yield
        return
    store = pyro.get_param_store()
    owned: set[int] = set()
    leftovers: dict[str, tuple[Tensor, object]] = {}
    with store.scope():
        try:
            yield
        finally:
            for m in modules:
                owned.update(id(p) for p in m.parameters())  # type: ignore[union-attr]
            for name in list(store.keys()):
                unconstrained = store._params[name]
                if id(unconstrained) not in owned:
                    leftovers[name] = (unconstrained, store._constraints[name])
    for name, (unconstrained, constraint) in leftovers.items():
        store._params[name] = unconstrained
        store._param_to_name[unconstrained] = name
        store._constraints[name] = constraint
