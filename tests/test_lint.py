"""The tree passes ruff's pyflakes checks and keeps every ``__all__`` sorted, and ``ruff format``
owns its layout ([tool.ruff] in pyproject.toml): an unused import, an undefined name, an unsorted
export list or a file the formatter would change fails here."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the Python the checks cover (tools/apply_format.py formats the same; Markdown is not formatted)
CHECKED = ["pyro_bnnlv", "tests", "tools", "tutorials", "docs/bench"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    command = [sys.executable, "-m", "ruff", *args, "--no-cache", *CHECKED]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing():
    out = _ruff("check")
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    out = _ruff("format", "--check", "--output-format", "concise")
    unformatted = sorted({line.split(":")[0] for line in out.stdout.splitlines() if "unformatted" in line})
    assert out.returncode == 0, (
        f"ruff format would change {len(unformatted)} file(s): {', '.join(unformatted)} "
        f"(run python tools/apply_format.py, or ruff format on them)\n{out.stderr}"
    )
