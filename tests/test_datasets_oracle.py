"""The true conditional densities of the synthetic sets, against closed forms and brute force."""

import numpy as np
import pytest
from scipy import integrate, stats

from pyro_bnnlv.datasets import ORACLE_DATASETS, expected_test_ll, load_dataset, true_log_density
from pyro_bnnlv.datasets.synthetic import _f_heavy_tail

HALF_LOG_2PI = 0.5 * np.log(2 * np.pi)


def test_heteroscedastic_ceilings_match_closed_forms():
    # goldberg: E log(x + 0.5) over U[0, 1] = [u log u - u] from 0.5 to 1.5
    e_log_v = (1.5 * np.log(1.5) - 1.5) - (0.5 * np.log(0.5) - 0.5)
    assert expected_test_ll("goldberg").value == pytest.approx(-HALF_LOG_2PI - 0.5 - 0.5 * e_log_v, abs=1e-10)
    # yuan: log v(x) = sin(2 pi x) integrates to 0
    assert expected_test_ll("yuan").value == pytest.approx(-HALF_LOG_2PI - 0.5, abs=1e-10)
    assert expected_test_ll("yuan").stderr == 0.0


def test_williams_ceiling_equals_the_mean_log_density_of_generated_data():
    """The quadrature of ``LL*`` and the density evaluated on the generator's own points agree."""
    data = load_dataset("williams", seed=5, sizes=(1, 1, 40_000))
    logp = true_log_density("williams", data.x_test, data.y_test)
    stderr = logp.std() / np.sqrt(len(logp))
    assert abs(logp.mean() - expected_test_ll("williams").value) < 4 * stderr
    assert expected_test_ll("williams").value == pytest.approx(0.388, abs=1e-3)  # the docs' figure


def test_depeweg_density_is_the_analytic_gaussian_and_its_ceiling_matches():
    """``f`` is linear in ``z``, so ``y | x ~ N(7 sin x, 9 cos^2(x/2) + 0.1)`` exactly."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-5, 5, 300)
    var = 9 * np.cos(x / 2) ** 2 + 0.1
    y = 7 * np.sin(x) + rng.normal(size=300) * np.sqrt(var) * 1.5
    exact = stats.norm.logpdf(y, 7 * np.sin(x), np.sqrt(var))
    np.testing.assert_allclose(true_log_density("depeweg", x, y), exact, atol=2e-3)

    # LL* = E_x[-0.5 log 2 pi v(x) - 0.5], x from the equal mixture of N(-4, .16), N(0, .81), N(4, .16)
    def e_log_v(mean, sd):
        return integrate.quad(
            lambda u: np.log(9 * np.cos(u / 2) ** 2 + 0.1) * stats.norm.pdf(u, mean, sd), mean - 10 * sd, mean + 10 * sd
        )[0]

    mean_log_v = np.mean([e_log_v(-4, 0.4), e_log_v(0, 0.9), e_log_v(4, 0.4)])
    oracle = expected_test_ll("depeweg", num_points=20_000, nodes=200)
    assert abs(oracle.value - (-HALF_LOG_2PI - 0.5 - 0.5 * mean_log_v)) < 4 * oracle.stderr
    assert 0 < oracle.stderr < 0.02


def test_bimodal_density_is_the_exact_two_branch_mixture():
    rng = np.random.default_rng(1)
    x = rng.uniform(-0.5, 2, 200)
    y = rng.uniform(-12, 12, 200)
    exact = np.logaddexp(stats.norm.logpdf(y, 10 * np.sin(x), 1.0), stats.norm.logpdf(y, 10 * np.cos(x), 1.0))
    np.testing.assert_allclose(true_log_density("bimodal", x, y, nodes=64), exact - np.log(2), rtol=1e-10)


def test_heavy_tail_density_matches_adaptive_quadrature_over_z():
    """Near ``|x| = 4`` ``f`` flips sign within the latent's spread: the grid rule must hold there."""
    x = np.array([-3.9, -1.0, 0.3, 2.0, 3.9, 3.9])
    y = np.array([-5.8, 0.4, 0.1, 5.0, -4.0, 9.0])  # the last far in the tail

    def density(xi, yi):
        integrand = lambda z: stats.norm.pdf(yi, _f_heavy_tail(xi, z), np.sqrt(0.1)) * stats.norm.pdf(z, 0, 0.1)
        return integrate.quad(integrand, -1.0, 1.0, points=[0.0], limit=500, epsabs=0.0, epsrel=1e-10)[0]

    exact = np.log([density(xi, yi) for xi, yi in zip(x, y)])
    np.testing.assert_allclose(true_log_density("heavy-tail", x, y), exact, atol=1e-3)
    np.testing.assert_allclose(true_log_density("heavy-tail", x, y, nodes=500), exact, atol=1e-2)


