"""Every command the README shows works from a fresh clone (users have no ``../shared``).

``test_readme_commands_run_in_a_fresh_copy`` copies the repository's files (``git ls-files --cached
--others --exclude-standard``: the tracked files and the new ones .gitignore does not hide, so that
it also works before a commit) into a temporary folder, which has no ``../shared`` beside it, and
runs the README's commands there in README order, as a user would, from the copy's root. Each
command is listed in ``COMMANDS`` with how it is covered:

* ``run``: the command runs, with the quick options of its entry appended (later options win in
  argparse): ``--epochs 1`` and a smaller synthetic log (``--num-users 300 --num-items 200
  --mean-impressions 30``, ~9k impressions instead of 195k), and no progress bar. The recipe runs
  in this process (``main`` of the copy's ``recipes/ctr_cvr.py``, loaded by path; ``mlloss`` is
  the installed checkout, the same files), because importing Lightning takes ~10 s a process on
  2 cores; other parts of a command (``echo ... > run.yaml``) run in bash in the copy.
* ``recipe part``: the quickstart's venv and pip install take minutes and the network, and are not
  run (tests/test_install.py checks the install contract, and that .ci/run runs the README's test
  command verbatim); its ``python recipes/ctr_cvr.py`` part runs as above, with this interpreter.
* ``processes``: a command that needs several processes (DDP on gloo) runs the copy's ``main`` on
  ranks forked from this process (``ranks.ForkedRanks``), in the environment torchrun gives its
  processes, so Lightning starts none of its own; tests/test_checkpoints.py runs a 2-process
  command line, whose Lightning starts rank 1 itself.
* ``parse``: the 2-process TorchRec run is tested in tests/test_checkpoints.py (train, checkpoint,
  killed, resume on 2 gloo processes): its options go through the recipe's own parser here. The
  same for the cost table's command with each loss it names.
* ``elsewhere``: inline commands the README shows (benchmarks, installs) are not run here; the entry
  says why and names the test that covers the tool, which must mention it.

The whole test takes ~15 s on 2 cores. ``test_every_readme_command_is_listed``
fails when the README shows a command that ``COMMANDS`` does not list.

The other tests: the shipped data samples (source, licence, the same bytes as ``../shared/data``
where it exists), and ``--resume`` meeting a checkpoint written with another sharding, strategy or
number of processes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch

from mlloss.checkpointing import mark_complete
from ranks import ForkedRanks
from recipe_util import load_recipe, without_timing

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SHARED_DATA = REPO.parent / "shared" / "data"
SAMPLES = {"ali-ccp-sample": 3, "aliexpress-sample": 2}  # folder in recipes/data -> number of CSV files

SMALL = ("--num-users", "300", "--num-items", "200", "--mean-impressions", "30")
QUICK = ("--epochs", "1", *SMALL, "--no-progress-bar")
QUICK_REAL_DATA = ("--epochs", "1", "--no-progress-bar")  # the samples have 100-200 rows
QUICK_RESUME = ("--epochs", "2", *SMALL, "--no-progress-bar")  # one epoch more than the QUICK run it continues


@dataclass(frozen=True)
class Coverage:
    # "run" (the recipe's main in this process), "recipe part", "processes" (its main on ranks forked from
    # this process; a 2-process command line, whose Lightning starts rank 1, runs in tests/test_checkpoints.py),
    # "parse", "elsewhere"
    how: str
    quick: tuple[str, ...] = ()  # appended to the recipe's options
    note: str = ""  # for "elsewhere" and "parse": why, and where it is tested
    test_file: str | None = None  # for "elsewhere": a test file that must mention `mentions`
    mentions: str | None = None


QUICKSTART = ('python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e ".[recipes]" --config-settings '
              'editable_mode=compat && .venv/bin/python recipes/ctr_cvr.py')
TEST_COMMAND = ('python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 fbgemm-gpu-cpu==1.8.0 -e '
                '".[test,torchrec]" --config-settings editable_mode=compat && .venv/bin/pip install -q --no-deps '
                'torchrec==1.8.0 && TRITON_INTERPRET=1 .venv/bin/python -m pytest -q -n 2 --dist loadfile')
NOT_A_BENCHMARK_RUN = "a benchmark that measures for minutes (numbers for the README), not run by the tests"

# Every command the README shows, in README order (```bash blocks, then inline `...` commands).
COMMANDS: dict[str, Coverage] = {
    QUICKSTART: Coverage("recipe part", QUICK),
    TEST_COMMAND: Coverage(
        "elsewhere", note="the CI script .ci/run runs it verbatim on a fresh clone",
        test_file="tests/test_install.py", mentions="def test_ci_runs_the_readme_test_command_verbatim"),
    "python recipes/ctr_cvr.py --loss bce+pdaom --model ple": Coverage("run", QUICK),
    "python recipes/ctr_cvr.py --loss laa": Coverage("run", QUICK),
    "python recipes/ctr_cvr.py --data ali-ccp": Coverage("run", QUICK_REAL_DATA),
    "python recipes/ctr_cvr.py --accelerator cpu --devices 2 --strategy ddp --loss laa --cross-device":
        Coverage("processes", QUICK),
    "python recipes/ctr_cvr.py --accelerator cpu --devices 2 --sharding table_wise": Coverage(
        "parse", QUICK, note="tests/test_checkpoints.py::test_sharded_recipe_on_2_ranks_killed_mid_epoch_and_mid_write_"
        "resumes_to_the_uninterrupted_run runs --accelerator cpu --devices 2 --sharding table_wise (its uninterrupted "
        "run on 2 gloo processes; the killed and resumed runs fork the same 2 ranks)"),
    'echo "loss: laa" > run.yaml && python recipes/ctr_cvr.py --config run.yaml': Coverage("run", QUICK),
    "python recipes/ctr_cvr.py --config run.yaml --epochs 8 --resume last": Coverage("run", QUICK_RESUME),
    "python recipes/ctr_cvr.py --config bce+pdaom --output-dir runs/pdaom": Coverage("run", QUICK),
    # inline commands
    "pip install .": Coverage(
        "elsewhere", note="an install (minutes, network); the core install's contract is tested without the extras",
        test_file="tests/test_install.py", mentions="def test_every_loss_trains_a_plain_pytorch_model_without_the_extras"),
    "python recipes/ctr_cvr.py --loss <name> --no-checkpoint": Coverage(
        "parse", QUICK, note="the command of the cost table: parsed with each --loss of the table; the runs above "
        "train these losses, and tests/test_torchrec.py runs --no-checkpoint"),
    "python benchmarks/recipe_losses.py": Coverage(
        "elsewhere", note=NOT_A_BENCHMARK_RUN + " (the cost table: 8 default recipe runs, ~7 min); its smoke run, two "
        "tiny runs of one loss, is tested", test_file="tests/test_benchmarks_smoke.py", mentions="recipe_losses.py"),
    "python benchmarks/bench_pairwise.py": Coverage(
        "elsewhere", note=NOT_A_BENCHMARK_RUN + "; its --quick smoke mode takes ~50 s on 2 cores, and the losses it "
        "times are tested against a float64 brute force", test_file="tests/test_losses.py", mentions="AUCLoss"),
    "python benchmarks/bench_gpu.py --quick": Coverage(
        "elsewhere", note="needs a CUDA GPU; its CPU smoke mode (--device cpu) is tested",
        test_file="tests/test_benchmarks_smoke.py", mentions="bench_gpu"),
    "python benchmarks/profile_call.py": Coverage(
        "elsewhere", note="its figures need a CUDA GPU; its CPU smoke run (interpreted kernels) is tested",
        test_file="tests/test_benchmarks_smoke.py", mentions="profile_call.py"),
    "python benchmarks/bench_recipe.py --device cuda": Coverage(
        "elsewhere", note="needs a CUDA GPU; the same benchmark's CPU smoke run is tested",
        test_file="tests/test_benchmarks_smoke.py", mentions="bench_recipe.py"),
    "python benchmarks/kernel_sass.py": Coverage(
        "elsewhere", note=NOT_A_BENCHMARK_RUN + "; its loop analysis and real sm_90 compiles are tested",
        test_file="tests/test_kernel_sass.py", mentions="benchmarks/kernel_sass.py"),
    "python benchmarks/cuda_specializations.py": Coverage(
        "elsewhere", note=NOT_A_BENCHMARK_RUN + "; its recording and two real sm_90 compiles are tested",
        test_file="tests/test_cuda_specializations.py", mentions="benchmarks/cuda_specializations.py"),
    "TRITON_INTERPRET=1 python benchmarks/host_path.py": Coverage(
        "elsewhere", note="its op and sync counts are tested, call by call",
        test_file="tests/test_host_path.py", mentions="host_path.count_call"),
    "python benchmarks/host_time.py": Coverage(
        "elsewhere", note="times every loss (numbers for the README), not run by the tests; a run of one loss, "
        "its kernels compiled for sm_90, is tested",
        test_file="tests/test_benchmarks_smoke.py", mentions="host_time.py"),
    "python benchmarks/host_time.py --replay": Coverage(
        "elsewhere", note="times every loss with and without graph replay (numbers for the README), not run by the "
        "tests; a run of one loss with --replay is tested",
        test_file="tests/test_benchmarks_smoke.py", mentions='"--replay"'),
    "TRITON_INTERPRET=1 python benchmarks/host_path.py --memory 1048576": Coverage(
        "elsewhere", note=NOT_A_BENCHMARK_RUN + " (one call at N = 1,048,576 per loss); the counting it shares is tested",
        test_file="tests/test_host_path.py", mentions="host_path"),
}
COST_TABLE_LOSSES = ("bce", "bce+pdaom", "bce+auc", "laa")  # the `--loss` rows of the README's cost table


# --------------------------------------------------------------------------- the README's commands


def _strip_comment(line: str) -> str:
    """``line`` without a shell comment (a ``#`` after white space, outside quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def readme_commands(text: str) -> list[str]:
    """The shell commands of the README's ```bash blocks (one a line, comments dropped), then the
    inline `...` spans outside code blocks that are commands (python, pip, an env assignment)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = " ".join(_strip_comment(line).split())
            if command:
                commands.append(command)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        command = " ".join(span.split())
        if re.match(r"(?:[A-Z_]+=\S+ )*(?:python3?|pip|\.venv/bin/\S+) ", command) and command not in commands:
            commands.append(command)
    return commands


def test_every_readme_command_is_listed():
    shown = readme_commands(README.read_text())
    unlisted = [command for command in shown if command not in COMMANDS]
    assert not unlisted, (f"README commands without an entry in COMMANDS of {Path(__file__).name} (say how each is "
                          f"covered): {unlisted}")
    stale = [command for command in COMMANDS if command not in shown]
    assert not stale, f"COMMANDS lists commands the README no longer shows: {stale}"
    for command, coverage in COMMANDS.items():
        assert coverage.how in ("run", "recipe part", "processes", "parse", "elsewhere"), command
        if coverage.how == "elsewhere":
            assert coverage.note and coverage.test_file and coverage.mentions, command
            assert coverage.mentions in (REPO / coverage.test_file).read_text(), (command, coverage.test_file)


# --------------------------------------------------------------------------- running them


def fresh_copy(destination: Path) -> Path:
    """The repository's tracked and not-ignored files, copied to ``destination/mlloss``."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    root = destination / "mlloss"
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    return root


RECIPE_SIBLINGS = ("ctr_cvr_options", "ctr_cvr_report", "ctr_cvr_resume", "_common")  # modules the recipe imports from its folder


def _load_recipe_from(root: Path) -> ModuleType:
    """The copy's recipe with the copy's sibling modules: the checkout's, imported by earlier tests,
    are dropped from sys.modules first (and the copy's afterwards, so later tests import theirs)."""
    for name in RECIPE_SIBLINGS:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(root / "recipes"))
    try:
        spec = importlib.util.spec_from_file_location("ctr_cvr_fresh_copy", root / "recipes" / "ctr_cvr.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(root / "recipes"))
        for name in RECIPE_SIBLINGS:
            sys.modules.pop(name, None)
    return module


def _recipe_argv(part: str) -> list[str] | None:
    """The options of ``part`` when it runs ``recipes/ctr_cvr.py`` with some Python, else None."""
    argv = shlex.split(part)
    if len(argv) >= 2 and Path(argv[0]).name in ("python", "python3") and argv[1] == "recipes/ctr_cvr.py":
        return argv[2:]
    return None


def run_command(command: str, coverage: Coverage, root: Path, recipe: ModuleType) -> dict | None:
    """Run ``command`` in ``root`` as ``coverage`` says; the recipe's report when it ran it."""
    report = None
    for part in command.split(" && "):
        argv = _recipe_argv(part)
        if argv is None:
            if coverage.how == "run":
                subprocess.run(["bash", "-c", part], cwd=root, check=True, timeout=60)
            continue  # "recipe part": the venv and pip install parts are not run
        argv = [*argv, *coverage.quick]
        if coverage.how == "processes":  # every rank forked from this process, in torchrun's environment
            world_size = int(argv[argv.index("--devices") + 1])
            ForkedRanks(lambda rank: recipe.main(argv), log=root / "ranks.log", world_size=world_size).join()
            report = json.loads((root / "runs" / "ctr_cvr" / "results.json").read_text())
        else:
            report = recipe.main(argv)
    return report


@pytest.mark.distributed
@pytest.mark.slow
def test_readme_commands_run_in_a_fresh_copy(tmp_path, monkeypatch):
    root = fresh_copy(tmp_path)
    assert not (root.parent / "shared").exists()
    monkeypatch.chdir(root)
    recipe = _load_recipe_from(root)
    shown = readme_commands(README.read_text())
    reports = {}
    for command in shown:
        coverage = COMMANDS[command]
        if coverage.how in ("run", "recipe part", "processes"):
            reports[command] = run_command(command, coverage, root, recipe)
            if coverage.how == "processes":  # its checkpoint records the 2 processes that wrote it
                last = torch.load(root / "runs" / "ctr_cvr" / "checkpoints" / "last.ckpt", weights_only=False)
                assert last["ctr_cvr"]["written_with"]["world_size"] == 2, command
        elif coverage.how == "parse":
            argv = _recipe_argv(command)
            names = COST_TABLE_LOSSES if "<name>" in command else (None,)
            for name in names:
                options = [name if token == "<name>" else token for token in argv]
                args = recipe.parse_args([*options, *coverage.quick])
                if name is not None:
                    assert args.loss == name and args.no_checkpoint
                else:
                    assert (args.accelerator, args.devices, args.sharding, args.embedding) == \
                        ("cpu", 2, "table_wise", "torchrec")

    def report(fragment: str) -> dict:
        return next(reports[c] for c in reports if fragment in c)

    quickstart = report(".venv/bin/python recipes/ctr_cvr.py")
    assert quickstart["config"]["loss"] == "bce" and quickstart["data"]["source"] == "synthetic"
    assert (report("--model ple")["config"]["model"], report("--model ple")["config"]["loss"]) == ("ple", "bce+pdaom")
    assert "model:rank/auc/click" in report("--loss laa")["results"]["test"]
    ali_ccp = report("--data ali-ccp")
    assert Path(ali_ccp["data"]["directory"]) == root / "recipes" / "data" / "ali-ccp-sample"
    assert ali_ccp["data"]["sizes"] == {"train": 100, "val": 50, "test": 50}
    ddp = report("--strategy ddp")
    assert (ddp["config"]["devices"], ddp["config"]["cross_device"], len(ddp["history"])) == (2, True, 1)
    configured, resumed = report("--config run.yaml"), report("--resume last")
    assert configured["config"]["loss"] == "laa" and resumed["config"]["loss"] == "laa"
    assert len(resumed["history"]) == 2, "the resumed run continues the configured one for one more epoch"
    assert without_timing(resumed["history"])[0] == without_timing(configured["history"])[0]


# --------------------------------------------------------------------------- the data samples


@pytest.mark.parametrize(("folder", "files"), list(SAMPLES.items()))
def test_data_samples_are_small_with_their_source_and_licence(folder, files):
    directory = REPO / "recipes" / "data" / folder
    csvs = sorted(directory.glob("*.csv"))
    assert len(csvs) == files
    assert sum(path.stat().st_size for path in csvs) < 100_000, "keep the repository light"
    assert "MIT License" in (directory / "LICENSE").read_text()
    readme = (directory / "README.md").read_text()
    assert "github.com/datawhalechina/torch-rechub" in readme and "MIT" in readme
    for path in csvs:
        assert path.name in readme and hashlib.sha256(path.read_bytes()).hexdigest() in readme, path.name
    if SHARED_DATA.is_dir():  # the copies in the repository are the shared files, byte for byte
        for path in csvs:
            assert path.read_bytes() == (SHARED_DATA / folder / path.name).read_bytes(), path.name


# --------------------------------------------------------------------------- --resume and other options


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("ctr_cvr")


def _write_sharded_checkpoint(checkpoint: Path, written_with: dict | None) -> None:
    """A stand-in for TorchRecStrategy's checkpoint directory: only what ``--resume`` reads first, and
    the completion marker that ``--resume last`` requires (not before the recipe recorded its layout)."""
    checkpoint.mkdir(parents=True)
    entry = {"history": []} if written_with is None else {"history": [], "written_with": written_with}
    torch.save({"ctr_cvr": entry, "epoch": 0}, checkpoint / "meta.pt")
    if written_with is not None:
        mark_complete(checkpoint)


SHARDED_ON_2 = {"sharding": "table_wise", "strategy": "TorchRecStrategy", "world_size": 2,
                "options": {"--sharding": "table_wise", "--strategy": "auto", "--devices": 2, "--num-nodes": 1}}


def test_resume_names_the_options_when_the_checkpoint_was_written_with_others(recipe, tmp_path):
    """Before loading: a sharded directory met by a run without --sharding (was a raw
    IsADirectoryError), and a file written by 2 processes met by 1; a new run replaces the
    sharded directory by its file."""
    run = [*QUICK, "--batch-size", "512"]
    recipe.main([*run, "--output-dir", str(tmp_path / "plain")])
    last = tmp_path / "plain" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=False)
    assert checkpoint["ctr_cvr"]["written_with"] == {
        "sharding": "none", "strategy": "SingleDeviceStrategy", "world_size": 1,
        "options": {"--sharding": "none", "--strategy": "auto", "--devices": 1, "--num-nodes": 1}}

    checkpoint["ctr_cvr"]["written_with"] = {**SHARDED_ON_2, "sharding": "none", "strategy": "DDPStrategy",
                                             "options": {**SHARDED_ON_2["options"], "--sharding": "none",
                                                         "--strategy": "ddp"}}
    torch.save(checkpoint, last)
    with pytest.raises(ValueError) as error:
        recipe.main([*run, "--epochs", "2", "--output-dir", str(tmp_path / "plain"), "--resume", "last"])
    message = str(error.value)
    assert message.startswith(f"--resume last: the checkpoint {last} was written with --sharding none on 2 processes "
                              "(--strategy ddp: DDPStrategy); this run has --sharding none on 1 process")
    assert "the number of processes (--devices x --num-nodes) differs" in message
    assert "resume with --sharding none --strategy ddp --devices 2 --num-nodes 1" in message

    sharded = tmp_path / "sharded" / "checkpoints" / "last.ckpt"
    _write_sharded_checkpoint(sharded, SHARDED_ON_2)
    with pytest.raises(ValueError, match=r"--sharding and the number of processes \(--devices x --num-nodes\) differ") \
            as error:
        recipe.main([*run, "--output-dir", str(tmp_path / "sharded"), "--resume", "last"])
    assert "was written with --sharding table_wise on 2 processes (--strategy auto: TorchRecStrategy); this run has " \
           "--sharding none on 1 process (--strategy auto: SingleDeviceStrategy)" in str(error.value)
    assert "or start a new run with another --output-dir" in str(error.value)

    recipe.main([*run, "--output-dir", str(tmp_path / "sharded")])  # a new run in the same folder
    assert sharded.is_file() and torch.load(sharded, weights_only=False)["ctr_cvr"]["written_with"]["world_size"] == 1


