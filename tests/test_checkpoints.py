"""Crash-safe checkpoints (mlloss.checkpointing, docs/checkpoints.md).

Unit tests: a writer killed (SIGKILL, in a forked process) in the middle of a file or a directory
never shadows the previous complete checkpoint; two writers of one file each publish only their
own whole file; a directory without its completion marker is skipped by ``--resume last`` with a
message; every state a crash can leave in the middle of a directory swap resolves to the newest
complete checkpoint; a checkpoint never replaces a folder that is not one; failed writes leave
nothing behind; errors name the path or the argument. The recipe's ``--resume`` refuses, before
loading, a checkpoint trained with other options or more epochs, and names a file that is not a
checkpoint of the recipe; its checkpoints keep the CUDA generators.

Fault tests: recipes/ctr_cvr.py's main runs in processes forked from the test's (one a rank; a
SIGKILL to each kills every rank at once, as a lost machine would) and is killed twice, in the
middle of epoch 2 (``MLLOSS_TEST_BATCH_PAUSE``) and, once resumed, while a checkpoint is being
written (``MLLOSS_TEST_CHECKPOINT_PAUSE``: the test waits for the temporary name to appear); it is
resumed with ``--resume last`` after each kill, and the final run's results.json (history and
results) and checkpoint (weights, optimizer states, loops, RNG state) must be bit-identical to an
uninterrupted run's. Once in one process (Lightning ``.ckpt`` files), once on 2 gloo ranks with
table-wise sharded tables (TorchRec DCP directories).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mlloss import checkpointing
from mlloss.checkpointing import (
    BATCH_PAUSE_ENV,
    CHECKPOINT_PAUSE_ENV,
    MARKER_FILENAME,
    atomic_directory,
    begin_directory,
    finish_interrupted_publish,
    incomplete_reason,
    latest_complete_checkpoint,
    mark_complete,
    retired_path,
    save_atomically,
    staging_path,
    write_atomically,
)
from mlloss.integrations import lightning_checkpoints
from mlloss.integrations.lightning_checkpoints import AtomicCheckpointIO, fault_test_callbacks
from ranks import ForkedRanks
from recipe_util import RECIPES, load_recipe, without_timing

resume = load_recipe("ctr_cvr_resume")  # the recipe's --resume (recipes/ctr_cvr_resume.py)

RECIPE = RECIPES / "ctr_cvr.py"
SMALL = ("--num-users", "300", "--num-items", "200", "--mean-impressions", "30", "--epochs", "3", "--no-progress-bar")
SHARDED = ("--batch-size", "512", "--loss", "balanced-loa", "--accelerator", "cpu", "--devices", "2",
           "--sharding", "table_wise", "--dropout", "0.2")  # dropout and the LoA counts: each rank's own must come back


# --------------------------------------------------------------------------- the building blocks


@pytest.fixture
def fork(tmp_path_factory):
    """``fork(target, *args)``: ``target(0, *args)`` in one process forked from this one
    (``ranks.ForkedRanks``), its output logged in a folder of its own (the tests list ``tmp_path``)."""
    def start(target, *args) -> ForkedRanks:
        return ForkedRanks(target, args, log=tmp_path_factory.mktemp("writer") / "output.log", world_size=1)

    return start


def _write_slowly(_rank: int, path: str) -> None:
    def write(stream):
        stream.write(b"\0" * 4096)
        stream.flush()
        Path(path + ".started").touch()
        time.sleep(60)  # killed here

    write_atomically(path, write)


def _write_directory_slowly(_rank: int, path: str, mark: bool) -> None:
    if mark:  # the files and the marker are written, then the hook pauses before the swap
        os.environ[CHECKPOINT_PAUSE_ENV] = "60"
    with atomic_directory(path) as tmp:
        torch.save({"version": 2}, tmp / "meta.pt")
        (tmp / "shard0").write_bytes(b"\1" * 100)
        if not mark:
            Path(path + ".started").touch()
            time.sleep(60)  # killed here, before the marker


def _temporary_files(final: Path) -> list[Path]:
    """The temporary files of writes of ``final``: ``.partial/<name>.<random>.tmp``, one per write."""
    return sorted(staging_path(final).parent.glob(f"{final.name}.*.tmp"))


def test_a_file_killed_mid_write_never_shadows_the_previous_one(tmp_path, fork):
    final = tmp_path / "last.ckpt"
    save_atomically({"version": 1}, final)
    assert not staging_path(final).parent.exists(), "nothing left behind"
    fork(_write_slowly, str(final)).kill_when(lambda: Path(str(final) + ".started").exists(), timeout=60)
    [temporary] = _temporary_files(final)
    assert temporary.stat().st_size == 4096, "the killed write is under its temporary name"
    assert torch.load(final, weights_only=False) == {"version": 1}
    skipped = []
    assert latest_complete_checkpoint(tmp_path, report=skipped.append) == final
    assert skipped == [f"skipped {temporary}: a checkpoint file whose write did not finish (it is renamed "
                       f"to {final} when it is complete)"]
    save_atomically({"version": 3}, final)  # the next write removes the leftover
    assert torch.load(final, weights_only=False) == {"version": 3} and not staging_path(final).parent.exists()


def _write_in_two_parts(_rank: int, path: str, blob: bytes) -> None:
    """Write half of ``blob``, signal, wait for ``<path>.go``, then the rest (or be killed meanwhile)."""
    def write(stream):
        stream.write(blob[: len(blob) // 2])
        stream.flush()
        Path(path + ".half").touch()
        deadline = time.monotonic() + 60
        while not Path(path + ".go").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        stream.write(blob[len(blob) // 2:])

    write_atomically(path, write)


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_concurrent_writers_of_one_checkpoint_each_publish_only_their_own_whole_file(tmp_path, fork):
    """Each write has a temporary file of its own: a second writer neither removes nor publishes
    the first one's half-written file (it did both with one fixed temporary name), the first one
    then publishes its own whole file, and a killed writer's file is skipped and removed by the
    next write."""
    final = tmp_path / "last.ckpt"
    save_atomically({"by": "first"}, final)
    blob = _saved({"by": "slow", "weights": torch.arange(10_000)})
    slow = fork(_write_in_two_parts, str(final), blob)
    slow.wait_until(lambda: Path(str(final) + ".half").exists(), timeout=60)  # its first half written
    save_atomically({"by": "fast"}, final)  # while the slow writer holds its half-written file
    assert torch.load(final, weights_only=False) == {"by": "fast"}
    assert [path.stat().st_size for path in _temporary_files(final)] == [len(blob) // 2], "the slow one's, untouched"
    Path(str(final) + ".go").touch()
    slow.join(60)
    assert final.read_bytes() == blob and not staging_path(final).parent.exists()

    fork(_write_slowly, str(final)).kill_when(lambda: Path(str(final) + ".started").exists(), timeout=60)
    skipped = []
    assert latest_complete_checkpoint(tmp_path, report=skipped.append) == final
    assert skipped == [f"skipped {_temporary_files(final)[0]}: a checkpoint file whose write did not finish (it is "
                       f"renamed to {final} when it is complete)"]
    save_atomically({"by": "next"}, final)
    assert torch.load(final, weights_only=False) == {"by": "next"} and not staging_path(final).parent.exists()


def test_a_temporary_file_removed_before_its_writer_locked_it_is_not_the_one_written(tmp_path, monkeypatch):
    """Another writer's clearing removes the temporary files no writer holds locked: a new one
    taken between its creation and its lock is written, then cannot be renamed (it is gone)."""
    final = tmp_path / "last.ckpt"
    real_lock, removed = checkpointing._lock, []

    def lock(stream, *, blocking):
        if blocking and not removed:  # the first new file: another writer's clearing takes it first
            [temporary] = _temporary_files(final)
            temporary.unlink()
            removed.append(temporary)
        real_lock(stream, blocking=blocking)

    monkeypatch.setattr(checkpointing, "_lock", lock)
    save_atomically({"version": 1}, final)
    assert removed and torch.load(final, weights_only=False) == {"version": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_temporary_files_of_earlier_versions_are_skipped_and_cleared(tmp_path):
    """Before the hex names, tempfile.mkstemp named the temporary file (letters, digits, underscores)."""
    final = tmp_path / "last.ckpt"
    save_atomically({"version": 1}, final)
    legacy = staging_path(final).parent / "last.ckpt.k3_zqw8x.tmp"
    legacy.parent.mkdir()
    legacy.write_bytes(b"\0" * 10)
    skipped = []
    assert latest_complete_checkpoint(tmp_path, report=skipped.append) == final
    assert skipped == [(f"skipped {legacy}: a checkpoint file whose write did not finish (it is renamed to {final} "
                        "when it is complete)")]
    save_atomically({"version": 2}, final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_the_checkpoint_pause_counts_every_write_of_the_process_and_pauses_at_the_nth(tmp_path, monkeypatch, capsys):
    """MLLOSS_TEST_CHECKPOINT_PAUSE=<seconds>@<n>: files and directories count alike, from 1."""
    monkeypatch.setattr(checkpointing, "_writes_in_this_process", 0)
    monkeypatch.setenv(CHECKPOINT_PAUSE_ENV, "0@2")
    save_atomically({"version": 1}, tmp_path / "a.ckpt")
    with atomic_directory(tmp_path / "b.ckpt") as tmp:
        torch.save({"version": 2}, tmp / "meta.pt")
    save_atomically({"version": 3}, tmp_path / "a.ckpt")
    paused = [line for line in capsys.readouterr().err.splitlines() if line.startswith(CHECKPOINT_PAUSE_ENV)]
    assert paused == [(f"{CHECKPOINT_PAUSE_ENV}: {staging_path(tmp_path / 'b.ckpt')} is written; pausing 0 s before "
                       "making it visible (write 2 of this process)")]


@pytest.mark.parametrize("spec", ["5@", "5@0", "5@-1", "-1", "x@2", "nan"])
def test_a_checkpoint_pause_that_would_pause_at_every_write_or_at_none_is_refused(tmp_path, monkeypatch, spec):
    monkeypatch.setenv(CHECKPOINT_PAUSE_ENV, spec)
    with pytest.raises(ValueError, match=re.escape(f"{CHECKPOINT_PAUSE_ENV} must be <seconds> or <seconds>@<n> "
                                                   f"(seconds >= 0, writes counted from n = 1); got {spec!r}")):
        save_atomically({"version": 1}, tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()


def test_the_batch_pause_pauses_once_after_the_first_step_that_reaches_its_batch(monkeypatch, capsys):
    """MLLOSS_TEST_BATCH_PAUSE=<seconds>@<epoch>:<batch>; a step over batches 2 and 3 reports 3."""
    monkeypatch.setenv(BATCH_PAUSE_ENV, "0@1:2")
    [pause] = fault_test_callbacks()
    slept = []
    monkeypatch.setattr(lightning_checkpoints.time, "sleep", slept.append)
    trainer = SimpleNamespace(current_epoch=0, global_step=0, global_rank=0)
    for epoch, batches in ((0, (0, 1, 2, 3)), (1, (0, 1, 3, 4)), (2, (0, 1, 2))):
        trainer.current_epoch = epoch
        for batch_idx in batches:
            pause.on_train_batch_end(trainer, None, None, None, batch_idx)
            trainer.global_step += 1
    assert slept == [0.0]
    assert capsys.readouterr().err == f"{BATCH_PAUSE_ENV}: pausing 0 s after batch 3 of epoch 1 (global step 6, rank 0)\n"


def test_a_checkpoint_never_replaces_a_directory_that_is_not_one(tmp_path):
    """save_atomically(obj, folder) moved the folder aside and removed it with all its files."""
    runs = tmp_path / "runs"
    (runs / "experiment-1").mkdir(parents=True)
    (runs / "experiment-1" / "results.json").write_text("{}")
    for save in (lambda: save_atomically({"w": 1}, runs), lambda: AtomicCheckpointIO().save_checkpoint({"w": 1}, runs)):
        with pytest.raises(IsADirectoryError, match=re.escape(f"{runs} is a directory that is not a checkpoint")):
            save()
    with pytest.raises(IsADirectoryError, match=re.escape(str(runs))):
        with atomic_directory(runs) as tmp:
            (tmp / "shard").write_bytes(b"x")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "runs", "runs/experiment-1", "runs/experiment-1/results.json"], "untouched, nothing left behind"

    for marker in (MARKER_FILENAME, "meta.pt"):  # a checkpoint directory (meta.pt: before the marker existed)
        checkpoint = tmp_path / f"with-{marker}"
        checkpoint.mkdir()
        (checkpoint / "shard").write_bytes(b"x")
        (checkpoint / marker).touch()
        save_atomically({"version": 2}, checkpoint)
        assert torch.load(checkpoint, weights_only=False) == {"version": 2}


def test_atomic_checkpoint_io_takes_file_urls_and_refuses_remote_ones(tmp_path, monkeypatch):
    """A file:// URL was written as the relative path ./file:/..., which loading did not find."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "checkpoints" / "last.ckpt"
    io_plugin = AtomicCheckpointIO()
    io_plugin.save_checkpoint({"epoch": 1}, f"file://{target}")
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()] == [Path("checkpoints/last.ckpt")]
    assert io_plugin.load_checkpoint(f"file://{target}") == {"epoch": 1}
    io_plugin.remove_checkpoint(f"file://{target}")
    assert not target.exists()
    for method, call in (("save_checkpoint", lambda url: io_plugin.save_checkpoint({}, url)),
                         ("remove_checkpoint", io_plugin.remove_checkpoint)):
        with pytest.raises(ValueError, match=re.escape(f"AtomicCheckpointIO.{method}: path 's3://bucket/last.ckpt' "
                                                       "is a URL of a remote file system")):
            call("s3://bucket/last.ckpt")


