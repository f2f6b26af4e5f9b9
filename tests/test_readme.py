"""The README's quick start and the guide's snippets run as written (with fewer SVI steps), the
README's commands exist, and its links into docs/ point at headings that exist."""

import math
import re
import runpy
import warnings
from pathlib import Path

import pytest

import pyro_bnnlv as pb

README = Path(__file__).resolve().parents[1] / "README.md"
GUIDE = README.parent / "docs" / "guide.md"


def _section_blocks(heading: str, doc: Path = README) -> list[str]:
    """Every python block under the heading ``## heading`` of ``doc`` (the README or the guide)."""
    match = re.search(rf"## {re.escape(heading)}\n(.*?)(?=\n## |\Z)", doc.read_text(), re.S)
    assert match, f"no heading '## {heading}' in {doc.name}"
    return re.findall(r"```python\n(.*?)```", match.group(1), re.S)


def _section_code(heading: str, doc: Path = README) -> str:
    """The first python block under the heading ``## heading`` of ``doc``."""
    return _section_blocks(heading, doc)[0]


def _small(code: str, replacements: dict[str, str]) -> str:
    """``code`` with each ``old`` replaced by ``new``; every ``old`` must occur (so the test
    notices when the README changes under it)."""
    for old, new in replacements.items():
        assert old in code, old
        code = code.replace(old, new)
    return code


def _run_quick_start(namespace: dict) -> None:
    code = _section_code("Quick start")
    code = _small(code, {"num_steps=3000": "num_steps=50", "num_samples=500": "num_samples=50"})
    exec(compile(code, "README quick start", "exec"), namespace)


def test_readme_quick_start_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    _run_quick_start(namespace)
    assert namespace["pred"]["obs"].shape[0] == 100
    assert namespace["f"].shape[0] == 50


def test_readme_nuts_section_runs(tmp_path, monkeypatch):
    """The guide's NUTS / ArviZ snippet runs after the README's quick start (small sizes)."""
    block = _section_code("NUTS, the gold standard, and ArviZ", GUIDE)
    small = {
        "num_samples=1000, warmup_steps=1000": "num_samples=30, warmup_steps=30",
        "num_chains=4": "num_chains=2",
        "num_samples=1000, num_draws=100": "num_samples=60, num_draws=3",
    }
    for old, new in small.items():
        assert old in block, old
        block = block.replace(old, new)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    _run_quick_start(namespace)
    exec(
        compile(block.replace("seed=0)", "seed=0, progress=False, max_tree_depth=5)"), "guide NUTS", "exec"), namespace
    )
    idata = namespace["idata"]
    assert idata.weights["w"].shape[:2] == (2, 30)
    assert "log_likelihood" in idata.groups()


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors for the headings of ``doc``: lower case, punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    headings = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", ["README.md", "docs/guide.md", "docs/results.in.md"])
def test_links_into_docs_resolve(doc):
    """Every relative markdown link ``[..](FILE.md#anchor)`` names a file and heading that exist."""
    path = README.parent / doc
    for target, anchor in re.findall(r"\]\(([\w./-]*\.md)?#([\w-]+)\)", path.read_text()):
        linked = (path.parent / target).resolve() if target else path
        assert linked.exists(), f"{doc} links to {target}, which does not exist"
        if linked.name == "results.md":  # generated: its headings are the template's
            linked = linked.with_name("results.in.md")
        assert anchor in _anchors(linked), f"{doc} links to {target}#{anchor}: no such heading"


def test_every_moved_snippet_is_tested():
    """The guide's python blocks are the ones the tests above run (none left untested)."""
    tested = {
        "BNN+LV and NCAI in your own script",
        "NUTS, the gold standard, and ArviZ",
        "Implicit hypernetwork guides and k-NN ELBOs (NN-HyVI, FuNN-HyVI)",
        "Projected BNN: inference in a low-dimensional weight space",
        "Linearised and sampled Laplace, in-between uncertainty",
        "Classification and K-FAC Laplace",
        "Sweeps: parallel, resumable experiments",
    }
    headings = re.findall(r"^## (.+)$", GUIDE.read_text(), re.M)
    with_code = {h for h in headings if _section_blocks(h, GUIDE)}
    assert with_code == tested
    assert all(len(_section_blocks(h, GUIDE)) == 1 for h in tested)


def test_readme_commands_match_ci():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    install = re.search(r"## Install\s+```bash\n(.*?)\n```", text, re.S).group(1).strip().splitlines()
    tests = re.search(r"## Tests\s+```bash\n(.*?)\n```", text, re.S).group(1).strip()
    lines = ci.splitlines()
    assert install == [line for line in lines if line in install]  # every install line, in order
    assert lines.index(install[-1]) < lines.index(tests)


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
    code = _section_code("Sweeps: parallel, resumable experiments", GUIDE)
    code = (
        code.replace("for s in range(5)", "for s in range(1)")
        .replace("steps=2000", "steps=20")
        .replace("workers=2", 'executor="inline", progress=False')
    )
    script = tmp_path / "sweep_section.py"  # run as a user's script: __main__ with a file
    script.write_text(code)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = runpy.run_path(str(script), run_name="__main__")["table"]
    assert not [w for w in caught if "y_mean" in str(w.message)]  # the snippet reports the original scale
    assert len(table) == 2 and (table["status"] == "done").all() and table["test_ll"].notna().all()
    assert (tmp_path / "runs" / "yacht" / "sweep.sqlite").exists()


