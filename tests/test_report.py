"""``pyro-bnnlv results``: docs/results.md is what docs/results.in.md and the CSVs give."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from pyro_bnnlv.cli import main
from pyro_bnnlv.reproduce import report, tables

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def checkout(tmp_path):
    """A copy of the template, the page, README.md and the CSVs they read (not the sweep stores)."""
    (tmp_path / "docs" / "results").mkdir(parents=True)
    for name in (report.TEMPLATE, report.OUTPUT, report.README):
        shutil.copy(ROOT / name, tmp_path / name)
    for csv in (ROOT / "docs" / "results").glob("*.csv"):
        shutil.copy(csv, tmp_path / "docs" / "results" / csv.name)
    return tmp_path


def test_committed_results_page_is_current(capsys):
    assert main(["results", "--check", "--root", str(ROOT)]) == 0, capsys.readouterr().err
    assert "up to date" in capsys.readouterr().out


def test_changed_csv_value_fails_check_naming_the_files(checkout, capsys):
    csv = checkout / "docs" / "results" / "hyvi-cosine.csv"
    table = pd.read_csv(csv)
    table.loc[table["method"] == "MFVI", "test_ll"] = -9.0
    table.to_csv(csv, index=False)
    assert main(["results", "--check", "--root", str(checkout)]) == 1
    err = capsys.readouterr().err
    assert "docs/results.md is stale" in err
    assert "docs/results/hyvi-cosine.csv" in err
    assert "-9.00" in err  # the diff shows the new value
    # regenerating makes it current again, and only that table changed
    before = (checkout / report.OUTPUT).read_text()
    assert main(["results", "--root", str(checkout)]) == 0
    after = (checkout / report.OUTPUT).read_text()
    changed = [a for a, b in zip(after.splitlines(), before.splitlines()) if a != b]
    assert changed == ["| MFVI | 0.093 | 0.12 | 0.12 | -9.00 | 244 / 83 | 469 / 445 |"]
    assert main(["results", "--check", "--root", str(checkout)]) == 0


def test_edited_prose_fails_check(checkout, capsys):
    template = checkout / report.TEMPLATE
    template.write_text(template.read_text().replace("# Results", "# Results, edited", 1))
    assert main(["results", "--check", "--root", str(checkout)]) == 1
    assert "differs from docs/results.in.md" in capsys.readouterr().err


def test_marker_naming_a_missing_csv_is_a_clear_error(checkout, capsys):
    template = checkout / report.TEMPLATE
    template.write_text(template.read_text() + "\n<!-- table: proj-uci docs/results/no-such.csv -->\n")
    assert main(["results", "--check", "--root", str(checkout)]) == 2
    err = capsys.readouterr().err
    assert "docs/results.in.md:" in err and "docs/results/no-such.csv" in err and "does not exist" in err


def test_unknown_table_and_bad_column_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown table 'nope'.*known"):
        report.render("<!-- table: nope docs/results/x.csv -->\n", tmp_path)
    with pytest.raises(ValueError, match="names no CSV"):
        report.render("<!-- table: bench -->\n", tmp_path)
    pd.DataFrame({"contender": ["a"], "ms": [1.0]}).to_csv(tmp_path / "b.csv", index=False)
    with pytest.raises(ValueError, match="b.csv has no column"):
        report.render("<!-- table: bench-runs b.csv column=speed -->\n", tmp_path)


def test_rendering_rounds_like_the_old_readme(tmp_path):
    """Two decimals, no ``-0.00``; the paper's printed decimals rounded half-up."""
    assert tables.num(-0.004) == "0.00" and tables.num(2.345678) == "2.35"
    assert tables.paper_value(-1.055) == "-1.06" and tables.as_printed(0.243) == "0.243"
    assert tables.as_printed(4.7) == "4.70"
    rows = pd.DataFrame(
        {"dataset": ["d"] * 3, "scheme": ["random"] * 3, "method": ["A", "B", "C"], "test_ll": [-1.0, -0.5, -2.0]}
    )
    rows.to_csv(tmp_path / "p.csv", index=False)
    text = report.render("<!-- table: proj-uci p.csv -->\n", tmp_path)
    assert "| d | random | -1.00 | **-0.50** | -2.00 |" in text
    assert text.startswith("<!-- GENERATED")