def test_latest_complete_checkpoint_refuses_a_file_and_takes_a_missing_folder_for_a_first_run(tmp_path):
    save_atomically({"epoch": 7}, tmp_path / "last.ckpt")
    with pytest.raises(NotADirectoryError, match=re.escape(f"directory '{tmp_path / 'last.ckpt'}' is a file")):
        latest_complete_checkpoint(tmp_path / "last.ckpt", report=pytest.fail)
    assert latest_complete_checkpoint(tmp_path / "missing", report=pytest.fail) is None
    # name is the checkpoints' file name: '' made the folder itself a candidate, None a pathlib error
    for name in ("", ".", "sub/last.ckpt", None):
        with pytest.raises(ValueError, match=re.escape(f"name must be the file name of the checkpoints in directory "
                                                       f"(such as 'last.ckpt'; a folder goes in directory); got name={name!r}")):
            latest_complete_checkpoint(tmp_path, name=name, report=pytest.fail)


def test_failed_writes_leave_nothing_behind_and_name_the_argument(tmp_path):
    def fail(stream):
        raise RuntimeError("the write fails")

    with pytest.raises(RuntimeError, match="the write fails"):
        write_atomically(tmp_path / "a.ckpt", fail)
    with pytest.raises(RuntimeError, match="the body fails"):
        with atomic_directory(tmp_path / "b.ckpt") as tmp:
            (tmp / "shard").write_bytes(b"x")
            raise RuntimeError("the body fails")
    info_error = re.escape(f"info path={tmp_path!r} for the completion marker of {tmp_path / 'c.ckpt'} is not JSON")
    with pytest.raises(TypeError, match=info_error):
        with atomic_directory(tmp_path / "c.ckpt", path=tmp_path) as tmp:
            (tmp / "shard").write_bytes(b"x")
    assert list(tmp_path.iterdir()) == [], "no temporary file or directory left"

    (tmp_path / "d").mkdir()
    with pytest.raises(TypeError, match=re.escape(f"info epoch={{1}} for the completion marker of {tmp_path / 'd'}")):
        mark_complete(tmp_path / "d", epoch={1})
    assert list((tmp_path / "d").iterdir()) == [], f"no {MARKER_FILENAME}.tmp left"


