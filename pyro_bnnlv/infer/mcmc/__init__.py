"""NUTS as the gold-standard posterior (:func:`run_nuts`), with a flat-vector fast path.

* :mod:`.nuts`: :func:`run_nuts` (plan, sample, review) and :func:`chain_records`;
* :mod:`.kernel`: :class:`FlatNUTS`, Pyro's NUTS on one flat parameter vector, its tree in C++
  (``_flat_nuts.cpp``) or in its Python twin;
* :mod:`.init`: the flat potential of a model and the chains' starting points;
* :mod:`.chains` and :mod:`.processes`: chains in this process or in watched child processes.
"""

from ...models.potential import FlatPotential, mlp_classification_potential, mlp_regression_potential
from .init import flat_potential
from .kernel import FlatNUTS, TreeState
from .nuts import chain_records, run_nuts
from .processes import ChainProcessError, chain_start_method

__all__ = [
    "ChainProcessError",
    "FlatNUTS",
    "FlatPotential",
    "TreeState",
    "chain_records",
    "chain_start_method",
    "flat_potential",
    "mlp_classification_potential",
    "mlp_regression_potential",
    "run_nuts",
]
