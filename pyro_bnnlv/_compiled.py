"""Ground layer: building the package's C++ kernels on first use, once, safely.

Two kernels are compiled with :func:`torch.utils.cpp_extension.load` the first time they are
needed: the NUTS core (``infer/mcmc/_flat_nuts.cpp``) and the NCAI pairwise statistics
(``stats/_pairwise.cpp``). ``pyro-bnnlv build`` builds both ahead of time. :func:`build_extension`
does it for both:

* **one build per source and toolchain.** The build directory,
  ``$TORCH_EXTENSIONS_DIR`` (else torch's default root) ``/pyro_bnnlv/<name>-<key>``, is keyed by
  a hash of the source, the torch and Python versions, the compiler (``$CXX``, else ``c++``, its
  real path and ``--version`` line) and the flags. A finished build holds a ``BUILT`` marker and
  is loaded directly from its ``.so``, with no ninja that could decide it is stale;
* **never replaced under a running process.** A build runs in a child process, in a temporary
  directory beside the final one, with this environment's ``ninja``, and is renamed into place in
  one step; a directory with its marker is never written again;
* builds of one extension are serialised by an operating-system file lock
  (:class:`filelock.FileLock`), which the kernel releases when its holder dies; a process that
  finds the lock taken says that it waits for another process's build. A temporary directory
  left by a killed build is removed by the next build;
* before a build, one line on standard error says what is built, why and about how long it takes;
* a build that fails (no compiler, no Python headers) warns once per process with the
  compiler's first error line, and the caller falls back to its pure-Python twin.

``PYRO_BNNLV_COMPILED=0`` (or ``false``/``no``/``off``) disables every build.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType

import filelock
import torch

__all__ = [
    "ENV",
    "build_directory",
    "build_extension",
    "compiled_enabled",
    "nuts_extension",
    "resolve_nuts_extension",
    "toolchain",
]

ENV = "PYRO_BNNLV_COMPILED"
_MARKER = "BUILT"
_log = logging.getLogger("pyro_bnnlv")
_built: dict[str, ModuleType | None] = {}


def compiled_enabled() -> bool:
    """False when ``PYRO_BNNLV_COMPILED`` is set to ``0``/``false``/``no``/``off``."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _versioned(prefix: str) -> str:
    tag = f"{torch.__version__}_py{sys.version_info.major}{sys.version_info.minor}"
    return prefix + "_" + re.sub(r"\W", "_", tag)


@functools.cache
def toolchain() -> str:
    """The C++ compiler torch's builder runs (``$CXX``, else ``c++``), as its real path and the
    first line of its ``--version`` output (``"?"`` where it cannot be run)."""
    name = os.environ.get("CXX", "c++")
    found = shutil.which(name)
    path = os.path.realpath(found) if found else name
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        version = (out.stdout.strip().splitlines() or ["?"])[0]
    except (OSError, subprocess.SubprocessError):
        version = "?"
    return f"{path} ({version})"


def flags() -> tuple[str, ...]:
    """The compiler flags of both builds. With GCC, ``-fopenmp``: the kernels' ``at::parallel_for``
    then runs on torch's intra-op pool (its GNU OpenMP runtime, which the kernels' symbols resolve
    to through libtorch: no second runtime is linked); with another compiler, ``-fopenmp-simd``,
    and ``at::parallel_for`` runs its chunks one after another on the caller's thread (the same
    numbers: each chunk's computation is the same)."""
    name = toolchain().lower()
    gcc = "clang" not in name and ("g++" in name or "gcc" in name)
    return ("-O3", "-fopenmp" if gcc else "-fopenmp-simd", "-fno-trapping-math")


def build_directory(prefix: str, source: Path) -> Path:
    """Where ``source`` is built as the extension ``prefix`` for this torch, Python and
    compiler (see the module docstring)."""
    from torch.utils.cpp_extension import get_default_build_root

    key = hashlib.sha256(
        b"\0".join(
            [Path(source).read_bytes(), _versioned(prefix).encode(), toolchain().encode(), " ".join(flags()).encode()]
        )
    ).hexdigest()[:12]
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / "pyro_bnnlv" / f"{_versioned(prefix)}-{key}"


