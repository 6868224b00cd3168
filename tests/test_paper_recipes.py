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

import mlloss
from mlloss.data import GroupBatchSampler, SyntheticConfig, generate_impressions, split_by_time
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
        # above chance; --quick takes 10 Adam steps, so this is mostly the initialisation's ranking:
        # test_single_label_auc_objectives_favour_their_own_label checks that training moves it
        assert row["auc1"]["mean"] > 0.6 and row["auc2"]["mean"] > 0.6
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


def test_trained_rows_draw_label_2_at_their_pi2_and_report_its_loa_weight_ratio(dictatorship, dictatorship_results):
    """A trained row's rho gives label 2 the prior pi_2 on the seeds' training data (it was found on the
    reference sample for that pi_2), and ``loa_effective_weight_ratio`` is LoA's weight of label 2 over
    label 1 on that data, alpha_2 / alpha_1 = pi_1 (1 - pi_1) / (pi_2 (1 - pi_2))."""
    results, _ = dictatorship_results
    config = results["config"]
    for row in results["trained"]:
        _, labels, _, _ = dictatorship.make_datasets(config["seeds"], config["train_tau"], row["rho"],
                                                     config["train_size"], config["test_size"])
        rates = labels.reshape(-1, 2).double().mean(0)
        assert float(rates[1]) == pytest.approx(row["pi2"], abs=0.03)
        spread = rates * (1 - rates)
        assert row["loa_effective_weight_ratio"] == pytest.approx(float(spread[0] / spread[1]), rel=1e-5)


def test_trained_summaries_are_the_mean_and_sample_std_over_seeds(dictatorship_results):
    """A trained row's ``mean +/- std`` is the mean and the sample standard deviation (n - 1) of its seeds'."""
    import statistics

    for row in dictatorship_results[0]["trained"]:
        for metric in ("auc1", "auc2", "diff", "min"):
            values = [seed[metric] for seed in row["per_seed"]]
            assert row[metric]["mean"] == pytest.approx(statistics.fmean(values), abs=1e-12)
            assert row[metric]["std"] == pytest.approx(statistics.stdev(values), abs=1e-12)

def test_single_label_auc_objectives_favour_their_own_label(dictatorship, tmp_path):
    """Table 6's first rows: AUC(y1) trains on label 1 and AUC(y2) on label 2, so each ranks its own
    label far better than the other (w1 and w2 are 45 degrees apart). 300 steps: --quick's 10 train
    next to nothing."""
    results = dictatorship.main(["--quick", "--study", "trained", "--train-priors", "0.7", "--objectives", "auc-y1",
                                 "auc-y2", "--seeds", "0", "--epochs", "30", "--batch-size", "100", "--output-dir", str(tmp_path)])
    rows = {row["objective"]: row for row in results["trained"]}
    assert rows["auc-y1"]["auc1"]["mean"] > rows["auc-y1"]["auc2"]["mean"] + 0.1
    assert rows["auc-y2"]["auc2"]["mean"] > rows["auc-y2"]["auc1"]["mean"] + 0.1


def test_batched_mlp_is_one_relu_mlp_per_generator(dictatorship):
    """Model m of ``BatchedMLP`` is the MLP 2 -> hidden -> hidden -> 1 with ReLU between the layers
    (App. G.3), here rebuilt from its weights as ``nn.Linear`` layers."""
    batched = dictatorship.BatchedMLP(8, [torch.Generator().manual_seed(seed) for seed in (4, 9)])
    x = torch.randn(2, 50, 2, generator=torch.Generator().manual_seed(0))
    assert [tuple(w.shape[1:]) for w in batched.weights] == [(2, 8), (8, 8), (8, 1)]
    with torch.no_grad():
        scores = batched(x)
        for m in range(2):
            layers: list[torch.nn.Module] = []
            for weight, bias in zip(batched.weights, batched.biases):
                linear = torch.nn.Linear(weight.shape[1], weight.shape[2])
                linear.weight.copy_(weight[m].T)
                linear.bias.copy_(bias[m, 0])
                layers += [linear, torch.nn.ReLU()]
            torch.testing.assert_close(scores[m], torch.nn.Sequential(*layers[:-1])(x[m]).squeeze(-1))


