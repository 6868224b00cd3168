"""Tests of the paper-reproduction recipes (recipes/label_dictatorship.py, bank_marketing.py,
pdaom_ablation.py): each runs its ``--quick`` mode in-process and the tests check properties of
the results that hold robustly at that size, plus the data-file errors and the small helpers."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import ModuleType

import pytest
import torch

from mlloss.metrics import multilabel_auc
from recipe_util import load_recipe

BANK_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bank-marketing" / "bank-full.csv"


@pytest.fixture(scope="module")
def dictatorship() -> ModuleType:
    return load_recipe("label_dictatorship")


@pytest.fixture(scope="module")
def bank() -> ModuleType:
    return load_recipe("bank_marketing")


@pytest.fixture(scope="module")
def pdaom() -> ModuleType:
    return load_recipe("pdaom_ablation")


def _finite_unit(value: float) -> bool:
    return math.isfinite(value) and 0.0 <= value <= 1.0


# --------------------------------------------------------------------------- label dictatorship


@pytest.fixture(scope="module")
def dictatorship_results(dictatorship, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("label_dictatorship")
    return dictatorship.main(["--quick", "--output-dir", str(out)]), out


def _bayes_row(results: dict, tau: float, prior: float) -> dict:
    (row,) = [r for r in results["bayes"] if r["tau"] == tau and r["pi2"] == prior]
    return row


def test_shift_for_prior_hits_the_target(dictatorship):
    x = dictatorship.sample_inputs(5000, torch.Generator().manual_seed(1))
    for tau, prior in ((1.0, 0.02), (20.0, 0.3), (100.0, 0.9)):
        rho = dictatorship.shift_for_prior(x, tau, prior)
        eta = dictatorship.class_probabilities(x, tau, rho)
        assert float(eta[:, 1].mean()) == pytest.approx(prior, abs=1e-9)
    rho = dictatorship.shift_for_prior(x, math.inf, 0.3)  # deterministic labels: a quantile of x2
    assert float(dictatorship.class_probabilities(x, math.inf, rho)[:, 1].mean()) == pytest.approx(0.3, abs=1 / 5000)


def test_bayes_scorers_coincide_for_balanced_labels(dictatorship_results):
    """pi_1 = pi_2 = 0.5: the LoA scorer is 4 x the LaA scorer, the same ranking."""
    row = _bayes_row(dictatorship_results[0], 100.0, 0.5)
    assert row["loa"] == row["laa"]


def test_population_auc_is_the_auc_with_labels_integrated_out(dictatorship):
    generator = torch.Generator().manual_seed(3)
    scores = torch.randint(0, 6, (40,), generator=generator).double()  # many ties
    hard = torch.randint(0, 2, (40, 2), generator=generator).double()
    assert torch.equal(dictatorship.population_auc(scores, hard), multilabel_auc(scores, hard))
    eta = torch.rand(40, 1, generator=generator, dtype=torch.float64)
    draws = torch.bernoulli(eta.T.expand(20_000, -1), generator=generator)  # 20k label vectors
    # E[#concordant] / E[#pairs] over draws: sum the per-draw numerators and denominators
    positive, negative = draws, 1 - draws
    above = (scores[:, None] > scores[None, :]).double() + 0.5 * (scores[:, None] == scores[None, :]).double()
    above.fill_diagonal_(0)
    concordant = torch.einsum("di,ij,dj->", positive, above, negative)
    pairs = (positive.sum(1) * negative.sum(1)).sum()
    expected = float(dictatorship.population_auc(scores, eta)[0])
    assert float(concordant / pairs) == pytest.approx(expected, abs=3e-3)


def test_bayes_deterministic_limit_matches_the_closed_form(dictatorship, dictatorship_results):
    """tau = inf (eta in {0, 1}) on 20k points agrees with the closed form of docs/results.md, which
    has LoA's gap q^2 *shrink* as label 2 gets more skewed and fall below LaA's q/8 - q^2/2 once
    pi_2 (1 - pi_2) < 1/12: with a rare label 2 there are few disputed points left to dictate."""
    results = dictatorship_results[0]
    for prior in (0.5, 0.4, 0.3, 0.2, 0.05):
        row, limit = _bayes_row(results, math.inf, prior), dictatorship.deterministic_limit(prior)
        for scorer in ("loa", "laa"):
            assert row[scorer]["diff"] == row[scorer]["population"]["diff"]  # labels are eta
            for metric in ("auc1", "auc2", "diff"):
                assert row[scorer][metric] == pytest.approx(limit[scorer][metric], abs=3e-3)
    gaps = [_bayes_row(results, math.inf, p)["loa"]["diff"] for p in (0.4, 0.3, 0.2, 0.05)]
    assert gaps == sorted(gaps, reverse=True)
    most_skewed = _bayes_row(results, math.inf, 0.05)
    assert most_skewed["laa"]["diff"] > most_skewed["loa"]["diff"]


def test_bayes_loa_dictatorship_for_moderate_skew(dictatorship_results):
    """Fig. 2, near-deterministic labels (tau = 100): once label 2 is skewed, the LoA scorer favours
    it (label dictatorship), and its |AUC_1 - AUC_2| is well above LaA's and above its own value
    at pi_2 = 0.5. Population AUCs (no label noise)."""
    results = dictatorship_results[0]
    balanced = _bayes_row(results, 100.0, 0.5)["loa"]["population"]["diff"]
    for prior in (0.4, 0.3, 0.2):
        row = _bayes_row(results, 100.0, prior)
        loa, laa = row["loa"]["population"], row["laa"]["population"]
        assert loa["diff"] > balanced + 0.005
        assert loa["diff"] > laa["diff"] + 0.01
        assert loa["auc2"] > laa["auc2"] and loa["auc1"] < laa["auc1"]  # label 2 is the one favoured


def test_bayes_loa_gap_grows_as_labels_become_deterministic(dictatorship_results):
    """Sec. 7: "the closer the distributions are to being deterministic, the larger is Delta_AUC for
    loss aggregation" (tau = 5 < 100 < inf)."""
    results = dictatorship_results[0]
    for prior in (0.4, 0.3):
        gaps = [_bayes_row(results, tau, prior)["loa"]["population"]["diff"] for tau in (5.0, 100.0, math.inf)]
        assert gaps[0] + 0.005 < gaps[1] < gaps[2]


