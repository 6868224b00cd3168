"""recipes/ctr_cvr.py's ``--resume``: which checkpoint to continue from, what every checkpoint
records of the run that wrote it (the sharding, strategy and number of processes; the options of
the objective, model and data; the random states), and the check that a resumed run matches it
(docs/checkpoints.md).

The checkpoints themselves (temporary names, atomic publication, the newest complete one) are
``mlloss.checkpointing``; this module reads the recipe's options (``resume``, ``checkpoint_dir``,
``no_checkpoint``, ``epochs``, the layout's and those of :func:`training_options`), and
``OptimizerOptions`` applies the command line's ``--lr`` and ``--weight-decay`` to a resumed run.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_only

from mlloss.checkpointing import (METADATA_FILENAME, RETIRED_DIRNAME, STAGING_DIRNAME, is_checkpoint_directory,
                                 latest_complete_checkpoint, retired_path, staging_path)


@rank_zero_only
def _print_rank_zero(text: str) -> None:
    print(text, flush=True)


def check_checkpoint_dir(args: argparse.Namespace) -> None:
    """Refuse, before anything is trained, a ``--checkpoint-dir`` that the run would write its
    checkpoints into or ``--resume last`` read, and that cannot be their folder: a file, or a path
    under a file (NotADirectoryError, instead of one at the first checkpoint, after a whole epoch),
    a folder named ``.partial`` or ``.old``, which ``mlloss.checkpointing`` keeps for its
    temporary and retired copies (ValueError), or, when the run writes checkpoints, a folder it
    cannot write in or create (PermissionError, :func:`check_output_folder`)."""
    if args.no_checkpoint and args.resume != "last":
        return
    folder = Path(args.checkpoint_dir)
    if folder.name in (STAGING_DIRNAME, RETIRED_DIRNAME):
        kind = "temporary" if folder.name == STAGING_DIRNAME else "retired"
        raise ValueError(f"--checkpoint-dir {args.checkpoint_dir}: a folder named {folder.name} would be taken for the "
                         f"{kind} copies that mlloss.checkpointing keeps beside the checkpoints of {folder.parent}; "
                         "name another folder")
    check_output_folder("--checkpoint-dir", folder, "the checkpoints go into a folder (last.ckpt in it)",
                        writes=not args.no_checkpoint)


def check_output_folder(option: str, folder: Path, contents: str, writes: bool = True) -> None:
    """Refuse, before training, a folder ``option`` names that the run cannot write ``contents``
    into: a file or a path under a file (NotADirectoryError), or, when ``writes``, a folder
    without write and search permission, or whose nearest existing parent has none, so that it
    cannot be created (PermissionError; also a read-only file system). Without this the error
    came when the run first wrote there: after an epoch (a checkpoint) or after the whole run
    (results.json)."""
    # os.path.exists, not Path.exists: False, not PermissionError, below a folder that cannot be searched
    existing = next((path for path in (folder, *folder.parents) if os.path.exists(path)), None)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == folder else f"is under the file {existing}"
        raise NotADirectoryError(f"{option} {folder} {where}: {contents}; name a folder, new or existing")
    if writes and existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        what = "is a folder" if existing == folder else f"would be created in {existing}, a folder"
        raise PermissionError(f"{option} {folder} {what} this process cannot write in (no write or search "
                              f"permission, or a read-only file system): {contents}; name a folder it can write")


def resume_path(args: argparse.Namespace) -> Path | None:
    """The checkpoint ``--resume`` names (without it, a note if the run replaces an earlier run's
    checkpoint): ``last`` is the newest complete checkpoint
    (:func:`latest_complete_checkpoint` of ``<checkpoint-dir>/last.ckpt``; what it skips is printed;
    a folder that cannot be read is an OSError naming ``--checkpoint-dir``), a path must exist.
    First, on every run, :func:`check_checkpoint_dir` (the recipe calls this before training)."""
    check_checkpoint_dir(args)
    if args.resume is None:
        earlier = Path(args.checkpoint_dir) / "last.ckpt"
        if not args.no_checkpoint and earlier.exists():
            _print_rank_zero(f"note: this run replaces {earlier}, an earlier run's checkpoint (--resume last would "
                             "continue that run)")
        return None
    if args.resume != "last":
        path = Path(args.resume)
        if not path.exists():
            raise FileNotFoundError(f"--resume {args.resume}: no checkpoint at {path}")
        return path
    last = Path(args.checkpoint_dir) / "last.ckpt"
    skipped: list[str] = []
    try:
        path = latest_complete_checkpoint(args.checkpoint_dir, last.name, report=skipped.append)
    except OSError as error:  # e.g. a folder without read or search permission: the error names a path in it
        detail = (f"{error.strerror} (while looking for {error.filename})" if error.strerror and error.filename
                  else str(error))
        raise type(error)(f"--resume last: cannot read --checkpoint-dir {args.checkpoint_dir}: {detail}") from error
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

# The options that define what a run trains (by argparse destination): its objective, model and
# data. Not --lr and --weight-decay, which a resumed run may change (OptimizerOptions), nor
# --epochs (check_epochs); the others (--compile, --steps-per-call, --fixed-batches, threads,
# output) train the same model on the same batches (--compile and --fixed-batches may change the
# last bits of its float sums, as they do in an uninterrupted run).
OBJECTIVE_OPTIONS = ("loss", "lam", "cross_device")
MODEL_OPTIONS = ("model", "esmm", "embedding", "embedding_dim", "interaction", "expert_hidden", "tower_hidden",
                 "num_experts", "num_task_experts", "num_shared_experts", "num_levels", "dropout", "sparse_optimizer")
DATA_OPTIONS = ("data", "seed", "batch_size")
SYNTHETIC_DATA_OPTIONS = ("num_users", "num_items", "mean_impressions", "click_rate", "purchase_rate")
# Options only some runs use, recorded and compared only there (another --num-levels changes no MMoE).
USED_WHEN = {
    "num_experts": lambda args: args.model == "mmoe",
    "num_task_experts": lambda args: args.model in ("cgc", "ple"),
    "num_shared_experts": lambda args: args.model in ("cgc", "ple"),
    "num_levels": lambda args: args.model == "ple",
    "sparse_optimizer": lambda args: args.sharding != "none",
    "lam": lambda args: args.loss != "bce",  # no ranking term to weigh
}


def layout_options(args: argparse.Namespace) -> dict[str, Any]:
    """The command-line options that fix a checkpoint's layout and the data order of a run."""
    return {"--sharding": args.sharding, "--strategy": args.strategy, "--devices": args.devices,
            "--num-nodes": args.num_nodes}


