"""Issue 15's figures for a checkout: imports that run up the layers, in-function imports of the
package, the largest functions and files.

    python tools/architecture_report.py [REPO_DIR]

Layers, bottom to top (a module may import only from its own layer or below): the ground modules
(``_*``, ``param_names``, ``nets``); ``datasets`` and ``posterior``; ``models``; ``stats``; ``infer``;
``guides``; the adapters (``diagnostics``, ``plotting``, ``serialization``,
``sweep``); the experiments (``compare``, ``invariance``, ``bench``, ``reproduce``: the first three
are aliases of modules in ``reproduce``); ``cli``.
"""
import ast, sys
from pathlib import Path
root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]) / "pyro_bnnlv"
def module_of(p):
    rel = p.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__": parts = parts[:-1]
    return ".".join(parts)
LAYERS = [  # bottom -> top, by prefix
    ["pyro_bnnlv._", "pyro_bnnlv.param_names", "pyro_bnnlv.nets"],
    ["pyro_bnnlv.datasets", "pyro_bnnlv.posterior"], ["pyro_bnnlv.models"], ["pyro_bnnlv.stats"], ["pyro_bnnlv.infer"],
    ["pyro_bnnlv.guides"],
    ["pyro_bnnlv.diagnostics", "pyro_bnnlv.plotting", "pyro_bnnlv.serialization", "pyro_bnnlv.sweep"],
    ["pyro_bnnlv.compare", "pyro_bnnlv.invariance", "pyro_bnnlv.bench", "pyro_bnnlv.reproduce"],
    ["pyro_bnnlv.cli"],
]
def layer(mod):
    best = None
    for i, prefixes in enumerate(LAYERS):
        for pre in prefixes:
            if mod == pre or mod.startswith(pre + ".") or (pre.endswith("_") and mod.startswith(pre)):
                best = i
    return best
def resolve(mod, node, is_pkg):
    if node.level == 0: return node.module
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))
up, infn, funcs, files = [], [], [], []
for p in sorted(root.rglob("*.py")):
    mod = module_of(p); src = p.read_text(); tree = ast.parse(src)
    files.append((len(src.splitlines()), str(p.relative_to(root.parent))))
    is_pkg = p.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            funcs.append((node.end_lineno - node.lineno + 1, f"{p.relative_to(root.parent)}:{node.name}"))
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    target = resolve(mod, sub, is_pkg) if isinstance(sub, ast.ImportFrom) else sub.names[0].name
                    if target and target.startswith("pyro_bnnlv"):
                        infn.append(f"{p.relative_to(root.parent)}:{sub.lineno} -> {target}")
        if isinstance(node, ast.ImportFrom):
            target = resolve(mod, node, is_pkg)
            if target and target.startswith("pyro_bnnlv") and mod != "pyro_bnnlv":
                la, lb = layer(mod), layer(target)
                if la is not None and lb is not None and lb > la:
                    up.append(f"{p.relative_to(root.parent)}:{node.lineno} {mod} -> {target}")
print("upward imports:", len(up)); [print("  ", u) for u in up]
print("in-function imports of the package:", len(infn)); [print("  ", u) for u in infn]
funcs.sort(reverse=True); files.sort(reverse=True)
print("largest functions:", funcs[:5]); print("largest files:", files[:5])