def test_results_name_the_command_that_made_them(dictatorship_results):
    results, out = dictatorship_results
    command = results["provenance"]["command"]
    assert command.startswith("python recipes/label_dictatorship.py --quick")
    assert (out / "results.md").read_text().startswith(f"Produced by `{command}`")
    assert results["provenance"]["runtime_s"] > 0


def test_trained_study_reports_every_objective(dictatorship_results):
    results, out = dictatorship_results
    cells = {(r["pi2"], r["objective"]) for r in results["trained"]}
    assert cells == {(p, o) for p in (0.5, 0.9) for o in ("loa", "laa", "balanced-loa")}
    for row in results["trained"]:
        assert len(row["per_seed"]) == 2
        assert all(_finite_unit(row[m]["mean"]) for m in ("auc1", "auc2", "diff", "min"))
        assert row["auc1"]["mean"] > 0.6 and row["auc2"]["mean"] > 0.6  # the MLP learned something
    assert json.loads((out / "results.json").read_text())["trained"]
    assert "Table 6" in (out / "results.md").read_text()


def test_cells_give_the_same_results_in_worker_processes(dictatorship, tmp_path):
    """--workers spreads the (pi_2, objective) cells over spawned processes; every cell seeds its
    own generators and runs with one thread, so the trained models are identical bit for bit."""
    tiny = ["--study", "trained", "--train-priors", "0.7", "--objectives", "loa", "laa", "--seeds", "0", "1",
            "--train-size", "300", "--test-size", "300", "--epochs", "2", "--hidden", "8", "--batch-size", "100"]
    serial = dictatorship.main(tiny + ["--workers", "1", "--output-dir", str(tmp_path / "serial")])
    parallel = dictatorship.main(tiny + ["--workers", "2", "--output-dir", str(tmp_path / "parallel")])
    assert [r["per_seed"] for r in serial["trained"]] == [r["per_seed"] for r in parallel["trained"]]
    assert parallel["provenance"]["workers"] == 2


