"""Crash-safe checkpoints probed as a user relies on them (docs/checkpoints.md), beside the larger
tests/test_checkpoints.py: a failure injected at each step of a write (an exception, a full disk, a
failed fsync, a file that cannot be renamed, a process that exits at once) leaves the previous
checkpoint loadable and nothing that ``latest_complete_checkpoint`` passes over; new folders and
files are fsynced; the newest complete checkpoint is chosen by its name, never by modification
times; ``AtomicCheckpointIO`` writes the file Lightning reads back for a local URL, and works with
``ModelCheckpoint``'s top-k removal, step-wise saving and ``save_last`` (a file or a symbolic link);
the recipe's ``--resume`` names each option that differs with both values, and the command it
suggests resumes.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
from pathlib import Path

import pytest
import torch

import mlloss.checkpointing as checkpointing
from mlloss.checkpointing import (
    MARKER_FILENAME,
    atomic_directory,
    begin_directory,
    finish_directory,
    latest_complete_checkpoint,
    save_atomically,
    staging_path,
    write_atomically,
)

pl = pytest.importorskip("pytorch_lightning")
from lightning_fabric.plugins import TorchCheckpointIO  # noqa: E402

from mlloss.integrations.lightning_checkpoints import AtomicCheckpointIO  # noqa: E402
from recipe_util import RECIPES, load_recipe  # noqa: E402

resume = load_recipe("ctr_cvr_resume")  # the recipe's --resume checks
options = load_recipe("ctr_cvr_options")


def _tree(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def _notes(error: BaseException) -> str:
    return str(error) + " " + " ".join(getattr(error, "__notes__", []))


# --------------------------------------------------------------------------- a failure at each step


def _full_disk_midway(stream) -> None:
    stream.write(b"\1" * 50_000)  # a part of the checkpoint reaches the temporary file
    raise OSError(errno.ENOSPC, "No space left on device")


def _fail_fsync(monkeypatch):
    def fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(checkpointing.os, "fsync", fsync)


def _fail_rename(monkeypatch):
    def replace(source, target):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(source), None, str(target))

    monkeypatch.setattr(checkpointing.os, "replace", replace)


@pytest.mark.parametrize(("failure", "raised"), [
    ("full disk while writing", errno.ENOSPC),
    ("fsync of the file fails", errno.EIO),
    ("the file cannot be renamed", errno.EXDEV),
])
def test_a_file_write_that_fails_at_any_step_keeps_the_previous_checkpoint(tmp_path, monkeypatch, failure, raised):
    final = tmp_path / "last.ckpt"
    save_atomically({"version": 1}, final)
    write = _full_disk_midway if failure.startswith("full disk") else (lambda stream: torch.save({"version": 2}, stream))
    if failure.startswith("fsync"):
        _fail_fsync(monkeypatch)
    elif failure.startswith("the file cannot"):
        _fail_rename(monkeypatch)
    with pytest.raises(OSError) as error:
        write_atomically(final, write)
    monkeypatch.undo()
    assert error.value.errno == raised and f"while writing the checkpoint {final}" in _notes(error.value)
    assert _tree(tmp_path) == ["last.ckpt"], "the temporary file and .partial/ are removed"
    assert torch.load(final, weights_only=False) == {"version": 1}
    assert latest_complete_checkpoint(tmp_path, report=pytest.fail) == final


def _marker_on_a_full_disk(monkeypatch):
    """The completion marker's JSON gets half written, then the disk is full."""
    real_dump = checkpointing.json.dump

    def dump(record, stream, **kwargs):
        stream.write("{")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpointing.json, "dump", dump)
    return real_dump


def _with_atomic_directory(final: Path) -> None:
    with atomic_directory(final, epoch=2) as tmp:
        torch.save({"version": 2}, tmp / "meta.pt")


def _with_begin_and_finish(final: Path) -> None:
    staging = begin_directory(final)
    torch.save({"version": 2}, staging / "meta.pt")
    (staging / "__0_0.distcp").write_bytes(b"\2" * 1000)
    finish_directory(staging, final, epoch=2)


@pytest.mark.parametrize("write", [_with_atomic_directory, _with_begin_and_finish], ids=["atomic_directory",
                                                                                       "begin_finish"])
