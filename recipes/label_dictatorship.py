"""Label dictatorship of loss aggregation (LoA) versus label aggregation (LaA), on synthetic data.

Reproduces two experiments of Lukasik et al. (2025), "Bipartite ranking from multiple labels: on
loss versus label aggregation":

* ``bayes`` -- Sec. 7, Fig. 2 (and Fig. 6): the per-label AUCs of the *Bayes-optimal* scorers, no
  training. x is uniform on [-1, 1]^2, eta_1(x) = sigmoid(tau w1.x), eta_2(x) = sigmoid(tau (w2.x - rho))
  with w1 = (1, 1)/sqrt(2), w2 = (0, 1); pi_1 = 0.5 by symmetry and rho is found by bisection on the
  sample so that pi_2 = mean eta_2 takes each value of ``--priors`` (0.5 down to 0.02). Labels are
  y_k ~ Bernoulli(eta_k). The LoA scorer (a_k = 1) is sum_k eta_k / (pi_k (1 - pi_k)) (Prop. 5.2), the
  LaA scorer (linear cost) is sum_k eta_k (Prop. 5.4); we report AUC_1, AUC_2 and |AUC_1 - AUC_2| of
  each on ``--samples`` points, for each tau.
* ``trained`` -- App. G.3/G.5, Table 6: a 3-layer MLP (2 -> 256 -> 256 -> 1, ReLU) trained for 50
  epochs with Adam on 8k samples of the same distribution (tau = ``--train-tau``), tested on 2k, with
  pi_1 = 0.5 and pi_2 in {0.5, ..., 0.9}, i.e. label 2's *positives* are the majority (LoA's weight
  1 / (pi (1 - pi)) is symmetric, so pi_2 = 0.9 is as skewed as 0.1). Objectives: ``LoALoss([1, 1])``,
  ``LaALoss()``, ``LoALoss("balanced")`` (logistic surrogate, all pairs); optionally the single-label
  AUC losses (Table 6's first two rows). Per-label test AUC, Diff and Min AUC, mean +/- std over seeds.

The seeds of one (pi_2, objective) cell are trained together as one batched model: every seed has
its own data, initialisation, batch order and MLP weights (tensors with a leading seed axis), and
the loss sees the seed index as its ``groups`` with ``reduction="sum"``, so that each seed's
parameters receive exactly the gradient of its own loss (Adam is elementwise, so the optimiser is
unchanged too). This only amortises per-step overhead.

    python recipes/label_dictatorship.py                 # both studies, full size
    python recipes/label_dictatorship.py --study bayes   # Fig. 2 only (seconds)
    python recipes/label_dictatorship.py --quick         # small version used by the tests

Writes ``results.json``, ``results.md`` and (with matplotlib) ``bayes_optimal.png`` to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

import mlloss
from mlloss.metrics import multilabel_auc

W1 = (1 / math.sqrt(2), 1 / math.sqrt(2))
W2 = (0.0, 1.0)
OBJECTIVES = ("loa", "laa", "balanced-loa", "auc-y1", "auc-y2")
OBJECTIVE_NAMES = {
    "loa": "LoA (1,1)",
    "laa": "LaA",
    "balanced-loa": "balanced LoA",
    "auc-y1": "AUC(y1)",
    "auc-y2": "AUC(y2)",
}
# Table 6 of the paper: |AUC(y1) - AUC(y2)| of the trained MLP, per objective and pi_2.
PAPER_TABLE6 = {
    "auc-y1": {0.5: 0.53, 0.6: 0.44, 0.7: 0.52, 0.8: 0.56, 0.9: 0.50},
    "auc-y2": {0.5: 0.49, 0.6: 0.46, 0.7: 0.50, 0.8: 0.54, 0.9: 0.45},
    "laa": {0.5: 0.06, 0.6: 0.04, 0.7: 0.08, 0.8: 0.07, 0.9: 0.07},
    "loa": {0.5: 0.05, 0.6: 0.13, 0.7: 0.09, 0.8: 0.11, 0.9: 0.10},
}


# --------------------------------------------------------------------------- synthetic distribution


def sample_inputs(num_samples: int, generator: torch.Generator) -> Tensor:
    """(n, 2) float64 points uniform on [-1, 1]^2."""
    return torch.rand(num_samples, 2, generator=generator, dtype=torch.float64) * 2 - 1


def class_probabilities(x: Tensor, tau: float, rho: float) -> Tensor:
    """(n, 2) eta_k(x): sigmoid(tau w1.x) and sigmoid(tau (w2.x - rho))."""
    w1 = torch.tensor(W1, dtype=x.dtype)
    w2 = torch.tensor(W2, dtype=x.dtype)
    return torch.stack([torch.sigmoid(tau * (x @ w1)), torch.sigmoid(tau * (x @ w2 - rho))], dim=1)


def shift_for_prior(x: Tensor, tau: float, prior: float, iterations: int = 100) -> float:
    """The rho with mean_x sigmoid(tau (w2.x - rho)) = ``prior`` on the sample ``x`` (bisection;
    the mean decreases in rho)."""
    if not 0 < prior < 1:
        raise ValueError(f"a label prior must lie in (0, 1); got {prior}")
    w2 = torch.tensor(W2, dtype=x.dtype)
    projection = x @ w2
    low, high = -1 - 60 / tau, 1 + 60 / tau  # sigmoid(+-60) is 1 or 0 to float64 precision
    for _ in range(iterations):
        rho = (low + high) / 2
        if float(torch.sigmoid(tau * (projection - rho)).mean()) > prior:
            low = rho
        else:
            high = rho
    return (low + high) / 2


def draw_labels(eta: Tensor, generator: torch.Generator) -> Tensor:
    """(n, K) 0/1 float labels y_k ~ Bernoulli(eta_k)."""
    return torch.bernoulli(eta, generator=generator)


# --------------------------------------------------------------------------- Bayes-optimal study


def loa_bayes_scores(eta: Tensor, priors: Tensor) -> Tensor:
    """Prop. 5.2 with a_k = 1: sum_k eta_k / (pi_k (1 - pi_k))."""
    return (eta / (priors * (1 - priors))).sum(1)


def laa_bayes_scores(eta: Tensor) -> Tensor:
    """Prop. 5.4 (linear cost, w_k = 1): sum_k eta_k."""
    return eta.sum(1)


def balance_metrics(scores: Tensor, labels: Tensor) -> dict[str, float]:
    """Per-label AUC of one score, |AUC_1 - AUC_2| (Diff) and min_k AUC_k (Min)."""
    auc = multilabel_auc(scores, labels).tolist()
    return {"auc1": auc[0], "auc2": auc[1], "diff": abs(auc[0] - auc[1]), "min": min(auc)}


def bayes_optimal_study(taus: Sequence[float], priors: Sequence[float], num_samples: int, seed: int) -> list[dict]:
    """One row per (tau, pi_2): rho, the label rates and the balance metrics of both scorers."""
    rows = []
    for tau in taus:
        generator = torch.Generator().manual_seed(seed)
        x = sample_inputs(num_samples, generator)
        for prior in priors:
            rho = shift_for_prior(x, tau, prior)
            eta = class_probabilities(x, tau, rho)
            labels = draw_labels(eta, generator)
            row = {"tau": tau, "pi2": prior, "rho": rho, "label_rates": labels.mean(0).tolist()}
            label_priors = torch.tensor([0.5, prior], dtype=torch.float64)  # pi_1 = 0.5 by symmetry of w1
            row["loa"] = balance_metrics(loa_bayes_scores(eta, label_priors), labels)
            row["laa"] = balance_metrics(laa_bayes_scores(eta), labels)
            rows.append(row)
    return rows


def bayes_table(rows: list[dict]) -> str:
    """Markdown table of the Bayes-optimal study (the numbers behind Fig. 2 and Fig. 6)."""
    lines = [
        "| tau | pi_2 | LoA AUC_1 | LoA AUC_2 | LoA diff | LaA AUC_1 | LaA AUC_2 | LaA diff |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lo, la = r["loa"], r["laa"]
        lines.append(
            f"| {r['tau']:g} | {r['pi2']:.2f} | {lo['auc1']:.3f} | {lo['auc2']:.3f} | **{lo['diff']:.3f}** "
            f"| {la['auc1']:.3f} | {la['auc2']:.3f} | **{la['diff']:.3f}** |"
        )
    return "\n".join(lines)


def plot_bayes(rows: list[dict], path: Path) -> bool:
    """Fig. 2 (diff vs pi_2 per tau, LoA solid, LaA dashed) and Fig. 6 (per-label AUCs at the
    largest tau); returns False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    taus = sorted({r["tau"] for r in rows})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, tau in enumerate(taus):
        sub = [r for r in rows if r["tau"] == tau]
        pis = [r["pi2"] for r in sub]
        color = f"C{i}"
        left.plot(pis, [r["loa"]["diff"] for r in sub], "-o", color=color, ms=3, label=f"LoA, tau={tau:g}")
        left.plot(pis, [r["laa"]["diff"] for r in sub], "--s", color=color, ms=3, label=f"LaA, tau={tau:g}")
    left.set(xlabel="pi_2 = P(Y2 = 1)", ylabel="|AUC_1 - AUC_2|", title="Bayes-optimal scorers (Fig. 2)")
    left.invert_xaxis()
    left.legend(fontsize=7, ncol=2)
    sub = [r for r in rows if r["tau"] == taus[-1]]
    pis = [r["pi2"] for r in sub]
    for scorer, style in (("loa", "-"), ("laa", "--")):
        for k, color in ((1, "C0"), (2, "C3")):
            right.plot(pis, [r[scorer][f"auc{k}"] for r in sub], style, color=color, label=f"{scorer.upper()} AUC_{k}")
    right.set(xlabel="pi_2", ylabel="AUC", title=f"Per-label AUC, tau={taus[-1]:g} (Fig. 6)")
    right.invert_xaxis()
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- trained study