def test_hyvi_uci_table_gives_the_standard_error_over_several_splits_and_skips_failures():
    """Table 5 reports mean ± standard error over 10 splits: so does the table of a paper run; a
    one-split CSV keeps its plain cells; failed fits do not enter the means."""
    from pyro_bnnlv.reproduce.hyvi import uci_table as _hyvi_uci

    rows = [
        dict(dataset="boston", split=s, method="MFVI", rmse=2.0 + s, test_ll=-2.0 - s, auroc_ood=0.9, status="done")
        for s in range(3)
    ]
    rows.append(
        dict(
            dataset="boston",
            split=3,
            method="MFVI",
            rmse=float("nan"),
            test_ll=float("nan"),
            auroc_ood=float("nan"),
            status="failed",
        )
    )
    table = _hyvi_uci([pd.DataFrame(rows)], ["x.csv"], {})
    # mean 3.00, sd 1, se 1/sqrt(3) = 0.58; the paper's MFVI boston RMSE 3.696 in brackets
    assert "3.00 ± 0.58 (3.70)" in table and "-3.00 ± 0.58 (-2.97)" in table
    one = _hyvi_uci([pd.DataFrame(rows[:1])], ["x.csv"], {})
    assert "±" not in one and "2.00 (3.70)" in one
    assert "| boston | 3 of 4 |" in table and "| boston | 1 of 1 |" in one
    # a sweep under way: pending rows count as planned splits, not as fits
    rows += [
        dict(
            dataset="boston",
            split=s,
            method=m,
            rmse=float("nan"),
            test_ll=float("nan"),
            auroc_ood=float("nan"),
            status="pending",
        )
        for s in (4, 5)
        for m in ("MFVI", "NN-HyVI")
    ]
    rows.append(dict(dataset="boston", split=0, method="NN-HyVI", rmse=3.0, test_ll=-3.0, auroc_ood=0.9, status="done"))
    partial = _hyvi_uci([pd.DataFrame(rows)], ["x.csv"], {})
    assert "| boston | 3 / 1 of 6 |" in partial and "3.00 ± 0.58 (3.70)" in partial
    capped = _hyvi_uci([pd.DataFrame(rows).assign(capped=[True] + [False] * (len(rows) - 1))], ["x.csv"], {})
    assert "| boston | 3 / 1 of 6 (1 capped) |" in capped


def test_proj_uci_table_marks_cells_picked_from_a_partly_finished_grid():
    """A proj-uci CSV written while its sweep is under way (--stop-after): a cell whose grid is
    partly finished is marked, a cell without a finished fit is empty and takes no part in the
    row's best."""
    from pyro_bnnlv.reproduce.projected import uci_table as _proj_uci

    rows = [
        dict(dataset="yacht", scheme="random", method="BbB", test_ll=-1.0, status="done"),
        dict(dataset="yacht", scheme="random", method="Proj-BNN", test_ll=-0.5, status="partial"),
        dict(dataset="yacht", scheme="random", method="Proj-BNN (MMD)", test_ll=float("nan"), status="pending"),
        dict(dataset="wine", scheme="random", method="BbB", test_ll=-0.9, status="done"),
        dict(dataset="wine", scheme="random", method="Proj-BNN", test_ll=-1.2, status="done"),
    ]
    table = _proj_uci([pd.DataFrame(rows)], ["x.csv"], {})
    assert "| yacht | random | -1.00 | **-0.50*** |  |" in table
    assert "| wine | random | **-0.90** | -1.20 |  |" in table


