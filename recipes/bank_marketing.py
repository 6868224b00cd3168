"""Loss versus label aggregation on UCI Bank Marketing: Lukasik et al. (2025), Table 3 and Fig. 3.

Two binary labels: ``housing`` (the paper's "mortgage", 55.6% positive in the full data) and
``loan`` (16.0%). The paper re-samples the data "with varying proportions of the positive mortgage
label" (Table 3: 0.9), trains "a linear model on numerical features using Adam for 100 epochs" with the
logistic surrogate, and averages 25 trials. It does not say more; our choices:

* resampling: every trial draws ``--rows`` rows without replacement, exactly round(rows * rate) of them
  with housing = 1 and the rest with housing = 0 (loan keeps whatever rate it has within each
  class), then splits them at random into train and test (``--test-fraction``). Each trial has its own
  resample, split, initialisation and batch order: trial t draws its rows and split from a generator
  seeded with ``trial_seed(seed, t)`` and its initialisation and batch order from one seeded with
  ``MODEL_SEED_OFFSET + trial_seed(seed, t)``, so that trial t is the same whatever ``--trials`` is
  (and trial t of the sweep at rate 0.9 is trial t of Table 3);
* features: the 7 numerical columns (age, balance, day, duration, campaign, pdays, previous),
  standardised with the mean and standard deviation of the trial's training rows; the categorical
  columns are not used;
* model: a linear scorer s = w.x (no bias: every objective here is pairwise, so a bias cancels),
  initialised uniformly in +-1/sqrt(7) like ``nn.Linear``; Adam (``--lr``), mini-batches of
  ``--batch-size``, ``--epochs`` epochs; the test AUCs are those after the last epoch;
* objectives, all with the logistic surrogate over all valid pairs of a batch: AUC(mortgage) and
  AUC(loan) (``AUCLoss`` on one label), LaA (``LaALoss()``: ybar = housing + loan, linear cost
  |ybar - ybar'|), LoA(1,1) (``LoALoss([1, 1])``) and balanced LoA (``LoALoss("balanced")``, whose
  a_k = pi_k (1 - pi_k) come from the running label means of training batches).

The trials of one (rate, objective) cell are trained together as one batched model: weights of
shape (trials, 7), the trial index passed to the loss as ``groups`` with ``reduction="sum"``, so
that each trial's weights get exactly the gradient of its own loss (Adam is elementwise). Balanced
LoA keeps one running prior estimate per trial (one loss module per trial, the trials' losses
summed), as a trial run alone would. The cells are independent and seed their own generators;
``--workers`` spreads them over processes of ``--threads`` threads each, with results identical for
any number of workers. The time goes to the loss (per trial and per pair of label levels, a
rectangle of score differences), not to the linear model.

    python recipes/bank_marketing.py                  # Table 3 (25 trials) and the Fig. 3 sweep
    python recipes/bank_marketing.py --no-sweep       # Table 3 only
    python recipes/bank_marketing.py --quick          # small version used by the tests

Writes ``results.json``, ``results.md`` (headed by the command that made them, its wall time and
the load average) and (with matplotlib) ``sweep.png`` to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import functools
import csv
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

import mlloss
from mlloss.metrics import multilabel_auc

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Provenance, SideBySideLoss, available_cores, check_ranges, check_seeds, config_dict,  # noqa: E402
                     parse_with_quick, pyplot, run_cells, summarize, write_outputs)

NUMERIC_FEATURES = ("age", "balance", "day", "duration", "campaign", "pdays", "previous")
LABELS = ("housing", "loan")  # housing is the paper's "mortgage"
DEFAULT_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "bank-marketing" / "bank-full.csv"
DATA_SOURCE = "the UCI Machine Learning Repository (Bank Marketing, https://archive.ics.uci.edu/dataset/222/bank+marketing)"
OBJECTIVES = ("auc-mortgage", "auc-loan", "laa", "loa", "balanced-loa")
OBJECTIVE_NAMES = {
    "auc-mortgage": "AUC(mortgage)",
    "auc-loan": "AUC(loan)",
    "laa": "LaA",
    "loa": "LoA(1,1)",
    "balanced-loa": "balanced LoA",
}
# Table 3 of the paper (mortgage positive rate 0.9): mean +/- the paper's error bar.
PAPER_TABLE3 = {
    "auc-mortgage": {"mortgage": "0.637 +/- 0.004", "loan": "0.523 +/- 0.002", "diff": "0.113 +/- 0.004", "min": "0.523 +/- 0.002"},
    "auc-loan": {"mortgage": "0.550 +/- 0.005", "loan": "0.573 +/- 0.002", "diff": "0.023 +/- 0.005", "min": "0.550 +/- 0.005"},
    "laa": {"mortgage": "0.616 +/- 0.003", "loan": "0.562 +/- 0.002", "diff": "0.054 +/- 0.005", "min": "0.562 +/- 0.002"},
    "loa": {"mortgage": "0.626 +/- 0.003", "loan": "0.555 +/- 0.002", "diff": "0.071 +/- 0.005", "min": "0.555 +/- 0.002"},
}
METRICS = ("mortgage", "loan", "diff", "min")
MODEL_SEED_OFFSET = 1 << 40  # a trial's model generator: MODEL_SEED_OFFSET + its data seed


# --------------------------------------------------------------------------- data


def load_bank(path: Path) -> tuple[Tensor, Tensor]:
    """(features (N, 7) float64 of ``NUMERIC_FEATURES``, labels (N, 2) float32 of ``LABELS``) from
    the ';'-separated ``bank-full.csv``; errors name the file and the offending line (and the column
    of a feature that is not a finite number)."""
    if not path.is_file():
        raise FileNotFoundError(f"Bank Marketing data not found at {path}; download bank-full.csv from {DATA_SOURCE} "
                                "and pass --data PATH/TO/bank-full.csv")
    with path.open(newline="") as handle:
        reader = csv.reader(handle, delimiter=";")
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path} is empty; expected the ';'-separated bank-full.csv")
        missing = [c for c in NUMERIC_FEATURES + LABELS if c not in header]
        if missing:
            raise ValueError(
                f"{path} lacks the columns {missing} (header read: {header[:6]}...); "
                "expected the ';'-separated bank-full.csv of UCI Bank Marketing"
            )
        feature_columns = [header.index(c) for c in NUMERIC_FEATURES]
        label_columns = [header.index(c) for c in LABELS]
        features, labels = [], []
        for line, row in enumerate(reader, start=2):
            features.append(_parse_features(row, feature_columns, path, line))
            labels.append(_parse_labels(row, label_columns, path, line))
    if not features:
        raise ValueError(f"{path} has a header but no data rows")
    return torch.tensor(features, dtype=torch.float64), torch.tensor(labels, dtype=torch.float32)


def _parse_features(row: list[str], columns: list[int], path: Path, line: int) -> list[float]:
    try:
        features = [float(row[c]) for c in columns]
    except (ValueError, IndexError) as error:
        raise ValueError(f"{path}, line {line}: cannot read the numerical features ({error}): {row}") from None
    for name, column, value in zip(NUMERIC_FEATURES, columns, features):
        if not math.isfinite(value):  # float() reads "nan" and "inf", which would poison the standardisation
            raise ValueError(f"{path}, line {line}, column {name!r}: {row[column]!r} is not a finite number")
    return features


def _parse_labels(row: list[str], columns: list[int], path: Path, line: int) -> list[float]:
    values = [row[c] if c < len(row) else "" for c in columns]
    if any(v not in ("yes", "no") for v in values):
        raise ValueError(f"{path}, line {line}: labels {dict(zip(LABELS, values))} must be 'yes' or 'no'")
    return [float(v == "yes") for v in values]


def resample(mortgage: Tensor, rate: float, rows: int, generator: torch.Generator) -> Tensor:
    """Indices of ``rows`` rows, round(rows * rate) with mortgage = 1, drawn without replacement."""
    positives = torch.nonzero(mortgage == 1).flatten()
    negatives = torch.nonzero(mortgage == 0).flatten()
    num_positive = round(rows * rate)
    if num_positive > len(positives) or rows - num_positive > len(negatives):
        raise ValueError(
            f"cannot draw {rows} rows with mortgage rate {rate}: the data has {len(positives)} positives "
            f"and {len(negatives)} negatives; lower --rows"
        )
    chosen = torch.cat([
        positives[torch.randperm(len(positives), generator=generator)[:num_positive]],
        negatives[torch.randperm(len(negatives), generator=generator)[: rows - num_positive]],
    ])
    return chosen[torch.randperm(rows, generator=generator)]


def trial_seed(seed: int, trial: int) -> int:
    """The seed of trial ``trial``'s data generator (rows drawn and train/test split)."""
    return seed * 1_000_003 + trial


