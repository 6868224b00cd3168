"""The options of recipes/ctr_cvr.py: its command line, config files that set them, and what they
select: the data (``load_data``; ``check_batches``: enough of it for every process), the model
(``build_model``) and the strategy (``build_strategy``).

``--config`` takes a YAML/JSON file keyed by long option name, or the name of one of the configs
in ``recipes/configs/`` (``bce``, ``laa``, ``bce+pdaom``, ``sharded``, ``multi-gpu``); options
given on the command line override the file's. A config's values go through the same parser as
the command line (types and choices checked), so a file can set nothing the command line cannot:
a flag takes true or false (YAML booleans, not strings such as "false"), an option of one value
one value (not a list, not null: leave a key out for its default), and ``compile: true`` is the
bare ``--compile`` (its default mode), ``compile: false`` no compilation.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mlloss.data import (GroupBatchSampler, ImpressionData, SyntheticConfig, generate_impressions, load_ali_ccp,
                         load_aliexpress, split_by_time)
from mlloss.integrations.torchrec import SHARDING_TYPES, SPARSE_OPTIMIZERS
from mlloss.models import CGC, PLE, DotInteraction, FieldEmbedding, MMoE, MultiTaskModel, SharedBottom

if TYPE_CHECKING:  # Lightning is imported by what needs it: the parser (``--help``) does not
    import pytorch_lightning as pl

DESCRIPTION = "Multi-task CTR/CVR training with a pairwise ranking loss from mlloss (recipes/ctr_cvr.py)."
TASKS = ("click", "purchase")
PER_TASK_LOSSES = ("bce", "bce+auc", "bce+pdaom", "auc", "pdaom")
RANKING_SCORE_LOSSES = ("laa", "loa", "balanced-loa")
MODELS = ("mmoe", "ple", "cgc", "shared-bottom")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
DATA_SOURCES = ("synthetic", "ali-ccp", "aliexpress")
RECIPES = Path(__file__).resolve().parent
CONFIGS = RECIPES / "configs"
SAMPLE_DATA = RECIPES / "data"  # small MIT-licensed samples, with their README and LICENSE
DEFAULT_DATA_DIRS = {"ali-ccp": SAMPLE_DATA / "ali-ccp-sample", "aliexpress": SAMPLE_DATA / "aliexpress-sample"}
SHARDINGS = ("none", *SHARDING_TYPES)


class OptionParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that keeps a table of its options (``add_argument`` returns each one's
    ``Action``), which :func:`config_argv` checks a config file's keys against."""

    def __init__(self, **kwargs: Any) -> None:
        self.options: dict[str, argparse.Action] = {}  # before __init__, which adds --help
        super().__init__(**kwargs)

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        group = super().add_argument_group(*args, **kwargs)
        add = group.add_argument

        def add_and_record(*names: str, **options: Any) -> argparse.Action:
            action = add(*names, **options)
            self.options.update(dict.fromkeys(action.option_strings, action))
            return action

        group.add_argument = add_and_record
        return group

    def add_argument(self, *names: str, **options: Any) -> argparse.Action:
        action = super().add_argument(*names, **options)
        self.options.update(dict.fromkeys(action.option_strings, action))
        return action


