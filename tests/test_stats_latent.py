import math

import pytest
import torch

import pyro_bnnlv as pb
from pyro_bnnlv.models.bnnlv import BNNLV
from pyro_bnnlv.stats.knn import knn_entropy
from pyro_bnnlv.stats.latent import (
    knn_entropy_1d,
    plot_uncertainty_decomposition,
    predictive_mse,
    reconstruction_mse,
    uncertainty_decomposition,
)


def test_knn_entropy_1d_matches_the_general_estimator_and_closed_form():
    g = torch.Generator().manual_seed(0)
    x = (
        torch.randn(6, 400, generator=g, dtype=torch.float64)
        * torch.tensor([0.5, 1, 2, 3, 4, 5.0]).unsqueeze(-1).double()
    )
    batched = knn_entropy_1d(x, k=5)
    for i in range(6):
        assert batched[i].item() == pytest.approx(knn_entropy(x[i].unsqueeze(-1), k=5).item(), rel=1e-10)
    sd = torch.tensor([0.5, 1, 2, 3, 4, 5.0], dtype=torch.float64)
    exact = 0.5 * torch.log(2 * math.pi * math.e * sd**2)
    assert (batched - exact).abs().max() < 0.1  # n = 400, k = 5: sd of the estimate ~0.05


def _linear_lv():
    """y = a x + b z + eps with fixed weights: every entropy has a closed form."""
    net = pb.MLP(2, [], 1, activation="identity")  # f([x, z]) = w0 x + w1 z + w2
    model = BNNLV(net, latent_dim=1, latent_scale=1.0, noise_scale=0.5)
    return model


def test_uncertainty_decomposition_closed_form():
    model = _linear_lv()
    # two weight samples differing only in the bias: epistemic = mixture of two Gaussians
    w = torch.tensor([[1.0, 2.0, -1.0], [1.0, 2.0, 1.0]])
    x = torch.tensor([[0.0], [3.0]])
    frame = uncertainty_decomposition(model, w, x, num_inner=4000, k=5, seed=0)
    sd = math.sqrt(2.0**2 + 0.5**2)  # latent contribution b * sigma_z, plus noise
    aleatoric = 0.5 * math.log(2 * math.pi * math.e * sd**2)
    assert frame["aleatoric"].tolist() == pytest.approx([aleatoric] * 2, abs=0.05)
    # total: entropy of 0.5 N(-1, sd^2) + 0.5 N(1, sd^2), by numerical integration
    t = torch.linspace(-15, 15, 20001, dtype=torch.float64)
    dens = 0.5 * (
        torch.distributions.Normal(-1.0, sd).log_prob(t).exp() + torch.distributions.Normal(1.0, sd).log_prob(t).exp()
    )
    total = -(dens * dens.log()).sum().item() * (t[1] - t[0]).item()
    assert frame["total"].tolist() == pytest.approx([total] * 2, abs=0.05)
    assert (frame["epistemic"] > 0).all() and (frame["epistemic"] < 0.2).all()


def test_reconstruction_and_predictive_mse():
    model = _linear_lv()
    w = torch.tensor([[1.0, 2.0, 0.0]]).expand(3, 3)
    x = torch.linspace(-1, 1, 10).unsqueeze(-1)
    z = torch.randn(3, 10, 1)
    y = x[:, 0] + 2 * z[0, :, 0]
    rec = reconstruction_mse(model, {"w": w, "z": z}, x, y)
    expected = (y - (x[:, 0] + 2 * z[:, :, 0])).square().mean().item()
    assert rec == pytest.approx(expected, rel=1e-6)
    assert reconstruction_mse(model, {"w": w[:1], "z": z[:1]}, x, y) == pytest.approx(0.0, abs=1e-10)
    # predictive: latents from the prior; with many samples E f = x, so MSE -> mean (2 z_0)^2
    many = {"w": torch.tensor([[1.0, 2.0, 0.0]]).expand(20000, 3)}
    pmse = predictive_mse(model, many, x, y, seed=0)
    assert pmse == pytest.approx((2 * z[0, :, 0]).square().mean().item(), abs=0.01)


def test_plot_uncertainty_decomposition(tmp_path):
    model = _linear_lv()
    w = torch.randn(20, 3)
    frame = uncertainty_decomposition(model, w, torch.linspace(-2, 2, 15).unsqueeze(-1), num_inner=50)
    plot_uncertainty_decomposition({"a": frame, "b": frame}, tmp_path / "ud.png")
    assert (tmp_path / "ud.png").stat().st_size > 5000