def test_a_checkpoint_directory_with_files_in_subfolders_is_complete(tmp_path):
    final = tmp_path / "last.ckpt"
    with atomic_directory(final) as tmp:
        torch.save({"version": 1}, tmp / "meta.pt")
        (tmp / "shards").mkdir()
        (tmp / "shards" / "rank0").write_bytes(b"\1" * 10)
    files = json.loads((final / MARKER_FILENAME).read_text())["files"]
    assert files == {"meta.pt": (final / "meta.pt").stat().st_size, "shards/rank0": 10}
    assert latest_complete_checkpoint(tmp_path, report=pytest.fail) == final
    (final / "shards" / "rank0").unlink()
    assert incomplete_reason(final) == "its completion marker lists shards/rank0, which is missing"


def test_a_directory_killed_before_its_marker_is_skipped_with_a_message(tmp_path, fork, capsys):
    final = tmp_path / "last.ckpt"
    with atomic_directory(final, epoch=0) as tmp:
        torch.save({"version": 1}, tmp / "meta.pt")
    assert json.loads((final / MARKER_FILENAME).read_text())["files"] == {"meta.pt": (final / "meta.pt").stat().st_size}
    fork(_write_directory_slowly, str(final), False).kill_when(lambda: Path(str(final) + ".started").exists(), timeout=60)
    staging = staging_path(final)
    assert (staging / "meta.pt").is_file() and not (staging / MARKER_FILENAME).exists()
    assert torch.load(final / "meta.pt", weights_only=False) == {"version": 1}, "the previous one is untouched"

    args = argparse.Namespace(resume="last", checkpoint_dir=tmp_path, no_checkpoint=False)
    assert resume.resume_path(args) == final
    printed = capsys.readouterr().out
    assert f"--resume last: skipped {staging}: a directory without the completion marker COMPLETE" in printed

    (final / MARKER_FILENAME).unlink()  # neither is complete now: the error names both and why
    with pytest.raises(FileNotFoundError) as error:
        resume.resume_path(args)
    message = str(error.value)
    assert message.startswith(f"--resume last: no checkpoint at {final} that is complete (skipped {staging}: ")
    assert f"skipped {final}: a directory without the completion marker COMPLETE" in message


def test_a_directory_killed_after_its_marker_is_the_newest_complete_one(tmp_path, fork):
    final = tmp_path / "last.ckpt"
    with atomic_directory(final) as tmp:
        torch.save({"version": 1}, tmp / "meta.pt")
    fork(_write_directory_slowly, str(final), True).kill_when(lambda: (staging_path(final) / MARKER_FILENAME).exists(),
                                                              timeout=60)
    skipped = []
    assert latest_complete_checkpoint(tmp_path, report=skipped.append) == staging_path(final) and not skipped
    assert finish_interrupted_publish(staging_path(final), report=skipped.append) == final
    assert torch.load(final / "meta.pt", weights_only=False) == {"version": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"], "no temporary or retired copy left"
    assert skipped == [f"finished the interrupted write of {final} (moved {staging_path(final)} there)"]


def _directory(path: Path, version: int, complete: bool = True) -> None:
    path.mkdir(parents=True)
    torch.save({"version": version}, path / "meta.pt")
    if complete:
        mark_complete(path)


def test_a_directory_write_removes_the_temporary_file_a_killed_file_write_left(tmp_path, fork):
    """begin_directory removed only a staging directory: the killed file write's temporary file (a
    whole checkpoint's bytes) stayed for good, and every --resume last reported it as unfinished."""
    final = tmp_path / "last.ckpt"
    save_atomically({"version": 1}, final)
    fork(_write_slowly, str(final)).kill_when(lambda: Path(str(final) + ".started").exists(), timeout=60)
    Path(str(final) + ".started").unlink()
    assert len(_temporary_files(final)) == 1
    with atomic_directory(final) as tmp:
        torch.save({"version": 2}, tmp / "meta.pt")
    assert latest_complete_checkpoint(tmp_path, report=pytest.fail) == final
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "last.ckpt", "last.ckpt/COMPLETE", "last.ckpt/meta.pt"], "no temporary file, no empty .partial/"


def _fail(stream) -> None:
    raise RuntimeError("the write fails")


def _write_directory_killed_midway(final: Path) -> None:
    """What a directory write killed in the middle of its files leaves: begun, never finished."""
    staging = begin_directory(final)
    torch.save({"version": 3}, staging / "meta.pt")


def _write_file_failing(final: Path) -> None:
    with pytest.raises(RuntimeError, match="the write fails"):
        write_atomically(final, _fail)


