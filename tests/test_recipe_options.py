"""Tests of the CTR/CVR recipe's options (recipes/ctr_cvr_options.py): a config file's values are
checked as the command line's would be, and --devices takes 'auto' or a number of devices; the
checks before training: enough batches for every process in every epoch, folders the run can write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from recipe_util import load_recipe


@pytest.fixture(scope="module")
def options():
    return load_recipe("ctr_cvr_options")


def parse_config(options, tmp_path: Path, text: str, *argv: str):
    config = tmp_path / "run.yaml"
    config.write_text(text)
    return options.parse_args(["--config", str(config), *argv])


@pytest.mark.parametrize(("text", "key", "value"), [
    ('esmm: "false"\n', "esmm", "'false'"),  # was esmm=True: a non-empty string is truthy
    ("cross-device: 'false'\nloss: laa\n", "cross-device", "'false'"),  # was True
    ("progress-bar: 'no'\n", "progress-bar", "'no'"),  # was True
    ("no-checkpoint: 'true'\n", "no-checkpoint", "'true'"),
    ("fixed-batches: 1\n", "fixed-batches", "1"),
])
def test_a_config_flag_takes_true_or_false_only(options, tmp_path, capsys, text, key, value):
    with pytest.raises(SystemExit):
        parse_config(options, tmp_path, text)
    assert f"{key} is a flag and takes true or false; got {value}" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "message"), [
    ("checkpoint-dir: null\n", "checkpoint-dir is null; give it a value, or leave the key out"),  # was Path('None')
    ("output-dir: ~\n", "output-dir is null"),  # was Path('None')
    ("lambda: null\nloss: laa\n", "lambda is null"),
    ("batch-size: [1, 2]\n", "batch-size takes one value; got [1, 2]"),  # argparse's error named no key
    ("devices: [0, 1]\n", "devices takes one value; got [0, 1]"),
    ("loss: {a: 1}\n", "loss takes one value; got {'a': 1}"),
    ("data-dir: true\ndata: ali-ccp\n", "data-dir takes one value, not true or false; got True"),  # was Path('True')
    ("batch-size: true\n", "batch-size takes one value, not true or false; got True"),
    ("expert-hidden: []\n", "expert-hidden takes one or more values (a value or a list of them); got []"),
    ("expert-hidden: [8, null]\n", "expert-hidden takes one or more values"),
    ("compile: [default]\n", "compile takes one value; got ['default']"),
])
def test_a_config_value_the_command_line_cannot_give_is_refused_naming_its_key(options, tmp_path, capsys, text, message):
    with pytest.raises(SystemExit):
        parse_config(options, tmp_path, text)
    assert f"run.yaml: {message}" in capsys.readouterr().err


def test_config_values_become_the_options_the_command_line_would_give(options, tmp_path):
    args = parse_config(options, tmp_path, "output-dir: -x\nesmm: false\ncross-device: true\nloss: auc\n")
    assert args.output_dir == Path("-x") and args.checkpoint_dir == Path("-x") / "checkpoints"  # was "expected one argument"
    assert (args.esmm, args.cross_device) == (False, True)
    assert parse_config(options, tmp_path, "no-esmm: true\n").esmm is False  # the --no-X spelling as the key
    assert parse_config(options, tmp_path, "no-esmm: false\n").esmm is True
    assert parse_config(options, tmp_path, "expert-hidden: 8\n").expert_hidden == [8]
    # compile: true is the bare --compile (its const, the default mode); false is no compilation
    assert parse_config(options, tmp_path, "compile: true\n").compile == "default"  # was "invalid choice: 'True'"
    assert parse_config(options, tmp_path, "compile: false\n").compile is None
    assert parse_config(options, tmp_path, "compile: reduce-overhead\n").compile == "reduce-overhead"
    assert parse_config(options, tmp_path, "compile: true\n", "--compile", "max-autotune-no-cudagraphs").compile == \
        "max-autotune-no-cudagraphs"


@pytest.mark.parametrize("value", ["abc", "0,1", "0", "-1", "2.0", ""])
def test_devices_takes_auto_or_a_positive_count(options, capsys, tmp_path, value):
    # a raw ValueError traceback from int() in parse_args, not a usage error
    with pytest.raises(SystemExit):
        options.parse_args(["--devices", value])
    assert f"argument --devices: expected a number of devices >= 1 or 'auto'; got {value!r}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(options, tmp_path, f"devices: '{value}'\n")
    assert f"argument --devices: expected a number of devices >= 1 or 'auto'; got {value!r}" in capsys.readouterr().err


def test_devices_parses_auto_and_counts(options, tmp_path):
    assert options.parse_args([]).devices == 1
    assert options.parse_args(["--devices", "auto"]).devices == "auto"
    assert options.parse_args(["--devices", "3"]).devices == 3
    assert parse_config(options, tmp_path, "devices: 2\n").devices == 2


# --------------------------------------------------------------------------- checks before training


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("ctr_cvr")


def test_an_epoch_that_packs_into_fewer_batches_than_processes_is_refused_before_training(options):
    """The number of batches changes with the epoch's order of the users (next fit of whole users);
    check_batches looked at epoch 0 only, so a run whose third epoch packed into fewer batches than
    processes trained two epochs and then stopped with the sampler's error (drop_last leaves every
    rank none). Every epoch of --epochs is checked now, and the advised --batch-size fits them all."""
    from mlloss.data import GroupBatchSampler, SyntheticConfig, generate_impressions, split_by_time

    world, epochs = 3, 4
    train = split_by_time(generate_impressions(SyntheticConfig(num_users=20, num_items=50, mean_impressions=10)))[0]

    def batches_per_epoch(batch_size: int) -> list[int]:
        sampler = GroupBatchSampler(train.user, batch_size, seed=0)
        counts = []
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            counts.append(len(list(sampler)))
        return counts

    # a batch size whose epoch 0 has a batch per process but a later epoch has not
    batch_size, counts = next((size, counts) for size in range(len(train) // world + 1, len(train))
                              if (counts := batches_per_epoch(size))[0] >= world and min(counts) < world)
    short = next(epoch for epoch, count in enumerate(counts) if count < world)
    args = options.parse_args(["--num-users", "20", "--num-items", "50", "--mean-impressions", "10",
                               "--batch-size", str(batch_size), "--epochs", str(epochs)])
    with pytest.raises(ValueError) as error:
        options.check_batches((train, train, train), args, world)
    message = str(error.value)
    assert message.startswith(f"--batch-size {batch_size} packs the training split's {len(train)} impressions into "
                              f"{counts[short]} batch(es), fewer than the {world} processes (--devices x --num-nodes), "
                              f"in epoch {short + 1} of --epochs {epochs}")
    assert message.endswith(f"give --batch-size {len(train) // world} or less")
    args.epochs = short  # the epochs before the short one pack into enough batches
    options.check_batches((train, train, train), args, world)
    args.batch_size, args.epochs = len(train) // world, 50
    options.check_batches((train, train, train), args, world)
    assert min(batches_per_epoch(args.batch_size)) >= world


def refuse_writes(monkeypatch, folder: Path) -> None:
    """Make ``folder`` read-only (search, no write), also for root, whom permissions do not stop:
    os.access, which the check asks, says no for it."""
    folder.chmod(0o500)
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == folder and mode & os.W_OK
                        else access(path, mode, **kw))


TINY = ["--num-users", "60", "--num-items", "50", "--mean-impressions", "10", "--epochs", "1", "--no-progress-bar"]


@pytest.mark.parametrize("option", ["--checkpoint-dir", "--output-dir"])
@pytest.mark.parametrize("below", [False, True])  # the folder itself, or a new folder in a read-only one
def test_a_folder_the_run_cannot_write_is_refused_before_training(recipe, tmp_path, monkeypatch, option, below):
    """A --checkpoint-dir without write permission failed at the first checkpoint, after a whole
    epoch of training, and an --output-dir at the end of the run, losing every result. Both are
    checked before the data are loaded (a large CSV takes minutes)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    folder = locked / "new" if below else locked
    refuse_writes(monkeypatch, locked)
    monkeypatch.setattr(recipe.CtrCvrModule, "training_step", lambda *a: pytest.fail("trained before the check"))
    monkeypatch.setattr(recipe, "load_data", lambda *a: pytest.fail("loaded the data before the check"))
    other = "--output-dir" if option == "--checkpoint-dir" else "--checkpoint-dir"
    try:
        with pytest.raises(PermissionError) as error:
            recipe.main([*TINY, option, str(folder), other, str(tmp_path / "elsewhere")])
    finally:
        locked.chmod(0o700)
    assert str(error.value).startswith(f"{option} {folder} ")
    where = f"would be created in {locked}, a folder" if below else "is a folder"
    assert f"{where} this process cannot write in" in str(error.value)
    assert not (tmp_path / "elsewhere" / "results.json").exists()


