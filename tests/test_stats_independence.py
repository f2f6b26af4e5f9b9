"""The independence terms of pyro_bnnlv.stats.independence, validated alone against KSG (issue 37)."""

import importlib.util
from pathlib import Path

import pytest
import torch

from pyro_bnnlv.stats import correlation_penalty
from pyro_bnnlv.stats.hsic import normalized_hsic
from pyro_bnnlv.stats.independence import independence_statistic

BENCH = Path(__file__).parents[1] / "docs" / "bench" / "independence_terms.py"


def _bench():
    spec = importlib.util.spec_from_file_location("independence_terms", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def validation():
    bench = _bench()
    torch.manual_seed(0)
    # NCAI's full-batch size on the set; the reference KSG on fewer points than the
    # script's 20,000 to stay fast
    return bench, *bench.validate(n=350, draws=2, reference_n=5000, candidates=("knn-mi", "hsic"))


def test_knn_mi_orders_the_1d_patterns_as_ksg_does(validation):
    bench, reference, values = validation
    assert len(bench.ONE_D) >= 20
    assert bench.spearman(reference, values["knn-mi"], bench.ONE_D) >= 0.9
    # the single-bandwidth HSIC NCAI uses today does not: the reason for the new term
    assert bench.spearman(reference, values["hsic"], bench.ONE_D) < 0.8
    # over all 31 (3-D x included, where a batch of 350 resolves no oscillation in one of three
    # coordinates) knn-mi still ranks best of the two, but docs/bench/independence_terms.py
    # measures 0.87 there, below the 0.9 asked for
    assert bench.spearman(reference, values["knn-mi"]) > bench.spearman(reference, values["hsic"])


def test_the_reference_estimator_on_a_batch_is_the_criterions_ceiling(validation):
    """KSG itself, on the candidates' batches of 350, orders the patterns below the 0.9 asked of
    the terms (it misses the oscillation in one of three coordinates that it sees on 5,000 points),
    and below knn-mi: the criterion is out of reach at this batch size for any statistic."""
    bench, reference, values = validation
    ceiling = bench.spearman(reference, values[bench.KSG_ON_BATCH])
    assert ceiling < 0.9
    assert bench.spearman(reference, values["knn-mi"]) > ceiling
    assert values[bench.KSG_ON_BATCH]["3-D sin f=3"] < 0.1 < reference["3-D sin f=3"]


def test_knn_mi_is_near_zero_under_independence_at_ncai_batch_sizes():
    bench = _bench()
    for n, q95_max in ((128, 0.15), (350, 0.09)):
        mean, q95 = bench.null_quantiles(n, reps=40, candidates=("knn-mi",))["knn-mi"]
        assert abs(mean) < 0.02 and 0 < q95 < q95_max, (n, mean, q95)
    mean, q95 = bench.null_quantiles(350, reps=20, candidates=("hsic-multiscale",))["hsic-multiscale"]
    assert abs(mean) < 0.002 and q95 < 0.01


@pytest.mark.parametrize("kind", ["hsic-multiscale", "knn-mi", "dcor"])
def test_gradient_descent_on_mu_removes_the_dependence(kind):
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(120, 1, generator=gen, dtype=torch.float64) * 6 - 3
    mu = (torch.sin(3 * x) + 0.3 * torch.randn(120, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    start = independence_statistic(x, mu, kind).item()
    opt = torch.optim.Adam([mu], lr=0.05)
    for _ in range(60):
        opt.zero_grad()
        value = independence_statistic(x, mu, kind)
        value.backward()
        assert torch.isfinite(mu.grad).all()
        opt.step()
    assert independence_statistic(x, mu.detach(), kind).item() < 0.5 * start


def test_the_old_terms_are_the_library_functions():
    gen = torch.Generator().manual_seed(0)
    x, mu = torch.randn(50, 2, generator=gen), torch.randn(50, 1, generator=gen)
    assert independence_statistic(x, mu, "hsic") == normalized_hsic(x, mu)
    assert independence_statistic(x, mu, "pc") == correlation_penalty(x, mu)


def test_knn_mi_is_reproducible_and_scale_invariant_in_mu():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(100, 3, generator=gen, dtype=torch.float64)
    mu = x[:, :1] ** 2 + 0.5 * torch.randn(100, 1, generator=gen, dtype=torch.float64)
    value = independence_statistic(x, mu, "knn-mi")
    assert value == independence_statistic(x, mu, "knn-mi")
    assert independence_statistic(x, 7.0 * mu + 2.0, "knn-mi").item() == pytest.approx(value.item(), rel=1e-9)
    assert value.item() > 0.2


def test_bad_arguments_are_named():
    x, mu = torch.randn(20, 1), torch.randn(20, 1)
    with pytest.raises(ValueError, match="kind must be one of"):
        independence_statistic(x, mu, "mine")
    with pytest.raises(ValueError, match="k <= m <= n - 1"):
        independence_statistic(x, mu, "knn-mi", m=30)
    with pytest.raises(ValueError, match=r"scales\[1\]"):
        independence_statistic(x, mu, scales=(0.5, -1.0))
    with pytest.raises(ValueError, match="scales must be a non-empty"):
        independence_statistic(x, mu, scales=())
    with pytest.raises(ValueError, match="same number of rows"):
        independence_statistic(x, mu[:10])
    with pytest.raises(ValueError, match="at least 3 rows"):
        independence_statistic(x[:2], mu[:2])
    with pytest.raises(TypeError, match="`mu_z`"):
        independence_statistic(x, "mu")


def test_descending_one_knn_size_leaves_the_dependence_and_several_sizes_remove_it():
    """Issue 37: the floored k-NN estimate at its one size m = 15 is met by arranging the means
    while KSG (and the estimate at another size) still measures dependence; floored at each of
    four sizes with fresh reference sets, the same descent ends with a third of that dependence
    (KSG over three seeds: 0.13-0.17 against 0.01-0.09 nats)."""
    from pyro_bnnlv.stats import ksg_mutual_information
    from pyro_bnnlv.stats.independence import knn_mutual_information

    ksg = {"knn-mi": [], "knn-mi-multiscale": []}
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.rand(200, 1) * 6 - 3
        start = 0.3 * x + 0.3 * torch.randn(200, 1)  # dependent on x
        for kind in ksg:
            mu = start.clone().requires_grad_()
            opt = torch.optim.Adam([mu], lr=0.05)
            for _ in range(300):
                value = independence_statistic(x, mu, kind).clamp_min(0)  # NCAIElbo's floor
                opt.zero_grad()
                value.backward()
                opt.step()
            end = mu.detach()
            ksg[kind].append(ksg_mutual_information(x.double().numpy(), end.double().numpy()))
            if kind == "knn-mi":  # met at its size and seed, not at a larger size
                assert independence_statistic(x, end, kind).item() < 0.05
                assert knn_mutual_information(x, end, m=64, seed=100).item() > 0.15
    single, multi = (sum(v) / 3 for v in ksg.values())
    assert single > 0.12 and multi < 0.08 and max(ksg["knn-mi-multiscale"]) < min(ksg["knn-mi"]), ksg


def test_multiscale_knn_mi_floors_each_size_and_draws_fresh_sets():
    from pyro_bnnlv.stats.independence import knn_mutual_information, multiscale_knn_mi

    gen = torch.Generator().manual_seed(2)
    x = torch.rand(300, 1, generator=gen) * 6 - 3
    fine = torch.sin(8 * x) + 0.2 * torch.randn(300, 1, generator=gen)  # 8 rad per unit of x
    # seeded: the mean of the floored single-size estimates, seed + j for the j-th size
    sizes = (8, 16, 32)
    expected = (
        sum(knn_mutual_information(x, fine, m=m, subsets=2, seed=5 + j).clamp_min(0) for j, m in enumerate(sizes)) / 3
    )
    assert multiscale_knn_mi(x, fine, sizes, seed=5) == expected
    assert expected.item() > 0.3
    # fresh sets from torch's global generator: reproducible under a seed, different across calls
    torch.manual_seed(0)
    a, b = multiscale_knn_mi(x, fine), multiscale_knn_mi(x, fine)
    torch.manual_seed(0)
    assert multiscale_knn_mi(x, fine) == a and a != b
    # under independence: non-negative and small at NCAI's batch sizes
    torch.manual_seed(1)
    null = torch.stack([multiscale_knn_mi(x, torch.randn(300, 1)) for _ in range(20)])
    assert (null >= 0).all() and null.mean() < 0.05
    # sizes above the batch are skipped; none usable is an error naming the fix
    assert torch.isfinite(multiscale_knn_mi(x[:20], fine[:20]))
    with pytest.raises(ValueError, match="larger batch"):
        multiscale_knn_mi(x[:6], fine[:6])


def test_multiscale_knn_mi_floors_each_size_before_the_average(monkeypatch):
    """A negative estimate at one size must not cancel dependence seen at another."""
    from pyro_bnnlv.stats import independence

    per_size = {8: 0.3, 16: -0.5, 32: 0.1, 64: -0.2}
    monkeypatch.setattr(
        independence, "knn_mutual_information", lambda x, mu, k, m, subsets, seed, anchors: torch.tensor(per_size[m])
    )
    x, mu = torch.randn(100, 1), torch.randn(100, 1)
    assert independence.multiscale_knn_mi(x, mu).item() == pytest.approx((0.3 + 0.1) / 4)


def test_doubling_sizes_reach_a_quarter_of_the_batch():
    from pyro_bnnlv.stats.independence import doubling_sizes

    assert doubling_sizes(20) == (8,)  # below 8 points per quarter: the smallest size alone
    assert doubling_sizes(64) == (8, 16)
    assert doubling_sizes(1366) == (8, 16, 32, 64, 128, 256)
    assert doubling_sizes(2048) == (8, 16, 32, 64, 128, 256, 512)


def test_anchored_knn_mi_estimates_the_full_sum_at_random_points():
    """Anchors: the same estimate at a random subset of the points (all points: the same number;
    a subset: an unbiased estimate of it, whose mean over draws matches)."""
    from pyro_bnnlv.stats.independence import knn_mutual_information

    gen = torch.Generator().manual_seed(3)
    x = torch.rand(400, 1, generator=gen) * 6 - 3
    mu = torch.tanh(x) + 0.3 * torch.randn(400, 1, generator=gen)
    full = knn_mutual_information(x, mu, m=32, subsets=2, seed=7)
    assert knn_mutual_information(x, mu, m=32, subsets=2, seed=7, anchors=400) == full
    torch.manual_seed(0)
    draws = torch.stack([knn_mutual_information(x, mu, m=32, subsets=2, seed=7, anchors=64) for _ in range(200)])
    assert draws.std() > 0.01  # different anchors each call
    assert abs(draws.mean() - full) < 4 * draws.std() / 200**0.5
    # gradients reach only the anchors and the points in their neighbourhoods
    leaf = mu.clone().requires_grad_()
    torch.manual_seed(1)
    knn_mutual_information(x, leaf, m=8, subsets=1, seed=None, anchors=5).backward()
    assert 5 <= int((leaf.grad != 0).sum()) <= 5 * (1 + 8 + 8)


def test_knn_mi_wide_floors_each_doubling_size_at_its_anchors(monkeypatch):
    """``knn-mi-wide``: the floored mean of the estimates at sizes doubling up to a quarter of the
    batch, each at :data:`WIDE_ANCHORS` anchors with fresh reference sets."""
    from pyro_bnnlv.stats import independence

    calls = []

    def fake(x, mu, k, m, subsets, seed, anchors):
        calls.append((m, subsets, seed, anchors))
        return torch.tensor(0.2 if m < 64 else -0.1)

    monkeypatch.setattr(independence, "knn_mutual_information", fake)
    x, mu = torch.randn(600, 1), torch.randn(600, 1)
    value = independence_statistic(x, mu, "knn-mi-wide")
    assert [c[0] for c in calls] == [8, 16, 32, 64, 128]
    assert all(c[1:] == (2, None, independence.WIDE_ANCHORS) for c in calls)
    assert value.item() == pytest.approx(3 * 0.2 / 5)


def test_fresh_reference_sets_are_uniform_subsets_of_the_other_points():
    from pyro_bnnlv.stats.independence import _fresh_reference_sets

    torch.manual_seed(0)
    n, m = 40, 12
    counts = torch.zeros(n, n)
    for _ in range(200):
        sets = _fresh_reference_sets(n, m, 3, torch.device("cpu"))
        assert sets.shape == (3, n, m)
        assert not (sets == torch.arange(n).view(1, n, 1)).any()  # never the point itself
        assert (sets.sort(-1).values.diff(dim=-1) > 0).all()  # no repeats within a set
        counts += torch.zeros(3 * n, n).scatter_(1, sets.reshape(3 * n, m), 1.0).view(3, n, n).sum(0)
    off = counts[~torch.eye(n, dtype=torch.bool)]
    expected = 200 * 3 * m / (n - 1)  # each other point equally likely to be in i's set
    assert (off - expected).abs().max() < 0.35 * expected


def test_knn_terms_refuse_to_be_traced_rather_than_freeze_their_neighbourhoods():
    """torch.jit.trace would record the first batch's neighbourhoods (data-dependent indices, and
    the cache keyed on the data's bytes) as constants: tracing is refused with the fix, and so is
    NCAIElbo(jit=True) with a k-NN term."""
    from pyro_bnnlv import NCAIElbo

    x, mu = torch.rand(60, 1), torch.randn(60, 1)
    for kind in ("knn-mi", "knn-mi-multiscale", "knn-mi-wide"):
        with pytest.raises(RuntimeError, match="cannot be traced.*call them eagerly"):
            torch.jit.trace(lambda a, b: independence_statistic(a, b, kind), (x, mu), check_trace=False)
        with pytest.raises(ValueError, match=f"independence='{kind}' cannot be compiled with jit=True"):
            NCAIElbo(independence=kind, jit=True)


def test_the_validation_script_runs_the_candidates_asked_for(monkeypatch, capsys):
    bench = _bench()
    argv = ["independence_terms.py", "--candidates", "knn-mi-wide", "hsic", "--n", "64", "--draws", "1"]
    monkeypatch.setattr("sys.argv", [*argv, "--reference-n", "400", "--null-reps", "2"])
    bench.main()
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("pattern"))
    assert header.split() == ["pattern", "KSG", "KSG", "on", "n", "knn-mi-wide", "hsic"]
    assert out.count("null n=") == 4 and "Spearman vs KSG" in out