def test_a_directory_whose_marker_cannot_be_written_leaves_nothing_and_names_the_checkpoint(
        tmp_path, monkeypatch, write):
    """The staging copy of a directory whose marker failed (a full disk, a failed fsync) stayed in
    .partial/, as large as a checkpoint, reported by every --resume last until the next write, and
    the error (a bare ENOSPC) named neither the checkpoint nor its temporary copy."""
    final = tmp_path / "last.ckpt"
    with atomic_directory(final, epoch=1) as tmp:
        torch.save({"version": 1}, tmp / "meta.pt")
    _marker_on_a_full_disk(monkeypatch)
    with pytest.raises(OSError) as error:
        write(final)
    monkeypatch.undo()
    assert error.value.errno == errno.ENOSPC
    assert f"while writing the checkpoint {final} (at its temporary name {staging_path(final)})" in _notes(error.value)
    assert _tree(tmp_path) == ["last.ckpt", f"last.ckpt/{MARKER_FILENAME}", "last.ckpt/meta.pt"]
    assert latest_complete_checkpoint(tmp_path, report=pytest.fail) == final
    assert torch.load(final / "meta.pt", weights_only=False) == {"version": 1}


def test_a_marker_that_cannot_be_written_leaves_a_directory_the_caller_made(tmp_path, monkeypatch):
    """Only begin_directory's staging copy is the library's to remove; a folder of the caller's is not."""
    own = tmp_path / "mine"
    own.mkdir()
    torch.save({"version": 2}, own / "meta.pt")
    _marker_on_a_full_disk(monkeypatch)
    with pytest.raises(OSError):
        finish_directory(own, tmp_path / "last.ckpt")
    monkeypatch.undo()
    assert _tree(tmp_path) == ["mine", "mine/meta.pt"]


def _exit_midway(path: str) -> None:
    def write(stream):
        stream.write(b"\0" * 4096)
        stream.flush()
        os._exit(3)  # no cleanup, no exception handler: as an out-of-memory kill

    write_atomically(path, write)


def _exit_before_publishing(path: str) -> None:
    checkpointing._pause_before_publishing = lambda staging: os._exit(3)  # written and fsynced, not yet renamed
    save_atomically({"version": 2}, path)


@pytest.mark.parametrize("writer", [_exit_midway, _exit_before_publishing], ids=["midway", "before_rename"])
def test_a_writer_that_exits_at_once_is_never_resumed_and_the_next_write_clears_it(tmp_path, writer):
    final = tmp_path / "last.ckpt"
    save_atomically({"version": 1}, final)
    process = multiprocessing.get_context("fork").Process(target=writer, args=(str(final),))
    process.start()
    process.join(60)
    assert process.exitcode == 3
    [temporary] = staging_path(final).parent.iterdir()
    skipped = []
    assert latest_complete_checkpoint(tmp_path, report=skipped.append) == final
    assert skipped == [f"skipped {temporary}: a checkpoint file whose write did not finish (it is renamed to {final} "
                       "when it is complete)"]
    assert torch.load(final, weights_only=False) == {"version": 1}
    save_atomically({"version": 3}, final)
    assert _tree(tmp_path) == ["last.ckpt"] and torch.load(final, weights_only=False) == {"version": 3}


# --------------------------------------------------------------------------- durability


def _record_fsyncs(monkeypatch) -> tuple[list[Path], list[int]]:
    """The folders fsynced (``_fsync_directory``) and the inodes of the files fsynced (``os.fsync``)."""
    folders, inodes = [], []
    real_fsync_directory, real_fsync = checkpointing._fsync_directory, os.fsync
    monkeypatch.setattr(checkpointing, "_fsync_directory",
                        lambda folder: folders.append(Path(folder)) or real_fsync_directory(folder))
    monkeypatch.setattr(checkpointing.os, "fsync", lambda fd: inodes.append(os.fstat(fd).st_ino) or real_fsync(fd))
    return folders, inodes


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_checkpoint_and_the_folders_created_for_it_are_fsynced(tmp_path, monkeypatch, kind):
    """The first checkpoint's folder (here runs/a/, both new) was created without an fsync of its
    parent: its rename into runs/a/ was durable, runs/a/ itself not, and a power loss could take
    the folder with the checkpoint."""
    final = tmp_path / "runs" / "a" / "last.ckpt"
    folders, inodes = _record_fsyncs(monkeypatch)
    if kind == "file":
        save_atomically({"version": 1}, final)
        assert final.stat().st_ino in inodes, "the file's data is fsynced before its rename"
    else:
        with atomic_directory(final) as tmp:
            torch.save({"version": 1}, tmp / "meta.pt")
        assert (final / "meta.pt").stat().st_ino in inodes and (final / MARKER_FILENAME).stat().st_ino in inodes
    missing = {tmp_path, tmp_path / "runs", final.parent} - set(folders)
    assert not missing, f"not fsynced: {sorted(map(str, missing))}"


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_every_rename_is_followed_by_an_fsync_of_the_folder_it_renames_into(tmp_path, monkeypatch, kind):
    """A rename is durable once its folder is fsynced after it (before, the new name is not there yet):
    replacing a checkpoint file, and the swap of a directory (the previous one into .old/, the new one
    into its name, and the marker into the directory)."""
    final = tmp_path / "last.ckpt"

    def write(version: int) -> None:
        if kind == "file":
            save_atomically({"version": version}, final)
        else:
            with atomic_directory(final) as tmp:
                torch.save({"version": version}, tmp / "meta.pt")

    write(1)
    events = []
    real_replace, real_fsync_directory = os.replace, checkpointing._fsync_directory
    monkeypatch.setattr(checkpointing.os, "replace", lambda source, target: events.append(
        ("rename", Path(target).parent)) or real_replace(source, target))
    monkeypatch.setattr(checkpointing, "_fsync_directory", lambda folder: events.append(
        ("fsync", Path(folder))) or real_fsync_directory(folder))
    write(2)
    monkeypatch.undo()
    renamed_into = [(i, folder) for i, (what, folder) in enumerate(events) if what == "rename"]
    assert len(renamed_into) == (1 if kind == "file" else 3)
    for i, folder in renamed_into:
        assert ("fsync", folder) in events[i + 1:], f"no fsync of {folder} after the rename into it"