def test_a_read_only_checkpoint_dir_is_fine_without_checkpoints(recipe, tmp_path, monkeypatch):
    """--no-checkpoint writes nothing there: its --checkpoint-dir may be read-only."""
    refuse_writes(monkeypatch, tmp_path)
    resume = load_recipe("ctr_cvr_resume")
    args = recipe.parse_args([*TINY, "--checkpoint-dir", str(tmp_path), "--no-checkpoint"])
    try:
        resume.check_checkpoint_dir(args)
        args.no_checkpoint = False
        with pytest.raises(PermissionError, match=f"--checkpoint-dir {tmp_path} is a folder this process cannot write"):
            resume.check_checkpoint_dir(args)
    finally:
        tmp_path.chmod(0o700)


@pytest.mark.parametrize("model,argv", [
    ("mmoe", ["--num-experts", "3"]),
    ("cgc", ["--num-task-experts", "1", "--num-shared-experts", "3"]),
    ("ple", ["--num-levels", "3", "--num-task-experts", "1", "--num-shared-experts", "3"]),
    ("shared-bottom", []),
])
def test_the_architecture_options_reach_the_model(options, model, argv):
    """build_model gives the tower the options name (not the defaults): the same layers, of the same
    shapes, and the same dropout, as the model built by hand from them."""
    import torch

    from mlloss.models import CGC, PLE, FieldEmbedding, MMoE, MultiTaskModel, SharedBottom

    args = options.parse_args(["--model", model, "--num-users", "40", "--embedding-dim", "4", "--interaction", "none",
                               "--expert-hidden", "12", "6", "--tower-hidden", "5", "--dropout", "0.25", "--esmm",
                               *argv])
    (train, _, _), _ = options.load_data(args)
    built = options.build_model(args, train, 2)
    input_dim = 4 * len(train.cardinalities) + train.dense.shape[1]
    backbone = {
        "mmoe": lambda: MMoE(input_dim, 2, num_experts=3, expert_hidden=(12, 6), tower_hidden=(5,), dropout=0.25),
        "cgc": lambda: CGC(input_dim, 2, num_task_experts=1, num_shared_experts=3, expert_hidden=(12, 6),
                           tower_hidden=(5,), dropout=0.25),
        "ple": lambda: PLE(input_dim, 2, num_levels=3, num_task_experts=1, num_shared_experts=3,
                           expert_hidden=(12, 6), tower_hidden=(5,), dropout=0.25),
        "shared-bottom": lambda: SharedBottom(input_dim, 2, bottom_hidden=(12, 6), tower_hidden=(5,), dropout=0.25),
    }[model]()
    expected = MultiTaskModel(FieldEmbedding(train.cardinalities, 4), backbone, esmm=True)

    def layout(module):
        shapes = {name: tuple(value.shape) for name, value in module.state_dict().items()}
        dropouts = [(name, layer.p) for name, layer in module.named_modules() if isinstance(layer, torch.nn.Dropout)]
        return shapes, dropouts

    assert layout(built) == layout(expected)
    assert built.interaction is None and built.esmm is True