@pytest.mark.parametrize("next_write", [_write_directory_killed_midway, _write_file_failing], ids=["directory", "file"])
def test_a_complete_staging_copy_stays_the_newest_checkpoint_until_the_next_write_is_complete(
        tmp_path, capsys, next_write):
    """begin_directory (and write_atomically) removed a complete .partial/<name>, the newest complete
    checkpoint (its writer was killed after the marker, before the swap), when the next write
    began: a crash of that write then resumed from the older <name>. It is made visible first."""
    final = tmp_path / "last.ckpt"
    _directory(final, 1)
    _directory(staging_path(final), 2)
    next_write(final)
    found = latest_complete_checkpoint(tmp_path, report=lambda message: None)
    assert found == final and torch.load(final / "meta.pt", weights_only=False) == {"version": 2}
    assert not retired_path(final).parent.exists(), "the previous one removed once the swap was done"
    assert f"finished the interrupted write of {final} (moved {staging_path(final)} there)" in capsys.readouterr().out


@pytest.mark.parametrize(("next_write", "versions"), [(_write_directory_killed_midway, [1, 3]), (_write_file_failing, [1])],
                         ids=["directory", "file"])
def test_an_incomplete_staging_copy_is_cleared_by_the_next_write_never_made_visible(tmp_path, next_write, versions):
    final = tmp_path / "last.ckpt"
    _directory(final, 1)
    _directory(staging_path(final), 2, complete=False)  # killed before its marker
    next_write(final)
    assert latest_complete_checkpoint(tmp_path, report=lambda message: None) == final
    assert torch.load(final / "meta.pt", weights_only=False) == {"version": 1}
    assert sorted(torch.load(meta, weights_only=False)["version"] for meta in tmp_path.rglob("meta.pt")) == versions


def test_a_checkpoint_folder_named_like_a_temporary_or_retired_folder_is_refused(tmp_path):
    """A checkpoint file in a folder named .partial was skipped as an unfinished write, and one in a
    folder named .old was moved out of its folder by finish_interrupted_publish, as a retired copy."""
    for name in (".partial", ".old"):
        final = tmp_path / name / "last.ckpt"
        refused = re.escape(f"the checkpoint folder {final.parent} is named {name}, which mlloss.checkpointing keeps "
                            f"for the {'temporary' if name == '.partial' else 'retired'} copies of the checkpoints "
                            f"in {tmp_path}")
        with pytest.raises(ValueError, match=refused):
            save_atomically({"version": 1}, final)
        with pytest.raises(ValueError, match=refused), atomic_directory(final) as tmp:
            torch.save({"version": 1}, tmp / "meta.pt")
        with pytest.raises(ValueError, match=refused):
            latest_complete_checkpoint(final.parent, report=pytest.fail)
        named = re.escape(f"the checkpoint name {name} is the name mlloss.checkpointing keeps for the folder of the "
                          f"temporary and retired copies of the checkpoints in {tmp_path}")  # was an IsADirectoryError
        with pytest.raises(ValueError, match=named):
            save_atomically({"version": 1}, tmp_path / name)
        with pytest.raises(ValueError, match=named), atomic_directory(tmp_path / name) as tmp:
            torch.save({"version": 1}, tmp / "meta.pt")
    assert list(tmp_path.iterdir()) == [], "nothing written"


@pytest.mark.parametrize(("state", "newest"), [
    ({"final": 1}, "final"),
    ({"final": 1, "staging": 2}, "staging"),  # killed after the marker, before the swap
    ({"retired": 1, "staging": 2}, "staging"),  # killed between the two renames
    ({"final": 2, "retired": 1}, "final"),  # killed before the previous one was removed
    ({"retired": 1}, "retired"),  # a file replaced a directory and was killed between the renames
    ({"final": 1, "staging": -2}, "final"),  # killed before the marker (negative: incomplete)
    ({"retired": 1, "staging": -2}, "retired"),
])
def test_every_state_a_crash_leaves_resolves_to_the_newest_complete_checkpoint(tmp_path, state, newest):
    final = tmp_path / "last.ckpt"
    paths = {"final": final, "staging": staging_path(final), "retired": retired_path(final)}
    for name, version in state.items():
        _directory(paths[name], abs(version), complete=version > 0)
    found = latest_complete_checkpoint(tmp_path, report=lambda message: None)
    assert found == paths[newest]
    finish_interrupted_publish(found, report=lambda message: None)
    assert torch.load(final / "meta.pt", weights_only=False) == {"version": abs(state[newest])}
    assert latest_complete_checkpoint(tmp_path, report=lambda message: None) == final
    if newest != "final":  # a copy moved to its name leaves no folder of copies behind
        assert not retired_path(final).parent.exists()
    with atomic_directory(final) as tmp:  # and the next write goes on from every state
        torch.save({"version": 3}, tmp / "meta.pt")
    assert torch.load(final / "meta.pt", weights_only=False) == {"version": 3}
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "last.ckpt", f"last.ckpt/{MARKER_FILENAME}", "last.ckpt/meta.pt"]


def test_a_retired_copy_never_replaces_what_is_at_the_checkpoints_name(tmp_path):
    final = tmp_path / "last.ckpt"
    _directory(final, 2)
    (final / "meta.pt").write_bytes(b"changed")  # no longer the file its marker lists
    _directory(retired_path(final), 1)
    found = latest_complete_checkpoint(tmp_path, report=lambda message: None)
    assert found == retired_path(final)
    assert finish_interrupted_publish(found, report=pytest.fail) == found
    assert (final / "meta.pt").read_bytes() == b"changed"
    assert torch.load(found / "meta.pt", weights_only=False) == {"version": 1}