def build_parser() -> OptionParser:
    """The recipe's command line (``--help`` lists it with defaults)."""
    p = OptionParser(description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", default=None, metavar="NAME|PATH",
                   help="options from a YAML or JSON file keyed by long option name (loss: laa, batch-size: 512, "
                        f"expert-hidden: [64, 32], esmm: true), or a named config of recipes/configs/ "
                        f"({', '.join(named_configs())}); options on the command line override it (--no-X "
                        "turns a flag off; a config's --lambda and --cross-device go with its loss when the "
                        "command line's --loss has no use for them)")
    p.add_argument("--model", choices=MODELS, default="mmoe", help="multi-task tower")
    p.add_argument("--loss", choices=PER_TASK_LOSSES + RANKING_SCORE_LOSSES, default="bce",
                   help="objective name passed to mlloss.build_loss")
    p.add_argument("--lambda", dest="lam", type=float, default=None, metavar="LAMBDA",
                   help="weight of the ranking term: 'lam' of bce+X losses (library default if unset), "
                        "or the ranking-head weight of laa/loa/balanced-loa (1 if unset)")
    p.add_argument("--esmm", action=argparse.BooleanOptionalAction, default=False, help="purchase head = pCTR * pCVR (ESMM)")
    p.add_argument("--epochs", type=int, default=5, help="passes over the training split")
    p.add_argument("--batch-size", type=int, default=1024, help="most impressions per batch (per device); users are kept whole")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--weight-decay", type=float, default=1e-4, help="Adam L2 penalty (curbs id-embedding overfitting)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of the training")
    p.add_argument("--steps-per-call", type=int, default=8,
                   help="optimizer steps (batches) per call of the training step: Lightning's per-call work is paid "
                        "once for all of them; callbacks' on_train_batch_* hooks run once per call")
    p.add_argument("--cross-device", action=argparse.BooleanOptionalAction, default=False,
                   help="under DDP, take the ranking loss's pairs across all ranks (cross_device=True)")
    g = p.add_argument_group("data")
    g.add_argument("--data", choices=DATA_SOURCES, default="synthetic",
                   help="synthetic Ali-CCP-like log, or an Ali-CCP / AliExpress CSV directory")
    g.add_argument("--data-dir", type=Path, default=None,
                   help="directory of the *train*/*val*/*test* CSV files (None: the samples in recipes/data/)")
    g = p.add_argument_group("synthetic data")
    g.add_argument("--num-users", type=int, default=SyntheticConfig.num_users, help="users in the log")
    g.add_argument("--num-items", type=int, default=SyntheticConfig.num_items, help="items (Zipf popularity)")
    g.add_argument("--mean-impressions", type=float, default=SyntheticConfig.mean_impressions,
                   help="mean number of impressions per user")
    g.add_argument("--click-rate", type=float, default=SyntheticConfig.click_rate, help="clicks per impression")
    g.add_argument("--purchase-rate", type=float, default=SyntheticConfig.purchase_rate,
                   help="purchases per impression")
    g = p.add_argument_group("architecture")
    g.add_argument("--embedding-dim", type=int, default=16, help="dimension of every field embedding")
    g.add_argument("--interaction", choices=("dot", "none"), default="dot",
                   help="append the pairwise dot products of the field embeddings (FM/DLRM style)")
    g.add_argument("--expert-hidden", type=int, nargs="+", default=[64, 32],
                   help="widths of expert MLPs (of the bottom MLP for shared-bottom)")
    g.add_argument("--tower-hidden", type=int, nargs="+", default=[16], help="hidden widths of each task tower")
    g.add_argument("--num-experts", type=int, default=4, help="MMoE experts")
    g.add_argument("--num-task-experts", type=int, default=2, help="CGC/PLE experts per task")
    g.add_argument("--num-shared-experts", type=int, default=2, help="CGC/PLE shared experts")
    g.add_argument("--num-levels", type=int, default=2, help="PLE extraction levels")
    g.add_argument("--dropout", type=float, default=0.0, help="dropout after hidden layers")
    g.add_argument("--embedding", choices=("plain", "torchrec"), default="plain",
                   help="torch.nn.Embedding tables, or a TorchRec EmbeddingBagCollection fed a KeyedJaggedTensor")
    g = p.add_argument_group("TorchRec sharding (needs the torchrec extra)")
    g.add_argument("--sharding", choices=SHARDINGS, default="none",
                   help="shard the tables with DistributedModelParallel (implies --embedding torchrec)")
    g.add_argument("--sparse-optimizer", choices=SPARSE_OPTIMIZERS, default="rowwise_adagrad",
                   help="fused optimizer of sharded tables (adam only on CUDA)")
    g.add_argument("--sparse-lr", type=float, default=0.05, help="learning rate of the sparse optimizer")
    g = p.add_argument_group("hardware and output")
    g.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu")
    g.add_argument("--devices", type=device_count, default="1", help="number of devices (>= 1), or 'auto'")
    g.add_argument("--num-nodes", type=int, default=1, help="machines of a multi-node job (Lightning's num_nodes)")
    g.add_argument("--strategy", default="auto", help="Lightning strategy, e.g. ddp")
    g.add_argument("--cpu-threads", type=int, default=1,
                   help="torch intra-op threads per process: these small models run fastest on one, "
                        "which also keeps DDP ranks from oversubscribing the cores")
    g.add_argument("--output-dir", type=Path, default=Path("runs/ctr_cvr"),
                   help="where results.json, results.md and curves.png go")
    g.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="where last.ckpt is written every epoch (default: <output-dir>/checkpoints)")
    g.add_argument("--no-checkpoint", action="store_true", help="write no checkpoints")
    g.add_argument("--resume", default=None, metavar="PATH",
                   help="continue training from a checkpoint: a path, or 'last' for <checkpoint-dir>/last.ckpt")
    g.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES, metavar="MODE",
                   help="torch.compile the training step's model and loss as one graph (mlloss losses are "
                        "torch.library ops), and the model for evaluation; MODE is torch.compile's: "
                        "reduce-overhead replays CUDA graphs on a GPU (default: %(const)s)")
    g.add_argument("--fixed-batches", action=argparse.BooleanOptionalAction, default=False,
                   help="pad every training batch to --batch-size rows (filler rows left out of the losses by "
                        "their mask=): one shape for every step, so that --compile reduce-overhead records one "
                        "CUDA graph instead of one per batch size (~8%% more rows computed at batch 1,024)")
    g.add_argument("--graph-replay", action=argparse.BooleanOptionalAction, default=False,
                   help="replay the pairwise losses' eager calls on a GPU from CUDA graphs (mlloss.set_graph_replay): "
                        "their host path paid once per batch shape, so best with --fixed-batches")
    g.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True,
                   help="show Lightning's progress bar")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options of ``argv`` (default ``sys.argv[1:]``) over those of ``--config``, checked."""
    p = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    config = p.parse_known_args(argv)[0].config
    args = p.parse_args(config_argv(config, p) + argv if config is not None else argv)
    typed = typed_options(argv)
    moot = {"lam": not (args.loss.startswith("bce+") or args.loss in RANKING_SCORE_LOSSES),  # no ranking term
            "cross_device": args.loss == "bce"}  # no pairs
    for name, unset in (("lam", None), ("cross_device", False)):
        # A config's ranking options belong to its loss, which the command line replaced by one
        # without them (--config laa --loss bce): they go with it. Typed ones are errors below.
        if moot[name] and name not in typed:
            setattr(args, name, unset)
    for name in ("epochs", "batch_size", "num_users", "num_items", "embedding_dim", "cpu_threads", "num_nodes",
                 "steps_per_call", "num_experts", "num_shared_experts", "num_levels"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if not 0 <= args.seed < 2**32:  # pl.seed_everything's range (numpy's seeds); its error named no option
        p.error(f"--seed must be in [0, 2**32 - 1]; got {args.seed}")
    if args.num_task_experts < 0:  # 0: a CGC level without task experts, an MMoE
        p.error(f"--num-task-experts must be >= 0; got {args.num_task_experts}")
    if not 0 < args.lr < math.inf:
        p.error(f"--lr must be finite and > 0; got {args.lr}")
    if not 0 <= args.weight_decay < math.inf:
        p.error(f"--weight-decay must be finite and >= 0; got {args.weight_decay}")
    if not 0 <= args.dropout < 1:
        p.error(f"--dropout must be in [0, 1); got {args.dropout}")
    for name in ("expert_hidden", "tower_hidden"):  # checked before the data are made
        if any(width < 1 for width in getattr(args, name)):
            p.error(f"--{name.replace('_', '-')} widths must be >= 1; got {getattr(args, name)}")
    if args.lam is not None and moot["lam"]:
        p.error(f"--lambda weighs a ranking term, which --loss {args.loss} does not have")
    if args.lam is not None and not 0 <= args.lam < math.inf:  # a negative weight trains the term to anti-rank
        p.error(f"--lambda must be finite and >= 0; got {args.lam}")
    if args.cross_device and moot["cross_device"]:
        p.error("--cross-device applies to a ranking loss, which --loss bce does not have")
    if args.sharding != "none":
        if args.strategy not in ("auto", "ddp"):
            p.error(f"--sharding uses its own strategy (TorchRec DMP); drop --strategy {args.strategy}")
        args.embedding = "torchrec"
    if not args.sparse_lr > 0:
        p.error(f"--sparse-lr must be > 0; got {args.sparse_lr}")
    if args.data == "synthetic" and args.data_dir is not None:
        p.error("--data-dir needs --data ali-ccp or --data aliexpress")
    if args.data != "synthetic" and args.data_dir is None:
        args.data_dir = DEFAULT_DATA_DIRS[args.data]
    if args.checkpoint_dir is None:
        args.checkpoint_dir = args.output_dir / "checkpoints"
    if args.resume is not None and args.no_checkpoint:
        p.error("--resume continues a checkpointed run; drop --no-checkpoint")
    return args


def device_count(value: str) -> int | str:
    """``--devices``: ``'auto'`` or a number of devices >= 1 (Lightning's ``devices``)."""
    if value == "auto":
        return value
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a number of devices >= 1 or 'auto'; got {value!r}")
    return count


def typed_options(argv: Sequence[str]) -> set[str]:
    """The destinations of the options ``argv`` itself gives (not a config's, not defaults)."""
    parser = build_parser()
    for action in parser.options.values():
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_known_args(argv)[0]))