def make_trials(
    features: Tensor, labels: Tensor, rate: float, args: argparse.Namespace
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-trial standardised (train x, train y, test x, test y), stacked on a leading trial axis."""
    num_test = round(args.rows * args.test_fraction)
    parts: list[list[Tensor]] = [[], [], [], []]
    for trial in range(args.trials):
        generator = torch.Generator().manual_seed(trial_seed(args.seed, trial))
        index = resample(labels[:, 0], rate, args.rows, generator)
        test, train = index[:num_test], index[num_test:]
        mean, std = features[train].mean(0), features[train].std(0).clamp_min(1e-12)
        for part, value in zip(parts, (
            (features[train] - mean) / std, labels[train], (features[test] - mean) / std, labels[test]
        )):
            part.append(value.float())
    return tuple(torch.stack(part) for part in parts)  # type: ignore[return-value]


# --------------------------------------------------------------------------- training


def build_objective(name: str) -> nn.Module:
    """The pairwise loss of ``name``; trials are its groups and their losses are summed."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; choose from {OBJECTIVES}")
    library_name = "auc" if name in ("auc-mortgage", "auc-loan") else name  # loa: weights (1, 1)
    return mlloss.build_loss(library_name, reduction="sum")


def objective_labels(name: str, labels: Tensor) -> Tensor:
    """Both label columns, or the one a single-label AUC objective trains on."""
    return {"auc-mortgage": labels[:, 0], "auc-loan": labels[:, 1]}.get(name, labels)