def test_a_file_at_the_staging_name_is_an_unfinished_write_never_the_newest(tmp_path):
    """mlloss before the temporary names of its own per write wrote a file at .partial/<name>."""
    final = tmp_path / "last.ckpt"
    save_atomically({"version": 1}, final)
    staging_path(final).parent.mkdir()
    torch.save({"version": 2}, staging_path(final))
    skipped = []
    assert latest_complete_checkpoint(tmp_path, report=skipped.append) == final
    assert skipped == [(f"skipped {staging_path(final)}: a checkpoint file whose write did not finish (it is renamed "
                        f"to {final} when it is complete)")]
    save_atomically({"version": 3}, final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_removing_a_checkpoint_removes_its_temporary_and_retired_copies(tmp_path):
    final = tmp_path / "last.ckpt"
    _directory(final, 3)
    _directory(staging_path(final), 4, complete=False)
    _directory(retired_path(final), 2)
    (staging_path(final).parent / "last.ckpt.0123456789ab.tmp").write_bytes(b"\0")  # a dead file write's
    checkpointing.remove_checkpoint(final)
    assert list(tmp_path.iterdir()) == []


def test_what_the_resolver_skips_is_printed_on_global_rank_zero_only(tmp_path, monkeypatch, capsys):
    final = tmp_path / "last.ckpt"
    _directory(final, 1)
    _directory(staging_path(final), 2, complete=False)

    def printed() -> str:
        assert latest_complete_checkpoint(tmp_path) == final
        return capsys.readouterr().out

    for name in checkpointing.RANK_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    assert f"skipped {staging_path(final)}" in printed(), "no launcher: rank 0"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")  # the first process of the second node
    assert printed() == ""
    monkeypatch.setenv("RANK", "0")
    assert f"skipped {staging_path(final)}" in printed()
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # the process group's rank comes first
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    assert printed() == ""


def test_a_marker_that_does_not_match_the_files_makes_the_directory_incomplete(tmp_path):
    _directory(tmp_path / "ckpt", 1)
    assert incomplete_reason(tmp_path / "ckpt") is None
    with open(tmp_path / "ckpt" / "meta.pt", "ab") as stream:
        stream.write(b"x")
    assert "lists meta.pt with" in incomplete_reason(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "meta.pt").unlink()
    assert incomplete_reason(tmp_path / "ckpt") == "its completion marker lists meta.pt, which is missing"
    marker = tmp_path / "ckpt" / MARKER_FILENAME
    for text in ('{"format": "mlloss.checkpointing/1"}', "[]", '{"files": 3}', "{"):  # no list of files
        marker.write_text(text)
        assert incomplete_reason(tmp_path / "ckpt").startswith(f"its completion marker {marker} is not readable ("), text


def test_errors_name_the_path(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError) as error:
        save_atomically({}, tmp_path / "a-file" / "last.ckpt")
    assert str(tmp_path / "a-file") in str(error.value) + "".join(getattr(error.value, "__notes__", []))

    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(b"PK\3\4 not a whole checkpoint")
    with pytest.raises(RuntimeError, match=re.escape(f"could not load the checkpoint {broken}")):
        AtomicCheckpointIO().load_checkpoint(broken)
    with pytest.raises(RuntimeError, match=re.escape(f"could not load the checkpoint {broken}")):
        resume.saved_record(broken, "last")
    with pytest.raises(IsADirectoryError, match=re.escape(str(tmp_path))):
        AtomicCheckpointIO().load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(f"no checkpoint at {tmp_path / 'missing'}")):
        resume.resume_path(argparse.Namespace(resume=str(tmp_path / "missing"), checkpoint_dir=tmp_path,
                                                  no_checkpoint=False))


# --------------------------------------------------------------------------- the recipe's --resume checks


RUN = ("--num-users", "300", "--num-items", "200", "--mean-impressions", "30", "--batch-size", "512",
       "--no-progress-bar")


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("ctr_cvr")


@pytest.fixture(scope="module")
def two_epochs(recipe, tmp_path_factory) -> Path:
    """The output folder of a run of 2 epochs, which the tests resume (refused runs write nothing)."""
    out_dir = tmp_path_factory.mktemp("two_epochs") / "run"
    recipe.main([*RUN, "--epochs", "2", "--output-dir", str(out_dir)])
    return out_dir


@pytest.mark.parametrize(("options", "saved", "given"), [
    (("--loss", "bce+auc"), "--loss bce", "--loss bce+auc"),  # trained on silently with another objective
    (("--embedding-dim", "8", "--expert-hidden", "32"), "--embedding-dim 16, --expert-hidden 64 32",
     "--embedding-dim 8, --expert-hidden 32"),  # Lightning's raw state-dict error
    pytest.param(("--embedding", "torchrec"), "--embedding plain", "--embedding torchrec",
                 marks=pytest.mark.skipif(importlib.util.find_spec("torchrec") is None,
                                          reason="the torchrec extra is not installed (docs/install.md)")),
    (("--seed", "1", "--esmm", "--num-users", "200"), "--no-esmm, --seed 0, --num-users 300",
     "--esmm, --seed 1, --num-users 200"),
])
def test_resume_refuses_a_checkpoint_trained_with_other_options(recipe, two_epochs, options, saved, given):
    last = two_epochs / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError) as error:
        recipe.main([*RUN, "--epochs", "3", *options, "--output-dir", str(two_epochs), "--resume", "last"])
    message = str(error.value)
    assert message.startswith(f"--resume last: the checkpoint {last} was trained with {saved}; this run has {given}. ")
    assert f"resume with {saved.replace(',', '')}, or start a new run" in message


def test_resume_refuses_fewer_epochs_than_the_checkpoint_has(recipe, two_epochs):
    """Lightning trained none and results.json reported the checkpoint's 2 epochs for --epochs 1."""
    last = two_epochs / "checkpoints" / "last.ckpt"
    with pytest.raises(ValueError, match=re.escape(f"--resume last: the checkpoint {last} has completed 2 epochs, more "
                                                   "than --epochs 1 (the run's epochs in all, the checkpoint's "
                                                   "included): resume with --epochs 2 or more")):
        recipe.main([*RUN, "--epochs", "1", "--output-dir", str(two_epochs), "--resume", "last"])
    resume.check_epochs(argparse.Namespace(epochs=2, resume="last"), last, 2)  # the same number: evaluates it


def test_resume_last_names_the_newer_copy_it_resumes_from(tmp_path, capsys):
    final = tmp_path / "last.ckpt"
    _directory(final, 1)
    args = argparse.Namespace(resume="last", checkpoint_dir=tmp_path, no_checkpoint=False)
    assert resume.resume_path(args) == final and capsys.readouterr().out == ""
    _directory(staging_path(final), 2)  # killed after its marker, before the swap
    assert resume.resume_path(args) == staging_path(final)
    assert capsys.readouterr().out == (f"--resume last: resuming from {staging_path(final)}, the newest complete "
                                       f"checkpoint (a crash interrupted its move to {final})\n")


def test_resume_refuses_a_checkpoint_of_another_kind_of_strategy(tmp_path):
    path = tmp_path / "last.ckpt"
    saved = {"sharding": "none", "strategy": "FSDPStrategy", "world_size": 1,
             "options": {"--sharding": "none", "--strategy": "fsdp", "--devices": 1, "--num-nodes": 1}}
    here = {**saved, "strategy": "SingleDeviceStrategy", "options": {**saved["options"], "--strategy": "auto"}}
    args = argparse.Namespace(resume="last")
    with pytest.raises(ValueError, match=re.escape("and --strategy differs: resume with --sharding none --strategy fsdp")):
        resume.check_layout(args, path, saved, here)
    resume.check_layout(args, path, {**saved, "strategy": "DDPStrategy"}, here)  # checkpoints of one kind


