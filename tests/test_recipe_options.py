"""Tests of the CTR/CVR recipe's options (recipes/ctr_cvr_options.py): a config file's values are
checked as the command line's would be, and --devices takes 'auto' or a number of devices."""

from __future__ import annotations

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