def named_configs() -> list[str]:
    """The names of the configs in recipes/configs/ (``--config laa`` reads ``configs/laa.yaml``)."""
    return sorted(path.stem for path in CONFIGS.glob("*.yaml"))


def config_argv(config: str, parser: OptionParser) -> list[str]:
    """The options of a YAML/JSON config file (a path, or a name in recipes/configs/) as
    command-line tokens, so that argparse checks them like typed options (types, choices) and
    later command-line options override them. A value that the command line could not give is
    an error naming its key: a flag's value that is not a boolean, null, a list for an option of
    one value, a boolean for an option that takes a value (``compile: true`` excepted: the bare
    ``--compile``). A value is passed as ``--option=value``, so that one starting with ``-`` is a
    value, not an option."""
    import yaml  # a dependency of pytorch-lightning; JSON is YAML too

    path = Path(config)
    if not path.is_file() and (CONFIGS / f"{config}.yaml").is_file():
        path = CONFIGS / f"{config}.yaml"
    if not path.is_file():
        parser.error(f"--config {config}: no such file, nor a named config ({', '.join(named_configs())})")
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        parser.error(f"--config {path}: not valid YAML/JSON ({error})")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: expected a mapping of option names to values; got {type(values).__name__}")
    tokens: list[str] = []
    for key, value in values.items():
        option = "--" + str(key).replace("_", "-")
        action = parser.options.get(option)
        if action is None or option in ("--config", "--help"):
            parser.error(f"--config {path}: unknown option {key!r}")
        tokens += _option_tokens(option, action, value, f"--config {path}: {key}", parser)
    return tokens