def test_each_rank_restores_its_own_random_and_objective_states(monkeypatch):
    """A checkpoint keeps every rank's states (rank_states); rank 1 must take rank 1's, not rank 0's."""
    generators = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        generators.append(torch.get_rng_state())
    counts = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])]
    saved = {"torch_rng_state": generators[0],
             "rank_states": [{"torch_rng_state": g, "objective": {"seen": c}} for g, c in zip(generators, counts)]}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    resume.restore_rng_states(saved)
    assert torch.equal(torch.get_rng_state(), generators[1])

    objective = torch.nn.Module()
    objective.register_buffer("seen", torch.zeros(2))
    module, trainer = SimpleNamespace(objective=objective), SimpleNamespace(global_rank=1)
    callback = resume.ObjectiveRankStates()
    callback.on_load_checkpoint(trainer, module, {"ctr_cvr": saved})
    callback.on_train_start(trainer, module)
    assert torch.equal(objective.seen, counts[1])


def test_a_run_without_sharding_removes_every_copy_of_an_earlier_sharded_checkpoint(tmp_path, capsys):
    """Its complete staging copy would otherwise be what --resume last takes, over the run's own file."""
    final = tmp_path / "last.ckpt"
    for path, version in ((final, 1), (staging_path(final), 2), (retired_path(final), 0)):
        _directory(path, version)
    args = argparse.Namespace(checkpoint_dir=tmp_path, no_checkpoint=False, sharding="none")
    resume.replace_other_kind_of_checkpoint(args, SimpleNamespace(is_global_zero=True))
    assert latest_complete_checkpoint(tmp_path, report=pytest.fail) is None
    assert f"removed {final}, the sharded checkpoint of an earlier run" in capsys.readouterr().out


def test_a_checkpoint_that_predates_the_record_of_its_options_still_resumes(recipe, two_epochs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_epochs, run)
    last = run / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=False)
    assert checkpoint["ctr_cvr"]["trained_with"]["--loss"] == "bce"
    del checkpoint["ctr_cvr"]["trained_with"]
    torch.save(checkpoint, last)
    with warnings.catch_warnings(record=True) as caught:  # a moved run: Lightning's dirpath notice, muted
        warnings.simplefilter("always")
        resumed = recipe.main([*RUN, "--epochs", "3", "--output-dir", str(run), "--resume", "last"])
    assert not [str(w.message) for w in caught if "dirpath has changed" in str(w.message)]
    assert len(resumed["history"]) == 3
    assert torch.load(last, weights_only=False)["ctr_cvr"]["trained_with"]["--batch-size"] == 512


@pytest.mark.parametrize("foreign", [torch.nn.Linear(2, 2).state_dict(), torch.zeros(3)], ids=["state_dict", "tensor"])
def test_resume_names_a_loadable_file_that_is_not_a_checkpoint_of_the_recipe(recipe, tmp_path, foreign):
    """A plain state dict or a tensor ended deep in Lightning (KeyError, IndexError) without the path."""
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    torch.save(foreign, last)
    with pytest.raises(RuntimeError, match=re.escape(f"could not load the checkpoint {last}: it is not a checkpoint "
                                                     "of recipes/ctr_cvr.py")):
        recipe.main([*RUN, "--epochs", "1", "--output-dir", str(tmp_path), "--resume", "last"])


def test_checkpoints_keep_the_cuda_generators_and_load_without_them(recipe, monkeypatch):
    """The CUDA generators (dropout on a GPU) are saved once CUDA is initialised (mocked here) and
    restored; a checkpoint without them (the CPU's, or an older one) loads as before."""
    module = SimpleNamespace(history=[{"epoch": 1}], trainer=SimpleNamespace(strategy=None, world_size=1),
                             run_options={}, objective=torch.nn.Module())
    cuda_states, restored = [torch.arange(16, dtype=torch.uint8)], []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: cuda_states)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    checkpoint = {}
    recipe.CtrCvrModule.on_save_checkpoint(module, checkpoint)
    assert checkpoint["ctr_cvr"]["cuda_rng_states"] == cuda_states
    cpu_state = checkpoint["ctr_cvr"]["torch_rng_state"]
    torch.rand(3)
    recipe.CtrCvrModule.on_load_checkpoint(module, checkpoint)
    assert len(restored) == 1 and torch.equal(restored[0][0], cuda_states[0])
    assert torch.equal(torch.get_rng_state(), cpu_state)

    del checkpoint["ctr_cvr"]["cuda_rng_states"]
    module.history = []
    recipe.CtrCvrModule.on_load_checkpoint(module, checkpoint)
    assert len(restored) == 1 and module.history == [{"epoch": 1}]


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_checkpoint_files_are_as_readable_as_any_file_the_user_writes(tmp_path, umask, mode):
    # mkstemp's temporary file is 0600: published as it was, a group's evaluation job could not read it.
    previous = os.umask(umask)
    try:
        final = save_atomically({"a": 1}, tmp_path / "last.ckpt")
    finally:
        os.umask(previous)
    assert final.stat().st_mode & 0o777 == mode


def test_writing_a_checkpoint_never_changes_the_umask(tmp_path, monkeypatch):
    """The umask was read by setting it to 0 and back: a file that another thread of the process
    (a logger's) created in between was world-writable. Every umask the write sets is recorded."""
    set_masks, real_umask = [], os.umask
    monkeypatch.setattr(os, "umask", lambda mask: set_masks.append(mask) or real_umask(mask))
    previous = real_umask(0o022)
    try:
        save_atomically({"a": 1}, tmp_path / "last.ckpt")
        save_atomically({"a": 2}, tmp_path / "last.ckpt")  # over a file
    finally:
        real_umask(previous)
    assert [oct(mask) for mask in set_masks if mask != 0o022] == [], "the process's umask changed during the write"


def test_a_file_system_without_locks_still_gets_its_checkpoint(tmp_path, monkeypatch):
    # flock fails with ENOLCK on some network mounts: every write raised, leaving its temporary file.
    import errno

    import mlloss.checkpointing as checkpointing

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(checkpointing.fcntl, "flock", no_locks)
    final = save_atomically({"a": 1}, tmp_path / "last.ckpt")
    assert torch.load(final, weights_only=False) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_resume_takes_the_options_that_train_the_same_run(recipe, tmp_path):
    """--lambda unset is lambda 1 (a config's `lambda: 1.0`, then a resume without it, was refused), and
    --data-dir is the folder, typed relative or absolute."""
    out_dir = tmp_path / "laa"
    recipe.main([*RUN, "--loss", "laa", "--epochs", "1", "--output-dir", str(out_dir)])
    resumed = recipe.main([*RUN, "--loss", "laa", "--lambda", "1.0", "--epochs", "2", "--output-dir", str(out_dir),
                           "--resume", "last"])
    assert len(resumed["history"]) == 2
    sample = RECIPES / "data" / "ali-ccp-sample"
    typed = [resume.training_options(recipe.parse_args(["--data", "ali-ccp", "--data-dir", str(folder)]))["--data-dir"]
             for folder in (sample, os.path.relpath(sample))]
    assert typed[0] == typed[1] == str(sample.resolve())