class BatchedMLP(nn.Module):
    """``num_models`` independent MLPs 2 -> hidden -> hidden -> 1 (ReLU), evaluated together:
    input (M, B, 2) -> scores (M, B). Initialised like ``nn.Linear`` (uniform +-1/sqrt(fan_in))."""

    def __init__(self, num_models: int, hidden: int, generator: torch.Generator) -> None:
        super().__init__()
        widths = [2, hidden, hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            bound = 1 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(_uniform((num_models, fan_in, fan_out), bound, generator)))
            self.biases.append(nn.Parameter(_uniform((num_models, 1, fan_out), bound, generator)))

    def forward(self, x: Tensor) -> Tensor:
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(bias, x, weight)
            if i < last:
                x = torch.relu(x)
        return x.squeeze(-1)


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator) -> Tensor:
    return (torch.rand(shape, generator=generator) * 2 - 1) * bound


def build_objective(name: str) -> nn.Module:
    """The loss for ``name``, summing the per-seed losses (seeds are the groups)."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; choose from {OBJECTIVES}")
    library_name = "auc" if name in ("auc-y1", "auc-y2") else name  # loa: weights (1, 1)
    return mlloss.build_loss(library_name, reduction="sum")


def objective_labels(name: str, labels: Tensor) -> Tensor:
    """The label columns an objective trains on: both, or one for the single-label AUC losses."""
    return labels[:, int(name[-1]) - 1] if name.startswith("auc-y") else labels


def make_datasets(
    seeds: Sequence[int], tau: float, rho: float, num_train: int, num_test: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-seed train/test inputs (S, n, 2) float32 and labels (S, n, 2) float32."""
    xs, ys = [], []
    for seed in seeds:
        generator = torch.Generator().manual_seed(10_000 + seed)
        x = sample_inputs(num_train + num_test, generator)
        xs.append(x.float())
        ys.append(draw_labels(class_probabilities(x, tau, rho), generator).float())
    x, y = torch.stack(xs), torch.stack(ys)
    return x[:, :num_train], y[:, :num_train], x[:, num_train:], y[:, num_train:]