def training_options(args: argparse.Namespace, *, unused: bool = False) -> dict[str, Any]:
    """The command-line options that define what a run trains, by option name: its objective,
    model and data (the generator's options for synthetic data, else ``--data-dir``). With
    ``unused``, also those the run does not use (:data:`USED_WHEN`, the other data's), with the
    values it gives them: what a resumed run needs to match of a checkpoint's other model or data."""
    data = SYNTHETIC_DATA_OPTIONS if args.data == "synthetic" else ("data_dir",)
    if unused:
        data = (*SYNTHETIC_DATA_OPTIONS, "data_dir")
    options = {}
    for name in (*OBJECTIVE_OPTIONS, *MODEL_OPTIONS, *DATA_OPTIONS, *data):
        if not unused and not USED_WHEN.get(name, lambda args: True)(args):
            continue
        value = getattr(args, name)
        if name == "lam" and value is None:
            value = 1.0  # the weight a ranking term gets without --lambda: the same run either way
        options["--lambda" if name == "lam" else "--" + name.replace("_", "-")] = \
            str(Path(value).resolve()) if isinstance(value, Path) else value  # the folder, wherever typed from
    return options


def recorded_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The command-line options a checkpoint records (:func:`checkpoint_record`)."""
    return {"layout": layout_options(args), "training": training_options(args)}


def checkpoint_layout(trainer: pl.Trainer, options: dict[str, Any]) -> dict[str, Any]:
    """What a run's checkpoints depend on: the sharding of the tables (the saved state's layout),
    the strategy (its checkpoint format) and the number of processes (the shards, and the batches
    dealt to each rank); ``options`` are the command-line values behind them. Recorded in every
    checkpoint, compared by :func:`check_resume`."""
    strategy = trainer.strategy
    sharding = getattr(strategy, "sharding", "none") if type(strategy).__name__ == "TorchRecStrategy" else "none"
    return {"sharding": sharding, "strategy": type(strategy).__name__, "world_size": trainer.world_size,
            "options": dict(options)}


def checkpoint_record(trainer: pl.Trainer, options: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What every checkpoint records of the run that wrote it, compared by :func:`check_resume`:
    ``written_with``, its :func:`checkpoint_layout`, and ``trained_with``, its
    :func:`training_options`; ``options`` is :func:`recorded_options` (empty: nothing recorded)."""
    return {"written_with": checkpoint_layout(trainer, options.get("layout", {})),
            "trained_with": options.get("training", {})}


