import torch
from pyro.infer.autoguide import AutoMultivariateNormal, AutoNormal

import pyro_bnnlv as pb
from pyro_bnnlv.datasets import load_dataset
from pyro_bnnlv.serialization import load_fit, save_fit


def test_round_trip_gives_identical_predictions(tmp_path):
    data = load_dataset("cosine")
    fits = []
    for seed, guide_cls in ((0, AutoNormal), (1, AutoMultivariateNormal)):
        model = pb.BNN(pb.MLP(1, [8], 1), noise_scale=0.2, learn_noise=True)
        guide = guide_cls(model, init_loc_fn=pb.init_to_network(model, seed=seed))
        pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=30, seed=seed, progress=False)
        path = tmp_path / f"fit{seed}.pt"
        save_fit(path, model, guide, data.x_train, data.y_train)
        fits.append((model, guide, path))
    for model, guide, path in fits:
        model2, guide2 = load_fit(path)
        assert type(guide2) is type(guide)
        torch.testing.assert_close(model2.noise_scale, model.noise_scale)
        a = pb.sample_posterior(model, guide, data.x_train, num_samples=50, seed=7)
        b = pb.sample_posterior(model2, guide2, data.x_train, num_samples=50, seed=7)
        torch.testing.assert_close(a["w"], b["w"], rtol=0, atol=0)
        ma = pb.evaluate(model, a, data.x_test, data.y_test)
        mb = pb.evaluate(model2, b, data.x_test, data.y_test)
        assert ma.equals(mb)


def test_projected_bnn_round_trip_single_task_multi_task_and_fixed_phi(tmp_path):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 1, generator=g)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(30, generator=g)
    task = torch.arange(30) % 3
    base = pb.ProjectedBNN(pb.MLP(1, [6], 1), latent_dim=2, decoder_hidden=[5])
    cases = {
        "single": (
            pb.ProjectedBNN(
                pb.MLP(1, [6], 1), latent_dim=2, decoder_hidden=[5], decoder_activation="tanh", noise_scale=0.3
            ),
            {},
        ),
        "multi": (pb.ProjectedBNN(pb.MLP(1, [6], 1), latent_dim=2, num_tasks=3, learn_noise=True), {"task": task}),
        "fixed": (
            pb.ProjectedBNN(
                pb.MLP(1, [6], 1), latent_dim=2, decoder_hidden=[5], fixed_phi=torch.randn(base.num_phi, generator=g)
            ),
            {},
        ),
    }
    for name, (model, kwargs) in cases.items():
        guide = AutoNormal(model)
        pb.fit_svi(model, guide, x, y, num_steps=20, seed=0, progress=False, model_kwargs=kwargs)
        path = tmp_path / f"{name}.pt"
        save_fit(path, model, guide, x, y, model_kwargs=kwargs)
        model2, guide2 = load_fit(path)
        assert type(model2) is pb.ProjectedBNN and model2.num_tasks == model.num_tasks
        assert model2.decoder.config() == model.decoder.config()
        for key, value in model.state_dict().items():
            torch.testing.assert_close(model2.state_dict()[key], value, rtol=0, atol=0)
        a = pb.sample_posterior(model, guide, x, num_samples=20, seed=3, sites=("w", "z"), **kwargs)
        b = pb.sample_posterior(model2, guide2, x, num_samples=20, seed=3, sites=("w", "z"), **kwargs)
        for site in ("w", "z"):
            torch.testing.assert_close(a[site], b[site], rtol=0, atol=0)


def test_save_fit_checks_model_kwargs(tmp_path):
    import pytest

    model = pb.ProjectedBNN(pb.MLP(1, [6], 1), latent_dim=2, num_tasks=3)
    x, y = torch.randn(9, 1), torch.randn(9)
    with pytest.raises(ValueError, match="task="):
        save_fit(tmp_path / "m.pt", model, AutoNormal(model), x, y)
