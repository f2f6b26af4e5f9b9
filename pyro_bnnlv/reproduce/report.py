"""``docs/results.md``, generated from the committed CSVs (``pyro-bnnlv results``).

The template ``docs/results.in.md`` holds the prose: what each experiment ran, the command that
reproduces it and what its numbers mean. Each table in it is a marker, one line::

    <!-- table: NAME PATH [PATH ...] [KEY=VALUE ...] -->

which :func:`render` replaces by the markdown table that the builder ``NAME`` (see
:data:`TABLES`) makes from the CSVs ``PATH`` (relative to the repository root). So the tables
say what the CSVs say, and ``pyro-bnnlv results --check`` (a test runs it) fails when someone
reruns an experiment and commits its CSV without regenerating the page.

``README.md`` quotes a few of those figures in sentences. Each such sentence is a generated
block, its body between two marker lines::

    <!-- generated: NAME PATH [PATH ...] [KEY=VALUE ...] -->
    (the builder's text, rewritten by ``pyro-bnnlv results``)
    <!-- end generated -->

indented like the opening marker and wrapped at 100 columns; ``--check`` fails, naming
``README.md`` and the block's line, when a body is not what its builder gives.

Usage::

    pyro-bnnlv results            # rewrite docs/results.md and README.md's generated blocks
    pyro-bnnlv results --check    # exit 1, naming the stale file and table, if either is out of date

Each paper's module builds its own tables (``ncai.compare_table``, ``hyvi.uci_table``, ...,
registered in :data:`TABLES`) with the cells of :mod:`.tables`.
"""

from __future__ import annotations

import difflib
import re
import shlex
import textwrap
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from . import classification, hyvi, in_between, ncai, ncai_family, projected, projected_toy
from . import tables

__all__ = [
    "OUTPUT",
    "README",
    "TABLES",
    "TEMPLATE",
    "build",
    "check",
    "default_root",
    "main",
    "render",
    "render_blocks",
]

TEMPLATE = "docs/results.in.md"
OUTPUT = "docs/results.md"
README = "README.md"

_MARKER = re.compile(r"^<!--\s*table:(?P<body>.*?)-->\s*$")
_BLOCK_OPEN = re.compile(r"^(?P<indent>[ \t]*)<!--\s*generated:(?P<body>.*?)-->\s*$")
_BLOCK_END = re.compile(r"^[ \t]*<!--\s*end generated\s*-->\s*$")


# --------------------------------------------------------------------------- benchmarks