def test_resume_takes_options_the_run_does_not_use(recipe, two_epochs, tmp_path):
    """The MMoE run's checkpoint resumes with another --num-levels (PLE's), --num-task-experts and
    --sparse-optimizer (sharded tables'): they were refused, though they change nothing."""
    run = tmp_path / "run"
    shutil.copytree(two_epochs, run)
    resumed = recipe.main([*RUN, "--epochs", "3", "--num-levels", "3", "--num-task-experts", "5",
                           "--sparse-optimizer", "sgd", "--output-dir", str(run), "--resume", "last"])
    assert len(resumed["history"]) == 3
    with pytest.raises(ValueError, match="was trained with --num-experts 4; this run has --num-experts 2"):
        recipe.main([*RUN, "--epochs", "4", "--num-experts", "2", "--output-dir", str(run), "--resume", "last"])


@pytest.mark.parametrize("resume_option", [(), ("--resume", "last")], ids=["new run", "resume last"])
def test_a_checkpoint_dir_that_is_a_file_is_refused_before_training(recipe, tmp_path, resume_option):
    """A new run trained a whole epoch, then failed at its first checkpoint (NotADirectoryError naming
    <file>/.partial); --resume last gave the library's message, which names its name= argument."""
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    out_dir = tmp_path / "run"
    with pytest.raises(NotADirectoryError, match=re.escape(f"--checkpoint-dir {a_file} is a file: the checkpoints go "
                                                           "into a folder (last.ckpt in it)")) as error:
        recipe.main([*RUN, "--epochs", "1", "--output-dir", str(out_dir), "--checkpoint-dir", str(a_file),
                     *resume_option])
    assert "name=" not in str(error.value)
    assert not (out_dir / "results.json").exists() and a_file.read_text() == "mine"


def test_a_checkpoint_dir_under_a_file_or_with_a_reserved_name_is_refused(tmp_path):
    (tmp_path / "a-file").write_text("")
    args = argparse.Namespace(resume=None, checkpoint_dir=tmp_path / "a-file" / "checkpoints", no_checkpoint=False)
    with pytest.raises(NotADirectoryError, match=re.escape(f"--checkpoint-dir {args.checkpoint_dir} is under the file "
                                                           f"{tmp_path / 'a-file'}")):
        resume.resume_path(args)
    args.no_checkpoint = True  # nothing is written there, nor read
    assert resume.resume_path(args) is None
    args.resume = "last"  # read
    with pytest.raises(NotADirectoryError, match="is under the file"):
        resume.resume_path(args)
    for name, kind in ((".partial", "temporary"), (".old", "retired")):
        args = argparse.Namespace(resume=None, checkpoint_dir=tmp_path / name, no_checkpoint=False)
        with pytest.raises(ValueError, match=re.escape(f"--checkpoint-dir {tmp_path / name}: a folder named {name} "
                                                       f"would be taken for the {kind} copies")):
            resume.resume_path(args)
    args = argparse.Namespace(resume=None, checkpoint_dir=tmp_path / "new" / "checkpoints", no_checkpoint=False)
    assert resume.resume_path(args) is None, "a folder that does not exist yet is created by the first checkpoint"


def test_resume_last_names_the_checkpoint_dir_it_cannot_read(tmp_path, monkeypatch):
    """A folder without read or search permission gave a raw PermissionError naming a path inside it
    (<dir>/.partial/last.ckpt, which does not exist). The library's error is mocked: permissions do
    not stop root, whom tests may run as."""
    inside = tmp_path / ".partial" / "last.ckpt"

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(inside))

    monkeypatch.setattr(resume, "latest_complete_checkpoint", unreadable)
    with pytest.raises(PermissionError, match=re.escape(f"--resume last: cannot read --checkpoint-dir {tmp_path}: "
                                                        f"Permission denied (while looking for {inside})")):
        resume.resume_path(argparse.Namespace(resume="last", checkpoint_dir=tmp_path, no_checkpoint=False))


def test_a_folder_that_is_not_a_checkpoint_is_not_removed_for_one(recipe, tmp_path):
    """A run without --sharding removed any directory at <checkpoint-dir>/last.ckpt, as the sharded
    checkpoint of an earlier run; now only a checkpoint directory, and before any training."""
    folder = tmp_path / "checkpoints" / "last.ckpt"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(IsADirectoryError, match=re.escape(f"{folder} is a directory that is not a checkpoint")):
        recipe.main([*RUN, "--epochs", "1", "--output-dir", str(tmp_path)])
    assert (folder / "notes.txt").read_text() == "mine"


# --------------------------------------------------------------------------- the recipe, killed and resumed


class Recipe(ForkedRanks):
    """recipes/ctr_cvr.py's ``main`` in processes forked from this one, which has imported the
    recipe, Lightning and TorchRec (``ranks.ForkedRanks``: with ``--devices 2`` both ranks in
    torchrun's environment); the uninterrupted run takes the command line, where Lightning starts
    rank 1 (``_run_command``), so the resumed runs must also equal a run of the command line."""

    def __init__(self, recipe, out_dir: Path, options: tuple[str, ...], label: str, **env: str) -> None:
        self.checkpoint = out_dir / "checkpoints" / "last.ckpt"
        argv = [*SMALL, *options, "--output-dir", str(out_dir)]
        world_size = int(options[options.index("--devices") + 1]) if "--devices" in options else 1
        super().__init__(_main_of_a_rank, (recipe, argv), log=out_dir.parent / f"{out_dir.name}-{label}.log",
                         world_size=world_size, env={BATCH_PAUSE_ENV: None, CHECKPOINT_PAUSE_ENV: None, **env})


def _main_of_a_rank(rank: int, recipe, argv: list[str]) -> None:
    checkpointing._writes_in_this_process = 0  # the checkpoint pause's count of this process's writes
    recipe.main(argv)