def test_readme_own_data_section_runs_twice(tmp_path, monkeypatch):
    """ "Your own data in 20 lines": both blocks, with fewer steps, run twice in one process (Pyro's
    global state must not leak between the runs) and give the same numbers both times."""
    import matplotlib.figure
    import pandas as pd

    monkeypatch.chdir(tmp_path)
    blocks = _section_blocks("Your own data in 20 lines")
    assert len(blocks) == 2
    results = []
    for _ in range(2):
        namespace: dict = {}
        for i, block in enumerate(blocks):
            code = _small(block, {"num_steps=3000": "num_steps=30"})
            exec(compile(code, f"README own data {i}", "exec"), namespace)
        assert isinstance(namespace["fig"], matplotlib.figure.Figure)
        assert set(namespace["valid"]) == {0.1, 0.3, 1.0}
        metrics = pb.evaluate(namespace["model"], namespace["guide"], namespace["data"], seed=0)
        assert isinstance(metrics, pd.Series) and math.isfinite(metrics["test_ll"])
        results.append((dict(namespace["valid"]), float(metrics["test_ll"])))
    assert results[0] == results[1]


def test_readme_bnnlv_section_runs(tmp_path, monkeypatch):
    """The BNN+LV / NCAI block on heavy-tail (300 training points < the paper's batch of 500)."""
    monkeypatch.chdir(tmp_path)
    code = _small(
        _section_code("BNN+LV and NCAI in your own script", GUIDE),
        {
            "num_steps=3000": "num_steps=20",
            "num_samples=500": "num_samples=50",
            "pb.ncai_guide(model, x, y)": "pb.ncai_guide(model, x, y, num_steps=20)",
            'load_dataset("heavy-tail")': 'load_dataset("heavy-tail", sizes=(120, 60, 60))',
        },
    )
    namespace: dict = {}
    exec(compile(code, "guide BNN+LV", "exec"), namespace)
    eb = namespace["eb"]
    assert len(eb.history) == 20 and eb.prior_scale > 0 and eb.latent_scale > 0
    assert namespace["w"]["w"].shape == (50, namespace["model"].num_weights)


def test_readme_hypernet_section_runs(tmp_path, monkeypatch):
    """The NN-HyVI / FuNN-HyVI block with the fast preset's sizes and a few steps."""
    monkeypatch.chdir(tmp_path)
    code = _small(
        _section_code("Implicit hypernetwork guides and k-NN ELBOs (NN-HyVI, FuNN-HyVI)", GUIDE),
        {
            "pb.KNNElbo()": "pb.KNNElbo.fast()",
            "pb.FunctionalKNNElbo(input_dist": "pb.FunctionalKNNElbo.fast(input_dist",
            "num_steps=3000": "num_steps=10",
            "num_samples=500": "num_samples=100",
        },
    )
    namespace: dict = {}
    exec(compile(code, "guide HyVI", "exec"), namespace)
    report = namespace["report"]
    assert set(report.index.get_level_values("method")) == {"NN-HyVI", "FuNN-HyVI"}
    assert (tmp_path / "ood.png").stat().st_size > 5000


def test_readme_classification_section_runs_twice(tmp_path, monkeypatch):
    """The README's classification snippet as written but for the step counts, twice in one
    process (Pyro's global state): the same numbers both times, and a working classifier."""
    monkeypatch.chdir(tmp_path)
    code = _small(
        _section_code("Classification"), {"num_steps=1500": "num_steps=300", "num_steps=2000": "num_steps=300"}
    )
    printed = []
    runs = []
    for _ in range(2):
        namespace: dict = {"print": printed.append}
        exec(compile(code, "README classification", "exec"), namespace)
        runs.append(namespace)
    mfvi, laplace = printed[0], printed[1]
    assert mfvi["accuracy"] > 0.8 and laplace["accuracy"] > 0.8
    assert printed[0].equals(printed[2]) and printed[1].equals(printed[3])


def test_guide_classification_section_runs(tmp_path, monkeypatch):
    """The guide's CNN / K-FAC snippet as written but for the MAP's steps: it prints the MAP's and
    the Laplace metrics and an OOD AUROC, and draws the reliability diagram."""
    monkeypatch.chdir(tmp_path)
    code = _small(_section_code("Classification and K-FAC Laplace", GUIDE), {"num_steps=1500": "num_steps=150"})
    printed: list = []
    exec(compile(code, "guide classification", "exec"), {"print": lambda *a: printed.append(a)})
    (map_metrics,), (laplace_metrics,), (label, auroc) = printed
    assert map_metrics["accuracy"] > 0.8 and laplace_metrics["accuracy"] > 0.8
    assert label == "OOD AUROC" and 0.5 < auroc <= 1.0
    assert (tmp_path / "reliability.png").stat().st_size > 5000


def test_readme_laplace_section_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _section_code("Linearised and sampled Laplace, in-between uncertainty", GUIDE)
    code = code.replace("pb.train_map(model, x, y)", "pb.train_map(model, x, y, num_steps=200, progress=False)")
    namespace: dict = {}
    exec(compile(code, "guide Laplace", "exec"), namespace)
    assert namespace["pred"].mean.shape[0] == namespace["data"].x_test.shape[0]


@pytest.mark.slow
def test_readme_projected_section_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = _small(
        _section_code("Projected BNN: inference in a low-dimensional weight space", GUIDE),
        {
            "x_valid=xv, y_valid=yv)": "x_valid=xv, y_valid=yv, num_steps=50, progress=False, "
            "fge_kwargs=dict(num_candidates=20, keep=10, map_steps=100), projection_kwargs=dict(num_steps=50))",
            "num_samples=500": "num_samples=50",
        },
    )
    namespace: dict = {}
    exec(compile(code, "guide projected", "exec"), namespace)
    assert namespace["w"]["w"].shape[0] == 50