# --------------------------------------------------------------------------- which checkpoint is the newest


def test_the_newest_complete_checkpoint_goes_by_name_not_by_modification_time(tmp_path):
    """Clock skew, equal times, names that sort otherwise as strings than as numbers (step 9, step
    10), a stray file: only <name> and its copies at the library's temporary names are candidates."""
    final = tmp_path / "last.ckpt"
    save_atomically({"version": 1}, final)
    os.utime(final, (0, 0))  # written under a clock that was behind
    for stray in ("last-v1.ckpt", "last.ckpt.bak", "step=9.ckpt", "step=10.ckpt", "notes.txt"):
        (tmp_path / stray).write_bytes(b"newer, but not the checkpoint")
    (tmp_path / "last.ckpt.d").mkdir()
    assert latest_complete_checkpoint(tmp_path, report=pytest.fail) == final
    assert latest_complete_checkpoint(tmp_path, name="step=9.ckpt", report=pytest.fail) == tmp_path / "step=9.ckpt"


def test_a_directory_checkpoint_replaces_a_dangling_save_last_link(tmp_path):
    final = tmp_path / "last.ckpt"
    final.symlink_to("epoch=1.ckpt")  # ModelCheckpoint(save_last="link") whose target was removed
    with atomic_directory(final) as tmp:
        torch.save({"version": 2}, tmp / "meta.pt")
    assert not final.is_symlink() and torch.load(final / "meta.pt", weights_only=False) == {"version": 2}
    assert _tree(tmp_path) == ["last.ckpt", f"last.ckpt/{MARKER_FILENAME}", "last.ckpt/meta.pt"]


def test_a_dangling_save_last_link_is_skipped_naming_its_target(tmp_path):
    """ModelCheckpoint(save_last="link") makes last.ckpt a symbolic link to a top-k file, which its
    top-k removal can take before the link is renewed: it was skipped as "it does not exist"."""
    save_atomically({"version": 1}, tmp_path / "epoch=1.ckpt")
    (tmp_path / "last.ckpt").symlink_to("epoch=1.ckpt")
    assert latest_complete_checkpoint(tmp_path, report=pytest.fail) == tmp_path / "last.ckpt"
    (tmp_path / "epoch=1.ckpt").unlink()
    skipped = []
    assert latest_complete_checkpoint(tmp_path, report=skipped.append) is None
    assert skipped == [f"skipped {tmp_path / 'last.ckpt'}: a symbolic link to epoch=1.ckpt, which does not exist"]


# --------------------------------------------------------------------------- AtomicCheckpointIO in Lightning


