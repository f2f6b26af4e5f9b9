"""save_fit / load_fit round trip for every model x guide pair the library ships, with and
without y, in float32 and (where the README promises it) float64: the reloaded pair draws the
same posterior samples, bit for bit, from the same seed."""

import pytest
import torch
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoLowRankMultivariateNormal,
    AutoMultivariateNormal,
    AutoNormal,
)

import pyro_bnnlv as pb
from pyro_bnnlv.guides import hypernet_lv_guide
from pyro_bnnlv.serialization import load_fit, save_fit


def _data(in_features, n=24, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, in_features, generator=g) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(n, generator=g)
    return x.to(dtype), y.to(dtype)


def _fit(model, guide, x, y, loss=None, **kwargs):
    pb.fit_svi(model, guide, x, y, num_steps=15, seed=0, progress=False, loss=loss, **kwargs)
    return guide


def _laplace(structure):
    def make(model, x, y):
        w_map = pb.train_map(model, x, y, num_steps=50, seed=0, progress=False)
        return pb.LinearizedLaplace(model, w_map, structure=structure).fit(x, y).as_guide(x.dtype)

    return make


def _knn(model, guide, x, y):
    return _fit(model, guide, x, y, loss=pb.KNNElbo(num_particles=4, num_kl_samples=20, num_prior_samples=20))


BNN = lambda: pb.BNN(pb.MLP(1, [6], 1), noise_scale=0.2, learn_noise=True)  # noqa: E731
BNNLV = lambda: pb.BNNLV(pb.MLP(2, [6], 1), latent_dim=1, noise_scale=0.2)  # noqa: E731
PROJ = lambda: pb.ProjectedBNN(pb.MLP(1, [6], 1), latent_dim=2, decoder_hidden=[5])  # noqa: E731
LIN = lambda: pb.OverparametrisedLinear(K=3, noise_scale=0.5)  # noqa: E731

# name: (model factory, columns of x, guide factory (model, x, y) -> fitted guide, sampled sites)
CASES = {
    "BNN-AutoNormal": (BNN, 1, lambda m, x, y: _fit(m, AutoNormal(m, init_loc_fn=pb.init_to_network(m)), x, y), ("w",)),
    "BNN-MeanField": (BNN, 1, lambda m, x, y: _fit(m, pb.MeanField(m), x, y), ("w",)),
    "BNN-AutoMultivariateNormal": (BNN, 1, lambda m, x, y: _fit(m, AutoMultivariateNormal(m), x, y), ("w",)),
    "BNN-AutoDiagonalNormal": (BNN, 1, lambda m, x, y: _fit(m, AutoDiagonalNormal(m), x, y), ("w",)),
    # rank 2 is not the default (round(sqrt(P)) = 4 for P = 19): save_fit records it, no guide_kwargs
    "BNN-AutoLowRankMultivariateNormal": (
        BNN,
        1,
        lambda m, x, y: _fit(m, AutoLowRankMultivariateNormal(m, rank=2), x, y),
        ("w",),
    ),
    "BNN-AutoLowRankMultivariateNormal-default-rank": (
        BNN,
        1,
        lambda m, x, y: _fit(m, AutoLowRankMultivariateNormal(m), x, y),
        ("w",),
    ),
    "BNN-AutoDelta": (BNN, 1, lambda m, x, y: _fit(m, AutoDelta(m), x, y), ("w",)),
    "BNN-HypernetGuide": (
        BNN,
        1,
        lambda m, x, y: _knn(m, pb.HypernetGuide(m, hidden_sizes=(7,), noise_dim=3), x, y),
        ("w",),
    ),
    "BNN-Laplace-full": (BNN, 1, _laplace("full"), ("w",)),
    "BNN-Laplace-diag": (BNN, 1, _laplace("diag"), ("w",)),
    "BNN-Laplace-last_layer": (BNN, 1, _laplace("last_layer"), ("w",)),
    "BNNLV-AutoNormal": (
        BNNLV,
        1,
        lambda m, x, y: _fit(m, AutoNormal(m, create_plates=m.create_plates), x, y, batch_size=8),
        ("w", "z"),
    ),
    "BNNLV-MeanField": (BNNLV, 1, lambda m, x, y: _fit(m, pb.MeanField(m), x, y, batch_size=8), ("w", "z")),
    "BNNLV-ncai_guide": (BNNLV, 1, lambda m, x, y: _fit(m, pb.ncai_guide(m, x, y, num_steps=20), x, y), ("w", "z")),
    "BNNLV-hypernet_lv_guide": (
        BNNLV,
        1,
        lambda m, x, y: _knn(m, hypernet_lv_guide(m, activation="Tanh"), x, y),
        ("w", "z"),
    ),
    "ProjectedBNN-AutoNormal": (PROJ, 1, lambda m, x, y: _fit(m, AutoNormal(m), x, y), ("w", "z")),
    "ProjectedBNN-MeanField": (PROJ, 1, lambda m, x, y: _fit(m, pb.MeanField(m), x, y), ("w", "z")),
    "Linear-AutoNormal": (LIN, 1, lambda m, x, y: _fit(m, AutoNormal(m), x, y), ("w",)),
    "Linear-MeanField": (LIN, 1, lambda m, x, y: _fit(m, pb.MeanField(m), x, y), ("w",)),
    "BNNLV-AutoLowRankMultivariateNormal": (
        BNNLV,
        1,
        lambda m, x, y: _fit(m, AutoLowRankMultivariateNormal(m, rank=3), x, y),
        ("w", "z"),
    ),
}
FLOAT64 = [
    "BNN-MeanField",
    "BNN-HypernetGuide",
    "BNN-Laplace-full",
    "BNNLV-MeanField",
    "BNNLV-hypernet_lv_guide",
    "BNN-AutoLowRankMultivariateNormal",
]


