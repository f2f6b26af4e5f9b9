"""Hand the layout to the formatter: strip every ``fmt: skip`` / ``fmt: off`` / ``fmt: on``
comment, then run ``ruff format`` (the settings of ``[tool.ruff.format]`` in pyproject.toml).

    python tools/apply_format.py [REPO_DIR]

Covers the directories of ``tests/test_lint.py``'s format check (``FORMATTED``). The markers are
found as comment tokens (``tokenize``), so a string that contains the words is left alone; a
comment that only ends in the marker (``# noqa  # fmt: skip``) keeps its first part. Running it
again changes nothing.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
FORMATTED = ["pyro_bnnlv", "tests", "tools", "tutorials", "docs/bench"]
SKIP = re.compile(r"\s*#\s*fmt:\s*skip\s*$")
OFF_ON = re.compile(r"#\s*fmt:\s*(?:off|on)\s*$")


def strip_markers(path: Path) -> int:
    """Remove the formatter markers of one file in place; the number removed."""
    src = path.read_text()
    lines = src.splitlines(keepends=True)
    edits: dict[int, tuple[int, str]] = {}  # 0-based line -> (comment column, comment kept)
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type != tokenize.COMMENT:
            continue
        row, col = tok.start[0] - 1, tok.start[1]
        if OFF_ON.fullmatch(tok.string):
            edits[row] = (col, "")
        elif SKIP.search(tok.string):
            edits[row] = (col, SKIP.sub("", tok.string))
    for row, (col, kept) in edits.items():
        line = lines[row]
        body, end = line[:col].rstrip(), line[len(line.rstrip("\r\n")) :]
        if kept:
            lines[row] = f"{body}  {kept}{end}" if body else f"{line[:col]}{kept}{end}"
        else:
            lines[row] = f"{body}{end}" if body else ""  # a marker on its own line goes with its line
    if edits:
        path.write_text("".join(lines))
    return len(edits)


def main() -> None:
    dirs = [ROOT / d for d in FORMATTED if (ROOT / d).is_dir()]
    removed = sum(strip_markers(p) for d in dirs for p in sorted(d.rglob("*.py")))
    print(f"removed {removed} formatter markers")
    subprocess.run([sys.executable, "-m", "ruff", "format", "--no-cache", *map(str, dirs)], cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