def _option_tokens(option: str, action: argparse.Action, value: Any, where: str, parser: OptionParser) -> list[str]:
    """The command-line tokens of ``option`` set to a config's ``value`` (``where`` names the file and
    key in errors): what typing it would give, or a usage error when no typing can give it."""
    is_flag = isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0
    if value is None:
        parser.error(f"{where} is null; give it a value, or leave the key out for the default")
    if is_flag and not isinstance(value, bool):
        parser.error(f"{where} is a flag and takes true or false; got {value!r}")
    if isinstance(action, argparse.BooleanOptionalAction):  # --X / --no-X, either one as the key
        positive, negative = action.option_strings
        on = value if option == positive else not value
        return [positive if on else negative]
    if is_flag or (action.nargs == "?" and isinstance(value, bool)):  # store_true; --compile [MODE]: its const
        return [option] if value else []
    if action.nargs in ("+", "*"):
        items = value if isinstance(value, list) else [value]
        if not items or any(isinstance(item, (bool, list, dict)) or item is None for item in items):
            parser.error(f"{where} takes one or more values (a value or a list of them); got {value!r}")
        return [option, *map(str, items)]
    if isinstance(value, (bool, list, dict)):
        parser.error(f"{where} takes one value{', not true or false' if isinstance(value, bool) else ''}; got {value!r}")
    return [f"{option}={value}"]


def build_model(args: argparse.Namespace, data: ImpressionData, num_heads: int) -> MultiTaskModel:
    """The tower selected by ``args.model`` over the concatenated field embeddings (with
    their pairwise dot products unless ``--interaction none``) and the dense features."""
    try:
        if args.embedding == "torchrec":
            from mlloss.integrations.torchrec import TorchRecEmbedding

            embedding = TorchRecEmbedding(data.cardinalities, args.embedding_dim, data.field_names)
        else:  # ImpressionData checked the ids
            embedding = FieldEmbedding(data.cardinalities, args.embedding_dim, validate_args=False)
    except (RuntimeError, MemoryError) as error:  # the allocator's error names no field
        if "alloc" not in str(error).lower() and not isinstance(error, MemoryError):
            raise
        largest = max(range(len(data.cardinalities)), key=data.cardinalities.__getitem__)
        raise MemoryError(
            f"the embedding tables do not fit in memory: {sum(data.cardinalities):,} rows (max id + 1 of each "
            f"field) of --embedding-dim {args.embedding_dim}; the largest is field {data.field_names[largest]!r} "
            f"with ids up to {data.cardinalities[largest] - 1:,}. The ids are rows of the tables: label-encode "
            f"them 0, 1, 2, ... (--data {args.data}), or lower --embedding-dim") from error
    interaction = DotInteraction(len(data.cardinalities), args.embedding_dim) if args.interaction == "dot" else None
    input_dim = (interaction or embedding).output_dim + data.dense.shape[1]
    expert_hidden, tower_hidden = tuple(args.expert_hidden), tuple(args.tower_hidden)
    if args.model == "mmoe":
        backbone = MMoE(input_dim, num_heads, args.num_experts, expert_hidden, tower_hidden, args.dropout)
    elif args.model == "cgc":
        backbone = CGC(input_dim, num_heads, args.num_task_experts, args.num_shared_experts,
                       expert_hidden, tower_hidden, args.dropout)
    elif args.model == "ple":
        backbone = PLE(input_dim, num_heads, args.num_levels, args.num_task_experts, args.num_shared_experts,
                       expert_hidden, tower_hidden, args.dropout)
    elif args.model == "shared-bottom":
        backbone = SharedBottom(input_dim, num_heads, expert_hidden, tower_hidden, args.dropout)
    else:
        raise ValueError(f"--model must be one of {MODELS}; got {args.model!r}")
    return MultiTaskModel(embedding, backbone, interaction, esmm=args.esmm)


