"""recipes/ctr_cvr.py's ``--resume``: which checkpoint to continue from, and the check that it was
written with this run's sharding, strategy and number of processes (docs/checkpoints.md).

The checkpoints themselves (temporary names, atomic publication, the newest complete one) are
``mlloss.checkpointing``; this module reads the recipe's options (``resume``, ``checkpoint_dir``,
``no_checkpoint``, ``sharding``, ``strategy``, ``devices``, ``num_nodes``), and
``OptimizerOptions`` applies the command line's ``--lr`` and ``--weight-decay`` to a resumed run.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_only

from mlloss.checkpointing import latest_complete_checkpoint, retired_path, staging_path


@rank_zero_only
def _print_rank_zero(text: str) -> None:
    print(text, flush=True)

def resume_path(args: argparse.Namespace) -> Path | None:
    """The checkpoint ``--resume`` names: ``last`` is the newest complete checkpoint
    (:func:`latest_complete_checkpoint` of ``<checkpoint-dir>/last.ckpt``; what it skips is printed),
    a path must exist."""
    if args.resume is None:
        return None
    if args.resume != "last":
        path = Path(args.resume)
        if not path.exists():
            raise FileNotFoundError(f"--resume {args.resume}: no checkpoint at {path}")
        return path
    last = Path(args.checkpoint_dir) / "last.ckpt"
    skipped: list[str] = []
    path = latest_complete_checkpoint(args.checkpoint_dir, last.name, report=skipped.append)
    for message in skipped:
        _print_rank_zero(f"--resume last: {message}")
    if path is None:
        detail = f" ({'; '.join(skipped)})" if skipped else ""
        raise FileNotFoundError(f"--resume last: no checkpoint at {last} that is complete{detail}" if skipped
                                else f"--resume last: no checkpoint at {last}")
    if path != last:
        _print_rank_zero(f"--resume last: resuming from {path}, the newest complete checkpoint (a crash "
                         f"interrupted its move to {last})")
    return path


# Strategies whose checkpoints differ only by --sharding (a file, or TorchRec's directory): compared as one.
PLAIN_STRATEGIES = ("SingleDeviceStrategy", "DDPStrategy", "TorchRecStrategy")


def layout_options(args: argparse.Namespace) -> dict[str, Any]:
    """The command-line options that fix a checkpoint's layout and the data order of a run."""
    return {"--sharding": args.sharding, "--strategy": args.strategy, "--devices": args.devices,
            "--num-nodes": args.num_nodes}


def checkpoint_layout(trainer: pl.Trainer, options: dict[str, Any]) -> dict[str, Any]:
    """What a run's checkpoints depend on: the sharding of the tables (the saved state's layout),
    the strategy (its checkpoint format) and the number of processes (the shards, and the batches
    dealt to each rank); ``options`` are the command-line values behind them. Recorded in every
    checkpoint, compared by :func:`check_resume`."""
    strategy = trainer.strategy
    sharding = getattr(strategy, "sharding", "none") if type(strategy).__name__ == "TorchRecStrategy" else "none"
    return {"sharding": sharding, "strategy": type(strategy).__name__, "world_size": trainer.world_size,
            "options": dict(options)}


