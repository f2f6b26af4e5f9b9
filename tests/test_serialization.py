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
        pb.fit_svi(model, guide, data.x_train, data.y_train, num_steps=30, seed=seed,
                   progress=False)  # fmt: skip
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
