"""The tree passes ruff's pyflakes checks and keeps every ``__all__`` sorted ([tool.ruff] in
pyproject.toml): an unused import, an undefined name or an unsorted export list fails here."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "pyro_bnnlv", "tests", "tools",
                          "tutorials", "docs/bench"], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