def process_states(objective: torch.nn.Module) -> dict[str, Any]:
    """The per-process states a resumed run restores: torch's CPU generator and, once CUDA is
    initialised, every CUDA device's (dropout on a GPU draws from those), restored by
    :func:`restore_rng_states`, and the ``objective``'s state (a balanced LoALoss's running label
    counts, which count each rank's own batches without ``--cross-device``), restored by
    :class:`ObjectiveRankStates`; of every process: each rank draws its own dropout masks, and the
    checkpoint, written by rank 0, keeps them all (``rank_states``, gathered; a collective, as
    Lightning calls the checkpoint hooks on every rank)."""
    states = {"torch_rng_state": torch.get_rng_state(),
              "objective": {name: value.cpu() for name, value in objective.state_dict().items()}}
    if torch.cuda.is_initialized():
        states["cuda_rng_states"] = torch.cuda.get_rng_state_all()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, states)
        states = {**states, "rank_states": gathered}
    return states


def restore_rng_states(saved: dict[str, Any]) -> None:
    """Restore this process's :func:`process_states` from ``saved`` (rank 0's in a checkpoint written
    before each rank's were kept). A checkpoint without CUDA states (written on the CPU, or before
    they were saved), or a run without CUDA, leaves the CUDA generators as seeded."""
    ranks = saved.get("rank_states")
    if ranks and torch.distributed.is_available() and torch.distributed.is_initialized():
        saved = ranks[torch.distributed.get_rank()]  # the same world size: check_resume compares it
    torch.set_rng_state(saved["torch_rng_state"])
    cuda_states = saved.get("cuda_rng_states")
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])


