import math
import warnings

import pyro
import pytest
import torch
from pyro.infer import JitTrace_ELBO, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
import pyro_bnnlv.infer.svi as svi_mod
from pyro_bnnlv.datasets import load_dataset


def _fit(seed, steps=30, **kw):
    data = load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [10], 1))
    guide = AutoNormal(model, init_scale=0.01)
    hist = pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=steps, seed=seed, progress=False, **kw)
    return model, guide, hist


def test_same_seed_same_numbers():
    _, g1, h1 = _fit(seed=3)
    _, g2, h2 = _fit(seed=3)
    _, _, h3 = _fit(seed=4)
    assert h1 == h2
    assert h1 != h3
    for (n1, p1), (n2, p2) in zip(g1.named_parameters(), g2.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


def test_jit_default_loss_equals_trace_elbo():
    """The compiled default computes the same estimator: same seed, same loss values."""
    data = load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [10], 1))
    guide = AutoNormal(model, init_scale=0.1)
    guide(data.x_train, data.y_train)
    losses = []
    for elbo in (Trace_ELBO(), JitTrace_ELBO()):
        vals = []
        for seed in range(3):
            pyro.set_rng_seed(seed)
            vals.append(elbo.loss(model, guide, data.x_train, data.y_train))
        losses.append(vals)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_svi_descends_and_beats_prior_predictive_on_cosine_toy():
    data = load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [50], 1), prior_scale=1.0, noise_scale=0.1)
    guide = AutoNormal(model, init_scale=0.01, init_loc_fn=pb.init_to_network(model, seed=0))
    hist = pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=1500, lr=0.01, seed=0, progress=False)
    assert sum(hist[-100:]) / 100 < 0.3 * sum(hist[:100]) / 100
    post = pb.sample_posterior(model, guide, data.x_train, num_samples=300, seed=0)
    prior = Predictive(model, num_samples=300, parallel=True, return_sites=["w"])(data.x_train)
    m_post = pb.evaluate(model, post, data.x_test, data.y_test)
    m_prior = pb.evaluate(model, prior["w"], data.x_test, data.y_test)
    # the prior predictive of a 50-unit N(0,1) network is very wide; the posterior fits the data
    # measured: posterior 0.50 vs prior -2.55 nats per point; demand 2 nats (a 7x density ratio)
    assert m_post["test_ll"] > m_prior["test_ll"] + 2.0
    assert m_post["test_ll"] > 0.2  # measured 0.50 (NUTS-quality fits reach about 0.8)
    assert m_post["rmse"] < 0.2  # measured 0.15; the noise std is 0.1


def test_minibatch_training_runs_and_descends():
    data = load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [20], 1))
    guide = AutoNormal(model, init_scale=0.01)
    hist = pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=300, batch_size=20, seed=0, progress=False)
    assert sum(hist[-30:]) < sum(hist[:30])


def test_non_finite_loss_names_the_step():
    data = load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [10], 1))
    guide = AutoNormal(model)
    calls = {"n": 0}

    class Exploding(Trace_ELBO):
        def loss_and_grads(self, model, guide, *args, **kwargs):
            calls["n"] += 1
            loss = super().loss_and_grads(model, guide, *args, **kwargs)
            return float("nan") if calls["n"] == 4 else loss

    with pytest.raises(pb.NonFiniteLossError, match="at step 3"):
        pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=10, loss=Exploding(), progress=False)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_steps=0), "num_steps"),
        (dict(num_steps=5, lr=-1.0), "lr"),
        (dict(num_steps=5, batch_size=0), "batch_size"),
        (dict(num_steps=5, batch_size=10_000), "batch_size"),
    ],
)
def test_bad_fit_arguments_raise(kwargs, match):
    data = load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [5], 1))
    with pytest.raises(ValueError, match=match):
        pb.fit_svi(model, AutoNormal(model), data.x_train, data.y_train, progress=False, **kwargs)