def train_linear(name: str, x: Tensor, y: Tensor, args: argparse.Namespace) -> Tensor:
    """Weights (trials, D) of one linear scorer per trial, trained with mini-batch Adam. Trial t's
    initialisation and batch orders come from its own generator (``MODEL_SEED_OFFSET +
    trial_seed(seed, t)``), and balanced LoA keeps running priors per trial, so trial t trains the
    same weights whatever the number of trials."""
    num_trials, num_train, dim = x.shape
    generators = [torch.Generator().manual_seed(MODEL_SEED_OFFSET + trial_seed(args.seed, t)) for t in range(num_trials)]
    bound = 1 / math.sqrt(dim)
    weights = nn.Parameter(torch.stack([(torch.rand(dim, generator=g) * 2 - 1) * bound for g in generators]))
    objective = SideBySideLoss(functools.partial(build_objective, name), functools.partial(objective_labels, name),
                               num_trials, per_model=name == "balanced-loa")  # its running priors: per trial
    optimizer = torch.optim.Adam([weights], lr=args.lr)
    for _ in range(args.epochs):
        orders = torch.stack([torch.randperm(num_train, generator=g) for g in generators])
        for batch in orders.split(args.batch_size, dim=1):
            xb = torch.gather(x, 1, batch[..., None].expand(-1, -1, dim))
            yb = torch.gather(y, 1, batch[..., None].expand(-1, -1, y.shape[2]))
            loss = objective(linear_scores(xb, weights), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return weights.detach()


def linear_scores(x: Tensor, weights: Tensor) -> Tensor:
    """Scores (trials, n) of inputs (trials, n, D) under weights (trials, D): a product and a sum,
    as a batched matrix-vector product (``einsum``) rounds one trial's scores differently when it
    is alone than among several."""
    return (x * weights[:, None, :]).sum(-1)


def evaluate(weights: Tensor, x: Tensor, y: Tensor) -> list[dict[str, float]]:
    """Per-trial test AUC of each label, Diff = |AUC_m - AUC_l| and Min."""
    scores = linear_scores(x, weights)
    results = []
    for trial in range(x.shape[0]):
        mortgage, loan = multilabel_auc(scores[trial], y[trial]).tolist()
        results.append({"mortgage": mortgage, "loan": loan, "diff": abs(mortgage - loan), "min": min(mortgage, loan)})
    return results


def run_cell(name: str, data: tuple[Tensor, Tensor, Tensor, Tensor], rate: float, args: argparse.Namespace) -> dict:
    """Train and evaluate one objective on the trials of one mortgage rate."""
    start = time.perf_counter()
    x, y, x_test, y_test = data
    per_trial = evaluate(train_linear(name, x, y, args), x_test, y_test)
    row = {
        "rate": rate, "objective": name, "trials": len(per_trial), "seconds": time.perf_counter() - start,
        "train_loan_rate": float(y[:, :, 1].mean()), "per_trial": per_trial,
        **{m: summarize([t[m] for t in per_trial]) for m in METRICS},
    }
    print(f"  rate {rate:.2f} {OBJECTIVE_NAMES[name]:<13} mortgage {row['mortgage']['mean']:.3f} "
          f"loan {row['loan']['mean']:.3f} diff {row['diff']['mean']:.3f} ({row['seconds']:.0f}s)", flush=True)
    return row


# --------------------------------------------------------------------------- reporting


def table3_markdown(rows: list[dict]) -> str:
    """Our Table 3 (mean +/- std over trials) with the paper's values in the next rows."""
    lines = [
        "| objective | source | AUC mortgage | AUC loan | Diff AUC | Min AUC |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        ours = " | ".join(f"{r[m]['mean']:.3f} +/- {r[m]['std']:.3f}" for m in METRICS)
        lines.append(f"| {OBJECTIVE_NAMES[r['objective']]} | ours | {ours} |")
        if r["objective"] in PAPER_TABLE3:
            paper = " | ".join(PAPER_TABLE3[r["objective"]][m] for m in METRICS)
            lines.append(f"| {OBJECTIVE_NAMES[r['objective']]} | paper | {paper} |")
    return "\n".join(lines)


def sweep_markdown(rows: list[dict]) -> str:
    """Fig. 3 as a table: Diff and Min AUC per mortgage rate and objective."""
    lines = ["| mortgage rate | objective | AUC mortgage | AUC loan | Diff AUC | Min AUC |", "|---:|---|---:|---:|---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["rate"], OBJECTIVES.index(r["objective"]))):
        cells = " | ".join(f"{r[m]['mean']:.3f} +/- {r[m]['std']:.3f}" for m in METRICS)
        lines.append(f"| {r['rate']:.2f} | {OBJECTIVE_NAMES[r['objective']]} | {cells} |")
    return "\n".join(lines)


def plot_sweep(rows: list[dict], path: Path) -> bool:
    """Fig. 3: Diff and Min AUC against the mortgage rate, one line per objective (error bars:
    std over trials); returns False when matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name in dict.fromkeys(r["objective"] for r in rows):
        sub = sorted((r for r in rows if r["objective"] == name), key=lambda r: r["rate"])
        rates = [r["rate"] for r in sub]
        for ax, metric in zip(axes, ("diff", "min")):
            ax.errorbar(rates, [r[metric]["mean"] for r in sub], yerr=[r[metric]["std"] for r in sub],
                        marker="o", ms=3, capsize=2, label=OBJECTIVE_NAMES[name])
    axes[0].set(xlabel="P(mortgage = 1)", ylabel="|AUC(mortgage) - AUC(loan)|", title="Diff AUC (lower is better)")
    axes[1].set(xlabel="P(mortgage = 1)", ylabel="min AUC", title="Min AUC (higher is better)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- entry point


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--data", type=Path, default=DEFAULT_DATA.resolve(), help="path of bank-full.csv")
    p.add_argument("--quick", action="store_true", help="small sizes for the tests (seconds)")
    p.add_argument("--rate", type=float, default=0.9, help="mortgage positive rate of Table 3")
    p.add_argument("--objectives", choices=OBJECTIVES, nargs="+", default=list(OBJECTIVES))
    p.add_argument("--trials", type=int, default=25, help="trials of Table 3 (trial t is the same whatever their number)")
    p.add_argument("--rows", type=int, default=10_000, help="rows drawn per trial (train + test)")
    p.add_argument("--test-fraction", type=float, default=0.2)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0,
                   help="trial t draws its rows and split with seed * 1000003 + t, its initialisation and batch order "
                        "with 2^40 + that")
    p.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True, help="run the Fig. 3 sweep")
    p.add_argument("--sweep-rates", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    p.add_argument("--sweep-objectives", choices=OBJECTIVES, nargs="+", default=["laa", "loa", "balanced-loa"])
    p.add_argument("--sweep-trials", type=int, default=10)
    p.add_argument("--workers", type=int, default=None,
                   help="processes the independent cells are spread over (None: the available cores; 1 with --quick)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every worker")
    p.add_argument("--output-dir", type=Path, default=Path("runs/bank_marketing"))
    args = parse_with_quick(p, argv, trials=3, rows=2000, epochs=4, batch_size=256, sweep_rates=[0.5], sweep_trials=2)
    if args.workers is None:
        args.workers = 1 if args.quick else available_cores()
    check_ranges(p, args, counts=("trials", "rows", "epochs", "batch_size", "sweep_trials", "threads", "workers"),
                 positive=("lr",))
    check_seeds(p, args, ("seed",))
    for rate in [args.rate, *args.sweep_rates]:
        if not 0 < rate < 1:
            p.error(f"mortgage rates must lie in (0, 1); got {rate}")
    if not 0 < args.test_fraction < 1:
        p.error(f"--test-fraction must lie in (0, 1); got {args.test_fraction}")
    num_test = round(args.rows * args.test_fraction)
    if min(num_test, args.rows - num_test) < 2:  # a trial's standardisation and AUCs need two rows in each part
        p.error(f"--rows {args.rows} with --test-fraction {args.test_fraction} gives {num_test} test and "
                f"{args.rows - num_test} training rows; each part needs at least 2")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    """Run Table 3 (and the sweep); returns the dictionary also written to ``results.json``."""
    args = parse_args(argv)
    provenance = Provenance(__file__, argv, args.workers, args.threads)
    torch.set_num_threads(args.threads)
    features, labels = load_bank(args.data)
    print(f"{args.data}: {len(labels)} rows, housing rate {labels[:, 0].mean():.3f}, loan rate {labels[:, 1].mean():.3f}")
    data = make_trials(features, labels, args.rate, args)
    cells = [(name, data, args.rate, args) for name in args.objectives]
    if args.sweep:
        sweep_args = argparse.Namespace(**{**vars(args), "trials": args.sweep_trials})
        for rate in args.sweep_rates:
            rate_data = make_trials(features, labels, rate, sweep_args)
            cells += [(name, rate_data, rate, sweep_args) for name in args.sweep_objectives]
    rows = run_cells(run_cell, cells, args.workers, args.threads)
    table, sweep = rows[: len(args.objectives)], rows[len(args.objectives) :]
    args.output_dir.mkdir(parents=True, exist_ok=True)
    text = f"## Table 3: mortgage rate {args.rate:g}, {args.trials} trials\n\n{table3_markdown(table)}\n"
    if sweep:
        text += f"\n## Fig. 3 sweep, {args.sweep_trials} trials per rate\n\n{sweep_markdown(sweep)}\n"
        print(f"wrote {args.output_dir / 'sweep.png'}" if plot_sweep(sweep, args.output_dir / "sweep.png")
              else "matplotlib is not installed: no plot")
    results = {"config": config_dict(args), "table3": table, "sweep": sweep}
    return write_outputs(args.output_dir, results, text, provenance)


if __name__ == "__main__":
    main()