def test_a_seeds_model_does_not_depend_on_the_other_seeds(dictatorship, tmp_path):
    """Seed s has its own generators (data, then initialisation and batch order) and, for balanced
    LoA, its own running priors, so ``--seeds 1`` reruns seed 1 of ``--seeds 2 0 1`` bit for bit.
    They came from one generator seeded by the first seed, drawn in blocks sized by the number of
    seeds, and balanced LoA pooled the seeds' label means. ``--seed`` (the Bayes study's) no longer
    moves the trained study's rho: ``--rho-seed`` does."""
    quick = ["--quick", "--study", "trained", "--train-priors", "0.9", "--objectives", "loa", "laa", "balanced-loa"]
    together = dictatorship.main(quick + ["--seeds", "2", "0", "1", "--output-dir", str(tmp_path / "together")])
    alone = dictatorship.main(quick + ["--seeds", "1", "--seed", "7", "--output-dir", str(tmp_path / "alone")])
    for many, one in zip(together["trained"], alone["trained"], strict=True):
        assert one["rho"] == many["rho"]
        assert one["per_seed"] == [many["per_seed"][2]]
    other_rho = dictatorship.main(quick + ["--seeds", "1", "--objectives", "loa", "--rho-seed", "7",
                                           "--output-dir", str(tmp_path / "rho")])
    assert other_rho["trained"][0]["rho"] != alone["trained"][0]["rho"]


# --------------------------------------------------------------------------- banking


@pytest.fixture(scope="module")
def bank_results(bank, tmp_path_factory) -> tuple[dict, Path]:
    if not BANK_DATA.is_file():
        pytest.skip(f"Bank Marketing data not found at {BANK_DATA}")
    out = tmp_path_factory.mktemp("bank_marketing")
    return bank.main(["--quick", "--data", str(BANK_DATA), "--output-dir", str(out)]), out


def test_bank_quick_run_gives_finite_aucs_for_every_objective(bank, bank_results):
    results, out = bank_results
    assert [r["objective"] for r in results["table3"]] == list(bank.OBJECTIVES)
    for row in results["table3"] + results["sweep"]:
        assert all(_finite_unit(t[m]) for t in row["per_trial"] for m in ("mortgage", "loan", "diff", "min"))
        for trial in row["per_trial"]:
            assert trial["diff"] == pytest.approx(abs(trial["mortgage"] - trial["loan"]))
            assert trial["min"] == min(trial["mortgage"], trial["loan"])
    assert {r["rate"] for r in results["sweep"]} == {0.5}
    text = (out / "results.md").read_text()
    assert text.startswith("Produced by `python recipes/bank_marketing.py --quick")
    assert "| LaA | paper | 0.616" in text


def test_bank_trials_do_not_depend_on_the_number_of_trials(bank, tmp_path):
    """Trial t has its own generators (rows and split, then initialisation and batch order) and, for
    balanced LoA, its own running priors, so ``--trials 2`` gives the first two trials of
    ``--trials 3`` bit for bit (the initialisations and batch orders came from one generator,
    drawn in blocks sized by the number of trials)."""
    if not BANK_DATA.is_file():
        pytest.skip(f"Bank Marketing data not found at {BANK_DATA}")
    quick = ["--quick", "--data", str(BANK_DATA), "--no-sweep", "--rows", "1000", "--epochs", "2"]
    three = bank.main(quick + ["--trials", "3", "--output-dir", str(tmp_path / "three")])
    two = bank.main(quick + ["--trials", "2", "--output-dir", str(tmp_path / "two")])
    for many, few in zip(three["table3"], two["table3"], strict=True):
        assert few["per_trial"] == many["per_trial"][:2]