def _bench(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """Any ``pyro-bnnlv bench NAME --output CSV``: every column that has a value, about three
    significant digits. ``columns=a,b`` keeps those columns (after the first)."""
    (t,) = frames
    t = t.dropna(axis=1, how="all")
    if "columns" in options:
        keep = options["columns"].split(",")
        missing = [c for c in keep if c not in t.columns]
        if missing:
            raise ValueError(f"{paths[0]} has no column(s) {missing}; it has {list(t.columns)}")
        t = t[[t.columns[0]] + keep]
    rows = [[tables.auto(v) for v in row] for row in t.itertuples(index=False)]
    return tables.table([str(c) for c in t.columns], rows)


def _bench_runs(frames: list[pd.DataFrame], paths: list[str], options: dict[str, str]) -> str:
    """Several runs of one benchmark side by side: ``column=NAME`` from each CSV, one column per
    run (named by the file), rows (the first column) where the first run has a value."""
    col = options.get("column")
    if not col:
        raise ValueError("the bench-runs table needs column=NAME")
    key = frames[0].columns[0]
    series = []
    for frame, path in zip(frames, paths):
        if col not in frame.columns:
            raise ValueError(f"{path} has no column {col!r}; it has {list(frame.columns)}")
        series.append(frame.set_index(key)[col])
    rows_index = [k for k in series[0].index if not pd.isna(series[0][k])]
    rows = [[str(k)] + [tables.auto(s.get(k, float("nan"))) for s in series] for k in rows_index]
    return tables.table([key] + [Path(p).stem for p in paths], rows)


Builder = Callable[[list[pd.DataFrame], list[str], dict[str, str]], str]

#: marker name -> builder(frames, paths, options) returning the markdown table
TABLES: dict[str, Builder] = {
    "ncai-compare": ncai.compare_table,
    "ncai-protocol": ncai.protocol_table,
    "ncai-paired": ncai.paired_table,
    "ncai-paired-summary": ncai.paired_summary,
    "ncai-family": ncai_family.family_table,
    "ncai-family-wins": ncai_family.family_wins_table,
    "ncai-family-lambda": ncai_family.family_lambda_table,
    "hyvi-cosine": hyvi.cosine_table,
    "hyvi-uci": hyvi.uci_table,
    "hyvi-uci-paired": hyvi.uci_paired_table,
    "hyvi-uci-summary": hyvi.uci_paired_summary,
    "knn-elbo-presets": hyvi.knn_presets_table,
    "in-between": in_between.in_between_table,
    "in-between-paired": in_between.protocol_paired_table,
    "proj-uci": projected.uci_table,
    "proj-uci-wins": projected.uci_wins_summary,
    "proj-four-modes": projected_toy.four_modes_table,
    "classification-two-moons": classification.two_moons_table,
    "classification-two-moons-paired": classification.two_moons_paired_table,
    "classification-digits": classification.digits_table,
    "classification-digits-paired": classification.digits_paired_table,
    "bench": _bench,
    "bench-runs": _bench_runs,
}


# --------------------------------------------------------------------------- rendering


def default_root() -> Path:
    """The checkout this package was installed from (editable install), else the working
    directory."""
    checkout = Path(__file__).resolve().parents[2]
    return checkout if (checkout / TEMPLATE).exists() else Path.cwd()


def _parse_marker(body: str, where: str) -> tuple[str, list[str], dict[str, str]]:
    tokens = shlex.split(body)
    if not tokens:
        raise ValueError(f"{where}: empty table marker; write <!-- table: NAME PATH.csv -->")
    name, rest = tokens[0], tokens[1:]
    if name not in TABLES:
        raise ValueError(f"{where}: unknown table {name!r}; known: {sorted(TABLES)}")
    paths = [t for t in rest if "=" not in t]
    options = dict(t.split("=", 1) for t in rest if "=" in t)
    if not paths:
        raise ValueError(f"{where}: table {name!r} names no CSV; write <!-- table: {name} docs/results/FILE.csv -->")
    return name, paths, options


def _generate(name: str, paths: list[str], options: dict[str, str], root: Path, where: str) -> str:
    """The text builder ``name`` makes from the CSVs ``paths`` under ``root``; errors name ``where``."""
    frames = []
    for path in paths:
        file = root / path
        if not file.is_file():
            raise FileNotFoundError(f"{where}: table {name!r} reads {path}, which does not exist under {root}")
        frames.append(pd.read_csv(file))
    try:
        return TABLES[name](frames, paths, options)
    except (KeyError, ValueError) as err:
        raise ValueError(f"{where}: table {name!r} from {', '.join(paths)}: {err}") from err


def _segments(template: str, root: Path, template_name: str = TEMPLATE) -> list[tuple[list[str], str]]:
    """The rendered page as segments ``(csv paths, text)``: static text has no paths."""
    segments: list[tuple[list[str], str]] = []
    for lineno, line in enumerate(template.splitlines(keepends=True), 1):
        match = _MARKER.match(line.strip())
        if not match:
            segments.append(([], line))
            continue
        where = f"{template_name}:{lineno}"
        name, paths, options = _parse_marker(match.group("body"), where)
        text = _generate(name, paths, options, root, where)
        source = " ".join(paths)
        segments.append((paths, f"<!-- generated from {source}: edit the CSV or {template_name} -->\n{text}\n"))
    return segments


_BANNER = (
    "<!-- GENERATED by `pyro-bnnlv results` from {template} and the CSVs under docs/results/;"
    " do not edit by hand: edit {template} and rerun. -->\n\n"
)


def render(template: str, root: str | Path = ".", template_name: str = TEMPLATE) -> str:
    """The page: ``template`` with every table marker replaced by its table."""
    body = "".join(text for _, text in _segments(template, Path(root), template_name))
    return _BANNER.format(template=template_name) + body


def render_blocks(text: str, root: str | Path = ".", name: str = README) -> tuple[str, list[str]]:
    """``text`` (README.md's) with every generated block's body rebuilt by its builder, and where
    the bodies differed (``"README.md:LINE (NAME from PATH)"``). A one-paragraph body is wrapped at
    100 columns with the opening marker's indent; a longer one (a table) keeps its lines."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    changed: list[str] = []
    i = 0
    while i < len(lines):
        match = _BLOCK_OPEN.match(lines[i].rstrip("\n"))
        out.append(lines[i])
        i += 1
        if not match:
            continue
        where = f"{name}:{i}"
        end = next((j for j in range(i, len(lines)) if _BLOCK_END.match(lines[j].rstrip("\n"))), None)
        if end is None:
            raise ValueError(
                f"{where}: generated block without an end; add the line <!-- end generated --> after its text"
            )
        builder, paths, options = _parse_marker(match.group("body"), where)
        generated = _generate(builder, paths, options, Path(root), where)
        indent = match.group("indent")
        if "\n" in generated:
            body = "".join(f"{indent}{line}\n" for line in generated.splitlines())
        else:
            body = (
                textwrap.fill(
                    generated,
                    width=100,
                    initial_indent=indent,
                    subsequent_indent=indent,
                    break_long_words=False,
                    break_on_hyphens=False,
                )
                + "\n"
            )
        if "".join(lines[i:end]) != body:
            changed.append(f"{where} ({builder} from {', '.join(paths)})")
        out += [body, lines[end]]
        i = end + 1
    return "".join(out), changed


def build(root: str | Path | None = None) -> str:
    """``docs/results.md`` as the template and CSVs under ``root`` give it."""
    root = Path(root) if root is not None else default_root()
    template = root / TEMPLATE
    if not template.is_file():
        raise FileNotFoundError(f"no template {TEMPLATE} under {root} (pass --root, the repository root)")
    return render(template.read_text(), root)


def check(root: str | Path | None = None) -> tuple[bool, str]:
    """``(True, "")`` when ``docs/results.md`` is what :func:`build` gives and README.md's
    generated blocks what their builders give, else ``(False, message)`` naming each stale file
    and the CSVs whose tables or blocks differ."""
    root = Path(root) if root is not None else default_root()
    messages = [message for ok, message in (_check_page(root), _check_readme(root)) if not ok]
    return not messages, "\n".join(messages)


def _check_page(root: Path) -> tuple[bool, str]:
    """:func:`check`'s part for ``docs/results.md``."""
    out = root / OUTPUT
    template = root / TEMPLATE
    if not template.is_file():
        raise FileNotFoundError(f"no template {TEMPLATE} under {root} (pass --root, the repository root)")
    segments = _segments(template.read_text(), root)
    expected = _BANNER.format(template=TEMPLATE) + "".join(text for _, text in segments)
    if not out.is_file():
        return False, f"{OUTPUT} is missing; run `pyro-bnnlv results`"
    current = out.read_text()
    if current == expected:
        return True, ""
    stale = [", ".join(paths) for paths, text in segments if paths and text not in current]
    what = f"the table(s) from {'; '.join(stale)} differ" if stale else f"its text differs from {TEMPLATE}"
    diff = list(
        difflib.unified_diff(
            current.splitlines(),
            expected.splitlines(),
            f"{OUTPUT} (committed)",
            f"{OUTPUT} (from the CSVs)",
            n=0,
            lineterm="",
        )
    )
    shown = "\n".join(diff[:12]) + ("\n..." if len(diff) > 12 else "")
    return False, f"{OUTPUT} is stale: {what}; run `pyro-bnnlv results` and commit it\n{shown}"


def _check_readme(root: Path) -> tuple[bool, str]:
    """:func:`check`'s part for README.md's generated blocks (a root without README.md has none)."""
    readme = root / README
    if not readme.is_file():
        return True, ""
    current = readme.read_text()
    expected, changed = render_blocks(current, root)
    if not changed:
        return True, ""
    diff = list(
        difflib.unified_diff(
            current.splitlines(),
            expected.splitlines(),
            f"{README} (committed)",
            f"{README} (from the CSVs)",
            n=0,
            lineterm="",
        )
    )
    shown = "\n".join(diff[:12]) + ("\n..." if len(diff) > 12 else "")
    return False, (
        f"{README} is stale: its generated block(s) at {'; '.join(changed)} differ; run `pyro-bnnlv "
        f"results` and commit it\n{shown}"
    )


def main(check_only: bool = False, root: str | Path | None = None) -> int:
    """Write ``docs/results.md`` (or, with ``check_only``, report whether it is up to date)."""
    root = Path(root) if root is not None else default_root()
    if check_only:
        ok, message = check(root)
        if not ok:
            import sys

            print(message, file=sys.stderr)
            return 1
        print(f"{OUTPUT} and {README}'s generated blocks are up to date")
        return 0
    text = build(root)
    (root / OUTPUT).write_text(text)
    print(f"wrote {root / OUTPUT}")
    readme = root / README
    if readme.is_file():
        text, changed = render_blocks(readme.read_text(), root)
        if changed:
            readme.write_text(text)
            print(f"rewrote {len(changed)} generated block(s) of {readme}")
    return 0