def train_seeds(
    objective_name: str, x: Tensor, y: Tensor, seeds: Sequence[int], args: argparse.Namespace
) -> BatchedMLP:
    """Train one MLP per seed on (x[s], y[s]) with mini-batch Adam; returns the batched model.
    The seeds' initialisations and batch orders are drawn from one generator seeded by ``seeds[0]``."""
    num_models, num_train = x.shape[0], x.shape[1]
    generator = torch.Generator().manual_seed(seeds[0])
    model = BatchedMLP(num_models, args.hidden, generator)
    objective = build_objective(objective_name)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    seed_ids = torch.arange(num_models)
    for _ in range(args.epochs):
        orders = torch.stack([torch.randperm(num_train, generator=generator) for _ in range(num_models)])
        for batch in orders.split(args.batch_size, dim=1):
            xb = torch.gather(x, 1, batch[..., None].expand(-1, -1, 2))
            yb = torch.gather(y, 1, batch[..., None].expand(-1, -1, 2))
            scores = model(xb).reshape(-1)
            groups = seed_ids.repeat_interleave(batch.shape[1])
            loss = objective(scores, objective_labels(objective_name, yb.reshape(-1, 2)), groups)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    t = torch.tensor(values, dtype=torch.float64)
    return {"mean": float(t.mean()), "std": float(t.std()) if len(values) > 1 else 0.0}