def _sample(model, guide, x, y, sites, needs_y):
    args = (x, y) if needs_y else (x,)
    return pb.sample_posterior(model, guide, *args, num_samples=6, sites=sites, seed=11)


@pytest.mark.parametrize("with_y", [True, False], ids=["with-y", "without-y"])
@pytest.mark.parametrize("case", list(CASES))
def test_round_trip(case, with_y, tmp_path):
    _run(case, with_y, torch.float32, tmp_path)


@pytest.mark.parametrize("case", FLOAT64)
def test_round_trip_float64(case, tmp_path):
    _run(case, False, torch.float64, tmp_path)


def _run(case, with_y, dtype, tmp_path):
    make_model, in_features, make_guide, sites = CASES[case]
    model = make_model().to(dtype)
    x, y = _data(in_features, dtype=dtype)
    guide = make_guide(model, x, y)
    path = tmp_path / "fit.pt"
    save_fit(path, model, guide, x, y if with_y else None)
    model2, guide2 = load_fit(path)
    assert type(model2) is type(model) and type(guide2) is type(guide)
    for key, value in model.state_dict().items():
        assert model2.state_dict()[key].dtype == value.dtype
        torch.testing.assert_close(model2.state_dict()[key], value, rtol=0, atol=0)
    needs_y = "z" in sites and isinstance(model, pb.BNNLV)  # local latents are indexed by training point
    a = _sample(model, guide, x, y, sites, needs_y)
    b = _sample(model2, guide2, x, y, sites, needs_y)
    for site in sites:
        assert b[site].dtype == dtype
        torch.testing.assert_close(b[site], a[site], rtol=0, atol=0)


def test_hypernet_activation_by_name():
    model = BNN()
    assert pb.HypernetGuide(model, activation="Tanh").activation is torch.nn.Tanh
    assert pb.HypernetGuide(model, activation=torch.nn.ELU).config()["activation"] == "ELU"
    with pytest.raises(ValueError, match="not a torch.nn module class"):
        pb.HypernetGuide(model, activation="os.system")


@pytest.mark.parametrize(
    "model_class, guide_class",
    [
        ("pyro_bnnlv.models.bnn:BNN", "pyro_bnnlv.guides.laplace:LaplaceGuide"),  # before issue 15's move
        ("pyro_bnnlv.models.bnn:BNN", "pyro_bnnlv.infer.laplace_guide:LaplaceGuide"),  # as format 2 wrote
        ("pyro_bnnlv.models.deep.somewhere:BNN", "pyro_bnnlv.infer.laplace.guide:LaplaceGuide"),  # a later move
    ],
)
def test_a_format_2_file_naming_old_module_paths_still_loads(model_class, guide_class, tmp_path):
    """Formats 1-2 named classes ``module:Qualname``; they are read by the last component, so a
    class moved to another module (LaplaceGuide into ``infer``'s sub-packages) keeps loading.
    Format 3 names classes by their registered name."""
    model = pb.BNN(pb.MLP(1, [4], 1), noise_scale=0.3)
    x, y = _data(1)
    guide = _laplace("full")(model, x, y)
    path = tmp_path / "fit.pt"
    save_fit(path, model, guide, x, y)
    payload = torch.load(path, weights_only=True)
    assert (payload["format"], payload["model_class"], payload["guide_class"]) == (3, "BNN", "LaplaceGuide")
    payload.update(format=2, model_class=model_class, guide_class=guide_class)  # written by hand, as format 2 was
    torch.save(payload, path)
    model2, guide2 = load_fit(path)
    assert type(model2) is pb.BNN and isinstance(guide2, pb.LaplaceGuide)
    torch.testing.assert_close(guide2.loc, guide.loc, rtol=0, atol=0)
    torch.testing.assert_close(guide2.scale_tril, guide.scale_tril, rtol=0, atol=0)


def test_format_3_names_classes_only_by_registered_name(tmp_path):
    model = BNN()
    x, y = _data(1)
    guide = _fit(model, pb.MeanField(model), x, y)
    path = tmp_path / "fit.pt"
    save_fit(path, model, guide, x, y)
    payload = torch.load(path, weights_only=True)
    payload["guide_class"] = "pyro_bnnlv.guides.mean_field:MeanField"  # not a registered name
    torch.save(payload, path)
    with pytest.raises(
        ValueError,
        match=r"names the guide class 'pyro_bnnlv.guides.mean_field:MeanField', which is "
        r"not one load_fit rebuilds \(AutoDelta, .*MeanField",
    ):
        load_fit(path)