def test_two_models_in_one_script_do_not_share_parameters():
    data = load_dataset("cosine")
    fits = []
    for seed in (0, 1):
        model = pb.BNN(pb.MLP(1, [10], 1))
        guide = AutoNormal(model, init_scale=0.01)
        pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=50, seed=seed, progress=False)
        fits.append((model, guide, guide.locs.w.detach().clone()))
    assert not torch.allclose(fits[0][2], fits[1][2])
    # sampling from the second guide must not pick up the first one's parameters and vice versa
    for model, guide, loc in fits:
        s = pb.sample_posterior(model, guide, data.x_train, num_samples=4000, seed=0)
        assert torch.allclose(s["w"].mean(0), loc, atol=0.01)
    assert len(pyro.get_param_store()) == 0


def test_bare_pyro_params_survive_isolation():
    data = load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [5], 1))

    scale = torch.tensor(0.01)  # a tensor: a Python float would make torch warn under the suite's filter

    def guide(x, y, batch_size=None):
        loc = pyro.param("my_loc", torch.zeros(model.num_weights))
        pyro.sample("w", pyro.distributions.Normal(loc, scale).to_event(1))

    pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=5, progress=False)
    assert "my_loc" in pyro.get_param_store()


def test_train_map_fits_the_data():
    data = load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [50], 1), noise_scale=0.1)
    w = pb.train_map(model, data.x_train, data.y_train, num_steps=2000, lr=0.01, seed=0, progress=False)
    pred = model.f(data.x_test, w).squeeze(-1)
    rmse = (pred - data.y_test).square().mean().sqrt()
    assert rmse < 0.15  # noise std is 0.1
    w2 = pb.train_map(model, data.x_train, data.y_train, num_steps=2000, lr=0.01, seed=0, progress=False)
    assert torch.equal(w, w2)
    assert math.isfinite(float(w.sum()))


def test_train_map_refuses_a_zero_learning_rate_and_models_with_other_latents():
    data = pb.load_dataset("cosine", sizes=(20, 5, 5))
    bnn = pb.BNN(pb.MLP(1, [5], 1))
    with pytest.raises(ValueError, match="lr must be a positive number"):
        pb.train_map(bnn, data.x_train, data.y_train, lr=0.0, num_steps=5)
    lv = pb.BNNLV(pb.MLP(2, [5], 1))
    with pytest.raises(TypeError, match="AutoDelta"):
        pb.train_map(lv, data.x_train, data.y_train, num_steps=5)
    with pytest.raises(TypeError, match="BNN\\+LV"):
        pb.ncai_guide(bnn, data.x_train, data.y_train)


def _module_net_model():
    from torch import nn

    torch.manual_seed(0)
    net = pb.ModuleNet(nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1)), 2, 1)
    return pb.BNN(net, noise_scale=0.1)


