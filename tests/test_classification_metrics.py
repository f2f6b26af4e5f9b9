"""Classification metrics (issue 42), against scikit-learn and hand-computed cases:
pyro_bnnlv.stats.classification."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from pyro_bnnlv.stats import (
    classification_metrics,
    mutual_information,
    ood_auroc,
    predictive_entropy,
    reliability_curve,
)

sk = pytest.importorskip("sklearn.metrics")


def _random(N=300, K=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    probs = torch.distributions.Dirichlet(torch.ones(K)).sample((N,)).to(dtype)
    probs = probs.clamp_min(1e-3)
    probs = probs / probs.sum(-1, keepdim=True)
    y = torch.randint(0, K, (N,), generator=g)
    return y, probs


def test_metrics_match_scikit_learn():
    torch.manual_seed(0)
    y, probs = _random()
    m = classification_metrics(y, probs)
    assert isinstance(m, pd.Series) and list(m.index) == ["test_ll", "accuracy", "brier", "ece"]
    p64 = probs.double().numpy()
    p64 = p64 / p64.sum(1, keepdims=True)  # float32 rows sum to 1 within 1e-7; scikit-learn warns about that
    assert m["test_ll"] == pytest.approx(-sk.log_loss(y.numpy(), p64, labels=range(4)), rel=1e-6)
    assert m["accuracy"] == pytest.approx(sk.accuracy_score(y.numpy(), p64.argmax(1)), abs=1e-12)
    try:  # scikit-learn >= 1.7 has the multi-class Brier score: sum over classes, unscaled
        ref = sk.brier_score_loss(y.numpy(), p64, labels=range(4), scale_by_half=False)
    except TypeError:
        ref = ((p64 - np.eye(4)[y.numpy()]) ** 2).sum(1).mean()
    assert m["brier"] == pytest.approx(ref, rel=1e-6)
    # binary: the multi-class Brier score is twice scikit-learn's binary mean (p_1 - y)^2
    yb, pb_ = _random(K=2, seed=1)
    mb = classification_metrics(yb, pb_)
    pb64 = pb_.double().numpy()
    pb64 = pb64 / pb64.sum(1, keepdims=True)
    assert mb["brier"] == pytest.approx(2 * sk.brier_score_loss(yb.numpy(), pb64[:, 1]), rel=1e-6)
    assert mb["test_ll"] == pytest.approx(-sk.log_loss(yb.numpy(), pb64), rel=1e-6)
    # a (N,) vector is P(y = 1)
    pd.testing.assert_series_equal(classification_metrics(yb, pb_[:, 1]), mb, rtol=1e-6)


def test_log_probs_alternative_and_zero_probabilities():
    torch.manual_seed(1)
    y, probs = _random(N=50, K=3, dtype=torch.float64)
    a = classification_metrics(y, probs)
    b = classification_metrics(y, log_probs=probs.log())
    pd.testing.assert_series_equal(a, b, rtol=1e-12)
    # a zero probability on the true label: clamped (probs) or -inf (log_probs)
    probs0 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    y0 = torch.tensor([1, 0])
    tiny = torch.finfo(torch.float64).tiny
    assert classification_metrics(y0, probs0)["test_ll"] == pytest.approx((math.log(tiny) + math.log(0.5)) / 2)
    assert classification_metrics(y0, log_probs=probs0.log())["test_ll"] == -math.inf
    # (N,) log P(y = 1) for a binary problem
    p1 = torch.tensor([0.2, 0.9, 0.6], dtype=torch.float64)
    yb = torch.tensor([0, 1, 1])
    assert classification_metrics(yb, log_probs=p1.log())["test_ll"] == pytest.approx(
        float(torch.tensor([0.8, 0.9, 0.6], dtype=torch.float64).log().mean()), rel=1e-12
    )


def test_ece_and_reliability_curve_by_hand():
    # confidences 0.9 (right), 0.85 (wrong) in (0.8, 1]; 0.7 (right) in (0.6, 0.8]; 0.6 (wrong) in (0.4, 0.6]
    probs = torch.tensor([[0.9, 0.1], [0.85, 0.15], [0.3, 0.7], [0.6, 0.4]], dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 1])
    curve = reliability_curve(y, probs, bins=5)
    assert list(curve.columns) == ["lower", "upper", "confidence", "accuracy", "count"]
    np.testing.assert_allclose(curve["lower"], [0.0, 0.2, 0.4, 0.6, 0.8], atol=1e-15)
    np.testing.assert_allclose(curve["upper"], [0.2, 0.4, 0.6, 0.8, 1.0], atol=1e-15)
    assert curve["count"].tolist() == [0, 0, 1, 1, 2]
    np.testing.assert_allclose(curve["confidence"][2:], [0.6, 0.7, 0.875])
    np.testing.assert_allclose(curve["accuracy"][2:], [0.0, 1.0, 0.5])
    assert curve["confidence"][:2].isna().all() and curve["accuracy"][:2].isna().all()
    # ECE = 1/4 |0 - 0.6| + 1/4 |1 - 0.7| + 2/4 |0.5 - 0.875| = 0.15 + 0.075 + 0.1875
    assert classification_metrics(y, probs, bins=5)["ece"] == pytest.approx(0.4125, abs=1e-12)
    # perfectly calibrated: confidence 0.75 in one bin and 3 of 4 right
    cal = torch.tensor([[0.75, 0.25]] * 4)
    assert classification_metrics(torch.tensor([0, 0, 0, 1]), cal)["ece"] == pytest.approx(0.0, abs=1e-7)


def test_entropy_and_mutual_information_analytic_cases():
    p = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]], dtype=torch.float64)
    same = p.expand(7, 2, 3)
    h = -(p[0] * p[0].log()).sum()
    torch.testing.assert_close(predictive_entropy(same), torch.stack([h, torch.tensor(0.0, dtype=torch.float64)]))
    torch.testing.assert_close(mutual_information(same), torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(predictive_entropy(p), predictive_entropy(same))  # (N, K) is a predictive already
    # two confident samples that disagree: all the uncertainty is epistemic, log 2
    disagree = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    assert predictive_entropy(disagree).item() == pytest.approx(math.log(2))
    assert mutual_information(disagree).item() == pytest.approx(math.log(2))
    # samples that agree on a uniform predictive: all aleatoric
    uniform = torch.full((5, 3, 4), 0.25)
    torch.testing.assert_close(predictive_entropy(uniform), torch.full((3,), math.log(4), dtype=torch.float64))
    torch.testing.assert_close(mutual_information(uniform), torch.zeros(3, dtype=torch.float64))
    torch.manual_seed(2)
    samples = torch.distributions.Dirichlet(torch.ones(3)).sample((20, 10))
    mi, total = mutual_information(samples), predictive_entropy(samples)
    assert (mi >= 0).all() and (mi <= total + 1e-12).all() and mi.shape == (10,)


def test_ood_auroc_matches_scikit_learn_with_ties():
    g = torch.Generator().manual_seed(3)
    score_in = torch.randint(0, 6, (40,), generator=g).float()
    score_out = torch.randint(2, 9, (30,), generator=g).float()
    ref = sk.roc_auc_score([0] * 40 + [1] * 30, torch.cat([score_in, score_out]).numpy())
    assert ood_auroc(score_in, score_out) == pytest.approx(ref, abs=1e-12)
    assert ood_auroc(np.zeros(3), np.ones(2)) == 1.0 and ood_auroc([1.0, 1.0], [1.0]) == 0.5
    with pytest.raises(ValueError, match=r"score_out must be a non-empty \(N,\) vector"):
        ood_auroc(torch.zeros(3), torch.zeros(0))
    with pytest.raises(ValueError, match=r"score_in must be a non-empty \(N,\) vector.*reshape\(-1\)"):
        ood_auroc(torch.zeros(3, 1), torch.zeros(2))
    with pytest.raises(ValueError, match="score_in contains NaN"):
        ood_auroc(torch.tensor([0.0, math.nan]), torch.zeros(2))


def test_errors_name_the_argument_and_the_fix():
    y, probs = torch.tensor([0, 2, 1]), torch.tensor([[0.2, 0.3, 0.5]] * 3)
    with pytest.raises(ValueError, match=r"y has the label 3, outside \[0, 3\).*K mismatch"):
        classification_metrics(torch.tensor([0, 3, 1]), probs)
    with pytest.raises(ValueError, match=r"y has the label -1, outside \[0, 3\)"):
        classification_metrics(torch.tensor([0, -1, 1]), probs)
    with pytest.raises(
        ValueError,
        match=r"y must hold integer class labels.*float32; they are whole numbers: "
        r"pass y.long\(\)",
    ):
        classification_metrics(y.float(), probs)
    with pytest.raises(ValueError, match="they are not whole numbers: y must be class labels, not probabilities"):
        classification_metrics(torch.tensor([0.0, 0.5, 1.0]), probs)
    with pytest.raises(ValueError, match=r"probs contains NaN \(first at index \(1, 0\)\)"):
        classification_metrics(y, torch.tensor([[0.2, 0.3, 0.5], [math.nan, 0.5, 0.5], [0.2, 0.3, 0.5]]))
    with pytest.raises(ValueError, match=r"rows of probs must sum to 1 \(tolerance 0.0001\): row \(2,\) sums to 1.1"):
        classification_metrics(y, torch.tensor([[0.2, 0.3, 0.5]] * 2 + [[0.3, 0.3, 0.5]]))
    with pytest.raises(ValueError, match=r"probs must hold probabilities in \[0, 1\].*softmax"):
        classification_metrics(y, torch.tensor([[2.0, -0.5, -0.5]] * 3))
    with pytest.raises(ValueError, match="y has 2 labels but probs has 3 rows"):
        classification_metrics(y[:2], probs)
    with pytest.raises(ValueError, match=r"y must have shape \(N,\).*pass y.reshape\(-1\)"):
        classification_metrics(y[:, None], probs)
    with pytest.raises(ValueError, match=r"probs must have shape \(N, K\)"):
        classification_metrics(y, probs[None])
    with pytest.raises(ValueError, match="exactly one of probs= .* and log_probs="):
        classification_metrics(y)
    with pytest.raises(ValueError, match="log_probs must be log-probabilities.*log_softmax"):
        classification_metrics(y, log_probs=probs)
    with pytest.raises(ValueError, match="bins must be a positive integer"):
        classification_metrics(y, probs, bins=0)
    with pytest.raises(ValueError, match=r"probs_samples must have shape \(S, N, K\).*carry no disagreement"):
        mutual_information(probs)
    with pytest.raises(ValueError, match="rows of probs_samples must sum to 1"):
        predictive_entropy(torch.full((2, 3, 2), 0.6))
    assert classification_metrics(y.numpy(), probs.numpy().tolist())["accuracy"] == pytest.approx(1 / 3)


def test_plot_reliability_draws_the_curve_and_the_ece(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pyro_bnnlv.plotting import plot_reliability

    torch.manual_seed(4)
    y, probs = _random(N=200, K=3)
    fig = plot_reliability(y, probs, tmp_path / "rel.png", bins=10, title="toy")
    ax = fig.axes[0]
    curve = reliability_curve(y, probs, bins=10)
    bars = ax.patches
    assert len(bars) == 10
    np.testing.assert_allclose([b.get_height() for b in bars], curve["accuracy"].fillna(0.0), atol=1e-12)
    np.testing.assert_allclose([b.get_x() for b in bars], curve["lower"], atol=1e-12)
    alphas = np.array([b.get_facecolor()[3] for b in bars])
    assert alphas[curve["count"].idxmax()] == pytest.approx(1.0)
    assert (np.diff(alphas[np.argsort(curve["count"].to_numpy(), kind="stable")]) >= 0).all()  # shade grows with count
    ece = classification_metrics(y, probs, bins=10)["ece"]
    assert ax.get_title() == f"toy  ECE = {ece:.3f} (10 bins, 200 points)"
    np.testing.assert_allclose(ax.lines[1].get_xdata(), [0, 1])  # the diagonal
    assert (tmp_path / "rel.png").stat().st_size > 5000
    _, own = plt.subplots()
    assert plot_reliability(y, probs, ax=own) is own.figure and own.get_title().startswith("ECE = ")
    plt.close("all")
