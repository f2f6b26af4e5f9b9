"""Epistemic entropy per input and the OOD AUROC (HyVI paper sec. 4)."""

import math

import pytest
import torch
from sklearn.metrics import roc_auc_score

import pyro_bnnlv as pb
from pyro_bnnlv.stats import auroc, epistemic_entropy, knn_entropy_1d, ood_report


def test_epistemic_entropy_of_a_gaussian_linear_predictive():
    """f(x) = a x + b with a ~ N(1, 0.3^2), b ~ N(0, 0.2^2): f(x) ~ N(x, 0.09 x^2 + 0.04)."""
    model = pb.BNN(pb.MLP(1, [], 1, activation="identity"))
    g = torch.Generator().manual_seed(0)
    w = torch.stack([1 + 0.3 * torch.randn(4000, generator=g), 0.2 * torch.randn(4000, generator=g)], 1)
    x = torch.tensor([[-3.0], [0.0], [1.0], [5.0]])
    h = epistemic_entropy(model, {"w": w}, x)
    exact = 0.5 * torch.log(2 * math.pi * math.e * (0.09 * x[:, 0] ** 2 + 0.04))
    assert torch.allclose(h, exact, atol=0.05), (h, exact)


def test_knn_entropy_1d_with_ties_stays_finite():
    s = torch.tensor([[0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    assert torch.isfinite(knn_entropy_1d(s, k=1)).all()
    assert torch.isfinite(knn_entropy_1d(s, k=2)).all()


def test_auroc_matches_scikit_learn_with_ties():
    g = torch.Generator().manual_seed(1)
    neg = torch.randint(0, 6, (50,), generator=g).float()
    pos = torch.randint(2, 9, (70,), generator=g).float()
    labels = [0] * 50 + [1] * 70
    ref = roc_auc_score(labels, torch.cat([neg, pos]).numpy())
    assert auroc(neg, pos) == pytest.approx(ref, abs=1e-12)
    assert auroc(torch.zeros(3), torch.ones(3)) == 1.0
    with pytest.raises(ValueError, match="at least one"):
        auroc(torch.zeros(0), torch.ones(3))


def test_ood_report_table_and_figure(tmp_path):
    model = pb.BNN(pb.MLP(1, [], 1, activation="identity"))
    g = torch.Generator().manual_seed(0)
    w = torch.stack([1 + 0.3 * torch.randn(500, generator=g), 0.2 * torch.randn(500, generator=g)], 1)
    near = torch.linspace(-0.5, 0.5, 40)[:, None]
    far = torch.linspace(3, 4, 40)[:, None]
    frame = ood_report(model, w, near, near, far, figure=tmp_path / "ood.png")
    assert list(frame.index) == ["train", "test", "ood"]
    assert frame.loc["ood", "auroc"] == 1.0  # |x| >= 3 is always more uncertain here
    assert math.isnan(frame.loc["test", "auroc"])
    assert frame.loc["ood", "mean"] > frame.loc["test", "mean"]
    assert (tmp_path / "ood.png").stat().st_size > 1000
    lv = pb.BNNLV(pb.MLP(2, [3], 1), latent_dim=1)
    with pytest.raises(ValueError, match="uncertainty_decomposition"):
        epistemic_entropy(lv, torch.zeros(5, lv.net.num_weights), near)