@pytest.mark.parametrize("scheme", ["file:", "local://"])
def test_atomic_checkpoint_io_writes_the_file_lightning_reads_for_a_local_url(tmp_path, monkeypatch, scheme):
    """file:/x (fsspec's local file, as file:///x) was written as the relative ./file:/x, which
    Lightning's loading did not find; local:///x was refused as a remote file system."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "checkpoints" / "last.ckpt"
    url = scheme + str(target)
    AtomicCheckpointIO().save_checkpoint({"epoch": 3}, url)
    assert TorchCheckpointIO().load_checkpoint(url) == {"epoch": 3}, "Lightning's own reader, the reference"
    assert _tree(tmp_path) == ["checkpoints", "checkpoints/last.ckpt"]
    AtomicCheckpointIO().remove_checkpoint(url)
    assert _tree(tmp_path) == ["checkpoints"]
    with pytest.raises(ValueError, match=re.escape("AtomicCheckpointIO.save_checkpoint: path 'memory://last.ckpt' is "
                                                   "a URL of a remote file system")):
        AtomicCheckpointIO().save_checkpoint({}, "memory://last.ckpt")


def test_atomic_checkpoint_io_raises_as_lightnings_checkpoint_io(tmp_path):
    """A missing file is TorchCheckpointIO's FileNotFoundError (Lightning's resume tells it from a
    broken file); storage_options, which a local atomic write cannot take, are refused, not ignored."""
    missing = tmp_path / "missing.ckpt"
    for io_plugin in (TorchCheckpointIO(), AtomicCheckpointIO()):
        with pytest.raises(FileNotFoundError):
            io_plugin.load_checkpoint(missing)
    with pytest.raises(TypeError, match="AtomicCheckpointIO.save_checkpoint does not take storage_options"):
        AtomicCheckpointIO().save_checkpoint({"epoch": 1}, missing, storage_options={"compression": "zip"})
    assert _tree(tmp_path) == []


class _Tiny(pl.LightningModule):
    """A linear model whose logged ``score`` is its step modulo 4: the top-k ranking is known in advance."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        self.log("score", float(self.global_step % 4))
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 2)), batch_size=2)


@pytest.mark.parametrize("save_last", [True, "link"])
def test_model_checkpoint_top_k_every_n_steps_and_save_last_through_atomic_checkpoint_io(tmp_path, save_last):
    """The top-k removal goes through AtomicCheckpointIO.remove_checkpoint and leaves exactly the
    best k; save_last=True writes the latest state through it; save_last="link" is Lightning's
    symbolic link to the newest top-k file, not to the latest state (docs/checkpoints.md)."""
    folder = tmp_path / "ckpt"
    callback = pl.callbacks.ModelCheckpoint(dirpath=folder, monitor="score", mode="max", save_top_k=2,
                                            every_n_train_steps=3, save_last=save_last, filename="{step}")
    trainer = pl.Trainer(max_epochs=2, callbacks=[callback], plugins=[AtomicCheckpointIO()], logger=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(_Tiny())
    # saved at steps 3, 6, 9, 12, 15 with the score of the step before (global_step - 1) % 4: 2, 1, 0, 3, 2
    scores = {step: (step - 1) % 4 for step in range(3, trainer.global_step + 1, 3)}
    kept = sorted(scores, key=lambda step: (-scores[step], step))[:2]  # a tie does not displace the earlier one
    assert sorted(path for path in _tree(folder) if path != "last.ckpt") == sorted(f"step={s}.ckpt" for s in kept)
    last = latest_complete_checkpoint(folder, report=pytest.fail)
    assert last == folder / "last.ckpt" and last.is_symlink() == (save_last == "link")
    newest = max(scores) if save_last is True else max(kept)  # the link: the newest file that entered the top k
    assert torch.load(last, weights_only=False)["global_step"] == newest


# --------------------------------------------------------------------------- the recipe's --resume check


@pytest.mark.parametrize(("saved_argv", "run_argv", "named"), [
    (("--model", "mmoe", "--num-experts", "8"), ("--model", "ple"), "--model mmoe; this run has --model ple"),
    (("--loss", "laa", "--lambda", "0.5"), ("--loss", "bce"), "--loss laa; this run has --loss bce"),
    (("--data", "ali-ccp", "--data-dir", str(RECIPES / "data" / "ali-ccp-sample")), ("--num-users", "100"),
     "--data ali-ccp; this run has --data synthetic"),
    (("--num-users", "100", "--click-rate", "0.2"), ("--data", "ali-ccp"), "--data synthetic; this run has --data ali-ccp"),
    (("--dropout", "0.2", "--seed", "3"), ("--dropout", "0.1"), "--dropout 0.2, --seed 3; this run has --dropout 0.1, "
                                                                  "--seed 0"),
])
def test_the_resume_command_a_mismatch_suggests_resumes(saved_argv, run_argv, named):
    """The error names each option with both values, and its "resume with ..." resumes: it named only
    the options that differ among those this run uses, so that a checkpoint of MMoE with 8 experts,
    resumed as PLE, suggested --model mmoe, which then failed on --num-experts 8 (4 by default)."""
    saved = resume.training_options(options.parse_args([*saved_argv, "--resume", "last"]))
    path = Path("run/checkpoints/last.ckpt")
    with pytest.raises(ValueError) as error:
        resume.check_training_options(options.parse_args([*run_argv, "--resume", "last"]), path, saved)
    message = str(error.value)
    assert message.startswith(f"--resume last: the checkpoint {path} was trained with {named}. ")
    suggested = re.search(r"resume with (.*), or start a new run", message).group(1).split()
    resume.check_training_options(options.parse_args([*run_argv, *suggested, "--resume", "last"]), path, saved)
