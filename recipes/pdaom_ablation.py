"""PDAOM ablation on synthetic Ali-CCP-like data: Sun et al. (2023), Tables IV/V and Fig. 4.

Sun et al. add a pairwise exponential AUC term to cross-entropy (Eq. 7) and compare, on the CGC
backbone of the Meituan data, how the pairs are formed (Table V): all positive-negative pairs of the
batch (CE + PEL), the single hardest pair of the batch (CE + DAOM, Eq. 5), or the hardest pair of each
user's sub-batch summed over users (CE + PDAOM, Eq. 6); Fig. 4 varies the batch size and lambda.
The Meituan data are not public and the Ali-CCP sample in ``recipes/data/ali-ccp-sample`` has 100 rows, so we use
the synthetic Ali-CCP-like generator ``mlloss.data.generate_impressions`` (known click and purchase
probabilities; the last ``--test-fraction`` of the time range is the test set).

Objectives (each task's logit gets its own term, summed over click and purchase; the pairwise term
sees sigmoid(logit), as in the paper). ``--lam`` is lambda of Eq. 7 read as a loss *summed* over the
batch, sum_i CE_i + lambda * (pairwise term): Eq. 7 writes the cross-entropy of one sample next to
a sum over the batch's users. ``build_loss("bce+pdaom", lam=lambda)`` computes exactly that divided by
the batch size N (mean CE + lambda * sum_u phi_u / N; under Adam, invariant to the scale of the loss,
the same optimisation). The all-pairs term of PEL is a mean over pairs, which the library does not
rescale, so the recipe passes it ``lam = lambda / batch_size`` to put it on the same footing. With a
mean cross-entropy, a weight of order 1 on the summed hardest pairs already swamps the cross-entropy
(see the lambda = 1000 point of the sweep: 1000 / 384 = 2.6 on the mean scale).

* ``bce``       -- ``build_loss("bce")``;
* ``bce+pel``   -- ``build_loss("bce+auc", surrogate="exponential")``: all pairs of the batch, no groups;
* ``bce+daom``  -- ``build_loss("bce+pdaom")`` without groups: the hardest pair of the batch;
* ``bce+pdaom`` -- ``build_loss("bce+pdaom")`` with the user ids as groups: Eq. 6 (sum over users).

Model: field embeddings (user, item, category, segment, slot) with their pairwise dot products and
the dense features, a shared-bottom MLP and one tower per task (``mlloss.models``); Adam. Batches keep
each user's impressions together (``mlloss.data.GroupBatchSampler``: users shuffled every epoch and
packed whole into batches of at most ``--batch-size`` rows), as the paper's training data "ranked by
user ID". Every objective of a seed sees the same data, initialisation and batch order, so
differences are paired.

Metrics on the test set, per task: AUC and GAUC (AUC per user, unweighted mean over users with both
classes: the paper sets every user's weight to 1), reported in points (x100) like the paper, and
the paired difference to BCE at the same seed and batch size.

    python recipes/pdaom_ablation.py               # Table V analogue + lambda and batch-size sweeps
    python recipes/pdaom_ablation.py --no-sweeps   # Table V analogue only
    python recipes/pdaom_ablation.py --quick       # small version used by the tests

Writes ``results.json``, ``results.md`` (headed by the command that made them, its wall time and
the load average) and (with matplotlib) ``sweeps.png`` to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

import mlloss
from mlloss.data import GroupBatchSampler, ImpressionData, SyntheticConfig, generate_impressions, split_by_time
from mlloss.evaluation import ranking_metrics as evaluate_ranking
from mlloss.models import DotInteraction, FieldEmbedding, MultiTaskModel, SharedBottom

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Provenance, check_ranges, check_seeds, config_dict, parse_with_quick, pyplot, sample_std,  # noqa: E402
                     write_outputs)

TASKS = ("click", "purchase")
OBJECTIVES = ("bce", "bce+pel", "bce+daom", "bce+pdaom")
OBJECTIVE_NAMES = {"bce": "CE", "bce+pel": "CE+PEL (all pairs)", "bce+daom": "CE+DAOM", "bce+pdaom": "CE+PDAOM"}
METRICS = tuple(f"{task}_{metric}" for task in TASKS for metric in ("auc", "gauc"))
# Table V of the paper (Meituan data, CGC; CE from Table IV): AUC/GAUC x100 of CTR and CVR.
PAPER_TABLE5 = {
    "bce": (75.89, 68.19, 89.15, 75.85),
    "bce+pel": (75.90, 68.21, 89.15, 75.89),
    "bce+daom": (76.03, 68.35, 89.26, 76.13),
    "bce+pdaom": (76.11, 68.62, 89.34, 76.29),
}


# --------------------------------------------------------------------------- data and model


def build_model(data: ImpressionData, args: argparse.Namespace) -> MultiTaskModel:
    """Embeddings + dot interactions + dense features -> shared-bottom MLP -> click and purchase logits."""
    embedding = FieldEmbedding(data.cardinalities, args.embedding_dim)
    interaction = DotInteraction(len(data.cardinalities), args.embedding_dim)
    backbone = SharedBottom(interaction.output_dim + data.dense.shape[1], len(TASKS), args.bottom_hidden, args.tower_hidden)
    return MultiTaskModel(embedding, backbone, interaction)


def build_objective(name: str, lam: float, batch_size: int) -> tuple[nn.Module, bool]:
    """(loss, whether it takes the user ids as groups) for an objective name; ``lam`` is Eq. 7's
    lambda (see the module docstring)."""
    if name == "bce":
        return mlloss.build_loss("bce"), False
    if name == "bce+pel":  # a mean over pairs: put on the summed-CE scale by hand
        return mlloss.build_loss("bce+auc", surrogate="exponential", lam=lam / batch_size), False
    if name == "bce+daom":
        return mlloss.build_loss("bce+pdaom", lam=lam), False
    if name == "bce+pdaom":
        return mlloss.build_loss("bce+pdaom", lam=lam), True
    raise ValueError(f"unknown objective {name!r}; choose from {OBJECTIVES}")


# --------------------------------------------------------------------------- training and evaluation


def train(name: str, train_data: ImpressionData, seed: int, lam: float, batch_size: int, args: argparse.Namespace) -> MultiTaskModel:
    """Train a fresh model (initialised from ``seed``) with one objective."""
    torch.manual_seed(seed)
    model = build_model(train_data, args)
    objective, grouped = build_objective(name, lam, batch_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    labels = train_data.labels
    sampler = GroupBatchSampler(train_data.user, batch_size, seed=seed)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for indices in sampler:
            index = torch.tensor(indices)
            logits = model(train_data.sparse[index], train_data.dense[index])
            groups = train_data.user[index] if grouped else None
            loss = sum(objective(logits[:, t], labels[index, t], groups) for t in range(len(TASKS)))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return model


def ranking_metrics(scores: Tensor, data: ImpressionData) -> dict[str, float]:
    """AUC and GAUC x100 of each task's column of ``scores`` (N, 2), by the library's one report
    (:func:`mlloss.evaluation.ranking_metrics`, as recipes/ctr_cvr.py), with the paper's GAUC:
    every user weighted 1 (Sun et al., Section III-C), where ctr_cvr.py weighs users by impressions."""
    values = evaluate_ranking(scores, data.labels, data.user, label_names=TASKS, group_weighting="uniform", quiet=True)
    return {f"{task}_{metric}": 100 * float(values[f"{metric}/{task}"]) for task in TASKS for metric in ("auc", "gauc")}


def evaluate(model: MultiTaskModel, data: ImpressionData) -> dict[str, float]:
    """Test metrics of ``model`` on ``data`` (scored in chunks)."""
    model.eval()
    with torch.no_grad():
        scores = torch.cat([model(s, d) for s, d in zip(data.sparse.split(8192), data.dense.split(8192))])
    model.train()
    return ranking_metrics(scores, data)


def run(name: str, splits: tuple[ImpressionData, ImpressionData], seed: int, lam: float, batch_size: int,
        args: argparse.Namespace) -> dict:
    """One training run and its test metrics."""
    start = time.perf_counter()
    model = train(name, splits[0], seed, lam, batch_size, args)
    row = {"objective": name, "seed": seed, "lam": lam, "batch_size": batch_size, **evaluate(model, splits[1])}
    row["seconds"] = time.perf_counter() - start
    print(f"  {name:<10} seed {seed} lam {lam:g} batch {batch_size:>4}: "
          + " ".join(f"{m} {row[m]:.2f}" for m in METRICS) + f" ({row['seconds']:.0f}s)", flush=True)
    return row


def summarize(runs: list[dict], baseline: list[dict]) -> dict:
    """Mean and std over seeds of every metric, and of the paired difference to ``baseline``
    (the BCE runs of the same seeds and batch size)."""
    base = {r["seed"]: r for r in baseline}
    out = {}
    for m in METRICS:
        values = torch.tensor([r[m] for r in runs], dtype=torch.float64)
        deltas = torch.tensor([r[m] - base[r["seed"]][m] for r in runs], dtype=torch.float64)
        out[m] = {"mean": float(values.mean()), "std": sample_std(values),
                  "delta_mean": float(deltas.mean()), "delta_std": sample_std(deltas)}
    return out


def cells(runs: list[dict], **match: object) -> list[dict]:
    """The runs whose fields equal ``match``."""
    return [r for r in runs if all(r[k] == v for k, v in match.items())]


# --------------------------------------------------------------------------- reporting


def table5_markdown(summary: dict[str, dict], oracle: dict[str, float]) -> str:
    """Our Table V analogue (mean +/- std, and paired delta to CE) beside the paper's values."""
    head = " | ".join(f"{task} {m.upper()}" for task in TASKS for m in ("auc", "gauc"))
    lines = [f"| objective | source | {head} |", "|---|---|" + "---:|" * len(METRICS)]
    for name, stats in summary.items():
        ours = " | ".join(f"{stats[m]['mean']:.2f} +/- {stats[m]['std']:.2f}" for m in METRICS)
        delta = " | ".join(f"{stats[m]['delta_mean']:+.2f} +/- {stats[m]['delta_std']:.2f}" for m in METRICS)
        paper = " | ".join(f"{v:.2f}" for v in PAPER_TABLE5[name])
        paper_delta = " | ".join(f"{v - b:+.2f}" for v, b in zip(PAPER_TABLE5[name], PAPER_TABLE5["bce"]))
        lines += [f"| {OBJECTIVE_NAMES[name]} | ours | {ours} |", f"| {OBJECTIVE_NAMES[name]} | ours, minus CE | {delta} |",
                  f"| {OBJECTIVE_NAMES[name]} | paper (Meituan) | {paper} |",
                  f"| {OBJECTIVE_NAMES[name]} | paper, minus CE | {paper_delta} |"]
    lines.append("| oracle (true probabilities) | ours | " + " | ".join(f"{oracle[m]:.2f}" for m in METRICS) + " |")
    return "\n".join(lines)