def trained_study(args: argparse.Namespace) -> list[dict]:
    """One row per (pi_2, objective): per-seed and summarised test metrics of the trained MLPs."""
    reference = sample_inputs(100_000, torch.Generator().manual_seed(args.seed))
    rows = []
    for prior in args.train_priors:
        rho = shift_for_prior(reference, args.train_tau, prior)
        x, y, x_test, y_test = make_datasets(args.seeds, args.train_tau, rho, args.train_size, args.test_size)
        report = mlloss.label_dictatorship(y.reshape(-1, 2), label_names=["y1", "y2"])
        for name in args.objectives:
            start = time.perf_counter()
            model = train_seeds(name, x, y, args.seeds, args)
            with torch.no_grad():
                scores = model(x_test)
            per_seed = [balance_metrics(scores[s], y_test[s]) for s in range(len(args.seeds))]
            rows.append({
                "pi2": prior, "rho": rho, "objective": name, "seconds": time.perf_counter() - start,
                "loa_effective_weight_ratio": report.effective_weights[1] / report.effective_weights[0],
                "per_seed": per_seed,
                **{m: summarize([p[m] for p in per_seed]) for m in ("auc1", "auc2", "diff", "min")},
            })
            print(f"  trained pi_2={prior:.2f} {OBJECTIVE_NAMES[name]:<13} diff {rows[-1]['diff']['mean']:.3f} "
                  f"({rows[-1]['seconds']:.0f}s)", flush=True)
    return rows


def trained_table(rows: list[dict]) -> str:
    """Markdown table of the trained study next to Table 6's Diff AUC."""
    lines = [
        "| pi_2 | objective | AUC(y1) | AUC(y2) | Diff AUC | Min AUC | paper Diff (Table 6) |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        paper = PAPER_TABLE6.get(r["objective"], {}).get(round(r["pi2"], 2))
        cells = [f"{r[m]['mean']:.3f} +/- {r[m]['std']:.3f}" for m in ("auc1", "auc2", "diff", "min")]
        lines.append(
            f"| {r['pi2']:.2f} | {OBJECTIVE_NAMES[r['objective']]} | " + " | ".join(cells)
            + f" | {'-' if paper is None else f'{paper:.2f}'} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- entry point


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--study", choices=("bayes", "trained", "both"), default="both")
    p.add_argument("--quick", action="store_true", help="small sizes for the tests (seconds)")
    p.add_argument("--seed", type=int, default=0, help="seed of the Bayes-optimal samples")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--output-dir", type=Path, default=Path("runs/label_dictatorship"))
    g = p.add_argument_group("Bayes-optimal study (Fig. 2)")
    g.add_argument("--taus", type=float, nargs="+", default=[1, 5, 20, 100])
    g.add_argument("--priors", type=float, nargs="+",
                   default=[0.5, 0.4, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.02], help="values of pi_2")
    g.add_argument("--samples", type=int, default=100_000)
    g = p.add_argument_group("trained study (Table 6)")
    g.add_argument("--train-tau", type=float, default=20.0, help="tau of both labels' eta")
    g.add_argument("--train-priors", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8, 0.9])
    g.add_argument("--objectives", choices=OBJECTIVES, nargs="+", default=["loa", "laa", "balanced-loa"])
    g.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="one data set and MLP per seed")
    g.add_argument("--train-size", type=int, default=8000)
    g.add_argument("--test-size", type=int, default=2000)
    g.add_argument("--epochs", type=int, default=50)
    g.add_argument("--batch-size", type=int, default=512)
    g.add_argument("--hidden", type=int, default=256)
    g.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.taus, args.priors = 20_000, [5.0, 100.0], [0.5, 0.3, 0.2, 0.05]
        args.train_priors, args.seeds, args.train_size, args.test_size = [0.5, 0.9], [0, 1], 1000, 1000
        args.epochs, args.hidden = 5, 32
    for name in ("samples", "train_size", "test_size", "epochs", "batch_size", "hidden", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for prior in args.priors + args.train_priors:
        if not 0 < prior < 1:
            p.error(f"priors must lie in (0, 1), got {prior}")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the selected studies; returns the dictionary also written to ``results.json``."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    markdown = []
    if args.study in ("bayes", "both"):
        results["bayes"] = bayes_optimal_study(args.taus, args.priors, args.samples, args.seed)
        markdown += ["## Bayes-optimal scorers (Fig. 2)", "", bayes_table(results["bayes"]), ""]
        if plot_bayes(results["bayes"], args.output_dir / "bayes_optimal.png"):
            print(f"wrote {args.output_dir / 'bayes_optimal.png'}")
        else:
            print("matplotlib is not installed: no plot")
    if args.study in ("trained", "both"):
        results["trained"] = trained_study(args)
        markdown += [f"## Trained MLP (Table 6), tau = {args.train_tau:g}", "", trained_table(results["trained"]), ""]
    results["runtime_s"] = time.perf_counter() - start
    text = "\n".join(markdown)
    print(text)
    (args.output_dir / "results.md").write_text(text)
    (args.output_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {args.output_dir / 'results.json'} ({results['runtime_s']:.0f}s)")
    return results


if __name__ == "__main__":
    main()
