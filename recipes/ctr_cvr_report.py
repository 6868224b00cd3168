"""What recipes/ctr_cvr.py reports: the data, baselines, the epoch line, results.json/.md and curves.png.

Every metric is :func:`mlloss.evaluation.ranking_metrics` (the function behind the
``RankingMetrics`` callback that evaluates the model), keyed ``<scorer>/<metric>``: scorers
``model`` (the click and purchase heads), ``model:rank`` (the ranking head of laa/loa),
``popularity`` and ``oracle``; metrics ``auc/<task>``, ``gauc/<task>`` and for a ranking head
``diff_auc``, ``min_auc``, ``multipartite_auc``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import torch
from torch import Tensor

from mlloss.data import ImpressionData
from mlloss.evaluation import ranking_metrics

from _common import pyplot  # recipes/_common.py, beside this file: matplotlib (imported when asked), or None

TASKS = ("click", "purchase")
GAUC_WEIGHTING: Final = "size"  # GAUC: each user's AUC weighted by the user's impressions (as in DIN's GAUC)
METRICS = tuple(f"{metric}/{task}" for task in TASKS for metric in ("auc", "gauc"))


# Lightning's notices that say nothing about this run: the training step takes the experimental
# `dataloader_iter` flavour on purpose (several batches a call, each one optimizer step, no gradient
# accumulation: docs/recipe.md, "The training step"), which Lightning warns about at every epoch;
# Lightning 2.6 calls a pytree API that torch >= 2.10 deprecates; the checkpoint folder is not empty
# when a run resumes or repeats another (it holds last.ckpt by design; resume_path prints a note when
# a run replaces another's checkpoint); a checkpoint resumed from another folder (--resume PATH, a
# moved run) "won't reload best_k_models": the recipe keeps last.ckpt only, there are none; and a
# tip that advertises a cloud logger.
MUTED_WARNINGS = (r"You are using the `dataloader_iter` step flavor", r"Found `dataloader_iter` argument",
                  r".*isinstance\(treespec, LeafSpec\)", r"Checkpoint directory .* exists and is not empty",
                  r"The dirpath has changed from")
MUTED_INFO = "litlogger"


class _WithoutText(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


_MUTED_INFO_FILTER = _WithoutText(MUTED_INFO)


@contextlib.contextmanager
def lightning_notices_muted() -> Iterator[None]:
    """The run's output without ``MUTED_WARNINGS`` and Lightning's info lines that name ``MUTED_INFO``."""
    logger = logging.getLogger("pytorch_lightning.utilities.rank_zero")  # Lightning's rank_zero_info
    logger.addFilter(_MUTED_INFO_FILTER)
    try:
        with warnings.catch_warnings():
            for message in MUTED_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        logger.removeFilter(_MUTED_INFO_FILTER)


def evaluate(scores: Tensor, data: ImpressionData) -> dict[str, float]:
    """The AUC and GAUC of each task for (N, 2) scores (one column per task) on ``data``."""
    values = ranking_metrics(scores, data.labels, data.user, label_names=TASKS, group_weighting=GAUC_WEIGHTING,
                             quiet=True)
    return {key: float(values[key]) for key in METRICS}


def baseline_results(train: ImpressionData, split: ImpressionData) -> dict[str, float]:
    """AUC/GAUC of item popularity (training impressions of the item), when the data names an
    item field, and of the true probabilities, when the data knows them (synthetic data)."""
    results = {}
    if train.item_field is not None:
        item = train.field_names.index(train.item_field)
        popularity = torch.bincount(train.sparse[:, item], minlength=train.cardinalities[item]).double()
        scores = popularity[split.sparse[:, item]]
        results |= {f"popularity/{k}": v for k, v in evaluate(torch.stack([scores, scores], 1), split).items()}
    if split.p_click is not None and split.p_purchase is not None:
        oracle = evaluate(torch.stack([split.p_click, split.p_purchase], 1), split)
        results |= {f"oracle/{k}": v for k, v in oracle.items()}
    return results


def scorer_results(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The ``<scorer>/<metric>`` results of the last evaluation from ``{scorer: RankingMetrics}``:
    AUC/GAUC per task, and a ranking head's (``model:rank``) DiffAUC, MinAUC and multipartite AUC."""
    results = {}
    for scorer, callback in metrics.items():
        for name, value in callback.results.items():
            metric = name.split("/", 2)[2]  # "<val|test>/<scorer>/<metric>"
            if metric.split("/")[0] in ("auc", "gauc") or (scorer == "model:rank" and "auc" in metric):
                results[f"{scorer}/{metric}"] = value
    return results


