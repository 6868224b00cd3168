"""Label dictatorship of loss aggregation (LoA) versus label aggregation (LaA), on synthetic data.

Reproduces two experiments of Lukasik et al. (2025), "Bipartite ranking from multiple labels: on
loss versus label aggregation":

* ``bayes`` -- Sec. 7, Fig. 2 (and Fig. 6): the per-label AUCs of the *Bayes-optimal* scorers, no
  training. x is uniform on [-1, 1]^2, eta_1(x) = sigmoid(tau w1.x), eta_2(x) = sigmoid(tau (w2.x - rho))
  with w1 = (1, 1)/sqrt(2), w2 = (0, 1); pi_1 = 0.5 by symmetry and rho is found by bisection on the
  sample so that pi_2 = mean eta_2 takes each value of ``--priors`` (0.5 down to 0.02). Labels are
  y_k ~ Bernoulli(eta_k). The LoA scorer (a_k = 1) is sum_k eta_k / (pi_k (1 - pi_k)) (Prop. 5.2, up to
  the factor 1/K), the LaA scorer (linear cost) is sum_k eta_k (Prop. 5.4); for each tau we report
  AUC_1, AUC_2 and |AUC_1 - AUC_2| of each on ``--samples`` points, against the drawn labels (the
  paper's protocol) and against eta itself (the population AUC given the points, free of label
  noise). ``--taus`` accepts ``inf`` (deterministic labels, eta_k in {0, 1}); the closed form of that
  limit (derived in docs/results.md) is printed beside the table and drawn in the figure.
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
unchanged too). Seed s draws its data from a generator seeded with ``DATA_SEED_OFFSET + s`` and its
initialisation and batch order from one seeded with ``MODEL_SEED_OFFSET + s``, and balanced LoA
keeps one running prior estimate per seed (one loss module per seed), so that a seed's model and
test AUCs are the same whichever other seeds are listed: ``--seeds 3`` reruns seed 3 of
``--seeds 0 1 2 3 4`` alone. rho is found for each pi_2 on ``--rho-seed``'s reference sample, shared
by all seeds. Cells (a tau of the Bayes study, a (pi_2, objective) pair of the trained one) are
independent and seed their own generators; ``--workers`` spreads them over processes of
``--threads`` threads each, with results identical for any number of workers.

    python recipes/label_dictatorship.py                 # both studies, full size
    python recipes/label_dictatorship.py --study bayes   # Fig. 2 only (seconds)
    python recipes/label_dictatorship.py --quick         # small version used by the tests

Writes ``results.json``, ``results.md`` (headed by the command that made them, its wall time and
the load average) and (with matplotlib) ``bayes_optimal.png`` to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import functools
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
SCORER_NAMES = {"loa": "LoA", "laa": "LaA"}
# Generator seeds of the trained study's seed s: its data set (train and test points and labels)
# and its MLP (initialisation, then the batch order of every epoch). The offsets keep the streams
# apart, so that no seed's model stream is another seed's data stream.
DATA_SEED_OFFSET = 10_000
MODEL_SEED_OFFSET = 1 << 32
RHO_SAMPLES = 100_000  # size of the reference sample on which rho is found for the trained study


# --------------------------------------------------------------------------- synthetic distribution


def sample_inputs(num_samples: int, generator: torch.Generator) -> Tensor:
    """(n, 2) float64 points uniform on [-1, 1]^2."""
    return torch.rand(num_samples, 2, generator=generator, dtype=torch.float64) * 2 - 1


def scaled_sigmoid(z: Tensor, tau: float) -> Tensor:
    """sigmoid(tau z); for tau = inf its limit, the step 1(z > 0) (1/2 at z = 0)."""
    if math.isinf(tau):
        return torch.heaviside(z, torch.tensor(0.5, dtype=z.dtype))
    return torch.sigmoid(tau * z)


def class_probabilities(x: Tensor, tau: float, rho: float) -> Tensor:
    """(n, 2) eta_k(x): sigmoid(tau w1.x) and sigmoid(tau (w2.x - rho))."""
    w1 = torch.tensor(W1, dtype=x.dtype)
    w2 = torch.tensor(W2, dtype=x.dtype)
    return torch.stack([scaled_sigmoid(x @ w1, tau), scaled_sigmoid(x @ w2 - rho, tau)], dim=1)


def shift_for_prior(x: Tensor, tau: float, prior: float, iterations: int = 100) -> float:
    """The rho with mean_x sigmoid(tau (w2.x - rho)) = ``prior`` on the sample ``x`` (bisection;
    the mean decreases in rho). For tau = inf, the midpoint between the two order statistics of
    w2.x around the 1 - prior quantile, so that no point lies on the boundary."""
    if not 0 < prior < 1:
        raise ValueError(f"a label prior must lie in (0, 1); got {prior}")
    w2 = torch.tensor(W2, dtype=x.dtype)
    projection = x @ w2
    if math.isinf(tau):
        ordered, n = torch.sort(projection).values, len(projection)
        below = min(max(n - round(prior * n), 1), n - 1)  # points with w2.x < rho
        return float((ordered[below - 1] + ordered[below]) / 2)
    low, high = -1 - 60 / tau, 1 + 60 / tau  # sigmoid(+-60) is 1 or 0 to float64 precision
    for _ in range(iterations):
        rho = (low + high) / 2
        if float(scaled_sigmoid(projection - rho, tau).mean()) > prior:
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


def population_auc(scores: Tensor, eta: Tensor) -> Tensor:
    """(K,) AUC of ``scores`` against each label with the labels integrated out given the points:
    pairs (i, j), i != j, weighted by eta_k(x_i) (1 - eta_k(x_j)), ties counting 1/2. This is what the
    AUC against drawn labels estimates, without the label noise; for eta in {0, 1} the two agree."""
    values, tie_block = torch.unique(scores, sorted=True, return_inverse=True)
    aucs = []
    for column in eta.T:
        positive = torch.zeros(len(values), dtype=torch.float64).index_add_(0, tie_block, column)
        negative = torch.zeros(len(values), dtype=torch.float64).index_add_(0, tie_block, 1 - column)
        below = torch.cumsum(negative, 0) - negative
        self_pairs = (column * (1 - column)).sum()  # the i = j terms, all ties
        concordant = (positive * (below + negative / 2)).sum() - self_pairs / 2
        aucs.append(concordant / (positive.sum() * negative.sum() - self_pairs))
    return torch.stack(aucs)


def _summary(auc: Sequence[float]) -> dict[str, float]:
    return {"auc1": auc[0], "auc2": auc[1], "diff": abs(auc[0] - auc[1]), "min": min(auc)}


def balance_metrics(scores: Tensor, labels: Tensor, eta: Tensor | None = None) -> dict:
    """Per-label AUC of one score, |AUC_1 - AUC_2| (Diff) and min_k AUC_k (Min) against the labels;
    with ``eta``, the same against eta under ``"population"``."""
    metrics: dict = _summary(multilabel_auc(scores, labels).tolist())
    if eta is not None:
        metrics["population"] = _summary(population_auc(scores, eta).tolist())
    return metrics


def deterministic_limit(prior: float) -> dict[str, dict[str, float]]:
    """tau -> inf in closed form: x uniform on the square, label 1 the half-plane x1 + x2 > 0, label 2
    the strip x2 > rho. With q = pi_2 (1 - pi_2), the disputed regions (1, 0) and (0, 1) have masses
    (1 - pi_2)^2 / 2 and pi_2^2 / 2 (their product is q^2 / 4), and (docs/results.md):
    LoA (label 2 dictates whenever pi_2 != 1/2): AUC_1 = 1 - q^2, AUC_2 = 1;
    LaA ((1, 0) and (0, 1) tied):                AUC_1 = 1 - q^2 / 2, AUC_2 = 1 - q / 8."""
    q = prior * (1 - prior)
    laa = _summary([1 - q * q / 2, 1 - q / 8])
    loa = laa if prior == 0.5 else _summary([1 - q * q, 1.0])
    return {"loa": loa, "laa": laa}


def bayes_rows_for_tau(tau: float, priors: Sequence[float], num_samples: int, seed: int) -> list[dict]:
    """One row per pi_2 at one tau: rho, the label rates and the balance metrics of both scorers.
    The points are the same for every pi_2 of a tau (seeded by ``seed``); labels are drawn anew."""
    generator = torch.Generator().manual_seed(seed)
    x = sample_inputs(num_samples, generator)
    rows = []
    for prior in priors:
        rho = shift_for_prior(x, tau, prior)
        eta = class_probabilities(x, tau, rho)
        labels = draw_labels(eta, generator)
        label_priors = torch.tensor([0.5, prior], dtype=torch.float64)  # pi_1 = 0.5 by symmetry of w1
        rows.append({
            "tau": tau, "pi2": prior, "rho": rho, "label_rates": labels.mean(0).tolist(),
            "loa": balance_metrics(loa_bayes_scores(eta, label_priors), labels, eta),
            "laa": balance_metrics(laa_bayes_scores(eta), labels, eta),
        })
    return rows


def bayes_optimal_study(
    taus: Sequence[float], priors: Sequence[float], num_samples: int, seed: int, workers: int = 1, threads: int = 1
) -> list[dict]:
    """The rows of every tau (one cell per tau), in the order of ``taus``."""
    cells = [(tau, list(priors), num_samples, seed) for tau in taus]
    return [row for rows in run_cells(bayes_rows_for_tau, cells, workers, threads) for row in rows]


def bayes_table(rows: list[dict]) -> str:
    """Markdown table of the Bayes-optimal study (the numbers behind Fig. 2 and Fig. 6)."""
    lines = [
        "| tau | pi_2 | LoA AUC_1 | LoA AUC_2 | LoA diff | LoA diff, pop. | LaA AUC_1 | LaA AUC_2 | LaA diff | LaA diff, pop. |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = []
        for scorer in SCORER_NAMES:
            m = r[scorer]
            cells += [f"{m['auc1']:.3f}", f"{m['auc2']:.3f}", f"**{m['diff']:.3f}**", f"{m['population']['diff']:.3f}"]
        lines.append(f"| {r['tau']:g} | {r['pi2']:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def limit_table(priors: Sequence[float]) -> str:
    """Markdown table of the closed-form deterministic limit (tau -> inf)."""
    lines = [
        "| pi_2 | q = pi_2 (1 - pi_2) | LoA AUC_1 = 1 - q^2 | LoA diff = q^2 | LaA AUC_1 = 1 - q^2/2 | LaA AUC_2 = 1 - q/8 | LaA diff = q/8 - q^2/2 |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for prior in priors:
        limit = deterministic_limit(prior)
        lines.append(
            f"| {prior:.2f} | {prior * (1 - prior):.4f} | {limit['loa']['auc1']:.4f} | **{limit['loa']['diff']:.4f}** "
            f"| {limit['laa']['auc1']:.4f} | {limit['laa']['auc2']:.4f} | **{limit['laa']['diff']:.4f}** |"
        )
    return "\n".join(lines)


def plot_bayes(rows: list[dict], path: Path) -> bool:
    """Fig. 2 (top: |AUC_1 - AUC_2| against pi_2, one panel per tau, LoA solid and LaA dashed; lines
    are population AUCs, markers the AUCs against drawn labels) and Fig. 6 (bottom: per-label
    population AUCs); a last column draws the closed-form tau -> inf limit. False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    taus = list(dict.fromkeys(r["tau"] for r in rows))
    fine = [p / 200 for p in range(2, 101)]  # pi_2 from 0.01 to 0.5 for the closed form
    columns = len(taus) + 1
    fig, axes = plt.subplots(2, columns, figsize=(3.1 * columns, 6.2), sharex=True, squeeze=False)
    styles = {"loa": ("C3", "-", "o"), "laa": ("C0", "--", "s")}
    for column, tau in enumerate(taus):
        sub = [r for r in rows if r["tau"] == tau]
        pis = [r["pi2"] for r in sub]
        for scorer, (color, line, marker) in styles.items():
            name = SCORER_NAMES[scorer]
            axes[0, column].plot(pis, [r[scorer]["population"]["diff"] for r in sub], line, color=color, label=f"{name} (pop.)")
            axes[0, column].plot(pis, [r[scorer]["diff"] for r in sub], marker, color=color, ms=3, ls="none",
                                 label=f"{name} (drawn labels)")
            for k, shade in ((1, 1.0), (2, 0.55)):
                axes[1, column].plot(pis, [r[scorer]["population"][f"auc{k}"] for r in sub], line, color=color,
                                     alpha=shade, label=f"{name} AUC_{k}")
        axes[0, column].set_title(f"tau = {tau:g}")
    limits = [deterministic_limit(p) for p in fine]
    for scorer, (color, line, _) in styles.items():
        name = SCORER_NAMES[scorer]
        axes[0, -1].plot(fine, [lim[scorer]["diff"] for lim in limits], line, color=color, label=name)
        for k, shade in ((1, 1.0), (2, 0.55)):
            axes[1, -1].plot(fine, [lim[scorer][f"auc{k}"] for lim in limits], line, color=color, alpha=shade)
    axes[0, -1].set_title("tau -> inf (closed form)")
    for ax in axes[0]:
        ax.set_ylim(bottom=0)
    axes[0, 0].set_ylabel("|AUC_1 - AUC_2|  (Fig. 2)")
    axes[1, 0].set_ylabel("per-label AUC  (Fig. 6)")
    for ax in axes[1]:
        ax.set_xlabel("pi_2 = P(Y2 = 1)")
    axes[1, 0].invert_xaxis()  # the x axis is shared: skew grows to the right in every panel
    axes[0, 0].legend(fontsize=6)
    axes[1, 0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------- trained study


class BatchedMLP(nn.Module):
    """One independent MLP 2 -> hidden -> hidden -> 1 (ReLU) per generator, evaluated together:
    input (M, B, 2) -> scores (M, B). Initialised like ``nn.Linear`` (uniform +-1/sqrt(fan_in));
    model m's weights are drawn from ``generators[m]`` alone (layer by layer, weight then bias), so
    they do not depend on the other generators."""

    def __init__(self, hidden: int, generators: Sequence[torch.Generator]) -> None:
        super().__init__()
        widths = [2, hidden, hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            bound = 1 / math.sqrt(fan_in)
            for params, shape in ((self.weights, (fan_in, fan_out)), (self.biases, (1, fan_out))):
                params.append(nn.Parameter(torch.stack([_uniform(shape, bound, g) for g in generators])))

    def forward(self, x: Tensor) -> Tensor:
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            if i < last:
                x = torch.relu(torch.baddbmm(bias, x, weight))
            else:  # output width 1: a product and a sum, as a batched matrix-vector product of
                # one model rounds differently from the same model's among several
                x = (x * weight.transpose(1, 2)).sum(-1, keepdim=True) + bias
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
    """Per-seed train/test inputs (S, n, 2) float32 and labels (S, n, 2) float32; seed s's from a
    generator seeded with ``DATA_SEED_OFFSET + s``."""
    xs, ys = [], []
    for seed in seeds:
        generator = torch.Generator().manual_seed(DATA_SEED_OFFSET + seed)
        x = sample_inputs(num_train + num_test, generator)
        xs.append(x.float())
        ys.append(draw_labels(class_probabilities(x, tau, rho), generator).float())
    x, y = torch.stack(xs), torch.stack(ys)
    return x[:, :num_train], y[:, :num_train], x[:, num_train:], y[:, num_train:]


def train_seeds(
    objective_name: str, x: Tensor, y: Tensor, seeds: Sequence[int], args: argparse.Namespace
) -> BatchedMLP:
    """Train one MLP per seed on (x[s], y[s]) with mini-batch Adam; returns the batched model.
    Seed s's initialisation and batch orders come from its own generator, seeded with
    ``MODEL_SEED_OFFSET + s``; balanced LoA keeps its running priors per seed (one loss module per
    seed, the seeds' losses summed), the other objectives are one call with the seeds as groups.
    So seed s trains the same model whichever other seeds train beside it. Adam's fused kernel does
    the same elementwise update as the default loop over parameters, in one call (a fifth of the
    step time at this size)."""
    num_models, num_train = x.shape[0], x.shape[1]
    if len(seeds) != num_models:
        raise ValueError(f"{len(seeds)} seeds for {num_models} data sets")
    generators = [torch.Generator().manual_seed(MODEL_SEED_OFFSET + seed) for seed in seeds]
    model = BatchedMLP(args.hidden, generators)
    objective = SideBySideLoss(functools.partial(build_objective, objective_name),
                               functools.partial(objective_labels, objective_name), num_models,
                               per_model=objective_name == "balanced-loa")  # its running priors: per seed
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    for _ in range(args.epochs):
        orders = torch.stack([torch.randperm(num_train, generator=g) for g in generators])
        for batch in orders.split(args.batch_size, dim=1):
            xb = torch.gather(x, 1, batch[..., None].expand(-1, -1, 2))
            yb = torch.gather(y, 1, batch[..., None].expand(-1, -1, 2))
            loss = objective(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model


def trained_cell(
    prior: float, rho: float, name: str, data: tuple[Tensor, Tensor, Tensor, Tensor], args: argparse.Namespace
) -> dict:
    """Train and test one objective on the seeds' data sets of one pi_2; one row of the table."""
    start = time.perf_counter()
    x, y, x_test, y_test = data
    model = train_seeds(name, x, y, args.seeds, args)
    with torch.no_grad():
        scores = model(x_test)
    per_seed = [balance_metrics(scores[s], y_test[s]) for s in range(len(args.seeds))]
    row = {
        "pi2": prior, "rho": rho, "objective": name, "seconds": time.perf_counter() - start,
        "per_seed": per_seed, **{m: summarize([p[m] for p in per_seed]) for m in ("auc1", "auc2", "diff", "min")},
    }
    print(f"  trained pi_2={prior:.2f} {OBJECTIVE_NAMES[name]:<13} diff {row['diff']['mean']:.3f} "
          f"({row['seconds']:.0f}s)", flush=True)
    return row


def trained_study(args: argparse.Namespace) -> list[dict]:
    """One row per (pi_2, objective): per-seed and summarised test metrics of the trained MLPs."""
    reference = sample_inputs(RHO_SAMPLES, torch.Generator().manual_seed(args.rho_seed))
    cells, weight_ratios = [], []
    for prior in args.train_priors:
        rho = shift_for_prior(reference, args.train_tau, prior)
        data = make_datasets(args.seeds, args.train_tau, rho, args.train_size, args.test_size)
        report = mlloss.label_dictatorship(data[1].reshape(-1, 2), label_names=["y1", "y2"])
        for name in args.objectives:
            cells.append((prior, rho, name, data, args))
            weight_ratios.append(report.effective_weights[1] / report.effective_weights[0])
    rows = run_cells(trained_cell, cells, args.workers, args.threads)
    for row, ratio in zip(rows, weight_ratios):
        row["loa_effective_weight_ratio"] = ratio
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
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the Bayes-optimal study's points and labels (not used by the trained study)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes the independent cells are spread over (None: the available cores; 1 with --quick)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every worker")
    p.add_argument("--output-dir", type=Path, default=Path("runs/label_dictatorship"))
    g = p.add_argument_group("Bayes-optimal study (Fig. 2)")
    g.add_argument("--taus", type=float, nargs="+", default=[1, 5, 20, 100], help="'inf' for deterministic labels")
    g.add_argument("--priors", type=float, nargs="+",
                   default=[0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.02], help="values of pi_2")
    g.add_argument("--samples", type=int, default=100_000)
    g = p.add_argument_group("trained study (Table 6)")
    g.add_argument("--train-tau", type=float, default=20.0, help="tau of both labels' eta")
    g.add_argument("--train-priors", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8, 0.9])
    g.add_argument("--objectives", choices=OBJECTIVES, nargs="+", default=["loa", "laa", "balanced-loa"])
    g.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4],
                   help="one data set and MLP per seed; each seed's results are the same whichever other seeds are listed")
    g.add_argument("--rho-seed", type=int, default=0,
                   help=f"seed of the {RHO_SAMPLES:,} reference points on which rho is found for each pi_2 (shared by all seeds)")
    g.add_argument("--train-size", type=int, default=8000)
    g.add_argument("--test-size", type=int, default=2000)
    g.add_argument("--epochs", type=int, default=50)
    g.add_argument("--batch-size", type=int, default=512)
    g.add_argument("--hidden", type=int, default=256)
    g.add_argument("--lr", type=float, default=1e-3)
    args = parse_with_quick(p, argv, samples=20_000, taus=[5.0, 100.0, math.inf], priors=[0.5, 0.4, 0.3, 0.2, 0.05],
                            train_priors=[0.5, 0.9], seeds=[0, 1], train_size=1000, test_size=1000, epochs=5, hidden=32)
    if args.workers is None:
        args.workers = 1 if args.quick else available_cores()
    check_ranges(p, args, counts=("samples", "train_size", "test_size", "epochs", "batch_size", "hidden", "threads", "workers"),
                 positive=("lr",))
    check_seeds(p, args, ("seed", "rho_seed"))
    check_seeds(p, args, ("seeds",), high=MODEL_SEED_OFFSET - DATA_SEED_OFFSET,
                why=f" (from 2**32 - {DATA_SEED_OFFSET} on, a seed's data stream would be another seed's model stream)")
    for tau in args.taus + [args.train_tau]:
        if not tau > 0:
            p.error(f"taus must be positive; got {tau}")
    for prior in args.priors + args.train_priors:
        if not 0 < prior < 1:
            p.error(f"priors must lie in (0, 1); got {prior}")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the selected studies; returns the dictionary also written to ``results.json``."""
    args = parse_args(argv)
    provenance = Provenance(__file__, argv, args.workers, args.threads)
    torch.set_num_threads(args.threads)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {"config": config_dict(args)}
    markdown = []
    if args.study in ("bayes", "both"):
        results["bayes"] = bayes_optimal_study(args.taus, args.priors, args.samples, args.seed, args.workers, args.threads)
        results["deterministic_limit"] = [{"pi2": p, **deterministic_limit(p)} for p in args.priors]
        markdown += [
            "## Bayes-optimal scorers (Fig. 2)", "",
            "AUCs against the drawn labels (the paper's protocol); 'pop.' against eta (no label noise).", "",
            bayes_table(results["bayes"]), "",
            "### Deterministic limit, tau -> inf (closed form)", "", limit_table(args.priors), "",
        ]
        if plot_bayes(results["bayes"], args.output_dir / "bayes_optimal.png"):
            print(f"wrote {args.output_dir / 'bayes_optimal.png'}")
        else:
            print("matplotlib is not installed: no plot")
    if args.study in ("trained", "both"):
        results["trained"] = trained_study(args)
        markdown += [f"## Trained MLP (Table 6), tau = {args.train_tau:g}", "", trained_table(results["trained"]), ""]
    return write_outputs(args.output_dir, results, "\n".join(markdown), provenance)


if __name__ == "__main__":
    main()