def test_proj_uci_table_gives_rmse_or_the_selected_step_size_and_latent_size_on_request():
    from pyro_bnnlv.reproduce.projected import uci_table as _proj_uci

    rows = pd.DataFrame(
        [
            dict(
                dataset="boston",
                scheme="random",
                method="BbB",
                lr=0.1,
                latent_dim=float("nan"),
                test_ll=-2.0,
                rmse=0.3,
                status="done",
            ),
            dict(
                dataset="boston",
                scheme="random",
                method="FGE",
                lr=float("nan"),
                latent_dim=float("nan"),
                test_ll=-2.5,
                rmse=0.4,
                status="done",
            ),
            dict(
                dataset="boston",
                scheme="random",
                method="Proj-BNN",
                lr=0.01,
                latent_dim=50.0,
                test_ll=-0.5,
                rmse=0.35,
                status="partial",
            ),
        ]
    )
    assert "| boston | random | **0.30** | 0.40 | 0.35* |" in _proj_uci([rows], ["x.csv"], {"values": "rmse"})
    assert "| boston | random | 0.1 |  | 0.01 / 50* |" in _proj_uci([rows], ["x.csv"], {"values": "selected"})
    with pytest.raises(ValueError, match="values='nll'.*values=test_ll"):
        _proj_uci([rows], ["x.csv"], {"values": "nll"})
    with pytest.raises(KeyError, match="latent_dim"):
        _proj_uci([rows.drop(columns="latent_dim")], ["x.csv"], {"values": "selected"})


def test_proj_four_modes_table_lists_the_seeds_and_bolds_only_fits_with_two_modes_in_every_seed():
    from pyro_bnnlv.reproduce.projected_toy import four_modes_table as _proj_four_modes

    def census(modes_mmd, ll):
        return pd.DataFrame(
            [
                dict(fit="MFVI on w", fits_three=1.0, modes=1, **{"miss -1": 0.0, "miss +1": 1.0}, test_ll=-1.3),
                dict(
                    fit="mmd",
                    prior_fits_three=0.75,
                    prior_modes=3,
                    fits_three=0.7,
                    modes=modes_mmd,
                    **{"miss -1": 0.52, "miss +1": 0.48},
                    test_ll=ll,
                ),
            ]
        )

    table = _proj_four_modes([census(2, 0.84), census(2, 0.61)], ["s0.csv", "s1.csv"], {})
    assert "| **mmd** | 0.75 / 0.75 | 3 / 3 | 0.70 / 0.70 | 2 / 2 | .52/.48 | 0.84 / 0.61 |" in table
    assert "| MFVI on w |  |  | 1.00 / 1.00 | 1 / 1 | 0/1 | -1.30 / -1.30 |" in table
    assert "**mmd**" not in _proj_four_modes([census(2, 0.8), census(1, -1.3)], ["a", "b"], {})
    with pytest.raises(ValueError, match="not proj-four-modes censuses"):
        _proj_four_modes([pd.DataFrame({"fit": ["x"]})], ["bad.csv"], {})


def test_ncai_protocol_table_puts_each_sets_true_density_ceiling_under_it(tmp_path):
    """The ceiling row is the set's ``E log p(y | x)`` (williams: 0.39) and only a set with a known
    generating density gets one."""
    methods = ["BNN (MFVI)", "BNN+LV (MFVI)", "BNN+LV (NCAI_0)", "BNN+LV (NCAI_lambda)"]
    rows = pd.DataFrame(
        {
            "dataset": ["williams"] * 4 + ["mine"] * 4,
            "method": methods * 2,
            "split": 1,
            "test_ll": [-0.1, 0.1, 0.2, 0.3] * 2,
            "mi_x_z": [None, 0.2, 0.3, 0.01] * 2,
            "hz_z": [None, 4.0, 5.0, 0.01] * 2,
            "selected": "noise_var=0.01",
        }
    )
    rows.to_csv(tmp_path / "n.csv", index=False)
    lines = report.render("<!-- table: ncai-protocol n.csv -->\n", tmp_path).splitlines()
    ceilings = [line for line in lines if "ceiling" in line]
    assert ceilings == ["| *ceiling: the true density* | *0.39* |  |  |"]
    assert lines.index(ceilings[0]) == lines.index(next(x for x in lines if "**mine**" in x)) - 1