def describe_data(*splits: ImpressionData) -> str:
    """One line per split (train, val, test): impressions, users, click and purchase rates."""
    return "\n".join(f"{name}: {len(d)} impressions, {len(d.user.unique())} users, click {d.click.mean():.4f}, "
                     f"purchase {d.purchase.mean():.4f}" for name, d in zip(("train", "val", "test"), splits))


def write_report(report: dict, output_dir: Path) -> None:
    """Print the results table and write ``results.json``, ``results.md`` and ``curves.png``
    (without matplotlib, the plot is skipped and says so)."""
    table = markdown_table(report["results"])
    print("\n" + table)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "results.json").write_text(json.dumps(report, indent=2, allow_nan=True))
    (output_dir / "results.md").write_text(table + "\n")
    written = ["results.json", "results.md"]
    if plot_curves(report["history"], output_dir / "curves.png"):
        written.append("curves.png")
    else:
        print("(curves.png skipped: pip install matplotlib to draw it)")
    print(f"\nwrote {', '.join(str(output_dir / name) for name in written)} ({report['runtime_s']:.0f}s)")


def format_epoch(row: dict[str, float]) -> str:
    """One line per validation epoch: loss, time, throughput, AUC/GAUC per task (and the ranking head's)."""
    parts = [f"epoch {row['epoch']:>2}", f"loss {row['train_loss']:.4f}", f"{row['seconds']:.1f}s",
             f"{row['train_samples_per_s']:,.0f} imp/s"]
    for task in TASKS:
        parts.append(f"val {task} AUC {row[f'model/auc/{task}']:.4f} GAUC {row[f'model/gauc/{task}']:.4f}")
    if "model:rank/diff_auc" in row:
        parts.append(f"rank head AUC {row['model:rank/auc/click']:.4f}/{row['model:rank/auc/purchase']:.4f} "
                     f"Diff {row['model:rank/diff_auc']:.4f} Min {row['model:rank/min_auc']:.4f}")
    return " | ".join(parts)


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    """One row per (split, scorer), columns AUC/GAUC of click and purchase."""
    lines = ["| split | scorer | " + " | ".join(METRICS) + " |", "|" + "---|" * (len(METRICS) + 2)]
    for split, flat in results.items():
        for scorer in dict.fromkeys(key.split("/")[0] for key in flat):
            values = " | ".join(f"{flat[f'{scorer}/{m}']:.4f}" for m in METRICS)
            lines.append(f"| {split} | {scorer} | {values} |")
    for split, flat in results.items():
        if "model:rank/diff_auc" in flat:
            lines.append(f"\n{split}, ranking head: DiffAUC {flat['model:rank/diff_auc']:.4f}, "
                         f"MinAUC {flat['model:rank/min_auc']:.4f}, "
                         f"multipartite AUC {flat['model:rank/multipartite_auc']:.4f}")
    return "\n".join(lines)


def plot_curves(history: Sequence[dict[str, float]], path: Path) -> bool:
    """Training loss and validation AUC/GAUC per task against the epoch, saved as a PNG;
    False (and nothing written) when matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    epochs = [row["epoch"] for row in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), constrained_layout=True)
    axes[0].plot(epochs, [row["train_loss"] for row in history], marker="o")
    axes[0].set(title="training loss", xlabel="epoch")
    for ax, metric in zip(axes[1:], ("auc", "gauc")):
        for task in TASKS:
            ax.plot(epochs, [row[f"model/{metric}/{task}"] for row in history], marker="o", label=f"{task} head")
            if f"model:rank/{metric}/{task}" in history[0]:
                ax.plot(epochs, [row[f"model:rank/{metric}/{task}"] for row in history], marker="s",
                        linestyle="--", label=f"ranking head vs {task}")
        ax.set(title=f"validation {metric.upper()}", xlabel="epoch")
        ax.legend(fontsize=8)
    for ax in axes:
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
