"""The README's cost-of-the-ranking-term table: the default recipe run with each loss.

Runs ``python recipes/ctr_cvr.py --loss <name> --no-checkpoint`` (the recipe's defaults: MMoE,
the built-in synthetic log, batches of 1,024, 5 epochs, one process) ``--runs`` times per loss,
one run at a time, and reads each run's ``results.json``: the training throughput of every
epoch after the first (``train_samples_per_s``, impressions per second; the first pays for
warm-up) and the test AUC / GAUC of the model's heads. Reports, per loss, the median throughput
over those epochs of all runs and the test metrics (whether the runs gave the same bits is
reported too: the recipe is deterministic on the CPU).

Usage::

    python benchmarks/recipe_losses.py [--losses bce bce+pdaom bce+auc laa] [--runs 2]
        [--output benchmarks/results/recipe-losses-cpu.json]

Prints a Markdown table and writes JSON and Markdown next to each other. Throughput depends on
the machine and its load (the load average is recorded): compare rows of the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _measure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METRICS = ("click_auc", "click_gauc", "purchase_auc", "purchase_gauc")
KEYS = {"click_auc": "model/auc/click", "click_gauc": "model/gauc/click",
        "purchase_auc": "model/auc/purchase", "purchase_gauc": "model/gauc/purchase"}


def recipe_argv(loss: str, output_dir: Path, extra: list[str]) -> list[str]:
    return ["--loss", loss, "--no-checkpoint", "--no-progress-bar", "--output-dir", str(output_dir), *extra]


def run_recipe(loss: str, output_dir: Path, extra: list[str]) -> dict:
    command = [sys.executable, str(ROOT / "recipes" / "ctr_cvr.py"), *recipe_argv(loss, output_dir, extra)]
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads((output_dir / "results.json").read_text())


def recipe_refusal(loss: str, extra: list[str]) -> str | None:
    """What recipes/ctr_cvr.py's option check says of a run's options (None: nothing), without running it."""
    recipes = str(ROOT / "recipes")
    if recipes not in sys.path:
        sys.path.insert(0, recipes)
    from ctr_cvr_options import parse_args

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parse_args(recipe_argv(loss, Path("scratch"), extra))
    except SystemExit:
        last = (said.getvalue().strip().splitlines() or ["(no message)"])[-1]
        return last.partition("error: ")[2] or last
    return None


def summarize(loss: str, reports: list[dict]) -> dict:
    throughputs = [row["train_samples_per_s"] for report in reports for row in report["history"][1:]]
    tests = [{name: report["results"]["test"][key] for name, key in KEYS.items()} for report in reports]
    return {
        "loss": loss,
        "impressions_per_s": statistics.median(throughputs),
        "epoch_throughputs": throughputs,
        "test": tests[0],
        "runs_identical": all(test == tests[0] for test in tests),
        "runtime_s": [report["runtime_s"] for report in reports],
    }


def markdown(rows: list[dict], meta: dict) -> str:
    lines = ["| `--loss` | impressions/s | click AUC | click GAUC | purchase AUC | purchase GAUC |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        metrics = " | ".join(f"{row['test'][m]:.4f}" for m in METRICS)
        lines.append(f"| `{row['loss']}` | {row['impressions_per_s']:,.0f} | {metrics} |")
    identical = all(row["runs_identical"] for row in rows)
    lines.append(f"\n{meta['runs']} run(s) per loss, median training throughput of epochs 2-{meta['epochs']}; "
                 f"test metrics of the runs {'identical to the bit' if identical else 'DIFFERENT across runs'}. "
                 f"{meta['machine']}; load average {meta['load_before']} before, {meta['load_after']} after. "
                 f"`{meta['command']}`")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--losses", nargs="+", default=["bce", "bce+pdaom", "bce+auc", "laa"])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5, help="the recipe's --epochs (its default: 5)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "recipe-losses-cpu.json")
    parser.add_argument("--recipe-args", nargs=argparse.REMAINDER, default=[],
                        help="further options for recipes/ctr_cvr.py (last on the command line)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.epochs < 2:
        parser.error(f"--runs must be >= 1 and --epochs >= 2 (epoch 1 is warm-up); got {args.runs}, {args.epochs}")
    for loss in args.losses:  # else a loss (or option) the recipe refuses ended the run after the losses before it
        refusal = recipe_refusal(loss, ["--epochs", str(args.epochs), *args.recipe_args])
        if refusal:
            given = f" with --recipe-args {' '.join(args.recipe_args)}" if args.recipe_args else ""
            parser.error(f"recipes/ctr_cvr.py refuses --losses {loss}{given}: {refusal}")
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for loss in args.losses:
            reports = [run_recipe(loss, Path(scratch) / f"{loss}-{run}", ["--epochs", str(args.epochs), *args.recipe_args])
                       for run in range(args.runs)]
            rows.append(summarize(loss, reports))
            print(f"{loss}: {rows[-1]['impressions_per_s']:,.0f} impressions/s", flush=True)
    meta = {
        "command": " ".join(["python benchmarks/recipe_losses.py", *(argv if argv is not None else sys.argv[1:])]),
        "runs": args.runs, "epochs": args.epochs,
        "machine": f"{platform.machine()} {_measure.cpu_model()}, {os.cpu_count()} cores, {platform.python_version()}",
        "load_before": None if load_before is None else [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "date": time.strftime("%Y-%m-%d"),
    }
    table = markdown(rows, meta)
    print(table)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    args.output.with_suffix(".md").write_text(table + "\n")
    return {"meta": meta, "rows": rows}


if __name__ == "__main__":
    main()
