"""Guides own their parameters: Pyro's global param store never hands one fitted guide another's
values (issue 16, silent wrong result 1)."""

import gc
import warnings

import pytest
import torch
from pyro.infer import Predictive
from pyro.infer.autoguide import AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.guides import HypernetGuide, hypernet_lv_guide
from pyro_bnnlv.param_names import param_fullnames

X = torch.linspace(-1, 1, 40).unsqueeze(-1)
Y = torch.sin(3 * X).squeeze(-1)


def _model(seed: int = 0) -> pb.BNN:
    torch.manual_seed(seed)
    return pb.BNN(pb.MLP(1, [10], 1, activation="tanh"), prior_scale=1.0, noise_scale=0.1)


def _raw_fit_corr(model, guide, y) -> float:
    """Correlation of a raw ``Predictive`` mean with ``y``."""
    f = Predictive(model, guide=guide, num_samples=50)(X)["obs"].mean(0)
    return torch.corrcoef(torch.stack([f, y]))[0, 1].item()


def _fit(model, guide, y) -> None:
    pb.fit_svi(model, guide, X, y, num_steps=300, lr=0.02, seed=0, progress=False)


def test_two_mean_field_guides_predict_with_their_own_posteriors_in_raw_predictive():
    ma, mb = _model(0), _model(1)
    ga, gb = pb.MeanField(ma), pb.MeanField(mb)
    _fit(ma, ga, Y)
    _fit(mb, gb, -Y)  # B fits the mirrored curve
    b_locs = gb.locs.w.detach().clone()
    assert _raw_fit_corr(ma, ga, Y) > 0.9
    assert _raw_fit_corr(mb, gb, -Y) > 0.9  # before the fix: -0.99 (A's posterior)
    assert _raw_fit_corr(ma, ga, Y) > 0.9
    torch.testing.assert_close(gb.locs.w.detach(), b_locs)  # nothing was written into B
    assert ga._pyro_name != gb._pyro_name


def test_plain_autoguides_sharing_names_warn_with_the_fix():
    ma, mb = _model(0), _model(1)
    ga = AutoNormal(ma, init_loc_fn=pb.init_to_network(ma))
    gb = AutoNormal(mb, init_loc_fn=pb.init_to_network(mb))
    _fit(ma, ga, Y)
    with pytest.warns(UserWarning, match="own_param_names"):
        _fit(mb, gb, -Y)
    # the fix the warning names
    gc_ = pb.own_param_names(AutoNormal(mb, init_loc_fn=pb.init_to_network(mb)))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="two fitted guides")
        _fit(mb, gc_, -Y)
    assert _raw_fit_corr(mb, gc_, -Y) > 0.9


def test_a_rerun_cell_does_not_inherit_the_previous_guides_values():
    """A notebook re-runs a cell: a new AutoNormal of the same class, fitted to other data, while
    the store still holds the old guide's tensors from a raw Predictive call."""
    model = _model(0)
    old = AutoNormal(model, init_loc_fn=pb.init_to_network(model))
    _fit(model, old, Y)
    assert _raw_fit_corr(model, old, Y) > 0.9  # puts old's tensors in the global store
    del old
    gc.collect()
    new = AutoNormal(model, init_loc_fn=pb.init_to_network(model, seed=1))
    _fit(model, new, -Y)
    assert _raw_fit_corr(model, new, -Y) > 0.9  # before the fix: the old fit's curve


def test_own_param_names_renames_every_part_and_refuses_a_used_guide():
    model = _model(0)
    g1, g2 = HypernetGuide(model), HypernetGuide(model)
    with torch.no_grad():
        g1(X, Y), g2(X, Y)
    n1, n2 = set(param_fullnames(g1)), set(param_fullnames(g2))
    assert n1 and n2 and not n1 & n2
    lv = pb.BNNLV(pb.MLP(2, [10], 1), prior_scale=1.0, noise_scale=0.1)
    a, b = hypernet_lv_guide(lv), hypernet_lv_guide(lv)
    assert a[0]._pyro_name.startswith(a._pyro_name + ".") and a._pyro_name != b._pyro_name
    with pytest.raises(RuntimeError, match="before the guide first runs"):
        pb.own_param_names(g1)
    with pytest.raises(TypeError, match="PyroModule"):
        pb.own_param_names(lambda x, y: None)


def test_readme_quick_start_pattern_twice_in_one_process_gives_the_same_numbers():
    out = []
    for _ in range(2):
        model = _model(0)
        guide = pb.MeanField(model)
        _fit(model, guide, Y)
        torch.manual_seed(1)
        out.append(Predictive(model, guide=guide, num_samples=20)(X)["obs"].mean(0))
    assert _raw_fit_corr(model, guide, Y) > 0.9
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0)