def test_bank_resample_hits_the_rate_exactly(bank):
    mortgage = torch.tensor([1.0] * 60 + [0.0] * 40)
    index = bank.resample(mortgage, 0.9, 50, torch.Generator().manual_seed(0))
    assert len(index) == 50 and len(set(index.tolist())) == 50
    assert int(mortgage[index].sum()) == 45
    with pytest.raises(ValueError, match="cannot draw 80 rows"):
        bank.resample(mortgage, 0.9, 80, torch.Generator().manual_seed(0))


def test_bank_missing_file_names_the_path_the_source_and_the_option(bank, tmp_path):
    # A fresh clone has no ../shared: the message said to pass --data, not where the file comes from.
    missing = tmp_path / "nope.csv"
    with pytest.raises(FileNotFoundError, match=r"nope\.csv; download bank-full\.csv from the UCI Machine Learning Repository "
                                                r"\(Bank Marketing, https://archive\.ics\.uci\.edu/dataset/222/bank\+marketing\) "
                                                r"and pass --data PATH/TO/bank-full\.csv"):
        bank.load_bank(missing)


def test_bank_malformed_files_name_the_path_and_line(bank, tmp_path):
    comma = tmp_path / "comma.csv"
    comma.write_text("age,balance,housing,loan\n30,100,yes,no\n")
    with pytest.raises(ValueError, match="comma.csv lacks the columns"):
        bank.load_bank(comma)
    header = ";".join(f'"{c}"' for c in (*bank.NUMERIC_FEATURES, *bank.LABELS))
    bad_label = tmp_path / "bad_label.csv"
    bad_label.write_text(header + "\n" + ";".join(["1"] * 7) + ';"yes";"maybe"\n')
    with pytest.raises(ValueError, match="bad_label.csv, line 2"):
        bank.load_bank(bad_label)
    bad_number = tmp_path / "bad_number.csv"
    bad_number.write_text(header + "\n" + ";".join(["1"] * 6) + ';"x";"yes";"no"\n')
    with pytest.raises(ValueError, match="bad_number.csv, line 2"):
        bank.load_bank(bad_number)


@pytest.mark.parametrize(("column", "value"), [("age", "nan"), ("balance", "inf"), ("pdays", "-inf")])
def test_bank_refuses_features_that_are_not_finite(bank, tmp_path, column, value):
    # float() read "nan" and "inf", which then spread through the standardisation of every trial
    header = ";".join(f'"{c}"' for c in (*bank.NUMERIC_FEATURES, *bank.LABELS))
    row = ["1"] * 7
    row[bank.NUMERIC_FEATURES.index(column)] = value
    path = tmp_path / "bank.csv"
    path.write_text(header + "\n" + ";".join(["1"] * 7) + ';"yes";"no"\n' + ";".join(row) + ';"no";"no"\n')
    with pytest.raises(ValueError, match=rf"bank\.csv, line 3, column '{column}': '{value}' is not a finite number"):
        bank.load_bank(path)


# --------------------------------------------------------------------------- PDAOM


def test_pdaom_quick_run_trains_and_reports_auc_and_gauc(pdaom, tmp_path):
    results = pdaom.main(["--quick", "--output-dir", str(tmp_path)])
    assert set(results["table5"]) == set(pdaom.OBJECTIVES)
    for stats in results["table5"].values():
        for metric in pdaom.METRICS:
            assert 0 < stats[metric]["mean"] < 100  # in points (x100)
    bce = results["table5"]["bce"]
    assert all(bce[m]["delta_mean"] == 0 for m in pdaom.METRICS)  # CE minus itself, same seed
    assert all(math.isfinite(results["oracle"][m]) for m in pdaom.METRICS)
    assert set(results["lambda_sweep"]) == {"10.0"} and set(results["batch_sweep"]) == {"128"}
    assert "CE+PDAOM" in (tmp_path / "results.md").read_text()


def test_pdaom_objectives_use_groups_only_for_pdaom(pdaom):
    grouped = {name: pdaom.build_objective(name, 1.0, 384)[1] for name in pdaom.OBJECTIVES}
    assert grouped == {"bce": False, "bce+pel": False, "bce+daom": False, "bce+pdaom": True}