def sweep_markdown(title: str, summary: dict[float, dict]) -> str:
    """A Fig. 4 panel as a table: CE+PDAOM minus CE (paired) per value of ``key``."""
    lines = [f"| {title} | " + " | ".join(f"d {m}" for m in METRICS) + " |", "|---:|" + "---:|" * len(METRICS)]
    for value, stats in summary.items():
        lines.append(f"| {value:g} | " + " | ".join(f"{stats[m]['delta_mean']:+.2f} +/- {stats[m]['delta_std']:.2f}" for m in METRICS) + " |")
    return "\n".join(lines)


def plot_sweeps(lam_summary: dict[float, dict], batch_summary: dict[float, dict], path: Path) -> bool:
    """Fig. 4 (a) batch size and (b) lambda: CE+PDAOM minus CE, per metric; False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, summary, xlabel in ((axes[0], batch_summary, "batch size"), (axes[1], lam_summary, "lambda")):
        xs = list(summary)
        for m in METRICS:
            ax.errorbar(xs, [summary[x][m]["delta_mean"] for x in xs], yerr=[summary[x][m]["delta_std"] for x in xs],
                        marker="o", ms=3, capsize=2, label=m)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set(xscale="log", xlabel=xlabel, ylabel="CE+PDAOM minus CE (points)")
    axes[0].set_title("(a) batch size (Fig. 4a)")
    axes[1].set_title("(b) lambda (Fig. 4b)")
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
    p.add_argument("--quick", action="store_true", help="small sizes for the tests (seconds)")
    p.add_argument("--objectives", choices=OBJECTIVES, nargs="+", default=list(OBJECTIVES))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="model seeds (data seed fixed)")
    p.add_argument("--lam", type=float, default=10.0,
                   help="lambda of Eq. 7 (cross-entropy summed over the batch) for the main table; the paper's best")
    p.add_argument("--batch-size", type=int, default=384, help="the paper's best batch size")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--sweeps", action=argparse.BooleanOptionalAction, default=True, help="run the Fig. 4 sweeps")
    p.add_argument("--sweep-lams", type=float, nargs="+", default=[1.0, 10.0, 100.0, 1000.0])
    p.add_argument("--sweep-batch-sizes", type=int, nargs="+", default=[128, 256, 384, 1024])
    g = p.add_argument_group("synthetic data and model")
    g.add_argument("--data-seed", type=int, default=0)
    g.add_argument("--users", type=int, default=2000)
    g.add_argument("--items", type=int, default=1000)
    g.add_argument("--mean-impressions", type=float, default=40.0)
    g.add_argument("--test-fraction", type=float, default=0.2, help="last fraction of the time range")
    g.add_argument("--embedding-dim", type=int, default=8)
    g.add_argument("--bottom-hidden", type=int, nargs="+", default=[64, 32])
    g.add_argument("--tower-hidden", type=int, nargs="+", default=[16])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--output-dir", type=Path, default=Path("runs/pdaom_ablation"))
    args = parse_with_quick(p, argv, users=300, items=200, mean_impressions=30.0, epochs=1, seeds=[0],
                            sweep_lams=[10.0], sweep_batch_sizes=[128])
    check_ranges(p, args, counts=("users", "items", "epochs", "batch_size", "embedding_dim", "threads", "sweep_batch_sizes",
                                  "bottom_hidden", "tower_hidden"),
                 positive=("lr", "mean_impressions"), non_negative=("lam", "sweep_lams"))
    check_seeds(p, args, ("seeds", "data_seed"))
    if args.mean_impressions < 1:  # a user has at least one impression (SyntheticConfig raised, as a traceback)
        p.error(f"--mean-impressions must be >= 1 (impressions per user); got {args.mean_impressions}")
    if not 0 < args.test_fraction < 1:
        p.error(f"--test-fraction must lie in (0, 1); got {args.test_fraction}")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the ablation; returns the dictionary also written to ``results.json``."""
    args = parse_args(argv)
    provenance = Provenance(__file__, argv, workers=1, threads=args.threads)
    torch.set_num_threads(args.threads)
    config = SyntheticConfig(num_users=args.users, num_items=args.items, mean_impressions=args.mean_impressions,
                             seed=args.data_seed)
    train_data, _, test_data = split_by_time(generate_impressions(config), val_fraction=0.0, test_fraction=args.test_fraction)
    splits = (train_data, test_data)
    print(f"train {len(train_data)} / test {len(test_data)} impressions, click rate {train_data.click.mean():.3f}, "
          f"purchase rate {train_data.purchase.mean():.4f}")
    oracle = ranking_metrics(torch.stack([test_data.p_click, test_data.p_purchase], 1), test_data)

    runs = [run(name, splits, seed, args.lam, args.batch_size, args) for name in dict.fromkeys(["bce", *args.objectives])
            for seed in args.seeds]
    base = cells(runs, objective="bce", batch_size=args.batch_size)
    table = {name: summarize(cells(runs, objective=name, lam=args.lam, batch_size=args.batch_size), base)
             for name in args.objectives}
    text = (f"## Table V analogue: lambda = {args.lam:g}, batch {args.batch_size}, {len(args.seeds)} seeds, "
            f"{args.epochs} epochs (AUC/GAUC x100, test)\n\n{table5_markdown(table, oracle)}\n")
    results: dict = {"config": config_dict(args), "sizes": {"train": len(train_data), "test": len(test_data)},
                     "oracle": oracle, "table5": table}
    if args.sweeps:
        lam_summary, batch_summary = sweeps(runs, splits, args)
        text += (f"\n## Fig. 4b analogue: lambda sweep (batch {args.batch_size})\n\n"
                 f"{sweep_markdown('lambda', lam_summary)}\n"
                 f"\n## Fig. 4a analogue: batch-size sweep (lambda {args.lam:g})\n\n"
                 f"{sweep_markdown('batch size', batch_summary)}\n")
        results |= {"lambda_sweep": {str(k): v for k, v in lam_summary.items()},
                    "batch_sweep": {str(k): v for k, v in batch_summary.items()}}
        args.output_dir.mkdir(parents=True, exist_ok=True)
        print(f"wrote {args.output_dir / 'sweeps.png'}" if plot_sweeps(lam_summary, batch_summary, args.output_dir / "sweeps.png")
              else "matplotlib is not installed: no plot")
    results["runs"] = runs
    return write_outputs(args.output_dir, results, text, provenance)


def sweeps(runs: list[dict], splits: tuple[ImpressionData, ImpressionData], args: argparse.Namespace
           ) -> tuple[dict[float, dict], dict[float, dict]]:
    """Fig. 4: CE+PDAOM over ``--sweep-lams`` (batch ``--batch-size``) and over ``--sweep-batch-sizes``
    (lambda ``--lam``), each against CE at the same batch size; new runs are appended to ``runs``."""
    def ensure(name: str, lam: float, batch_size: int) -> list[dict]:
        match = cells(runs, objective=name, batch_size=batch_size, **({} if name == "bce" else {"lam": lam}))
        if not match:
            match = [run(name, splits, seed, lam, batch_size, args) for seed in args.seeds]
            runs.extend(match)
        return match

    lam_summary = {lam: summarize(ensure("bce+pdaom", lam, args.batch_size), ensure("bce", lam, args.batch_size))
                   for lam in args.sweep_lams}
    batch_summary = {size: summarize(ensure("bce+pdaom", args.lam, size), ensure("bce", args.lam, size))
                     for size in sorted(args.sweep_batch_sizes)}
    return lam_summary, batch_summary


if __name__ == "__main__":
    main()