def test_trained_seeds_take_epochs_passes_of_batch_size_batches(dictatorship, monkeypatch):
    """``--epochs`` passes over the training points, each in batches of ``--batch-size`` (the last one
    shorter), one loss call per batch."""
    batch_sizes = []

    class Counting(dictatorship.SideBySideLoss):
        def __call__(self, scores, labels):
            batch_sizes.append(scores.shape[1])
            return super().__call__(scores, labels)

    monkeypatch.setattr(dictatorship, "SideBySideLoss", Counting)
    args = dictatorship.parse_args(["--quick", "--epochs", "3", "--batch-size", "300", "--hidden", "4"])
    x, y, _, _ = dictatorship.make_datasets([0, 1], 20.0, 0.0, 700, 10)
    dictatorship.train_seeds("loa", x, y, [0, 1], args)
    assert batch_sizes == [300, 300, 100] * 3


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


def _bank_like(rows: int = 3000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Features (rows, 7) on the scales of bank-full.csv's columns and labels (housing, loan) that each
    follow one feature: housing feature 0 (about half positive), loan feature 1 (about a fifth)."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(rows, 7, generator=generator, dtype=torch.float64) * torch.arange(1.0, 8.0) * 10 + 40
    noise = torch.randn(rows, 2, generator=generator, dtype=torch.float64)
    housing = (features[:, 0] - 40) / 10 + noise[:, 0] > 0
    loan = (features[:, 1] - 40) / 20 + noise[:, 1] > 1.2
    return features, torch.stack([housing, loan], 1).float()


def test_bank_trials_standardise_with_their_own_training_rows(bank):
    """Each trial's features are standardised with the mean and std of its training rows alone (the
    test rows are not looked at), and each trial keeps round(rows * rate) positive mortgages."""
    features, labels = _bank_like()
    args = bank.parse_args(["--quick", "--rows", "500", "--trials", "2"])
    x, y, x_test, y_test = bank.make_trials(features, labels, 0.3, args)
    assert x.shape == (2, 400, 7) and x_test.shape == (2, 100, 7)
    torch.testing.assert_close(x.double().mean(1), torch.zeros(2, 7, dtype=torch.float64), rtol=0, atol=1e-5)
    torch.testing.assert_close(x.double().std(1), torch.ones(2, 7, dtype=torch.float64), rtol=0, atol=1e-5)
    assert [int(y[t, :, 0].sum() + y_test[t, :, 0].sum()) for t in range(2)] == [150, 150]


def test_bank_cell_reports_the_test_aucs_of_each_trials_weights(bank, monkeypatch):
    """run_cell's per-trial AUCs are those of trial t's weights on trial t's test rows, against the
    mortgage and the loan label, and its loan rate is that of the training rows."""
    features, labels = _bank_like()
    args = bank.parse_args(["--quick", "--rows", "600", "--trials", "3"])
    data = bank.make_trials(features, labels, 0.5, args)
    weights = torch.randn(3, 7, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(bank, "train_linear", lambda name, x, y, args: weights)
    row = bank.run_cell("laa", data, 0.5, args)
    _, y, x_test, y_test = data
    for t, trial in enumerate(row["per_trial"]):
        scores = x_test[t] @ weights[t]
        for k, label in enumerate(("mortgage", "loan")):
            positive, negative = scores[y_test[t, :, k] == 1], scores[y_test[t, :, k] == 0]
            difference = positive[:, None] - negative[None, :]
            expected = float((difference > 0).double().mean() + 0.5 * (difference == 0).double().mean())
            assert trial[label] == pytest.approx(expected, abs=1e-6)
    loan = torch.cat([y[t, :, 1] for t in range(3)])
    assert row["train_loan_rate"] == pytest.approx(float(loan.sum() / len(loan)))


def test_bank_single_label_objectives_train_on_their_own_label(bank):
    """AUC(mortgage) trains on housing and AUC(loan) on loan: each ranks its own label the better."""
    features, labels = _bank_like()
    args = bank.parse_args(["--quick", "--rows", "1500", "--trials", "2", "--epochs", "3", "--batch-size", "128"])
    data = bank.make_trials(features, labels, 0.5, args)
    for name, own, other in (("auc-mortgage", "mortgage", "loan"), ("auc-loan", "loan", "mortgage")):
        for trial in bank.run_cell(name, data, 0.5, args)["per_trial"]:
            assert trial[own] > trial[other] + 0.1, (name, trial)


def test_bank_trials_start_from_their_own_initialisation(bank):
    """Trial t's initialisation and batch order come from its own generator: two trials given the
    same rows still train different weights."""
    features, labels = _bank_like()
    args = bank.parse_args(["--quick", "--rows", "500", "--trials", "1", "--epochs", "1"])
    x, y, _, _ = bank.make_trials(features, labels, 0.5, args)
    weights = bank.train_linear("loa", x.expand(2, -1, -1), y.expand(2, -1, -1), args)
    assert not torch.equal(weights[0], weights[1])


def test_bank_sweep_runs_sweep_trials_per_rate(bank, tmp_path):
    """``--sweep-trials`` sets the trials of the sweep's cells, ``--trials`` those of Table 3 (on a
    bank-full.csv-like file of synthetic rows)."""
    features, labels = _bank_like(rows=600)
    path = tmp_path / "bank.csv"
    header = ";".join(f'"{c}"' for c in (*bank.NUMERIC_FEATURES, *bank.LABELS))
    lines = [";".join(f"{v:.0f}" for v in row.tolist()) + ";" + ";".join('"yes"' if v else '"no"' for v in label.tolist())
             for row, label in zip(features, labels)]
    path.write_text("\n".join([header, *lines]) + "\n")
    results = bank.main(["--quick", "--data", str(path), "--rows", "200", "--trials", "3", "--sweep-trials", "2",
                         "--sweep-rates", "0.3", "0.5", "--objectives", "laa", "--sweep-objectives", "loa",
                         "--epochs", "1", "--output-dir", str(tmp_path / "out")])
    assert [(row["objective"], row["trials"], len(row["per_trial"])) for row in results["table3"]] == [("laa", 3, 3)]
    assert [(row["rate"], row["trials"], len(row["per_trial"])) for row in results["sweep"]] == [(0.3, 2, 2), (0.5, 2, 2)]


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
    # above 0 but below SyntheticConfig's 1: a traceback once the data were generated
    ("pdaom", ["--mean-impressions", "0.5"], r"--mean-impressions must be >= 1 \(impressions per user\); got 0.5"),
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


def _pairwise_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """AUC by counting the positive-negative pairs (ties 1/2)."""
    difference = scores[labels == 1][:, None] - scores[labels == 0][None, :]
    return float((difference > 0).double().mean() + 0.5 * (difference == 0).double().mean())


@pytest.mark.parametrize("name", ["bce+pel", "bce+pdaom"])
def test_pdaom_training_is_a_plain_loop_over_the_tasks_objectives(pdaom, name):
    """``train``: the model initialised from the seed, each user's impressions kept together in batches
    of ``batch_size`` reshuffled every epoch, each task's logit trained on its own label by Eq. 7's
    objective (PEL's all-pairs mean put on the summed-CE scale: lambda / batch size; PDAOM with the
    users as groups), the tasks' terms summed, one Adam step per batch; here written out by hand."""
    args = pdaom.parse_args(["--quick", "--epochs", "2"])
    data = generate_impressions(SyntheticConfig(num_users=80, num_items=60, mean_impressions=15, seed=5))
    seed, lam, batch_size = 3, 10.0, 64
    trained = pdaom.train(name, data, seed, lam, batch_size, args)

    torch.manual_seed(seed)
    model = pdaom.build_model(data, args)
    if name == "bce+pel":
        objective = mlloss.build_loss("bce+auc", surrogate="exponential", lam=lam / batch_size)
    else:
        objective = mlloss.build_loss("bce+pdaom", lam=lam)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    sampler = GroupBatchSampler(data.user, batch_size, seed=seed)
    steps = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for indices in sampler:
            index = torch.tensor(indices)
            logits = model(data.sparse[index], data.dense[index])
            groups = data.user[index] if name == "bce+pdaom" else None
            loss = objective(logits[:, 0], data.click[index], groups) + objective(logits[:, 1], data.purchase[index], groups)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
    assert steps > 2 * len(data) / batch_size
    for (key, got), want in zip(trained.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(got, want), key


def test_pdaom_reports_the_test_splits_auc_and_per_user_gauc_in_points(pdaom, monkeypatch):
    """A run's metrics are those of the model on the test split: AUC of each task's column and GAUC with
    every user that has both classes weighted 1 (Sun et al., Section III-C), x100."""
    args = pdaom.parse_args(["--quick"])
    data = generate_impressions(SyntheticConfig(num_users=200, num_items=100, mean_impressions=20, seed=2))
    train, _, test = split_by_time(data, val_fraction=0.0, test_fraction=0.3)
    torch.manual_seed(0)
    model = pdaom.build_model(train, args)  # untrained: its scores still rank
    monkeypatch.setattr(pdaom, "train", lambda *arguments: model)
    row = pdaom.run("bce", (train, test), 0, 1.0, 64, args)
    model.eval()
    with torch.no_grad():
        scores = model(test.sparse, test.dense)
    for t, task in enumerate(pdaom.TASKS):
        labels = getattr(test, task)
        assert row[f"{task}_auc"] == pytest.approx(100 * _pairwise_auc(scores[:, t], labels), abs=1e-6)
        users = [test.user == user for user in test.user.unique()]
        per_user = [_pairwise_auc(scores[rows, t], labels[rows]) for rows in users if 0 < labels[rows].sum() < rows.sum()]
        assert len(per_user) >= 2
        assert row[f"{task}_gauc"] == pytest.approx(100 * sum(per_user) / len(per_user), abs=1e-6)


def test_pdaom_sweeps_pair_each_cell_with_ce_at_its_batch_size(pdaom, tmp_path):
    """Fig. 4: the lambda sweep's CE+PDAOM runs (at ``--batch-size``) and the batch-size sweep's (at each
    size, lambda ``--lam``) are compared with CE at the same seed and batch size."""
    results = pdaom.main(["--quick", "--objectives", "bce+pdaom", "--batch-size", "256", "--sweep-lams", "10", "30",
                          "--sweep-batch-sizes", "128", "--output-dir", str(tmp_path)])
    runs = results["runs"]

    def paired_delta(batch_size: int, lam: float) -> dict[str, float]:
        ours = {r["seed"]: r for r in runs if r["objective"] == "bce+pdaom" and r["batch_size"] == batch_size and r["lam"] == lam}
        ce = {r["seed"]: r for r in runs if r["objective"] == "bce" and r["batch_size"] == batch_size}
        assert ours and ours.keys() == ce.keys(), (batch_size, lam)
        return {m: sum(ours[s][m] - ce[s][m] for s in ours) / len(ours) for m in pdaom.METRICS}

    for sweep, key, batch_size, lam in (("lambda_sweep", "10.0", 256, 10.0), ("lambda_sweep", "30.0", 256, 30.0),
                                        ("batch_sweep", "128", 128, 10.0)):
        expected = paired_delta(batch_size, lam)
        for m in pdaom.METRICS:
            assert results[sweep][key][m]["delta_mean"] == pytest.approx(expected[m], abs=1e-9), (sweep, key, m)