def test_resume_checks_checkpoints_that_predate_the_record(recipe, tmp_path):
    """Named by its path: --resume last takes only a directory with the completion marker."""
    last = tmp_path / "checkpoints" / "last.ckpt"
    run = [*QUICK, "--batch-size", "512", "--output-dir", str(tmp_path), "--resume", str(last)]
    _write_sharded_checkpoint(last, written_with=None)
    with pytest.raises(FileNotFoundError, match=f"no checkpoint at {re.escape(str(last))} that is complete \\(skipped "
                                                f"{re.escape(str(last))}: a directory without the completion marker"):
        recipe.main([*run[:-1], "last"])
    with pytest.raises(ValueError, match=r"written with some --sharding \(a checkpoint directory that predates"):
        recipe.main(run)
    shutil.rmtree(last)
    last.mkdir()
    with pytest.raises(FileNotFoundError, match="is a directory without meta.pt"):
        recipe.main(run)


def test_a_sharded_run_refuses_a_checkpoint_file(recipe, tmp_path):
    """The other direction, checked in this process before any rank starts."""
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed")
    recipe.main([*QUICK, "--batch-size", "512", "--output-dir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"written with --sharding none on 1 process .*; this run has --sharding "
                                         r"table_wise on 2 processes"):
        recipe.main([*QUICK, "--output-dir", str(tmp_path), "--resume", "last", "--accelerator", "cpu",
                     "--devices", "2", "--sharding", "table_wise"])