def load_data(args: argparse.Namespace) -> tuple[tuple[ImpressionData, ImpressionData, ImpressionData], dict]:
    """The (train, val, test) splits of ``--data`` and a description of their source."""
    if args.data == "ali-ccp":
        return load_ali_ccp(args.data_dir), {"source": "ali-ccp", "directory": str(args.data_dir)}
    if args.data == "aliexpress":
        return load_aliexpress(args.data_dir, seed=args.seed), {"source": "aliexpress", "directory": str(args.data_dir)}
    config = SyntheticConfig(
        num_users=args.num_users, num_items=args.num_items, mean_impressions=args.mean_impressions,
        click_rate=args.click_rate, purchase_rate=args.purchase_rate, seed=args.seed,
    )
    return split_by_time(generate_impressions(config)), {"source": "synthetic", **asdict(config)}


def build_strategy(args: argparse.Namespace) -> str | pl.strategies.Strategy:
    """``--strategy``, or with ``--sharding`` the TorchRec DMP strategy (gloo on the CPU)."""
    if args.sharding == "none":
        return args.strategy
    from mlloss.integrations.torchrec_strategy import TorchRecStrategy

    backend = "gloo" if args.accelerator == "cpu" or not torch.cuda.is_available() else "nccl"
    return TorchRecStrategy(args.sharding, args.sparse_optimizer, args.sparse_lr, process_group_backend=backend)


def check_batches(splits: Sequence[ImpressionData], args: argparse.Namespace, world_size: int) -> None:
    """A ValueError, in the command line's terms and before any training, for a run that would
    report nothing: an empty (train, val, test) split, or a training split packed, in any epoch of
    the run, into fewer batches than there are processes, which then get none (GroupDataModule
    drops the last ``batches % processes``; Lightning only warns "No training batches").

    The number of batches depends on the epoch's order of the users (next-fit packing of whole
    users): it is at least ``ceil(impressions / --batch-size)``, and when that is below the
    processes every epoch of ``--epochs`` is packed here, as the run will pack it (its seed and
    epoch), so that a later epoch does not stop the run after hours of training."""
    train = splits[0]
    sizes = "/".join(str(len(split)) for split in splits)
    for name, split in zip(("training", "validation", "test"), splits):
        if len(split) == 0:
            more = "--num-users, --mean-impressions" if args.data == "synthetic" else f"the files in {args.data_dir}"
            raise ValueError(f"the {name} split is empty (train/val/test: {sizes} impressions): it needs more data "
                             f"({more})")
    short = _first_short_epoch(train, args, world_size)
    if short is None:
        return
    epoch, num_batches = short
    fix = (f"give --batch-size {len(train) // world_size} or less"
           if len(train) >= world_size else "use fewer processes")
    raise ValueError(
        f"--batch-size {args.batch_size} packs the training split's {len(train)} impressions into {num_batches} "
        f"batch(es), fewer than the {world_size} processes (--devices x --num-nodes), in epoch {epoch + 1} of "
        f"--epochs {args.epochs} (the packing of whole users depends on their order, shuffled every epoch): every "
        f"process would train on none (the last batches % processes are dropped, so that all take the same "
        f"steps); {fix}")


def _first_short_epoch(train: ImpressionData, args: argparse.Namespace, world_size: int) -> tuple[int, int] | None:
    """(epoch, batches) of the first epoch of ``--epochs`` whose training batches, of all processes,
    are fewer than the processes, or None when every epoch has enough."""
    # A batch holds at most --batch-size impressions: every epoch packs at least ceil(impressions / it).
    if -(-len(train) // args.batch_size) >= world_size:
        return None
    sampler = GroupBatchSampler(train.user, args.batch_size, seed=args.seed)  # packs as the run will
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        if len(sampler) < world_size:
            return epoch, len(sampler)
    return None