def test_oracle_errors_name_the_argument():
    with pytest.raises(ValueError, match="name must be one of .*heavy-tail"):
        expected_test_ll("boston")
    with pytest.raises(ValueError, match="x and y must have the same length"):
        true_log_density("yuan", np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="x must have shape"):
        true_log_density("yuan", np.zeros((3, 2)), np.zeros(3))
    with pytest.raises(ValueError, match="y contains NaN"):
        true_log_density("yuan", np.zeros(2), np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match="nodes must be even"):
        true_log_density("bimodal", np.zeros(2), np.zeros(2), nodes=7)
    assert set(ORACLE_DATASETS) == {"heavy-tail", "depeweg", "bimodal", "goldberg", "yuan", "williams"}
    assert expected_test_ll("heavy_tail", num_points=50, nodes=10).stderr > 0  # underscore alias


def test_standardised_tensors_need_the_data_set_and_give_the_standardised_density():
    """Issue 39: on a standardised set's tensors the oracle refuses without ``data=``, and with it
    returns ``log p(y_raw | x_raw) + log y_std``, the density of the standardised target."""
    raw = load_dataset("yuan", seed=0)
    std = load_dataset("yuan", seed=0, standardize=True)
    with pytest.raises(ValueError, match=r"y is the y_test of the standardised data set 'yuan'.*pass data="):
        true_log_density("yuan", std.x_test, std.y_test)
    expected = true_log_density("yuan", raw.x_test.double(), raw.y_test.double()) + np.log(float(std.y_std))
    np.testing.assert_allclose(true_log_density("yuan", std.x_test, std.y_test, data=std), expected, atol=1e-5)
    lat_raw, lat_std = load_dataset("bimodal", seed=1), load_dataset("bimodal", seed=1, standardize=True)
    expected = true_log_density("bimodal", lat_raw.x_test.double(), lat_raw.y_test.double()) + np.log(
        float(lat_std.y_std)
    )
    np.testing.assert_allclose(
        true_log_density("bimodal", lat_std.x_test, lat_std.y_test, data=lat_std), expected, atol=1e-4
    )
    # a raw set passed as data changes nothing
    np.testing.assert_array_equal(
        true_log_density("yuan", raw.x_test, raw.y_test, data=raw), true_log_density("yuan", raw.x_test, raw.y_test)
    )
    with pytest.raises(ValueError, match=r"data is the data set 'yuan' but name is 'goldberg'"):
        true_log_density("goldberg", std.x_test, std.y_test, data=std)


def test_no_density_where_the_noise_variance_is_not_positive():
    """goldberg's v(x) = x + 0.5 is <= 0 for x <= -0.5: no density there (was NaN)."""
    with pytest.raises(ValueError, match=r"x\[1\] = -0.7: the noise variance of 'goldberg' is not positive there"):
        true_log_density("goldberg", np.array([0.2, -0.7, 0.5]), np.zeros(3))
    assert np.isfinite(true_log_density("goldberg", np.array([-0.4, 1.5]), np.zeros(2))).all()
