"""ELBOs beyond Pyro's ``Trace_ELBO``: each a ``pyro.infer.ELBO`` subclass usable with ``SVI``.

* :class:`FusedTraceElbo`: ``Trace_ELBO`` for the library's BNN and BNN+LV with a mean-field guide,
  computed without Pyro's traces (``fit_svi``'s default for those pairs);
* :class:`PenalizedElbo`: an ELBO plus differentiable penalties, one objective for every entry
  point (the base of :class:`NCAIElbo`); :class:`CompiledTraceElbo`: ``Trace_ELBO`` compiled and
  cross-checked against its eager twin (:mod:`.jit_guard`);
* :class:`NCAIElbo`: Yacoby, Pan & Doshi-Velez (2022), arXiv:1911.00569, eq. 27;
* :class:`KNNElbo`, :class:`FunctionalKNNElbo`: Pequignot et al. (2020), eq. 8-9;
* :class:`ClosedFormKLElbo`: Pradier et al. (2018), arXiv:1811.07006, eq. 5;
* :class:`LocalReparamELBO`: Kingma, Salimans & Welling (2015), as in Foong et al. (2019), App. D.
"""

from .closed_form_kl import ClosedFormKLElbo
from .fused import FusedTraceElbo
from .knn import FunctionalKNNElbo, KNNElbo, input_box
from .local_reparam import LocalReparamELBO, local_reparam_forward
from .ncai import NCAIElbo, ncai_penalties, safe_exp
from .penalized import CompiledTraceElbo, PenalizedElbo

__all__ = [
    "ClosedFormKLElbo",
    "CompiledTraceElbo",
    "FunctionalKNNElbo",
    "FusedTraceElbo",
    "KNNElbo",
    "LocalReparamELBO",
    "NCAIElbo",
    "PenalizedElbo",
    "input_box",
    "local_reparam_forward",
    "ncai_penalties",
    "safe_exp",
]
