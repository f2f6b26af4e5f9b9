"""Library code raises no tracer warning: compiled losses over the library's models, vectorised
particles included (pyproject.toml makes any tracer warning in the suite an error; these tests say
it where it matters)."""

import warnings
from pathlib import Path

import pyro
import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv._tracing import shape_branches


def _models():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 1, generator=g)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(24, generator=g)
    task = torch.arange(24) % 3
    return {
        "bnn": (pb.BNN(pb.MLP(1, [6], 1), noise_scale=0.3), x, y, {}),
        "bnn+lv": (pb.BNNLV(pb.MLP(2, [6], 1), noise_scale=0.3), x, y, {}),
        "linear": (pb.OverparametrisedLinear(4, noise_scale=0.5), x.double(), y.double(), {}),
        "projected multi-task": (pb.ProjectedBNN(pb.MLP(1, [6], 1), latent_dim=2, num_tasks=3), x, y, {"task": task}),
    }


@pytest.mark.parametrize("name", list(_models()))
@pytest.mark.parametrize("particles", [None, 1, 4])
def test_compiled_losses_over_library_models_raise_no_tracer_warning(name, particles):
    """``None``: fit_svi's default loss (fused, no JIT)."""
    from pyro.infer.autoguide import AutoNormal

    model, x, y, kwargs = _models()[name]
    loss = None
    if particles is not None:
        loss = pb.CompiledTraceElbo(num_particles=particles, vectorize_particles=particles > 1, max_plate_nesting=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        warnings.filterwarnings("error", message=".*disagrees with its eager twin")
        losses = pb.fit_svi(
            model,
            AutoNormal(model),
            x,
            y,
            num_steps=12,
            lr=0.01,
            seed=0,
            progress=False,
            loss=loss,
            model_kwargs=kwargs,
        )
    assert all(torch.isfinite(torch.tensor(losses)))


def _torch_default_filters():
    """A script's warning filters: default actions, and torch's own filter hiding the tracer
    warnings of torch's internals (torch.jit._trace, TracerWarning.ignore_lib_warnings)."""
    warnings.resetwarnings()
    warnings.simplefilter("always")
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning, module="torch.(?!jit)")


def test_a_kept_trace_shows_the_users_tracer_warnings_where_they_arose_and_not_torchs():
    """A compiled loss (on request): the first step's tracer warnings are held and shown, as
    if raised in place: the user's own (a branch on a traced size, in this file) is shown; torch's
    internal one (``Normal(loc, 0.01)`` makes a constant inside torch.distributions) stays hidden
    by torch's filter; an "error" filter raises the user's, naming where; and a step that fails
    for another reason still shows them, beside its error."""
    model = pb.BNN(pb.MLP(1, [3], 1))
    x, y = torch.randn(10, 1), torch.randn(10)

    def guide(x, y, batch_size=None):
        loc = pyro.param("tracing_test_loc", torch.zeros(model.num_weights))
        if x.shape[0] == 10:  # the user's own branch on a (traced) size
            loc = loc + 0.0
        pyro.sample("w", pyro.distributions.Normal(loc, 0.01).to_event(1))

    with warnings.catch_warnings(record=True) as record:
        _torch_default_filters()
        pb.fit_svi(model, guide, x, y, num_steps=3, progress=False, loss=pb.CompiledTraceElbo())
    tracer = [w for w in record if issubclass(w.category, torch.jit.TracerWarning)]
    assert [(Path(w.filename).name, "Python boolean" in str(w.message)) for w in tracer] == [("test_tracing.py", True)]

    with warnings.catch_warnings():
        _torch_default_filters()
        warnings.filterwarnings("error", category=torch.jit.TracerWarning, module=__name__)
        with pytest.raises(torch.jit.TracerWarning) as info:
            pb.fit_svi(model, guide, x, y, num_steps=3, progress=False, loss=pb.CompiledTraceElbo())
    assert any("test_tracing.py" in note for note in info.value.__notes__)

    def failing_guide(x, y, batch_size=None):  # fails while traced (eager calls come first)
        guide(x, y, batch_size)
        if torch.jit.is_tracing():
            raise ValueError("the guide's own error")

    with warnings.catch_warnings(record=True) as record:
        _torch_default_filters()
        with pytest.raises(ValueError, match="the guide's own error"):
            pb.fit_svi(model, failing_guide, x, y, num_steps=3, progress=False, loss=pb.CompiledTraceElbo())
    assert [Path(w.filename).name for w in record if issubclass(w.category, torch.jit.TracerWarning)] == [
        "test_tracing.py"
    ]


def test_shape_branches_hides_only_boolean_conversions_and_only_while_tracing():
    def f(x):
        with shape_branches():
            out = x * 2 if x.shape[0] == 3 else x
            return out + torch.tensor(1.0)  # a constant: still warns

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        traced = torch.jit.trace(f, (torch.ones(3),))
    messages = [str(w.message) for w in record if issubclass(w.category, torch.jit.TracerWarning)]
    assert messages and all("registered as constants" in m for m in messages)
    assert torch.equal(traced(torch.ones(3)), torch.full((3,), 3.0))
    with warnings.catch_warnings():  # eager: nothing is changed (a warning inside still shows)
        warnings.simplefilter("error")
        with pytest.raises(UserWarning), shape_branches():
            warnings.warn("shown", UserWarning)


def test_compiled_loss_keeps_one_graph_per_argument_dtype():
    """A graph records its inputs' dtypes: the same model and guide called with float64 data after
    float32 data of the same shape get a graph of their own, equal to the eager loss."""
    from pyro.infer import Trace_ELBO

    model = pb.BNN(pb.MLP(1, [3], 1), noise_scale=0.5)
    scale = torch.tensor(0.1)

    def guide(x, y, batch_size=None):
        loc = pyro.param("dtype_test_loc", torch.zeros(model.num_weights, dtype=x.dtype))
        pyro.sample("w", pyro.distributions.Normal(loc, scale.to(x.dtype)).to_event(1))

    loss = pb.CompiledTraceElbo()
    x, y = torch.randn(8, 1), torch.randn(8)
    with pyro.get_param_store().scope():
        loss.differentiable_loss(model, guide, x, y)
    model.double()
    with pyro.get_param_store().scope():
        loss.differentiable_loss(model, guide, x.double(), y.double())  # traces (its draws differ)
        pyro.set_rng_seed(0)
        compiled = loss.differentiable_loss(model, guide, x.double(), y.double())
        pyro.set_rng_seed(0)
        eager = Trace_ELBO().differentiable_loss(model, guide, x.double(), y.double())
    assert len(loss._compiled) == 2 and compiled.dtype == torch.float64
    assert torch.allclose(compiled, eager)
