"""The compiled NUTS core (C++) against its Python twin: same potential, same draws, same errors."""

import os
import types
import warnings
from pathlib import Path

import pyro
import pytest
import torch
from pyro.infer import MCMC

import pyro_bnnlv as pb
from pyro_bnnlv._mlp_kernels import ACTIVATION_TABLE
from pyro_bnnlv import _compiled
from pyro_bnnlv import _compiled as compiled
from pyro_bnnlv.infer.mcmc import FlatNUTS, FlatPotential, chain_records, mlp_regression_potential, run_nuts

from test_nuts import _check_exact, _draws, _linreg_data, _linreg_model, _tiny_bnn64

pytestmark = pytest.mark.skipif(compiled.nuts_extension() is None, reason="no C++ toolchain")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("latent_dim", [0, 2])
@pytest.mark.parametrize(
    "activation,hidden", [("tanh", []), ("tanh", [6])] + [(act, [7, 5]) for act in sorted(ACTIVATION_TABLE)]
)
def test_compiled_potential_equals_python_potential(activation, hidden, latent_dim, dtype):
    g = torch.Generator().manual_seed(0)
    net = pb.MLP(1 + latent_dim, hidden, 2, activation=activation)
    x = torch.randn(13, 1, generator=g, dtype=dtype)
    y = torch.randn(13, 2, generator=g, dtype=dtype)
    kw = dict(
        prior_loc=0.3,
        prior_scale=torch.rand(net.num_weights, generator=g, dtype=dtype) + 0.5,
        noise_scale=0.2,
        latent_dim=latent_dim,
        latent_scale=torch.full((latent_dim,), 0.7),
    )
    python = mlp_regression_potential(net, x, y, compiled=False, **kw)
    fast = mlp_regression_potential(net, x, y, compiled=True, **kw)
    assert python.compiled is None and fast.compiled is not None and fast.dim == python.dim
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    for i in range(3):
        q = torch.randn(python.dim, generator=g, dtype=dtype)
        if i == 2:  # a non-contiguous q
            q = torch.stack([q, q], 1)[:, 0]
        (u_py, g_py), (u_c, g_c) = python(q), fast(q)
        assert float(u_c) == pytest.approx(float(u_py), rel=rtol)
        assert g_c.dtype == dtype and g_c.shape == g_py.shape
        assert torch.allclose(g_c, g_py, rtol=0, atol=rtol * 10 * float(g_py.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("latent_dim", [0, 2])
def test_compiled_potential_with_uci_sized_layers_equals_python_potential(latent_dim, dtype):
    """UCI-sized layers (300 x 13 x 40 multiply-adds in the first layer and its weight gradient:
    whole register tiles, remainder rows and columns, 300 points padded to 304) give the Python
    twin's value and gradient."""
    g = torch.Generator().manual_seed(1)
    net = pb.MLP(13 + latent_dim, [40, 30], 1, activation="tanh")
    x = torch.randn(300, 13, generator=g, dtype=dtype)
    y = torch.randn(300, generator=g, dtype=dtype)
    kw = dict(prior_scale=0.8, noise_scale=0.3, latent_dim=latent_dim)
    python = mlp_regression_potential(net, x, y, compiled=False, **kw)
    fast = mlp_regression_potential(net, x, y, compiled=True, **kw)
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    for _ in range(2):
        q = 0.3 * torch.randn(python.dim, generator=g, dtype=dtype)
        (u_py, g_py), (u_c, g_c) = python(q), fast(q)
        assert float(u_c) == pytest.approx(float(u_py), rel=rtol)
        assert torch.allclose(g_c, g_py, rtol=0, atol=rtol * 10 * float(g_py.abs().max()))


def test_compiled_tree_reproduces_python_tree_draw_for_draw():
    """The C++ tree (with the compiled potential, or calling the Python one back) and the Python
    tree draw the same random numbers in the same order: identical chains up to rounding (the
    C++ leapfrog is not fused like torch's ``add(alpha=)``, ~1e-16 per step)."""
    model, x, y = _tiny_bnn64()
    kw = dict(prior_loc=model.prior_loc, prior_scale=model.prior_scale, noise_scale=model.noise_scale)
    pot_c = mlp_regression_potential(model.net, x, y, compiled=True, **kw)
    pot_py = mlp_regression_potential(model.net, x, y, compiled=False, **kw)
    w0 = model.net.init_weights(torch.Generator().manual_seed(1)).double()
    fixed = dict(step_size=0.01, adapt_step_size=False, adapt_mass_matrix=False)
    ref = _draws(FlatNUTS(pot_py, compiled=False, **fixed), w0, 30, 0)
    assert torch.allclose(_draws(FlatNUTS(pot_c, **fixed), w0, 30, 0), ref, atol=1e-10, rtol=0)
    assert torch.allclose(_draws(FlatNUTS(pot_py, compiled=True, **fixed), w0, 30, 0), ref, atol=1e-10, rtol=0)
    # with adaptation and a dense mass matrix (the tree's matrix-vector branch)
    for full_mass in (False, True):
        a = _draws(FlatNUTS(pot_c, max_tree_depth=6, full_mass=full_mass), w0, 3, 8)
        b = _draws(FlatNUTS(pot_py, compiled=False, max_tree_depth=6, full_mass=full_mass), w0, 3, 8)
        assert torch.allclose(a, b, atol=1e-7, rtol=0), (full_mass, (a - b).abs().max())


def test_compiled_tree_matches_python_tree_in_float32():
    """float32: the C++ sums energies in double, the Python tree in float32 (~1e-5 relative), so
    the chains agree only until a marginal accept/turn decision flips; over a few draws with a
    small step they agree to float32 rounding."""
    model, x, y = _tiny_bnn64()
    model, x, y = model.float(), x.float(), y.float()
    kw = dict(noise_scale=0.1, prior_scale=1.0)
    pot_c = mlp_regression_potential(model.net, x, y, compiled=True, **kw)
    pot_py = mlp_regression_potential(model.net, x, y, compiled=False, **kw)
    w0 = model.net.init_weights(torch.Generator().manual_seed(1))
    fixed = dict(step_size=0.01, adapt_step_size=False, adapt_mass_matrix=False, max_tree_depth=6)
    a = _draws(FlatNUTS(pot_c, **fixed), w0, 5, 0)
    b = _draws(FlatNUTS(pot_py, compiled=False, **fixed), w0, 5, 0)
    assert a.dtype == torch.float32 and torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()
    assert not torch.allclose(a[0], a[-1])


def test_compiled_tree_divergence_and_nan_energy_match_python_tree():
    """A step size far too large: every trajectory diverges at once; a potential that returns
    NaN away from the start: NaN energy counts as infinite (divergent) in both trees."""
    model, x, y = _tiny_bnn64()
    pot = mlp_regression_potential(model.net, x, y, compiled=False, noise_scale=0.1)
    w0 = model.net.init_weights(torch.Generator().manual_seed(1)).double()
    huge = dict(step_size=5.0, adapt_step_size=False, adapt_mass_matrix=False)
    nan_after_start = FlatPotential(
        pot.sites,
        lambda q: (pot.value_and_grad(q)[0] if torch.equal(q, w0) else float("nan"), pot.value_and_grad(q)[1]),
    )
    for p in (pot, nan_after_start):
        runs = []
        for c in (True, False):
            pyro.set_rng_seed(3)
            mcmc = MCMC(
                FlatNUTS(p, compiled=c, **huge),
                num_samples=4,
                warmup_steps=0,
                initial_params={"w": w0},
                disable_progbar=True,
            )
            mcmc.run()
            runs.append((mcmc.get_samples()["w"], chain_records(mcmc)[0]))
        (a, rec_a), (b, rec_b) = runs
        assert torch.equal(a, b) and torch.equal(a[-1], w0)  # never moves
        for rec in (rec_a, rec_b):
            assert rec["divergences"] == [0, 1, 2, 3]
            assert rec["num_steps"] == [1, 1, 1, 1]


def test_extension_rejects_inconsistent_inputs():
    ext = compiled.nuts_extension()
    x, y = torch.randn(5, 1), torch.randn(5, 1)
    layers = [(1, 3, 0, 3), (3, 1, 6, 9)]  # P = 10
    ok = dict(loc=torch.zeros(10), prec=torch.ones(10), zprec=torch.ones(0))

    def make(**kw):
        a = {**ok, **kw}
        return ext.MLPPotential(
            x, y, kw.get("layers", layers), 1, a["loc"], a["prec"], False, 1.0, 0.0, kw.get("k", 0), a["zprec"]
        )

    assert make().dim == 10
    for bad, msg in [
        (dict(prec=torch.ones(9)), "loc and prec"),
        (dict(zprec=torch.ones(2)), "zprec"),
        (dict(loc=torch.zeros(10, dtype=torch.float64), prec=torch.ones(10, dtype=torch.float64)), "dtype"),
        (dict(layers=[(1, 3, 0, 3), (3, 1, 6, 8), (1, 1, 9, 10)]), "does not fit"),
        (dict(layers=[(2, 3, 0, 3), (3, 1, 6, 9)]), "fan_in"),
        (dict(k=3), "latent_dim"),
    ]:
        with pytest.raises(RuntimeError, match=msg):
            make(**bad)
    pot = make()
    with pytest.raises(RuntimeError, match="shape"):
        pot.value_and_grad(torch.zeros(9))
    q, m = torch.zeros(10), torch.ones(10)
    args = (0.0, 0.1, 1000.0)
    with pytest.raises(RuntimeError, match="one length"):
        ext.build_tree(pot, q, torch.zeros(9), q, 1, 2, *args, m, m, True)
    with pytest.raises(RuntimeError, match="mass matrix"):
        ext.build_tree(pot, q, q, q, 1, 2, *args, torch.eye(10), torch.eye(10), True)
    with pytest.raises(RuntimeError, match="depth"):
        ext.build_tree(pot, q, q, q, 1, -1, *args, m, m, True)
    with pytest.raises(RuntimeError, match="share a dtype"):
        ext.build_tree(pot, q, q, q, 1, 2, *args, m.double(), m, True)
    assert len(ext.build_tree(pot, q, q, q, 1, 2, *args, m, m, True)) == 17


def test_replacing_value_and_grad_drops_the_compiled_twin():
    model, x, y = _tiny_bnn64()
    pot = mlp_regression_potential(model.net, x, y, compiled=True, noise_scale=0.1)
    assert pot.compiled is not None
    inner = pot.value_and_grad
    pot.value_and_grad = lambda q: tuple(0.5 * v for v in inner(q))  # tempered by 1/2
    assert pot.compiled is None
    assert FlatNUTS(pot)._tree_potential is pot.value_and_grad


def test_compiled_tree_with_latent_inputs_matches_python_tree():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 1, generator=g, dtype=torch.float64)
    y = torch.randn(12, generator=g, dtype=torch.float64)
    net = pb.MLP(2, [5], 1)
    kw = dict(noise_scale=0.3, latent_dim=1, latent_scale=1.0)
    pot_c = mlp_regression_potential(net, x, y, compiled=True, **kw)
    pot_py = mlp_regression_potential(net, x, y, compiled=False, **kw)
    q0 = 0.3 * torch.randn(pot_py.dim, generator=g, dtype=torch.float64)
    init = pot_py.unpack(q0)
    fixed = dict(step_size=0.02, adapt_step_size=False, adapt_mass_matrix=False, max_tree_depth=5)

    def chain(pot, compiled_tree):
        torch.manual_seed(0)
        mcmc = MCMC(
            FlatNUTS(pot, compiled=compiled_tree, **fixed),
            num_samples=10,
            warmup_steps=0,
            initial_params=dict(init),
            disable_progbar=True,
        )
        mcmc.run()
        return mcmc.get_samples()

    a, b = chain(pot_c, True), chain(pot_py, False)
    for k in ("w", "z"):
        assert a[k].shape == b[k].shape
        assert torch.allclose(a[k], b[k], atol=1e-10, rtol=0)
    assert not torch.allclose(a["z"][0], a["z"][-1])  # the chain moved


def test_compiled_tree_rejects_a_bad_python_gradient():
    model, x, y = _tiny_bnn64()
    good = mlp_regression_potential(model.net, x, y, compiled=False, noise_scale=0.1)
    calls = []

    def wrong_after_setup(q):  # Pyro's setup evaluates the potential through autograd first
        calls.append(1)
        u, grad = good.value_and_grad(q)
        return u, (grad if len(calls) <= 1 else grad[:-1].clone())

    bad = FlatPotential(good.sites, wrong_after_setup)
    kernel = FlatNUTS(bad, step_size=0.01, adapt_step_size=False, adapt_mass_matrix=False)
    w0 = model.net.init_weights(torch.Generator().manual_seed(1)).double()
    with pytest.raises(RuntimeError, match="gradient must have the shape and dtype of q"):
        _draws(kernel, w0, 2, 0)


def test_disabled_or_unbuildable_core_falls_back_to_python(monkeypatch, tmp_path):
    x, y = _linreg_data()
    model = _linreg_model()
    monkeypatch.setenv("PYRO_BNNLV_COMPILED", "0")
    assert compiled.nuts_extension() is None
    pot = mlp_regression_potential(model.net, x, y, noise_scale=0.5, prior_scale=1.5)
    assert pot.compiled is None
    with pytest.raises(RuntimeError, match="compiled=True"):
        FlatNUTS(pot, compiled=True)
    with pytest.raises(RuntimeError, match="compiled=True"):
        mlp_regression_potential(model.net, x, y, compiled=True)
    mcmc = run_nuts(model, x, y, num_samples=600, warmup_steps=300, seed=0, progress=False, map_steps=200)
    assert not mcmc.run_info.compiled_tree and not mcmc.run_info.compiled_potential
    _check_exact(mcmc.get_samples()["w"], x, y)

    # a build that fails warns once, names the cause, and is not retried
    monkeypatch.delenv("PYRO_BNNLV_COMPILED")
    monkeypatch.setattr(_compiled, "_built", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))

    def broken(*args, **kwargs):
        raise RuntimeError("Error building extension\nfoo.cpp:1: error: no compiler here")

    monkeypatch.setattr(_compiled, "_compile", broken)
    with pytest.warns(RuntimeWarning, match="no compiler here"):
        assert compiled.nuts_extension() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiled.nuts_extension() is None