def test_ncai_paired_table_says_tie_within_the_splits_noise():
    """Issue 37: an ordering of two means over a few splits is a claim only with its paired
    difference; within a paired t-test's 5% band it is a tie."""
    import math

    from scipy import stats

    from pyro_bnnlv.reproduce.ncai import paired_table

    rows = []
    lam_ll = [0.5, 0.6, 0.4, 0.55, 0.45]  # vs MFVI: +0.5 each split (+-0.1): higher
    noisy = [0.9, -0.7, 0.8, -0.6, 0.1]  # vs NCAI_0: mean +0.1, SE large: tie
    for split in range(5):
        rows += [
            dict(dataset="toy", split=split, method="BNN+LV (MFVI)", test_ll=0.0, mi_x_z=0.5, hz_z=1.0),
            dict(
                dataset="toy",
                split=split,
                method="BNN+LV (NCAI_0)",
                test_ll=lam_ll[split] - noisy[split],
                mi_x_z=0.2,
                hz_z=0.5,
            ),
            dict(
                dataset="toy",
                split=split,
                method="BNN+LV (NCAI_lambda)",
                test_ll=lam_ll[split],
                mi_x_z=0.1 + 0.01 * split,
                hz_z=0.1,
            ),
        ]
    text = paired_table([pd.DataFrame(rows)], ["x.csv"], {})
    lines = text.splitlines()
    mfvi = next(line for line in lines if "BNN+LV MFVI" in line)
    zero = next(line for line in lines if "NCAI_0" in line)
    assert "0.50 (0.04), higher" in mfvi and "lower" in mfvi.split("|")[4]
    d = [n for n in noisy]
    se = float(pd.Series(d).std(ddof=1)) / math.sqrt(5)
    assert abs(0.1) < stats.t.ppf(0.975, 4) * se
    assert "0.10 (" in zero and ", tie" in zero.split("|")[3]


def test_stale_readme_block_fails_check_naming_readme_and_passes_after_regeneration(checkout, capsys):
    """README.md's sentences that quote the CSVs are generated blocks: a block whose body no
    longer matches its builder fails ``--check`` (naming README.md and the block), and
    ``pyro-bnnlv results`` rewrites it."""
    readme = checkout / report.README
    text = readme.read_text()
    assert "<!-- generated: ncai-paired-summary" in text
    readme.write_text(text.replace("SE at most 0.11", "SE at most 0.01", 1))
    assert main(["results", "--check", "--root", str(checkout)]) == 1
    err = capsys.readouterr().err
    assert "README.md is stale" in err and "ncai-paired-summary from docs/results/ncai-protocol-full.csv" in err
    assert main(["results", "--root", str(checkout)]) == 0
    assert readme.read_text() == text
    assert main(["results", "--check", "--root", str(checkout)]) == 0
    # a rerun committed without regenerating: the check names both files
    csv = checkout / "docs" / "results" / "proj-uci-paper.csv"
    table = pd.read_csv(csv)
    table.loc[table["method"] == "FGE", "test_ll"] += 100.0
    table.to_csv(csv, index=False)
    capsys.readouterr()
    assert main(["results", "--check", "--root", str(checkout)]) == 1
    err = capsys.readouterr().err
    assert "docs/results.md is stale" in err and "README.md is stale" in err
    assert "proj-uci-wins from docs/results/proj-uci-paper.csv" in err


def test_generated_block_without_end_is_a_clear_error(tmp_path):
    text = "x\n  <!-- generated: proj-uci-wins p.csv -->\n  old text\n"
    with pytest.raises(ValueError, match=r"README.md:2: generated block without an end.*end generated"):
        report.render_blocks(text, tmp_path)