def test_quick_sets_defaults_that_the_command_line_still_overrides(dictatorship, bank, pdaom):
    # --quick's small sizes are defaults: options typed beside it win (they were overwritten).
    args = pdaom.parse_args(["--quick", "--epochs", "3", "--seeds", "0", "1", "2", "--users", "1000"])
    assert (args.epochs, args.seeds, args.users, args.items) == (3, [0, 1, 2], 1000, 200)
    args = dictatorship.parse_args(["--quick", "--epochs", "3", "--hidden", "64"])
    assert (args.epochs, args.hidden, args.samples) == (3, 64, 20_000)
    args = bank.parse_args(["--quick", "--trials", "10", "--batch-size", "64"])
    assert (args.trials, args.batch_size, args.rows) == (10, 64, 2000)
    assert pdaom.parse_args([]).epochs != 1 and bank.parse_args([]).trials != 3  # and no --quick, no quick values


@pytest.mark.parametrize("recipe,argv,message", [
    ("pdaom", ["--lam", "-1"], r"--lam must be finite and >= 0; got -1.0"),
    ("pdaom", ["--sweep-batch-sizes", "128", "0"], r"--sweep-batch-sizes must be >= 1 \(each value\); got \[128, 0\]"),
    ("pdaom", ["--sweep-lams", "nan"], r"--sweep-lams must be finite and >= 0 \(each value\); got \[nan\]"),
    ("pdaom", ["--bottom-hidden", "0"], r"--bottom-hidden must be >= 1"),
    ("pdaom", ["--lr", "0"], r"--lr must be finite and > 0; got 0.0"),
    ("dictatorship", ["--lr", "-1"], r"--lr must be finite and > 0; got -1.0"),
    ("bank", ["--lr", "inf"], r"--lr must be finite and > 0; got inf"),
    # Seeds outside torch.Generator's range failed in manual_seed ("Overflow when unpacking long long", no
    # option named), the banking one after the data had loaded; too small training or test parts failed
    # in training ("scores must be finite") or gave NaN AUCs.
    ("dictatorship", ["--seed", str(2**64)], r"--seed must be in \[0, 2\*\*32 - 1\]; got 18446744073709551616"),
    ("dictatorship", ["--rho-seed", "-1"], r"--rho-seed must be in \[0, 2\*\*32 - 1\]; got -1"),
    ("dictatorship", ["--seeds", "0", str(2**32 - 10_000)],
     r"--seeds must be in \[0, 4294957295\] \(each value\) \(from 2\*\*32 - 10000 on, .*; got \[0, 4294957296\]"),
    ("bank", ["--seed", str(2**50)], r"--seed must be in \[0, 2\*\*32 - 1\]; got 1125899906842624"),
    ("bank", ["--rows", "5", "--test-fraction", "0.05"],
     r"--rows 5 with --test-fraction 0.05 gives 0 test and 5 training rows; each part needs at least 2"),
    ("bank", ["--rows", "3"], r"--rows 3 with --test-fraction 0.2 gives 1 test and 2 training rows"),
    ("pdaom", ["--seeds", "0", str(2**64)], r"--seeds must be in \[0, 2\*\*32 - 1\] \(each value\); got \[0, 18446744073709551616\]"),
    ("pdaom", ["--data-seed", "-1"], r"--data-seed must be in \[0, 2\*\*32 - 1\]; got -1"),
])
def test_paper_recipe_options_are_checked_before_any_work(recipe, argv, message, request, capsys):
    # --lam -1 failed after the CE runs had trained, naming lam / batch_size; --sweep-batch-sizes 0
    # after Table V and the lambda sweep.
    module = request.getfixturevalue(recipe)
    with pytest.raises(SystemExit):
        module.parse_args(["--quick", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_the_sweeps_switch_reads_as_it_works(pdaom, bank):
    assert pdaom.parse_args([]).sweeps and not pdaom.parse_args(["--no-sweeps"]).sweeps
    assert bank.parse_args([]).sweep and not bank.parse_args(["--no-sweep"]).sweep