def _run_command(out_dir: Path, options: tuple[str, ...]) -> None:
    """The recipe's command line in a subprocess (Lightning starts the other ranks)."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for name in (BATCH_PAUSE_ENV, CHECKPOINT_PAUSE_ENV):
        environment.pop(name, None)
    done = subprocess.run([sys.executable, str(RECIPE), *SMALL, *options, "--output-dir", str(out_dir)],
                          env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


def _results(out_dir: Path) -> dict:
    report = json.loads((out_dir / "results.json").read_text())
    # json.dumps: exact floats, and NaN equal to NaN
    return {"history": json.dumps(without_timing(report["history"])), "results": json.dumps(report["results"])}


def _checkpoint(path: Path) -> dict:
    """What must be bit-identical between the checkpoints of two runs: the training state (the
    callbacks' state holds the run's own paths, the history its wall-clock times)."""
    meta = _meta(path)
    if path.is_dir():  # TorchRecStrategy: the shards of every rank, read back whole
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        whole = path.parent.parent / "whole.pt"
        dcp_to_torch_save(path, whole)
        state = torch.load(whole, weights_only=False)
        whole.unlink()
    else:
        state = {"model": meta["state_dict"]}
    return {**state, "optimizer_states": meta["optimizer_states"], "loops": meta["loops"], "epoch": meta["epoch"],
            "global_step": meta["global_step"], "rng": meta["ctr_cvr"]["torch_rng_state"],
            "epochs_done": len(meta["ctr_cvr"]["history"])}


def _assert_identical(actual, expected, where: str = "checkpoint") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype, where
        assert torch.equal(actual, expected), f"{where} differs"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{where}: {actual.keys()} != {expected.keys()}"
        for key in expected:
            _assert_identical(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            _assert_identical(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def _meta(path: Path) -> dict:
    """Lightning's checkpoint without the tensors of TorchRec's shards."""
    return torch.load(path / "meta.pt" if path.is_dir() else path, weights_only=False)


def _epochs_done(checkpoint: Path) -> int:
    return len(_meta(checkpoint)["ctr_cvr"]["history"])


def _killed_twice_and_resumed(recipe, out_dir: Path, options: tuple[str, ...]) -> str:
    """Kill the run in the middle of epoch 2, resume it and kill it while it writes the checkpoint
    of epoch 2, resume it to the end; returns the last run's output."""
    # 1. SIGKILL after batch 2 of epoch 2 (index 1): the checkpoint of epoch 1 is the newest
    run = Recipe(recipe, out_dir, options, "1-killed-mid-epoch", **{BATCH_PAUSE_ENV: "120@1:2"})
    run.kill_when(lambda: f"{BATCH_PAUSE_ENV}: pausing" in run.output())
    assert _epochs_done(run.checkpoint) == 1 and not (out_dir / "results.json").exists()
    assert latest_complete_checkpoint(run.checkpoint.parent, report=pytest.fail) == run.checkpoint

    # 2. resumed, SIGKILL while the checkpoint of epoch 2 (its first write) waits at its temporary name
    # (a directory's .partial/last.ckpt, a file's .partial/last.ckpt.<random>.tmp)
    staging = staging_path(run.checkpoint)
    written = re.compile(re.escape(f"{CHECKPOINT_PAUSE_ENV}: {staging}") + r"(\.\w+\.tmp)? is written")
    run = Recipe(recipe, out_dir, (*options, "--resume", "last"), "2-killed-mid-write", **{CHECKPOINT_PAUSE_ENV: "120@1"})
    run.kill_when(lambda: written.search(run.output()))
    assert _epochs_done(run.checkpoint) == 1, "the visible checkpoint is still the previous one"
    skipped = []
    newest = latest_complete_checkpoint(run.checkpoint.parent, report=skipped.append)
    if staging.is_dir():  # a directory is complete with its marker: the newest; a temporary file is never used
        assert newest == staging and _epochs_done(staging) == 2 and not skipped
    else:
        [temporary] = _temporary_files(run.checkpoint)
        assert newest == run.checkpoint and skipped == [
            f"skipped {temporary}: a checkpoint file whose write did not finish (it is renamed to {run.checkpoint} "
            "when it is complete)"]

    # 3. resumed to the end
    return Recipe(recipe, out_dir, (*options, "--resume", "last"), "3-resumed").join()


def _check_equal_to_the_uninterrupted_run(resumed: Path, straight: Path) -> None:
    assert _results(resumed) == _results(straight)
    last = resumed / "checkpoints" / "last.ckpt"
    _assert_identical(_checkpoint(last), _checkpoint(straight / "checkpoints" / "last.ckpt"))
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"], "no temporary copy left"


@pytest.fixture(scope="module")
def uninterrupted(recipe, tmp_path_factory):
    """One uninterrupted run per configuration, shared by the tests: in this process when it has
    one process (saves the ~8 s of imports of a subprocess), else the command line in a subprocess."""
    cache: dict[str, Path] = {}

    def run(name: str, options: tuple[str, ...]) -> Path:
        if name not in cache:
            out_dir = tmp_path_factory.mktemp("straight") / name
            if "--devices" in options:
                _run_command(out_dir, options)
            else:
                recipe.main([*SMALL, *options, "--output-dir", str(out_dir)])
            cache[name] = out_dir
        return cache[name]

    return run


@pytest.mark.slow
def test_recipe_killed_mid_epoch_and_mid_write_resumes_to_the_uninterrupted_run(recipe, tmp_path, uninterrupted):
    straight = uninterrupted("plain", ())
    output = _killed_twice_and_resumed(recipe, tmp_path / "run", ())
    assert f"--resume last: skipped {staging_path(tmp_path / 'run' / 'checkpoints' / 'last.ckpt')}" in output
    _check_equal_to_the_uninterrupted_run(tmp_path / "run", straight)


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_recipe_on_2_ranks_killed_mid_epoch_and_mid_write_resumes_to_the_uninterrupted_run(
    recipe, tmp_path, uninterrupted
):
    """TorchRec DCP directories on 2 gloo ranks (table-wise tables): killed mid-write after the
    marker, the resumed run takes the temporary directory (the newest complete checkpoint) and
    moves it to its name."""
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed (docs/install.md)")
    import mlloss.integrations.torchrec_strategy  # noqa: F401  (imported once, here, for the forked ranks)

    straight = uninterrupted("sharded", SHARDED)
    last = straight / "checkpoints" / "last.ckpt"
    assert (last / "meta.pt").is_file() and (last / ".metadata").is_file() and (last / MARKER_FILENAME).is_file()
    assert len(list(last.glob("*.distcp"))) == 2, "one shard file per rank"
    history = json.loads((straight / "results.json").read_text())["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]

    output = _killed_twice_and_resumed(recipe, tmp_path / "run", SHARDED)
    staging = staging_path(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert f"--resume last: resuming from {staging}, the newest complete checkpoint" in output
    assert f"finished the interrupted write of {staging.parent.parent / 'last.ckpt'}" in output
    _check_equal_to_the_uninterrupted_run(tmp_path / "run", straight)


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_recipe_with_a_balanced_loa_resumes_each_ranks_own_label_counts(tmp_path, uninterrupted):
    """--loss balanced-loa under DDP without --cross-device: each rank counts its own labels, but
    every rank loaded rank 0's counts from the checkpoint (and DDP broadcast rank 0's buffers at its
    first forward), so the resumed epoch 2 left the uninterrupted one."""
    options = ("--loss", "balanced-loa", "--accelerator", "cpu", "--devices", "2", "--strategy", "ddp",
               "--batch-size", "256")
    straight = uninterrupted("ddp balanced-loa", (*options, "--epochs", "2"))
    _run_command(tmp_path / "run", (*options, "--epochs", "1"))
    _run_command(tmp_path / "run", (*options, "--epochs", "2", "--resume", "last"))
    _check_equal_to_the_uninterrupted_run(tmp_path / "run", straight)
    ranks = _meta(straight / "checkpoints" / "last.ckpt")["ctr_cvr"]["rank_states"]
    counts = [rank["objective"]["ranking_loss.seen_items"] for rank in ranks]
    assert counts[0] != counts[1]  # the counts this test is about differ by rank
