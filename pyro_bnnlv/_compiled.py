"""Ground layer: building the package's C++ kernels on first use, safely.

Two kernels are compiled with :func:`torch.utils.cpp_extension.load` the first time they are
needed: the NUTS core (``infer/mcmc/_flat_nuts.cpp``) and the NCAI pairwise statistics
(``stats/_pairwise.cpp``). :func:`build_extension` does it for both:

* the build goes to ``$TORCH_EXTENSIONS_DIR`` (else torch's default root) ``/pyro_bnnlv/<name>``,
  where ``<name>`` carries the torch and Python versions, so a build for another torch or Python
  is never loaded;
* builds of one extension are serialised by an operating-system file lock
  (:class:`filelock.FileLock`), which the kernel releases when its holder dies. Torch's own lock
  (a ``lock`` file created with ``O_EXCL`` in the build directory) is *not* released when a build
  is killed (Ctrl-C, ``kill -9``, a CI time-out), and every later ``load`` would then wait on it
  forever. Holding our lock, no other process of ours is building, so a torch ``lock`` file
  found there is stale and is removed (with a log line);
* a build that fails (no compiler, no Python headers) warns once per process with the
  compiler's first error line, and the caller falls back to its pure-Python twin.

``PYRO_BNNLV_COMPILED=0`` (or ``false``/``no``/``off``) disables every build.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType

import filelock
import torch

__all__ = ["ENV", "compiled_enabled", "build_directory", "build_extension", "nuts_extension",
           "resolve_nuts_extension"]

ENV = "PYRO_BNNLV_COMPILED"
_log = logging.getLogger("pyro_bnnlv")
_built: dict[str, ModuleType | None] = {}


def compiled_enabled() -> bool:
    """False when ``PYRO_BNNLV_COMPILED`` is set to ``0``/``false``/``no``/``off``."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _versioned(prefix: str) -> str:
    tag = f"{torch.__version__}_py{sys.version_info.major}{sys.version_info.minor}"
    return prefix + "_" + re.sub(r"\W", "_", tag)


def build_directory(prefix: str) -> Path:
    """Where the extension ``prefix`` is built for this torch and Python."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / "pyro_bnnlv" / _versioned(prefix)


def build_extension(prefix: str, source: Path, what: str, fallback: str) -> ModuleType | None:
    """Compile (or load the cached build of) ``source`` as the module ``prefix``; ``None`` when
    disabled or unbuildable.

    ``what`` names the kernel in log lines and the warning ("compiled NUTS core"); ``fallback``
    says what is used instead (for NUTS, the pure-Python fast path; ``pyro-bnnlv bench nuts``
    measures how much slower it is). The result is remembered per process: a failed build is not
    retried.
    """
    if not compiled_enabled():
        return None
    if prefix in _built:
        return _built[prefix]
    module: ModuleType | None
    try:
        from torch.utils.cpp_extension import load

        directory = build_directory(prefix)
        directory.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with filelock.FileLock(str(directory) + ".build.lock"):
            stale = directory / "lock"
            if stale.exists():  # torch's baton, left by a build that was killed
                _log.warning("pyro_bnnlv: removing the stale build lock %s (a build was interrupted)", stale)
                stale.unlink(missing_ok=True)
            _log.info("pyro_bnnlv: loading or building the %s (a build runs once per machine and source version)", what)
            module = load(name=_versioned(prefix), sources=[str(source)], build_directory=str(directory),
                          extra_cflags=["-O3", "-fopenmp-simd"], verbose=False)  # fmt: skip
        _log.info("pyro_bnnlv: %s ready after %.1f s", what, time.perf_counter() - t0)
    except Exception as err:  # any build failure: the caller falls back to Python
        lines = str(err).strip().splitlines()
        first = [ln for ln in lines if "error" in ln.lower() and "Error building" not in ln][:1] or lines[:1]
        warnings.warn(
            f"pyro_bnnlv could not build its {what}, so {fallback}: "
            f"{first[0] if first else type(err).__name__}. Set {ENV}=0 to silence this.",
            RuntimeWarning,
            stacklevel=3,
        )
        module = None
    _built[prefix] = module
    return module


_NUTS_SOURCE = Path(__file__).parent / "infer" / "mcmc" / "_flat_nuts.cpp"


def nuts_extension() -> ModuleType | None:
    """The compiled NUTS core (``infer/mcmc/_flat_nuts.cpp``: ``MLPPotential`` and ``build_tree``),
    built on the first call, or ``None`` if disabled or unbuildable (warns once, not retried)."""
    return build_extension("pyro_bnnlv_flat_nuts", _NUTS_SOURCE, "compiled NUTS core",
                           "NUTS uses the pure-Python fast path (several times slower per leapfrog step: pyro-bnnlv bench nuts)")  # fmt: skip


def resolve_nuts_extension(compiled: bool | None) -> ModuleType | None:
    """The NUTS core for a ``compiled=`` option: ``False`` -> ``None``; ``None`` ->
    :func:`nuts_extension` (``None`` if it cannot be built); ``True`` -> the core or a
    ``RuntimeError``."""
    module = None if compiled is False else nuts_extension()
    if compiled and module is None:
        raise RuntimeError(
            "compiled=True but the compiled NUTS core is unavailable (see the warning above, or "
            f"{ENV}=0 is set)"
        )
    return module