def test_module_net_trains_eagerly_without_a_jit_warning():
    """``ModuleNet``'s functional call cannot be traced: the default loss is eager from the start."""
    model = _module_net_model()
    x, y = torch.randn(30, 2), torch.randn(30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning (a JIT fallback included) fails the test
        losses = pb.fit_svi(model, pb.MeanField(model), x, y, num_steps=30, lr=0.01, seed=0, progress=False)
    assert losses[-1] < losses[0]


def test_low_rank_guide_trains_eagerly_without_a_guard_warning():
    """The compiled loss of Pyro's AutoLowRankMultivariateNormal differs from the eager one at the
    same random state (the JIT guard caught it at step 1, warned and went eager): the default loss
    is eager for it from the start, and still differs when compiled (so the choice is needed)."""
    import pyro
    from pyro.infer import Trace_ELBO
    from pyro.infer.autoguide import AutoLowRankMultivariateNormal

    torch.manual_seed(0)
    x = torch.randn(24, 1)
    y = torch.sin(x[:, 0])
    model = pb.BNN(pb.MLP(1, [4], 1), noise_scale=0.3)
    guide = AutoLowRankMultivariateNormal(model, rank=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*disagrees with its eager twin")
        losses = pb.fit_svi(model, guide, x, y, num_steps=30, lr=0.01, seed=0, progress=False)
    assert losses[-1] < losses[0]
    compiled = pb.CompiledTraceElbo()
    values = []
    for loss in (compiled, compiled, Trace_ELBO()):  # traced, compiled, eager: same random state
        pyro.set_rng_seed(1)
        with warnings.catch_warnings():  # tracing Pyro's low-rank Gaussian: its shape checks warn
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            values.append(float(loss.differentiable_loss(model, guide, x, y)))
    assert abs(values[1] - values[2]) > 1e-3 * abs(values[2])  # still wrong when compiled


def test_a_users_model_trains_eagerly_without_a_warning_and_model_errors_come_first():
    """A plain function around a model (not recognised) gets eager ``Trace_ELBO``: no JIT, no
    fallback and no warning; a guide's own error is raised as it is."""
    bnn = _module_net_model()

    def model(x, y=None):
        return bnn(x, y)

    x, y = torch.randn(30, 2), torch.randn(30)
    assert type(svi_mod._default_loss(model, pb.MeanField(model))) is Trace_ELBO
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        losses = pb.fit_svi(model, pb.MeanField(model), x, y, num_steps=5, seed=0, progress=False)
    assert len(losses) == 5 and all(math.isfinite(v) for v in losses)
    from pyro_bnnlv.guides import HypernetGuide

    mlp_model = pb.BNN(pb.MLP(2, [8], 1), noise_scale=0.1)
    with pytest.raises(NotImplementedError, match="KNNElbo"):
        pb.fit_svi(mlp_model, HypernetGuide(mlp_model), x, y, num_steps=5, seed=0, progress=False)


def test_default_loss_is_fused_for_the_librarys_pairs_and_eager_trace_elbo_otherwise():
    from pyro.infer.autoguide import AutoLowRankMultivariateNormal

    bnn, lv = pb.BNN(pb.MLP(1, [4], 1)), pb.BNNLV(pb.MLP(2, [4], 1))
    fused = [
        (bnn, pb.MeanField(bnn)),
        (bnn, AutoNormal(bnn)),
        (lv, pb.MeanField(lv)),
        (lv, AutoNormal(lv, create_plates=lv.create_plates)),
    ]
    for model, guide in fused:
        assert type(svi_mod._default_loss(model, guide)) is pb.FusedTraceElbo
    eager = [
        (lv, AutoNormal(lv)),  # z not subsampled with the model's plate
        (bnn, AutoLowRankMultivariateNormal(bnn)),
        (_module_net_model(), None),
        (lambda x, y=None: bnn(x, y), pb.MeanField(bnn)),
    ]
    for model, guide in eager:
        guide = guide if guide is not None else pb.MeanField(model)
        assert type(svi_mod._default_loss(model, guide)) is Trace_ELBO


def test_default_path_calls_no_torch_jit(monkeypatch):
    """The README quick start's fit (shortened) with ``torch.jit.trace`` made to raise."""

    def refuse(*args, **kwargs):
        raise AssertionError("torch.jit.trace called in fit_svi's default path")

    monkeypatch.setattr(torch.jit, "trace", refuse)
    data = load_dataset("cosine")
    model = pb.BNN(pb.MLP(1, [50], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1)
    guide = pb.MeanField(model)
    losses = pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=120, lr=0.01, seed=0, progress=False)
    assert sum(losses[-20:]) < sum(losses[:20])
    lv = pb.BNNLV(pb.MLP(2, [8], 1))
    pb.fit_svi(lv, pb.MeanField(lv), data.x_train, data.y_train, num_steps=20, batch_size=16, seed=0, progress=False)
    with pytest.raises(AssertionError, match="torch.jit.trace called"):  # the patch bites
        pb.fit_svi(
            model,
            pb.MeanField(model),
            data.x_train,
            data.y_train,
            num_steps=2,
            progress=False,
            loss=pb.CompiledTraceElbo(),
        )


_BRANCHY_MODEL = """
import torch, pyro, pyro.distributions as dist

def model(x, y=None):
    b = pyro.param("b", torch.tensor(1.0))
    scale = 0.1 if float(b) < THRESHOLD else 10.0  # a Python branch on a parameter's value
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(b * x[:, 0], scale), obs=y)

def guide(x, y=None):
    pass

torch.manual_seed(0)
x = torch.randn(50, 1)
y = 2.5 * x[:, 0] + 0.1 * torch.randn(50)
"""


def _branchy(threshold: float) -> dict:
    namespace: dict = {}
    exec(_BRANCHY_MODEL.replace("THRESHOLD", str(threshold)), namespace)  # noqa: S102
    return namespace


def _fit_b(ns: dict, loss, steps: int = 60) -> float:
    with pyro.get_param_store().scope():
        pb.fit_svi(
            ns["model"], ns["guide"], ns["x"], ns["y"], num_steps=steps, lr=0.05, seed=0, progress=False, loss=loss
        )
        return float(pyro.param("b"))


def test_a_branch_on_a_parameter_value_is_followed_by_the_default_loss():
    """Issue 39 item 8: the default is eager for a user's model, so the branch (flipping between
    the guard's steps 10 and 100 under the compiled loss) is followed: b after 60 steps equals
    the eager fit's; the compiled loss on request does not."""
    ns = _branchy(1.5)
    default, eager = _fit_b(ns, None), _fit_b(ns, Trace_ELBO())
    assert default == eager
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        compiled = _fit_b(ns, pb.CompiledTraceElbo())
    assert abs(compiled - eager) > 0.1  # the frozen branch, not caught between the guard's steps


def test_the_jit_guard_restarts_a_compiled_fit_from_the_initial_parameters():
    """A branch that flips before step 10: the guard catches it there and the fit restarts
    eagerly from the start, ending where the eager fit of the same seed ends (not continuing
    from the state the frozen branch produced)."""
    ns = _branchy(1.2)
    eager = _fit_b(ns, Trace_ELBO())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        compiled = _fit_b(ns, pb.CompiledTraceElbo())
    assert compiled == eager
    guard = [str(w.message) for w in record if "disagrees with its eager twin" in str(w.message)]
    assert len(guard) == 1 and "at step 10" in guard[0] and "restarting from the initial parameters" in guard[0]


def test_a_compiled_fit_in_a_script_read_from_standard_input_runs(tmp_path):
    """``python - < script.py``: re-emitting the tracer warnings of a model in ``__main__`` (whose
    loader cannot give its source) used to raise ImportError."""
    import subprocess
    import sys

    script = _BRANCHY_MODEL.replace("THRESHOLD", "1.5") + (
        "import pyro_bnnlv as pb\n"
        "pb.fit_svi(model, guide, x, y, num_steps=12, lr=0.05, seed=0, progress=False, loss=pb.CompiledTraceElbo())\n"
        "print('b', float(pyro.param('b')))\n"
    )
    out = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("b ") and "TracerWarning" in out.stderr


def _diverging_fit(kind: str, lr: float, **fit_kwargs):
    torch.manual_seed(0)
    x = torch.randn(50, 1)
    y = torch.sin(x[:, 0])
    model = pb.BNNLV(pb.MLP(2, [10], 1)) if kind == "bnnlv" else pb.BNN(pb.MLP(1, [10], 1))
    guide = AutoNormal(model) if kind == "autonormal" else pb.MeanField(model)
    if kind == "bnnlv":
        fit_kwargs.setdefault("batch_size", 10)
    return pb.fit_svi(model, guide, x, y, num_steps=200, lr=lr, seed=0, progress=False, **fit_kwargs)


@pytest.mark.parametrize(
    "kind, lr, fit_kwargs",
    [
        ("meanfield", 1e3, {}),
        ("meanfield", 1e6, {}),
        ("autonormal", 1e3, {}),
        ("bnnlv", 1e3, {}),
        ("meanfield", 1e3, {"loss": Trace_ELBO()}),
        ("meanfield", 1e3, {"check_jit": False}),  # the fused loss alone: an infinite loss
    ],
)
def test_a_huge_learning_rate_raises_non_finite_loss_error(kind, lr, fit_kwargs):
    """Issue 39 item 3: divergence is a NonFiniteLossError naming the step and the fix, not
    torch's "Expected parameter scale ... GreaterThan" dump."""
    with pytest.raises(pb.NonFiniteLossError, match=r"at step [1-9]\d*; try a smaller learning rate") as info:
        _diverging_fit(kind, lr, **fit_kwargs)
    assert "Expected parameter" not in str(info.value) and info.value.step >= 1


def test_a_model_error_at_the_first_step_is_not_called_divergence():
    """A distribution refusing a parameter at step 0 is the model's own error, raised as it is."""
    x, y = torch.randn(10, 1), torch.randn(10)

    def model(x, y=None):
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", pyro.distributions.Normal(x[:, 0], -1.0), obs=y)

    with pytest.raises(ValueError, match="Expected parameter scale"):
        pb.fit_svi(model, lambda x, y=None: None, x, y, num_steps=3, progress=False)


def test_train_map_fits_a_learned_noise_scale_and_ignores_where_svi_left_it():
    """``learn_noise=True``: sigma is fitted with w (from the model's current value) and written
    back; the result no longer depends on the value an earlier fit left in the model."""
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-2, 2, 200).unsqueeze(-1)
    y = torch.sin(2 * x).squeeze(-1) + 0.2 * torch.randn(200, generator=g)
    fits = []
    for start in (0.05, 1.0):  # what an earlier SVI fit might have left in the model
        model = pb.BNN(pb.MLP(1, [20], 1, activation="tanh"), noise_scale=start, learn_noise=True)
        w = pb.train_map(model, x, y, num_steps=1500, lr=0.02, seed=0, progress=False)
        fits.append((w, float(model.noise_scale)))
    (w_a, s_a), (w_b, s_b) = fits
    assert 0.15 < s_a < 0.26 and 0.15 < s_b < 0.26  # the generating 0.2, from either start
    assert abs(s_a - s_b) < 0.02
    fixed = pb.BNN(pb.MLP(1, [20], 1, activation="tanh"), noise_scale=1.0)
    pb.train_map(fixed, x, y, num_steps=50, seed=0, progress=False)
    assert float(fixed.noise_scale) == 1.0  # a fixed sigma stays fixed


def test_plateau_schedule_decays_the_rate_and_stops_when_it_is_spent():
    """PlateauSchedule (HyVI sec. 4.3): the epoch-mean loss goes to ReduceLROnPlateau; training
    stops once the rate is below min_lr, before the num_steps cap; rates follow lr * factor^k."""
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 40)[:, None]
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(40)
    model = pb.BNN(pb.MLP(1, [5], 1), noise_scale=0.1)
    seen = []
    real_step = torch.optim.lr_scheduler.ReduceLROnPlateau.step

    def spy(self, metrics, *args, **kwargs):
        real_step(self, metrics, *args, **kwargs)
        seen.append(self.optimizer.param_groups[0]["lr"])

    schedule = pb.PlateauSchedule(factor=0.5, patience=2, min_lr=1e-3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.lr_scheduler.ReduceLROnPlateau, "step", spy)
        hist = pb.fit_svi(
            model,
            pb.MeanField(model, seed=0),
            x,
            y,
            num_steps=20000,
            lr=0.01,
            batch_size=10,
            seed=0,
            progress=False,
            lr_schedule=schedule,
        )
    assert len(hist) < 20000 and len(hist) % 4 == 0  # stopped at an epoch's end (4 steps each)
    assert len(seen) == len(hist) // 4
    assert seen[-1] < 1e-3 <= seen[-2]  # stopped at the first epoch below min_lr
    assert set(seen) <= {0.01 * 0.5**k for k in range(10)}
    assert seen == sorted(seen, reverse=True)