def _compile(name: str, source: Path, directory: Path) -> None:
    """Build ``source`` into ``directory`` in a child process (so this process imports the
    module only once, from its final place), with the ``ninja`` of this environment first on
    the child's ``PATH``; ``RuntimeError`` with the compiler's output when it fails."""
    env = dict(os.environ)
    try:
        import ninja

        env["PATH"] = ninja.BIN_DIR + os.pathsep + env.get("PATH", "")
    except ImportError:  # pragma: no cover - ninja is a dependency
        pass
    code = (
        "import sys; from torch.utils.cpp_extension import load; "
        "load(name=sys.argv[1], sources=[sys.argv[2]], build_directory=sys.argv[3], "
        f"extra_cflags={list(flags())!r}, verbose=False)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, name, str(source), str(directory)], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip() or out.stdout.strip() or f"the build exited with {out.returncode}")


def _load(name: str, directory: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, directory / f"{name}.so")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {directory / (name + '.so')}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _last_build_seconds(root: Path) -> float | None:
    """How long the most recent finished build under ``root`` took (the ``seconds`` line of its
    marker; ``None`` if no build there recorded one): the notice's estimate for the next build on
    this machine, as the time a build takes varies severalfold between machines."""
    found = []
    for marker in root.glob(f"*/{_MARKER}"):
        try:
            lines = marker.read_text().splitlines()
            seconds = next(float(line.split()[1]) for line in lines if line.startswith("seconds "))
            found.append((marker.stat().st_mtime, seconds))
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return max(found)[1] if found else None


def _duration_note(root: Path) -> str:
    """The build notice's "how long": the last build on this machine, or a typical time."""
    last = _last_build_seconds(root)
    if last is None:
        return "about a minute on an idle machine, a few on a slow or busy one"
    return f"the last build on this machine took {last:.0f} s"


def _build_once(name: str, source: Path, directory: Path, what: str) -> None:
    """Build into ``directory`` unless a finished build is there; one builder at a time."""
    lock = filelock.FileLock(str(directory) + ".build.lock")
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        print(f"pyro_bnnlv: waiting for another process that is building the {what} ...", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        if (directory / _MARKER).exists():
            return
        print(
            f"pyro_bnnlv: building the {what} from {source.name} with {toolchain()} (once per "
            f"machine, source and compiler; {_duration_note(directory.parent)}; `pyro-bnnlv build` "
            "does it ahead of time)",
            file=sys.stderr,
            flush=True,
        )
        t0 = time.perf_counter()
        scratch = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(scratch, ignore_errors=True)  # left by a build that was killed
        shutil.rmtree(directory, ignore_errors=True)  # no marker: nobody loaded it
        scratch.mkdir(parents=True)
        _compile(name, source, scratch)
        seconds = time.perf_counter() - t0
        (scratch / _MARKER).write_text(f"{source.name} {toolchain()} {' '.join(flags())}\nseconds {seconds:.1f}\n")
        os.rename(scratch, directory)
        print(f"pyro_bnnlv: {what} built in {seconds:.0f} s ({directory})", file=sys.stderr, flush=True)
    finally:
        lock.release()


def build_extension(prefix: str, source: Path, what: str, fallback: str) -> ModuleType | None:
    """The compiled module of ``source`` (built on the first call on this machine, see the
    module docstring); ``None`` when disabled or unbuildable.

    ``what`` names the kernel in the notice and the warning ("compiled NUTS core"); ``fallback``
    says what is used instead. The result is remembered per process: a failed build is not
    retried.
    """
    if not compiled_enabled():
        return None
    if prefix in _built:
        return _built[prefix]
    module: ModuleType | None
    try:
        directory = build_directory(prefix, source)
        if not (directory / _MARKER).exists():
            directory.parent.mkdir(parents=True, exist_ok=True)
            _build_once(_versioned(prefix), Path(source), directory, what)
        module = _load(_versioned(prefix), directory)
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
    return build_extension(
        "pyro_bnnlv_flat_nuts",
        _NUTS_SOURCE,
        "compiled NUTS core",
        "NUTS uses the pure-Python fast path (several times slower per leapfrog step: pyro-bnnlv bench nuts)",
    )


def resolve_nuts_extension(compiled: bool | None) -> ModuleType | None:
    """The NUTS core for a ``compiled=`` option: ``False`` -> ``None``; ``None`` ->
    :func:`nuts_extension` (``None`` if it cannot be built); ``True`` -> the core or a
    ``RuntimeError``."""
    module = None if compiled is False else nuts_extension()
    if compiled and module is None:
        raise RuntimeError(
            f"compiled=True but the compiled NUTS core is unavailable (see the warning above, or {ENV}=0 is set)"
        )
    return module
