"""The architecture figures of issues 15 and 38 for a checkout.

    python tools/architecture_report.py [REPO_DIR]

Layers, bottom to top (a module may import only from its own layer or below): the ground modules
(``_*``, ``param_names``, ``nets``, ``protocols``); ``datasets`` and ``posterior``; ``models``; ``stats``;
``infer``; ``guides``; the adapters (``diagnostics``, ``plotting``, ``serialization``, ``sweep``);
the experiments (``reproduce``); ``cli``.

Counted (lines of Python are physical lines of ``pyro_bnnlv/**/*.py``, blank and comment lines
included; ``reproduce/`` is the experiments' configurations and runners, reported apart):

* upward imports, in-function imports of the package;
* alias modules (a module whose body is only imports, ``__all__``, a docstring and
  ``globals().update``), module-level ``__getattr__``, assignments to ``__module__``;
* functions over 100 lines;
* private names (``_x``) imported from another sub-package (``infer.mcmc`` and ``infer.elbos``
  are different sub-packages; the ground modules ``pyro_bnnlv._*`` are exempt as a whole, their
  own private names are not);
* ``hasattr(model, ...)`` probes, parameters annotated ``model: Any``, formatter markers
  (``# fmt: skip`` comments, ``# fmt: off`` / ``# fmt: on`` lines: none since ``ruff format`` owns
  the layout, tests/test_lint.py).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]) / "pyro_bnnlv"
LAYERS = [  # bottom -> top, by prefix
    ["pyro_bnnlv._", "pyro_bnnlv.param_names", "pyro_bnnlv.nets", "pyro_bnnlv.protocols"],
    ["pyro_bnnlv.datasets", "pyro_bnnlv.posterior"],
    ["pyro_bnnlv.models"],
    ["pyro_bnnlv.stats"],
    ["pyro_bnnlv.infer"],
    ["pyro_bnnlv.guides"],
    ["pyro_bnnlv.diagnostics", "pyro_bnnlv.plotting", "pyro_bnnlv.serialization", "pyro_bnnlv.sweep"],
    ["pyro_bnnlv.reproduce"],
    ["pyro_bnnlv.cli"],
]


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(mod: str) -> int | None:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for pre in prefixes:
            if mod == pre or mod.startswith(pre + ".") or (pre.endswith("_") and mod.startswith(pre)):
                best = i
    return best


def subpackage(mod: str) -> str:
    """``pyro_bnnlv.infer.mcmc.nuts`` -> ``pyro_bnnlv.infer.mcmc``; ground modules -> ``pyro_bnnlv._``."""
    parts = mod.split(".")
    if len(parts) > 1 and parts[1].startswith("_"):
        return "pyro_bnnlv._"
    package_dirs = []
    for k in range(1, len(parts)):
        if (ROOT.parent / Path(*parts[: k + 1])).is_dir():
            package_dirs = parts[: k + 1]
    return ".".join(package_dirs) if package_dirs else mod


def resolve(mod: str, node: ast.ImportFrom, is_pkg: bool) -> str | None:
    if node.level == 0:
        return node.module
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def is_alias_module(tree: ast.Module) -> bool:
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if not body:
        return False

    def trivial(n: ast.stmt) -> bool:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            return True
        if isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"]:
            return True
        return isinstance(n, ast.Expr) and "globals" in ast.unparse(n)

    return all(trivial(n) for n in body) and any(isinstance(n, ast.ImportFrom) and n.level for n in body)


def main() -> None:
    up, infn, long_funcs, files, aliases, getattrs, forged, private = [], [], [], [], [], [], [], []
    lines = {"package": 0, "reproduce": 0}
    counts = {"hasattr(model": 0, "model: Any": 0, "# fmt: skip": 0, "# fmt: off/on": 0}
    for path in sorted(ROOT.rglob("*.py")):
        mod, src = module_of(path), path.read_text()
        tree, rel, is_pkg = ast.parse(src), str(path.relative_to(ROOT.parent)), path.name == "__init__.py"
        n_lines = len(src.splitlines())
        files.append((n_lines, rel))
        lines["reproduce" if mod.startswith("pyro_bnnlv.reproduce") else "package"] += n_lines
        counts["hasattr(model"] += len(re.findall(r"hasattr\((?:self\.)?_?model\b", src))
        counts["model: Any"] += len(re.findall(r"\bmodel: Any\b", src))
        counts["# fmt: skip"] += len(re.findall(r"#\s*fmt:\s*skip\b", src))
        counts["# fmt: off/on"] += len(re.findall(r"^\s*#\s*fmt:\s*(?:off|on)\b", src, re.MULTILINE))
        if is_alias_module(tree) and not is_pkg:
            aliases.append(rel)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                getattrs.append(rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == "__module__" for t in node.targets
            ):
                forged.append(f"{rel}:{node.lineno}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > 100:
                    long_funcs.append((length, f"{rel}:{node.name}"))
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        target = resolve(mod, sub, is_pkg) if isinstance(sub, ast.ImportFrom) else sub.names[0].name
                        if target and target.startswith("pyro_bnnlv"):
                            infn.append(f"{rel}:{sub.lineno} -> {target}")
            if isinstance(node, ast.ImportFrom):
                target = resolve(mod, node, is_pkg)
                if not (target and target.startswith("pyro_bnnlv")):
                    continue
                la, lb = layer(mod), layer(target)
                if mod != "pyro_bnnlv" and la is not None and lb is not None and lb > la:
                    up.append(f"{rel}:{node.lineno} {mod} -> {target}")
                if subpackage(target) != subpackage(mod):
                    for alias in node.names:
                        if alias.name.startswith("_") and not alias.name.startswith("__"):
                            private.append(f"{rel}:{node.lineno} {target}.{alias.name}")

    def show(title: str, items: list) -> None:
        print(f"{title}: {len(items)}")
        for item in items:
            print("   ", item)

    show("upward imports", up)
    show("in-function imports of the package", infn)
    show("alias modules", aliases)
    show("module-level __getattr__", getattrs)
    show("assignments to __module__", forged)
    show("functions over 100 lines", sorted(long_funcs, reverse=True))
    show("private names imported across sub-packages", private)
    for name, n in counts.items():
        print(f"{name}: {n}")
    print(
        f"lines of Python: {lines['package']} outside reproduce/, {lines['reproduce']} in reproduce/, "
        f"{sum(lines.values())} in all; {len(files)} modules"
    )
    print("largest files:", sorted(files, reverse=True)[:5])


if __name__ == "__main__":
    main()