def test_a_build_killed_mid_way_does_not_hang_or_poison_the_next(monkeypatch, tmp_path, capsys):
    """A killed build leaves its scratch directory (with torch's O_EXCL ``lock`` baton, on which
    a later ``load`` would wait forever); the next build clears it, builds in a fresh scratch
    directory, says so on stderr, and publishes the result with its marker in one rename."""
    monkeypatch.setattr(_compiled, "_built", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = _compiled.build_directory("pyro_bnnlv_flat_nuts", _compiled._NUTS_SOURCE)
    scratch = directory.with_name(directory.name + ".tmp")
    scratch.mkdir(parents=True)
    (scratch / "lock").touch()  # what a build killed with SIGKILL leaves behind
    seen = {}

    def fake_compile(name, source, build_directory):
        seen["baton"] = (Path(build_directory) / "lock").exists()
        seen["name"], seen["directory"] = name, Path(build_directory)
        assert not directory.exists()  # nothing is published before the build has finished
        (Path(build_directory) / f"{name}.so").write_bytes(b"")

    monkeypatch.setattr(_compiled, "_compile", fake_compile)
    monkeypatch.setattr(_compiled, "_load", lambda name, d: ("module", d))
    assert compiled.nuts_extension() == ("module", directory)
    assert seen["baton"] is False and seen["directory"] == scratch
    assert torch.__version__.replace(".", "_").replace("+", "_") in seen["name"]  # never another torch's build
    assert (directory / "BUILT").exists() and not scratch.exists()
    assert "building the compiled NUTS core" in capsys.readouterr().err
    assert compiled.nuts_extension() == ("module", directory)  # remembered, not rebuilt


def test_the_build_notice_estimates_from_the_last_build_on_this_machine(monkeypatch, tmp_path, capsys):
    """The notice's "how long" is the last finished build's time on this machine (its marker
    records it), a typical time before any; a marker without one (an older build) is skipped."""
    monkeypatch.setattr(_compiled, "_built", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    clock = iter([100.0, 237.4, 500.0, 503.0])
    monkeypatch.setattr(_compiled, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(_compiled, "_compile", lambda name, source, d: (Path(d) / f"{name}.so").write_bytes(b""))
    monkeypatch.setattr(_compiled, "_load", lambda name, d: d)
    old = tmp_path / "pyro_bnnlv" / "an-older-build"
    old.mkdir(parents=True)
    (old / "BUILT").write_text("k.cpp g++ -O3\n")  # written before builds recorded their time
    first = compiled.nuts_extension()
    assert "about a minute on an idle machine, a few on a slow or busy one" in capsys.readouterr().err
    assert (first / "BUILT").read_text().splitlines()[-1] == "seconds 137.4"
    source = tmp_path / "other.cpp"
    source.write_text("// another kernel\n")
    _compiled.build_extension("pyro_bnnlv_other", source, "other kernels", "slower")
    err = capsys.readouterr().err
    assert "the last build on this machine took 137 s" in err and "built in 3 s" in err


def test_a_finished_build_is_never_rebuilt_or_replaced(monkeypatch, tmp_path):
    """Once a build has its marker, a process finds it and loads its ``.so`` without running the
    builder, whatever its ``PATH`` (issue 39: the venv's and the system's ninja each saw the
    other's build as stale)."""
    monkeypatch.setattr(_compiled, "_built", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    builds = []

    def fake_compile(name, source, build_directory):
        builds.append(name)
        (Path(build_directory) / f"{name}.so").write_bytes(b"")

    monkeypatch.setattr(_compiled, "_compile", fake_compile)
    monkeypatch.setattr(_compiled, "_load", lambda name, d: d)
    first = compiled.nuts_extension()
    stamp = (first / "BUILT").stat().st_mtime_ns
    for path in ("/usr/bin:/bin", os.environ["PATH"]):  # another PATH, another process
        monkeypatch.setenv("PATH", path)
        monkeypatch.setattr(_compiled, "_built", {})
        assert compiled.nuts_extension() == first
    assert len(builds) == 1 and (first / "BUILT").stat().st_mtime_ns == stamp


def test_build_directory_is_keyed_by_source_torch_and_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    source = tmp_path / "k.cpp"
    source.write_text("// one\n")
    base = _compiled.build_directory("k", source)
    assert base == _compiled.build_directory("k", source)  # stable
    source.write_text("// two\n")
    assert _compiled.build_directory("k", source) != base  # another source
    source.write_text("// one\n")
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\necho 'fake c++ 99.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    _compiled.toolchain.cache_clear()
    try:
        assert "fake c++ 99.0" in _compiled.toolchain()
        assert _compiled.build_directory("k", source) != base  # another compiler
    finally:
        monkeypatch.delenv("CXX")
        _compiled.toolchain.cache_clear()
    assert _compiled.build_directory("k", source) == base


def test_the_real_build_loads_in_a_process_without_the_builder_on_path(tmp_path):
    """The driver's finished build loads in a fresh process whose PATH has no ninja and whose
    builder would fail: the same file, not rebuilt."""
    import subprocess
    import sys

    if compiled.nuts_extension() is None:
        pytest.skip("needs the compiled core")
    so = compiled.nuts_extension().__file__
    before = os.stat(so).st_mtime_ns
    code = (
        "import pyro_bnnlv._compiled as c\n"
        "def no(*a, **k): raise SystemExit('the builder ran')\n"
        "c._compile = no\n"
        "print(c.nuts_extension().__file__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == so and os.stat(so).st_mtime_ns == before


def test_run_nuts_reports_the_compiled_path():
    x, y = _linreg_data()
    mcmc = run_nuts(_linreg_model(), x, y, num_samples=5, warmup_steps=5, seed=0, progress=False, map_steps=20)
    assert mcmc.run_info.compiled_tree and mcmc.run_info.compiled_potential


def test_baseline_isa_build_equals_python_potential():
    """The potential's baseline-ISA build (used on CPUs without AVX2+FMA; forced here by
    PYRO_BNNLV_BASELINE_ISA in a fresh process) gives the Python twin's value and gradient."""
    import os
    import subprocess
    import sys
    import textwrap

    if compiled.nuts_extension() is None:
        pytest.skip("needs the compiled core")
    code = textwrap.dedent("""
        import torch
        from pyro_bnnlv.nets import MLP
        from pyro_bnnlv.models.potential import mlp_regression_potential
        torch.manual_seed(0)
        worst = 0.0
        for dtype, (N, D, K, H, L) in [(torch.float32, (37, 3, 2, 11, 2)), (torch.float64, (100, 13, 0, 50, 1))]:
            net = MLP(D + K, [H, 7], L, activation="tanh")
            x, y = torch.randn(N, D, dtype=dtype), torch.randn(N, L, dtype=dtype)
            args = dict(latent_dim=K, noise_scale=0.3, prior_scale=0.7)
            c = mlp_regression_potential(net, x, y, compiled=True, **args)
            p = mlp_regression_potential(net, x, y, compiled=False, **args)
            q = torch.randn(c.dim, dtype=dtype) * 0.5
            (uc, gc), (up, gp) = c.compiled.value_and_grad(q), p(q)
            worst = max(worst, abs(float(uc) - float(up)) / abs(float(up)),
                        float((gc - gp).abs().max() / gp.abs().max()))
        print(worst)
    """)
    env = {**os.environ, "PYRO_BNNLV_BASELINE_ISA": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) < 1e-5


def test_build_command_builds_both_kernels(capsys):
    """``pyro-bnnlv build``: the NUTS core and the pairwise kernels, ahead of first use."""
    from pyro_bnnlv.cli import main

    if compiled.nuts_extension() is None:
        pytest.skip("needs the compiled core")
    assert main(["build"]) == 0
    out = capsys.readouterr().out
    assert f"compiled NUTS core: {compiled.nuts_extension().__file__}" in out
    assert "compiled pairwise kernels: " in out and out.count(".so") == 2
