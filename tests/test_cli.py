from pyro_bnnlv.cli import main


def test_fit_command_end_to_end(tmp_path, capsys):
    png = tmp_path / "fit.png"
    code = main(["fit", "--dataset", "cosine", "--steps", "40", "--hidden", "10", "--quiet",
                 "--num-samples", "20", "--output", str(png)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    for metric in ("test_ll", "rmse", "picp", "mpiw"):
        assert metric in out
    assert png.exists() and png.stat().st_size > 10_000


def test_fit_unknown_dataset_is_a_clear_error(capsys):
    assert main(["fit", "--dataset", "nope", "--steps", "5", "--quiet"]) == 2
    assert "unknown dataset 'nope'" in capsys.readouterr().err


def test_bench_svi_overhead_prints_ratios(capsys):
    assert main(["bench", "svi-overhead", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    assert "ratio_to_hand" in out and "particles_32_vs_1_ours" in out