def test_generated_block_keeps_its_indent_and_wraps(tmp_path):
    rows = [
        dict(dataset="d", scheme=s, method=m, valid_ll=v, test_ll=t)
        for s in ("random", "extrapolation")
        for m, v, t in (("BbB", 0.0, -1.0), ("FGE", 0.0, -2.0), ("Proj-BNN", 1.0, -0.5), ("Proj-BNN (MMD)", 0.5, -3.0))
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "p.csv", index=False)
    text = "* bullet\n  <!-- generated: proj-uci-wins p.csv -->\n  stale\n  <!-- end generated -->\n  after\n"
    new, changed = report.render_blocks(text, tmp_path)
    assert changed == ["README.md:2 (proj-uci-wins from p.csv)"]
    body = new.split("-->\n", 1)[1].split("  <!-- end generated -->")[0]
    assert all(line.startswith("  ") and len(line) <= 100 for line in body.splitlines())
    assert " ".join(body.split()).startswith("Against BbB and FGE in test LL, the Proj-BNN variant chosen")
    assert new.endswith("  <!-- end generated -->\n  after\n")
    assert report.render_blocks(new, tmp_path) == (new, [])


def test_proj_uci_wins_counts_the_variant_validation_chose_not_the_better_test_value():
    """A cell where eq. 6 validates better but the MMD decoder tests better counts for "chosen"
    only if eq. 6 itself beats BbB and FGE."""
    from pyro_bnnlv.reproduce.projected import uci_wins_summary

    def cell(scheme, eq6, mmd):  # (valid_ll, test_ll) per variant; BbB -1, FGE -2
        return [
            dict(dataset="d", scheme=scheme, method="BbB", valid_ll=0.0, test_ll=-1.0),
            dict(dataset="d", scheme=scheme, method="FGE", valid_ll=0.0, test_ll=-2.0),
            dict(dataset="d", scheme=scheme, method="Proj-BNN", valid_ll=eq6[0], test_ll=eq6[1]),
            dict(dataset="d", scheme=scheme, method="Proj-BNN (MMD)", valid_ll=mmd[0], test_ll=mmd[1]),
        ]

    rows = cell("a", (1.0, -1.5), (0.0, -0.5)) + cell("b", (0.0, -0.8), (1.0, -0.7))
    text = uci_wins_summary([pd.DataFrame(rows)], ["x.csv"], {})
    assert "(the MMD decoder in 1 of 2 cells, eq. 6 in 1) is best in 1 of 2 (not on d a)" in text
    assert "eq. 6's decoder alone in 1 of 2 (not on d a)" in text
    assert "the MMD decoder alone in 2 of 2." in text


def _hyvi_rows(diffs_nn: list[float], diffs_funn: list[float]) -> pd.DataFrame:
    """Ten splits; MFVI's test LL -1 each, NN-HyVI and FuNN-HyVI MFVI's plus the given differences."""
    rows = []
    for split, (a, b) in enumerate(zip(diffs_nn, diffs_funn)):
        for method, ll in (("MFVI", -1.0), ("NN-HyVI", -1.0 + a), ("FuNN-HyVI", -1.0 + b)):
            rows.append(
                dict(dataset="wine", split=split, method=method, test_ll=ll, rmse=0.7, auroc_ood=0.9, status="done")
            )
    return pd.DataFrame(rows)