def test_plateau_schedule_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="factor must lie in"):
        pb.PlateauSchedule(factor=1.5)
    with pytest.raises(ValueError, match="min_lr"):
        pb.PlateauSchedule(min_lr=0.0)
    with pytest.raises(ValueError, match="patience"):
        pb.PlateauSchedule(patience=-1)
    model = pb.BNN(pb.MLP(1, [2], 1))
    with pytest.raises(TypeError, match="lr_schedule must be a pb.PlateauSchedule"):
        pb.fit_svi(
            model,
            pb.MeanField(model),
            torch.zeros(4, 1),
            torch.zeros(4),
            num_steps=2,
            progress=False,
            lr_schedule={"factor": 0.7},
        )


@pytest.mark.parametrize("offset", [100.0, -100.0])
def test_plateau_schedule_decays_on_negative_losses_too(offset):
    """A worsening epoch loss is no progress whatever its sign (torch's default relative
    threshold would count a slightly worse negative loss as an improvement)."""
    from pyro_bnnlv.infer.svi import _PlateauStopper

    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([w], lr=0.01)
    stopper = _PlateauStopper(pb.PlateauSchedule(factor=0.5, patience=2, min_lr=1e-6), opt, steps_per_epoch=1)
    for epoch in range(9):
        stopper.done(offset + 0.005 * epoch)  # gets worse every epoch
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**2)  # decays at epochs 3 and 6
