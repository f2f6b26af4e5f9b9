"""The README's quick start runs as written (with fewer SVI steps) and its commands exist."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _section_code(heading: str) -> str:
    """The first python block under the README heading ``## heading``."""
    section = re.search(rf"## {re.escape(heading)}\n(.*?)(?=\n## |\Z)", README.read_text(), re.S).group(1)
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run_quick_start(namespace: dict) -> None:
    code = _section_code("Quick start")
    code = code.replace("num_steps=2000", "num_steps=50").replace("num_samples=500", "num_samples=50")
    exec(compile(code, "README quick start", "exec"), namespace)


def test_readme_quick_start_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    _run_quick_start(namespace)
    assert namespace["pred"]["obs"].shape[0] == 100
    assert namespace["f"].shape[0] == 50


def test_readme_nuts_section_runs(tmp_path, monkeypatch):
    """The NUTS / ArviZ snippet runs after the quick start (small sizes)."""
    block = _section_code("NUTS, the gold standard, and ArviZ")
    small = {"num_samples=1000, warmup_steps=1000": "num_samples=30, warmup_steps=30",
             "num_chains=4": "num_chains=2", "num_samples=1000, num_draws=100": "num_samples=60, num_draws=3"}
    for old, new in small.items():
        assert old in block, old
        block = block.replace(old, new)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    _run_quick_start(namespace)
    exec(compile(block.replace("seed=0)", "seed=0, progress=False, max_tree_depth=5)"),
                 "README NUTS", "exec"), namespace)  # fmt: skip
    idata = namespace["idata"]
    assert idata.posterior["w"].shape[:2] == (2, 30)
    assert "log_likelihood" in idata.groups()


def test_readme_commands_match_ci():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    install = re.search(r"## Install\s+```bash\n(.*?)\n```", text, re.S).group(1).strip()
    tests = re.search(r"## Tests\s+```bash\n(.*?)\n```", text, re.S).group(1).strip()
    assert install in ci.splitlines()
    assert tests in ci.splitlines()


@pytest.mark.parametrize("argv", [["datasets"], ["fit", "--help"], ["bench", "--help"]])
def test_cli_entry_points(argv, capsys):
    from pyro_bnnlv.cli import main

    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse --help exits 0
        code = exit_.code
    assert code == 0
    assert capsys.readouterr().out


def test_readme_sweep_example_runs(tmp_path, monkeypatch):
    """The sweep section's code, in this process (inline), on 2 tasks with a few steps."""
    monkeypatch.chdir(tmp_path)
    code = _section_code("Sweeps: parallel, resumable experiments")
    code = (code.replace("for s in range(5)", "for s in range(1)").replace("steps=2000", "steps=20")
            .replace("workers=2", 'executor="inline", progress=False'))  # fmt: skip
    namespace: dict = {"__name__": "__main__"}
    exec(compile(code, "README sweep section", "exec"), namespace)
    table = namespace["table"]
    assert len(table) == 2 and (table["status"] == "done").all() and table["test_ll"].notna().all()
    assert (tmp_path / "runs" / "yacht" / "sweep.sqlite").exists()