def test_hyvi_uci_paired_table_gives_a_clear_win_and_a_tie():
    from pyro_bnnlv.reproduce.hyvi import uci_paired_summary, uci_paired_table

    # NN-HyVI 0.5 above MFVI on every split (+-0.05): a win; FuNN-HyVI's +0.6 / -0.6 alternate: a tie
    nn = [0.5 + (0.05 if s % 2 else -0.05) for s in range(10)]
    funn = [0.6 if s % 2 else -0.6 for s in range(10)]
    table = uci_paired_table([_hyvi_rows(nn, funn)], ["x.csv"], {})
    lines = {line.split("|")[2].strip(): line for line in table.splitlines()[2:]}
    assert set(lines) == {"NN-HyVI minus MFVI", "NN-HyVI minus FuNN-HyVI", "MFVI minus FuNN-HyVI"}
    assert "0.50 (0.02), NN-HyVI" in lines["NN-HyVI minus MFVI"]
    assert "0.00 (0.20), tie" in lines["MFVI minus FuNN-HyVI"]
    # Table 5's wine: NN-HyVI -1.342, MFVI -0.981
    assert "| -0.36 |" in lines["NN-HyVI minus MFVI"] and "0.00 (0.00), n/a" in lines["NN-HyVI minus MFVI"]
    text = uci_paired_summary([_hyvi_rows(nn, funn)], ["x.csv"], {})
    assert "Table 5's best method on 0 of 1 sets" in text and "ahead of both others on wine" in text
    tie = uci_paired_summary([_hyvi_rows(funn, [-1.0] * 10)], ["x.csv"], {})
    assert "ties the runner-up on wine (MFVI minus NN-HyVI 0.00, SE 0.20)" in tie
    with pytest.raises(ValueError, match="at least 2"):
        uci_paired_summary([_hyvi_rows(nn, funn).query("split == 0")], ["x.csv"], {})


def test_ncai_paired_summary_names_wins_and_ties():
    from pyro_bnnlv.reproduce.ncai import paired_summary

    rows = []
    noisy = [0.9, -0.7, 0.8, -0.6, 0.1]
    for split in range(5):
        rows += [
            dict(dataset="toy", split=split, method="BNN (MFVI)", test_ll=-1.0, mi_x_z=None, hz_z=None),
            dict(
                dataset="toy",
                split=split,
                method="BNN+LV (MFVI)",
                test_ll=0.5 - noisy[split],
                mi_x_z=0.5,
                hz_z=0.1 + noisy[split],
            ),
            dict(
                dataset="toy",
                split=split,
                method="BNN+LV (NCAI_lambda)",
                test_ll=0.5 + 0.01 * split,
                mi_x_z=0.1 + 0.01 * split,
                hz_z=0.1,
            ),
        ]
    text = paired_summary([pd.DataFrame(rows)], ["x.csv"], {})
    assert "above the BNN's on toy (1.52, SE 0.01)" in text
    assert "; tied with BNN+LV MFVI's on toy (0.12, SE 0.33)." in text  # differences 0.9, -0.69, 0.82, -0.57, 0.14
    assert "`I(x; mu_z)` is below MFVI's on 1 of 1." in text
    assert "`HZ(mu_z)` is below MFVI's on 0 of 1 (a tie on toy)" in text


def test_in_between_paired_table_pairs_by_split_and_says_tie_within_noise():
    from pyro_bnnlv.reproduce.in_between import protocol_paired_table

    # MAP 0.3 above the default on every split (+-0.01): a win; LL +-0.5 alternating: a tie;
    # SL only in the first run: no row; split 5 only in the first run: not paired
    def run(map_ll, ll, sl=None, splits=range(5)):
        rows = [
            {
                "dataset": "boston",
                "kind": "standard",
                "split": s,
                "MAP": map_ll[s],
                "LL": ll[s],
                **({"SL": sl} if sl is not None else {}),
            }
            for s in splits
        ]
        return pd.DataFrame(rows)

    first = run(
        [-2.0 + (0.01 if s % 2 else -0.01) for s in range(6)],
        [0.5 if s % 2 else -0.5 for s in range(6)],
        sl=-3.0,
        splits=range(6),
    )
    default = run([-2.3] * 5, [0.0] * 5)
    lines = protocol_paired_table([first, default], ["a.csv", "b.csv"], {"label": "App._D"}).splitlines()
    assert lines[0].startswith("| set | splits | method | n | App. D | default | App. D - default (SE), verdict |")
    rows = {line.split("|")[3].strip(): line for line in lines[2:]}
    assert set(rows) == {"MAP", "LL"}
    assert "| 5 | -2.00 | -2.30 | +0.30 (0.00), App. D better | -2.69 |" in rows["MAP"]
    assert "| -0.10 (0.24), tie |" in rows["LL"]
    with pytest.raises(ValueError, match="two CSVs"):
        protocol_paired_table([first], ["a.csv"], {})