def _load_named(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise RuntimeError(f"could not load the checkpoint {path}: {type(error).__name__}: {error}") from error


def saved_record(path: Path, resume: str) -> dict[str, Any]:
    """The recipe's entry ``ctr_cvr`` of the checkpoint at ``path`` (a file, or under ``--sharding``
    a directory with ``meta.pt``): its history, random states and :func:`checkpoint_record` (absent
    from checkpoints that predate it). RuntimeError naming ``path`` when it does not load or is not
    a checkpoint of this recipe (a plain state dict, a tensor, another script's checkpoint)."""
    path = Path(path)
    if path.is_dir():
        meta = path / METADATA_FILENAME  # TorchRecStrategy: everything but the tensors of the shards
        if not meta.is_file():
            raise FileNotFoundError(f"--resume {resume}: {path} is a directory without meta.pt, not a checkpoint "
                                    "of this recipe (under --sharding a checkpoint is a directory with meta.pt)")
        checkpoint = _load_named(meta)
    else:
        checkpoint = _load_named(path)
    record = checkpoint.get("ctr_cvr") if isinstance(checkpoint, dict) else None
    if not isinstance(record, dict):
        raise RuntimeError(f"could not load the checkpoint {path}: it is not a checkpoint of recipes/ctr_cvr.py ("
                           f"{type(checkpoint).__name__} without the recipe's 'ctr_cvr' entry)")
    return record


def saved_layout(record: dict[str, Any], path: Path) -> dict[str, Any]:
    """The :func:`checkpoint_layout` in ``record``, the :func:`saved_record` of ``path``; what the
    checkpoint's kind tells, with None for the unknown values, when it was written before the
    recipe recorded it."""
    unrecorded = {"sharding": None if Path(path).is_dir() else "none", "strategy": None, "world_size": None,
                  "options": {}}
    return record.get("written_with") or unrecorded


def check_resume(args: argparse.Namespace, path: Path, trainer: pl.Trainer) -> None:
    """Raise ValueError, naming the options and both values, when the checkpoint at ``path`` was
    written with another sharding, strategy or number of processes than this run has, trained
    with another objective, model or data, or has completed more epochs than ``--epochs``: checked
    before Lightning loads it, which would end in a raw IsADirectoryError (a sharded directory
    read as a file), a state-dict mismatch, or a run that continues with another data order or
    objective. A checkpoint that predates the record of these options is checked for its kind."""
    record = saved_record(path, args.resume)
    check_layout(args, path, saved_layout(record, path), checkpoint_layout(trainer, layout_options(args)))
    check_training_options(args, path, record.get("trained_with", {}))
    check_epochs(args, path, len(record.get("history", [])))


def check_layout(args: argparse.Namespace, path: Path, saved: dict[str, Any], here: dict[str, Any]) -> None:
    """The sharding, strategy and number of processes of :func:`check_resume`."""
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


def check_training_options(args: argparse.Namespace, path: Path, saved: dict[str, Any]) -> None:
    """The objective, model and data of :func:`check_resume`: ``saved`` is the checkpoint's
    ``trained_with`` (empty in a checkpoint that predates it: nothing to compare)."""
    here = training_options(args)
    if saved.get("--lambda", 0) is None and saved.get("--loss") != "bce":
        saved = {**saved, "--lambda": 1.0}  # recorded unset (before 1 was recorded for it): the same weight
    differ = [option for option in here if option in saved and saved[option] != here[option]]
    if not differ:
        return
    # The checkpoint's options that this run does not use (the expert counts of the checkpoint's
    # model, the files of its data) and gives other values: "resume with" names them too, so that
    # the command it suggests resumes, rather than fail next on one of them.
    given = training_options(args, unused=True)
    also = [option for option in saved if option not in here and option in given and saved[option] != given[option]]
    raise ValueError(
        f"--resume {args.resume}: the checkpoint {path} was trained with "
        f"{', '.join(as_typed(option, saved[option]) for option in differ)}; this run has "
        f"{', '.join(as_typed(option, here[option]) for option in differ)}. A checkpoint resumes only with the "
        "objective, model and data it was trained with (--lr, --weight-decay and --epochs may change): resume with "
        f"{' '.join(as_typed(option, saved[option]) for option in (*differ, *also))}, or start a new run with another "
        "--output-dir (or --checkpoint-dir)"
    )


def as_typed(option: str, value: Any) -> str:
    """``option`` with ``value`` as the command line gives it (``--esmm``/``--no-esmm``, ``--expert-hidden 64 32``)."""
    if isinstance(value, bool):
        return option if value else "--no-" + option[2:]
    if value is None:
        return f"no {option}"
    return " ".join([option, *map(str, value)]) if isinstance(value, (list, tuple)) else f"{option} {value}"


def check_epochs(args: argparse.Namespace, path: Path, done: int) -> None:
    """``--epochs`` of :func:`check_resume`: it counts every epoch of the run, the checkpoint's
    included, and Lightning would train none and report the checkpoint's ``done`` epochs as this
    run's. The same number trains none and evaluates the checkpoint."""
    if args.epochs < done:
        raise ValueError(f"--resume {args.resume}: the checkpoint {path} has completed {done} epochs, more than "
                         f"--epochs {args.epochs} (the run's epochs in all, the checkpoint's included): resume with "
                         f"--epochs {done} or more")


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
    if last.is_dir() and not is_checkpoint_directory(last):
        raise IsADirectoryError(f"--checkpoint-dir {args.checkpoint_dir}: {last} is a directory that is not a checkpoint "
                                "(it has no completion marker): the run's checkpoint file would replace it; move it")
    for path in (staging_path(last), retired_path(last)):  # a crashed sharded write's copies, which
        if path.is_dir():                                   # --resume last would prefer
            shutil.rmtree(path)
    if last.is_dir():
        shutil.rmtree(last)
        print(f"removed {last}, the sharded checkpoint of an earlier run: this run (--sharding none) writes its own "
              "there")


class ObjectiveRankStates(pl.Callback):
    """Each rank's own objective state from the checkpoint (:func:`process_states`) once training
    starts: a balanced LoALoss without ``--cross-device`` counts each rank's own labels, but the
    module state of a checkpoint, which every rank loads, is rank 0's (rank 1 went on from rank
    0's counts, and the resumed run left the uninterrupted one). DDP leaves these buffers alone
    (it broadcast rank 0's at its first forward, over the restored ones)."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        names = [f"objective.{name}" for name, _ in pl_module.objective.named_buffers()]  # before DDP wraps the module
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(pl_module, names)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        ranks = checkpoint.get("ctr_cvr", {}).get("rank_states")
        self.saved = ranks[trainer.global_rank].get("objective") if ranks else None  # none before 2026-11-29

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.saved is not None:
            pl_module.objective.load_state_dict(self.saved)
            self.saved = None


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