def _load_named(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise RuntimeError(f"could not load the checkpoint {path}: {type(error).__name__}: {error}") from error


def saved_layout(path: Path, resume: str) -> dict[str, Any]:
    """The :func:`checkpoint_layout` recorded in the checkpoint at ``path`` (a file, or under
    ``--sharding`` a directory with ``meta.pt``); what the checkpoint's kind tells, with None for
    the unknown values, when it was written before the recipe recorded it."""
    path = Path(path)
    if path.is_dir():
        meta = path / "meta.pt"  # TorchRecStrategy: everything but the tensors of the shards
        if not meta.is_file():
            raise FileNotFoundError(f"--resume {resume}: {path} is a directory without meta.pt, not a checkpoint "
                                    "of this recipe (under --sharding a checkpoint is a directory with meta.pt)")
        checkpoint, unrecorded = _load_named(meta), {"sharding": None}
    else:
        checkpoint, unrecorded = _load_named(path), {"sharding": "none"}
    recorded = checkpoint.get("ctr_cvr", {}).get("written_with") if isinstance(checkpoint, dict) else None
    return recorded or {**unrecorded, "strategy": None, "world_size": None, "options": {}}


def check_resume(args: argparse.Namespace, path: Path, trainer: pl.Trainer) -> None:
    """Raise ValueError, naming the options and both values, when the checkpoint at ``path`` was
    written with another sharding, strategy or number of processes than this run has: checked
    before Lightning loads it, which would end in a raw IsADirectoryError (a sharded directory
    read as a file), a state-dict mismatch, or a run that continues with another data order."""
    saved, here = saved_layout(path, args.resume), checkpoint_layout(trainer, layout_options(args))
    differ = []
    if saved["sharding"] is None:  # a sharded checkpoint directory that did not record its --sharding
        if here["sharding"] == "none":
            differ.append("--sharding")
    elif saved["sharding"] != here["sharding"]:
        differ.append("--sharding")
    if saved["strategy"] is not None and strategy_kind(saved["strategy"]) != strategy_kind(here["strategy"]):
        differ.append("--strategy")
    if saved["world_size"] is not None and saved["world_size"] != here["world_size"]:
        differ.append("the number of processes (--devices x --num-nodes)")
    if not differ:
        return
    same = " ".join(f"{option} {value}" for option, value in saved["options"].items()) or \
        "the --sharding, --strategy, --devices and --num-nodes of the run that wrote it"
    what = differ[0] if len(differ) == 1 else ", ".join(differ[:-1]) + " and " + differ[-1]
    raise ValueError(
        f"--resume {args.resume}: the checkpoint {path} was written with {describe_layout(saved)}; this run has "
        f"{describe_layout(here)}. A checkpoint resumes only with the sharding, strategy and number of processes "
        f"that wrote it, and {what} {'differs' if len(differ) == 1 else 'differ'}: resume with {same}, or start "
        "a new run with another --output-dir (or --checkpoint-dir)"
    )


def strategy_kind(name: str) -> str:
    """``"plain"`` for the strategies whose checkpoints differ only by ``--sharding``, else ``name``."""
    return "plain" if name in PLAIN_STRATEGIES else name


def describe_layout(layout: dict[str, Any]) -> str:
    """A :func:`checkpoint_layout` in the words of the command-line options."""
    if layout["strategy"] is None:  # written before the recipe recorded the layout: only its kind is known
        if layout["sharding"] is None:
            return "some --sharding (a checkpoint directory that predates the record of these options)"
        return f"--sharding {layout['sharding']} (a checkpoint file that predates the record of these options)"
    n = layout["world_size"]
    strategy = layout["options"].get("--strategy")
    strategy = layout["strategy"] if strategy is None else f"{strategy}: {layout['strategy']}"
    return f"--sharding {layout['sharding']} on {n} process{'es' if n != 1 else ''} (--strategy {strategy})"


def replace_other_kind_of_checkpoint(args: argparse.Namespace, trainer: pl.Trainer) -> None:
    """Remove the sharded checkpoint directory ``<checkpoint-dir>/last.ckpt`` of an earlier run (and
    its temporary and retired copies) before a run without --sharding writes its checkpoint file
    there (Lightning would put the file inside the directory and leave the old checkpoint in
    place); ``TorchRecStrategy`` replaces a checkpoint file by its directory itself. A resumed run
    has the same kind (``check_resume``)."""
    last = Path(args.checkpoint_dir) / "last.ckpt"
    if args.no_checkpoint or args.sharding != "none" or not trainer.is_global_zero:
        return
    for path in (staging_path(last), retired_path(last)):  # a crashed sharded write's copies, which
        if path.is_dir():                                   # --resume last would prefer
            shutil.rmtree(path)
    if last.is_dir():
        shutil.rmtree(last)
        print(f"removed {last}, the sharded checkpoint of an earlier run: this run (--sharding none) writes its own "
              "there")


class OptimizerOptions(pl.Callback):
    """This run's ``--lr`` and ``--weight-decay`` on the dense optimizer once training starts: a
    resumed run's optimizer comes back with the values of the run that wrote the checkpoint
    (Lightning restores its param groups), which would otherwise silently win over the command
    line. The same values change nothing, so a resume with the same options stays bit-identical."""

    def __init__(self, lr: float, weight_decay: float) -> None:
        self.lr, self.weight_decay = lr, weight_decay

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"], group["weight_decay"] = self.lr, self.weight_decay