def test_an_id_too_large_for_the_tables_names_its_field(options, tmp_path):
    """Ids are rows of the embedding tables (max id + 1 rows per field): one raw, unencoded id of
    10^15 in an Ali-CCP file stopped the run with the allocator's error, which names no field."""
    import csv
    import shutil

    folder = tmp_path / "ali-ccp"
    shutil.copytree(options.DEFAULT_DATA_DIRS["ali-ccp"], folder)
    train_file = next(folder.glob("*train*.csv"))
    rows = list(csv.reader(train_file.open(newline="")))
    rows[1][rows[0].index("205")] = str(10**15)  # 1.6e16 floats: more than any address space
    with train_file.open("w", newline="") as file:
        csv.writer(file).writerows(rows)
    args = options.parse_args(["--data", "ali-ccp", "--data-dir", str(folder)])
    (train, _, _), _ = options.load_data(args)
    with pytest.raises(MemoryError) as error:
        options.build_model(args, train, 2)
    assert f"the largest is field '205' with ids up to {10**15:,}" in str(error.value)
    assert "label-encode them 0, 1, 2, ... (--data ali-ccp), or lower --embedding-dim" in str(error.value)


def test_cross_device_is_taken_by_every_loss_with_pairs(options, capsys):
    """--cross-device applies to every loss with a ranking term (bce+<name> included); plain bce has no
    pairs to take across the ranks, and a config's cross-device goes with a loss replaced by it."""
    for loss in (*options.PER_TASK_LOSSES, *options.RANKING_SCORE_LOSSES):
        if loss == "bce":
            with pytest.raises(SystemExit):
                options.parse_args(["--loss", loss, "--cross-device"])
            assert "--cross-device applies to a ranking loss" in capsys.readouterr().err
            assert options.parse_args(["--config", "multi-gpu", "--loss", loss]).cross_device is False
        else:
            assert options.parse_args(["--loss", loss, "--cross-device"]).cross_device is True, loss
            assert options.parse_args(["--config", "multi-gpu", "--loss", loss]).cross_device is True, loss


def test_sharding_selects_the_torchrec_tables(options):
    """--sharding shards TorchRec tables (shard_model finds no other): it implies --embedding torchrec."""
    for sharding in options.SHARDINGS:
        args = options.parse_args(["--sharding", sharding])
        assert args.embedding == ("plain" if sharding == "none" else "torchrec"), sharding


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_out_of_range_names_the_option(options, capsys, seed):
    """pl.seed_everything refused it with "-1 is not in bounds, numpy accepts from 0 to 4294967295"."""
    with pytest.raises(SystemExit):
        options.parse_args(["--seed", seed])
    assert f"--seed must be in [0, 2**32 - 1]; got {seed}" in capsys.readouterr().err
    assert options.parse_args(["--seed", str(2**32 - 1)]).seed == 2**32 - 1
