"""Crash-safe checkpoints: written under a temporary name, made visible atomically, resumed from
the newest complete one. Framework-free (torch only); Lightning's side, the checkpoint I/O plugin
and the fault-test callback, is :mod:`mlloss.integrations.lightning_checkpoints`, and TorchRec's
sharded directories are written by :class:`mlloss.integrations.torchrec_strategy.TorchRecStrategy`
through the functions here. Layout and protocol: docs/checkpoints.md.

A checkpoint at ``<dir>/<name>`` (``last.ckpt`` in recipes/ctr_cvr.py) is written under a
temporary name in ``<dir>/.partial/`` and only then moved to ``<dir>/<name>``:

* a file (Lightning's ``.ckpt``): written, flushed and fsynced as ``.partial/<name>.<random>.tmp``
  (a name of its own per write, created with mode ``0666`` less the umask, locked with ``flock`` by
  its writer until it is published, so that two writers never publish each other's parts), then
  ``os.replace``-d over the previous one (atomic: a reader sees the old file or the new one);
* a directory (TorchRec's ``torch.distributed.checkpoint`` shards plus ``meta.pt``, written by
  ``TorchRecStrategy``): every rank writes its shards into ``.partial/<name>``, then rank 0
  writes the completion marker ``COMPLETE`` last (the files and their sizes, as JSON) and swaps
  the directories: the previous one is moved to ``<dir>/.old/<name>``, the new one to
  ``<dir>/<name>``, and the previous one removed. ``os.replace`` cannot replace a
  non-empty directory; the resolver understands every state a crash can leave between the steps.

:func:`latest_complete_checkpoint` finds the newest complete checkpoint among ``.partial/<name>``
(a directory with its marker: its writer was killed after it was complete, before it was moved),
``<name>`` (a file, or a directory with its marker) and ``.old/<name>`` (killed between the two
moves), and reports each candidate it skips. A temporary file is never used: until it is
renamed, the previous file is the newest complete one. A write starts by clearing what crashed
writes left at the temporary names (:func:`_clear_staging`): the files no writer holds, and a
staging directory, which is first made visible when it is complete (the newest complete checkpoint
is never removed before a newer one is complete). A checkpoint replaces a file or a checkpoint
directory only: :func:`publish` refuses a directory without the marker or ``meta.pt``. The folders
``.partial`` and ``.old`` are this module's: a checkpoint folder of either name is refused
(:func:`_check_folder_name`), so that a path ``<folder>/.partial/<name>`` is always a staging copy.

Pieces:

* :func:`write_atomically` / :func:`save_atomically` -- one file; :func:`begin_directory`,
  :func:`finish_directory` (and :func:`atomic_directory` in one process) -- one directory;
  both end in :func:`publish`, the one implementation of "make it visible";
* :func:`latest_complete_checkpoint`, :func:`incomplete_reason`, :func:`finish_interrupted_publish`;
  what they skip or finish is printed on global rank 0 only: ``torch.distributed``'s rank once a
  process group is up, before that the launcher's environment (``RANK``, else ``LOCAL_RANK``,
  ``SLURM_PROCID``, ``JSM_NAMESPACE_RANK``: Lightning's order), else 0;
* the test hook ``MLLOSS_TEST_CHECKPOINT_PAUSE=<seconds>[@<n>]``, read from the environment
  (docs/checkpoints.md, "Fault tests"), pauses a writer after the temporary copy is complete and
  before it is made visible (every write, or only the n-th of the process); its sibling
  ``MLLOSS_TEST_BATCH_PAUSE`` pauses training (:mod:`mlloss.integrations.lightning_checkpoints`).

``AtomicCheckpointIO``, ``BatchPause`` and ``fault_test_callbacks`` were here; they still resolve
from this module, with a ``DeprecationWarning``, and import Lightning only then.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Optional

import torch

from ._deprecation import moved_names

__all__ = [
    "MARKER_FILENAME",
    "STAGING_DIRNAME",
    "RETIRED_DIRNAME",
    "CHECKPOINT_PAUSE_ENV",
    "BATCH_PAUSE_ENV",
    "staging_path",
    "retired_path",
    "write_atomically",
    "save_atomically",
    "begin_directory",
    "mark_complete",
    "finish_directory",
    "atomic_directory",
    "publish",
    "remove_checkpoint",
    "incomplete_reason",
    "is_checkpoint_directory",
    "latest_complete_checkpoint",
    "finish_interrupted_publish",
]

MARKER_FILENAME = "COMPLETE"  # written last into a checkpoint directory
METADATA_FILENAME = "meta.pt"  # TorchRecStrategy's Lightning state beside the shards (before the marker existed, its only sign)
MARKER_FORMAT = "mlloss.checkpointing/1"
STAGING_DIRNAME = ".partial"  # <dir>/.partial/<name>: being written
RETIRED_DIRNAME = ".old"  # <dir>/.old/<name>: the previous directory, during the swap
CHECKPOINT_PAUSE_ENV = "MLLOSS_TEST_CHECKPOINT_PAUSE"
BATCH_PAUSE_ENV = "MLLOSS_TEST_BATCH_PAUSE"  # read by mlloss.integrations.lightning_checkpoints
RANK_ENV_VARS = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")  # Lightning's order

# The Lightning half moved; the names resolve from here with a warning (mlloss._deprecation).
__getattr__ = moved_names(__name__, dict.fromkeys(
    ("AtomicCheckpointIO", "BatchPause", "fault_test_callbacks"), "mlloss.integrations.lightning_checkpoints"))


# --------------------------------------------------------------------------- names


def staging_path(final: str | os.PathLike) -> Path:
    """Where the checkpoint directory ``final`` is written before it is made visible:
    ``<dir>/.partial/<name>`` (a folder of its own, so that Lightning's ``ckpt_path="last"``, which
    looks for ``last*.ckpt`` in ``<dir>``, never picks it). A file is written beside it, under a
    name of its own per write (:func:`write_atomically`)."""
    final = Path(final)
    return final.parent / STAGING_DIRNAME / final.name


def retired_path(final: str | os.PathLike) -> Path:
    """Where the previous checkpoint directory ``final`` waits while the new one takes its name."""
    final = Path(final)
    return final.parent / RETIRED_DIRNAME / final.name


def _temporary_files(final: Path) -> list[Path]:
    """The files that writes of the checkpoint file ``final`` have under way, or left when they
    died: ``<dir>/.partial/<name>.<random>.tmp`` (the random part has no dot: hex digits, or
    ``tempfile.mkstemp``'s letters of earlier versions)."""
    folder = final.parent / STAGING_DIRNAME
    pattern = re.compile(re.escape(final.name) + r"\.\w+\.tmp")
    try:
        names = os.listdir(folder)
    except OSError:  # no folder (no write under way)
        return []
    return sorted(folder / name for name in names if pattern.fullmatch(name))


def _final_of(path: Path) -> Path | None:
    """The visible name of a staging or retired copy; None for any other path (unambiguous: no
    checkpoint folder has the name of a staging or retired folder, :func:`_check_folder_name`)."""
    return path.parent.parent / path.name if path.parent.name in (STAGING_DIRNAME, RETIRED_DIRNAME) else None


def _check_folder_name(final: Path) -> None:
    """Raise ValueError when the checkpoint ``final`` is named ``.partial`` or ``.old`` (the folder
    of its own copies), or is in a folder of either name: it would be taken for a staging or
    retired copy of ``<folder>/../<name>`` (skipped as an unfinished write, or moved out of its
    folder by :func:`finish_interrupted_publish`)."""
    if final.name in (STAGING_DIRNAME, RETIRED_DIRNAME):  # its copies would go into itself
        raise ValueError(f"the checkpoint name {final.name} is the name mlloss.checkpointing keeps for the folder of "
                         f"the temporary and retired copies of the checkpoints in {final.parent}; name it otherwise")
    folder = final.parent
    if folder.name in (STAGING_DIRNAME, RETIRED_DIRNAME):
        kind = "temporary" if folder.name == STAGING_DIRNAME else "retired"
        raise ValueError(f"the checkpoint folder {folder} is named {folder.name}, which mlloss.checkpointing keeps for "
                         f"the {kind} copies of the checkpoints in {folder.parent}: {final} would be taken for one; "
                         "name the folder otherwise")


# --------------------------------------------------------------------------- writing


def _fsync_directory(directory: Path) -> None:
    """Make a rename or a new file in ``directory`` durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _make_folder(folder: Path) -> None:
    """``folder.mkdir(parents=True, exist_ok=True)``, fsyncing the parent of each folder it creates:
    a checkpoint's rename is made durable by an fsync of its folder, but a folder created for the
    first checkpoint is itself a new name in its parent, which a power loss could otherwise take
    with the checkpoint in it."""
    created = list(itertools.takewhile(lambda path: not os.path.isdir(path), (folder, *folder.parents)))
    folder.mkdir(parents=True, exist_ok=True)
    for path in reversed(created):
        _fsync_directory(path.parent)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _remove_if_empty(directory: Path) -> None:
    with contextlib.suppress(OSError):
        directory.rmdir()


def _name_the_path(error: BaseException, what: str) -> None:
    if hasattr(error, "add_note"):  # Python >= 3.11; the type of the error is kept
        error.add_note(what)


_writes_in_this_process = 0


def _pause_before_publishing(staging: Path) -> None:
    """The fault-test hook ``MLLOSS_TEST_CHECKPOINT_PAUSE=<seconds>[@<n>]``: sleep with the
    complete temporary copy in place, before it is made visible (at every write of this process,
    or at the n-th only), so that a test can kill the process there."""
    global _writes_in_this_process
    _writes_in_this_process += 1
    spec = os.environ.get(CHECKPOINT_PAUSE_ENV)
    if not spec:
        return
    seconds, at, nth = spec.partition("@")
    try:
        seconds_value, nth_value = float(seconds), int(nth) if at else None
        if not seconds_value >= 0 or (nth_value is not None and nth_value < 1):
            raise ValueError
    except ValueError:
        # "5@" paused at every write and "5@0" at none, without a word
        raise ValueError(f"{CHECKPOINT_PAUSE_ENV} must be <seconds> or <seconds>@<n> (seconds >= 0, writes counted "
                         f"from n = 1); got {spec!r}") from None
    if nth_value is not None and nth_value != _writes_in_this_process:
        return
    print(f"{CHECKPOINT_PAUSE_ENV}: {staging} is written; pausing {seconds_value:g} s before making it visible "
          f"(write {_writes_in_this_process} of this process)", file=sys.stderr, flush=True)
    time.sleep(seconds_value)


def is_checkpoint_directory(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a checkpoint directory: it holds the completion marker, or ``meta.pt``
    (a checkpoint of ``TorchRecStrategy`` written before the marker existed)."""
    return any((Path(path) / name).is_file() for name in (MARKER_FILENAME, METADATA_FILENAME))


def _check_replaceable(final: Path) -> None:
    """Raise IsADirectoryError when ``final`` is a directory that is not a checkpoint: a checkpoint
    replaces a file, or a checkpoint directory (:func:`is_checkpoint_directory`), never another folder."""
    if final.is_dir() and not is_checkpoint_directory(final):
        raise IsADirectoryError(f"{final} is a directory that is not a checkpoint (it has neither {MARKER_FILENAME} "
                                f"nor {METADATA_FILENAME}): a checkpoint does not replace it; name a file "
                                "in it, or remove it")


def publish(staging: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Make the complete ``staging`` copy visible as ``final``, replacing what is there: a file or
    a checkpoint directory (IsADirectoryError for any other directory, see :func:`_check_replaceable`).

    A file over a file is one ``os.replace``. A directory (or anything replacing a directory)
    needs two renames: the previous ``final`` goes to :func:`retired_path` first, then ``staging``
    takes its name, then the previous one is removed; a crash between the renames leaves the
    previous checkpoint at the retired name, where :func:`latest_complete_checkpoint` finds it.
    """
    staging, final = Path(staging), Path(final)
    retired = retired_path(final)
    try:
        _check_replaceable(final)
        if final.is_dir() or (staging.is_dir() and (final.exists() or final.is_symlink())):
            _remove(retired)  # older than `final`, left by an earlier crash
            retired.parent.mkdir(exist_ok=True)
            os.replace(final, retired)
            _fsync_directory(retired.parent)
        os.replace(staging, final)
        _fsync_directory(final.parent)
        _fsync_directory(staging.parent)
        _remove(retired)
    except BaseException as error:
        _name_the_path(error, f"while making the checkpoint {staging} visible as {final}")
        raise
    _remove_if_empty(staging.parent)
    _remove_if_empty(retired.parent)
    return final


def _open_temporary_file(final: Path) -> tuple[IO[bytes], Path]:
    """A new file ``<dir>/.partial/<name>.<random>.tmp`` for a write of ``final``, open and locked
    (``flock``) until it is closed: :func:`_remove_abandoned_files` removes only unlocked ones.
    Created with mode ``0666``, which the kernel reduces by the umask (or the folder's default
    ACL): the permissions of any file the user creates, not ``mkstemp``'s ``0600``, which would
    hide the checkpoint from the group. The umask is never read by setting it (``os.umask``
    changes it for every thread of the process, whose files would meanwhile be created ``0666``).
    Tried again when the random name is taken, when another writer removed the empty folder, or
    the file before it was locked."""
    folder = final.parent / STAGING_DIRNAME
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC
    while True:
        _make_folder(folder)
        path = folder / f"{final.name}.{secrets.token_hex(6)}.tmp"  # hex: the \w+ of _temporary_files
        try:
            descriptor = os.open(path, flags, 0o666)
        except (FileExistsError, FileNotFoundError):
            continue
        stream = open(descriptor, "wb")
        try:
            _lock(stream, blocking=True)
        except BaseException:
            stream.close()
            path.unlink(missing_ok=True)
            raise
        if path.exists():
            return stream, path
        stream.close()


def _lock(stream: IO[bytes], *, blocking: bool) -> None:
    """``flock`` ``stream`` exclusively. A file system without locks (ENOLCK, EOPNOTSUPP: some
    network mounts) gets none: each write still has a name of its own, only the removal of a dead
    writer's file could then take a live one's (whose publish would fail, naming the path)."""
    try:
        fcntl.flock(stream, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise


def _remove_abandoned_files(final: Path) -> None:
    """Remove the temporary files of ``final`` whose writers died (a crash mid-write): those no
    writer holds locked. A write under way keeps its own."""
    for path in _temporary_files(final):
        with contextlib.suppress(OSError):  # locked (BlockingIOError): a writer at work; or already gone
            with open(path, "rb") as stream:
                _lock(stream, blocking=False)
                path.unlink()


def write_atomically(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """Write the file ``path`` through ``write(stream)`` into a temporary file of its own
    (``<dir>/.partial/<name>.<random>.tmp``), flush and fsync it, then :func:`publish` it: ``path``
    holds the previous file or the complete new one of one writer, never a part, also when several
    processes write it at once. A failed write removes its temporary file; errors name ``path``.
    Before writing it clears what crashed writes left (:func:`_clear_staging`). ValueError when
    the folder of ``path`` is named ``.partial`` or ``.old`` (:func:`_check_folder_name`)."""
    final = Path(path)
    try:
        _check_folder_name(final)
        _check_replaceable(final)
        _clear_staging(final)
        stream, staging = _open_temporary_file(final)
    except BaseException as error:
        _name_the_path(error, f"while writing the checkpoint {final}")
        raise
    try:
        with stream:  # locked until it is published
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
            _pause_before_publishing(staging)
            publish(staging, final)
    except BaseException as error:
        with contextlib.suppress(OSError):
            staging.unlink(missing_ok=True)
        _remove_if_empty(staging.parent)
        _name_the_path(error, f"while writing the checkpoint {final} (at its temporary name {staging})")
        raise
    return final


def save_atomically(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj, path)`` through :func:`write_atomically`."""
    return write_atomically(path, lambda stream: torch.save(obj, stream))


def _clear_staging(final: Path) -> None:
    """Clear what crashed writes of ``final`` left at the temporary names, before a new write: the
    temporary files no writer holds (:func:`_remove_abandoned_files`) and a directory at
    :func:`staging_path`. A complete one (its writer was killed after the marker, before the swap)
    is the newest complete checkpoint: it is made visible first (:func:`finish_interrupted_publish`),
    so that a crash of the new write still resumes from it; an incomplete one is removed."""
    staging = staging_path(final)
    finish_interrupted_publish(staging)  # a complete directory only; leaves anything else where it is
    _remove(staging)
    _remove_abandoned_files(final)


def begin_directory(final: str | os.PathLike) -> Path:
    """Start writing the checkpoint directory ``final``: an empty :func:`staging_path`, after
    clearing what crashed writes left (:func:`_clear_staging`: a complete staging copy is made
    visible first). Call on one process; the others write after a barrier. IsADirectoryError when
    ``final`` is a directory that is not a checkpoint (:func:`publish`); ValueError when its folder
    is named ``.partial`` or ``.old`` (:func:`_check_folder_name`)."""
    final = Path(final)
    _check_folder_name(final)
    _check_replaceable(final)
    _clear_staging(final)
    staging = staging_path(final)
    _make_folder(staging.parent)
    staging.mkdir()
    return staging


def _check_info(info: dict[str, Any], directory: Path) -> None:
    """Raise TypeError naming the entry of ``info`` that the JSON completion marker cannot hold."""
    for key, value in info.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as error:
            raise TypeError(f"info {key}={value!r} for the completion marker of {directory} is not JSON "
                            f"(str, int, float, bool, None, lists and dicts of them): {error}") from None


def mark_complete(directory: str | os.PathLike, **info: Any) -> Path:
    """Write the completion marker of ``directory`` last: JSON with every file's size (fsynced
    first) and ``info`` (JSON values: TypeError names any other); written under a temporary name
    and renamed, so that it is whole."""
    directory = Path(directory)
    _check_info(info, directory)
    files = {}
    for item in sorted(directory.rglob("*")):
        if item.is_file() and item.name not in (MARKER_FILENAME, MARKER_FILENAME + ".tmp"):
            with open(item, "rb") as stream:
                os.fsync(stream.fileno())
            files[item.relative_to(directory).as_posix()] = item.stat().st_size
    marker = directory / MARKER_FILENAME
    tmp = directory / (MARKER_FILENAME + ".tmp")
    try:
        with open(tmp, "w") as stream:
            json.dump({"format": MARKER_FORMAT, **info, "files": files}, stream, indent=1)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, marker)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    return marker


def finish_directory(staging: str | os.PathLike, final: str | os.PathLike, **info: Any) -> Path:
    """Mark the written ``staging`` directory complete and :func:`publish` it as ``final``. Call on
    one process once every process has written its part. When the marker cannot be written (a
    full disk, a failed fsync) ``staging``, :func:`begin_directory`'s copy, is removed, as a
    failed file write removes its temporary file, and the error names ``final`` and ``staging``;
    once it is marked, a failed publish leaves it, the newest complete checkpoint, for
    :func:`latest_complete_checkpoint`."""
    staging = Path(staging)
    try:
        mark_complete(staging, **info)
    except BaseException as error:  # no marker: never published, and as large as a checkpoint
        if staging == staging_path(final):  # begin_directory's copy: the library's to remove
            with contextlib.suppress(OSError):
                _remove(staging)
            _remove_if_empty(staging.parent)
        _name_the_path(error, f"while writing the checkpoint {final} (at its temporary name {staging})")
        raise
    _pause_before_publishing(staging)
    return publish(staging, final)


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, **info: Any) -> Iterator[Path]:
    """``with atomic_directory(path) as tmp:`` write the checkpoint's files into ``tmp``; on a clean
    exit it is marked complete and made visible as ``path`` (one process). When the body raises,
    ``tmp`` is removed; ``info`` that the marker cannot hold raises TypeError before anything is written."""
    _check_info(info, Path(final))
    staging = begin_directory(final)
    try:
        yield staging
    except BaseException:
        _remove(staging)
        _remove_if_empty(staging.parent)
        raise
    finish_directory(staging, final, **info)


def remove_checkpoint(path: str | os.PathLike) -> None:
    """Remove the checkpoint ``path`` (file or directory), its temporary and retired copies, and
    the temporary files of writes that died (not those of writes under way)."""
    path = Path(path)
    for item in (path, staging_path(path), retired_path(path)):
        _remove(item)
    _remove_abandoned_files(path)
    _remove_if_empty(staging_path(path).parent)
    _remove_if_empty(retired_path(path).parent)


# --------------------------------------------------------------------------- reading


def incomplete_reason(path: str | os.PathLike) -> str | None:
    """None when ``path`` is a complete checkpoint: a file (files are renamed into place whole) or
    a directory whose completion marker lists files that are all there with their sizes;
    otherwise why not."""
    path = Path(path)
    if not path.exists():
        if path.is_symlink():  # e.g. ModelCheckpoint(save_last="link") whose target top-k file was removed
            return f"a symbolic link to {os.readlink(path)}, which does not exist"
        return "it does not exist"
    if not path.is_dir():
        return None
    marker = path / MARKER_FILENAME
    if not marker.is_file():
        return (f"a directory without the completion marker {MARKER_FILENAME} (its write did not finish, or it "
                "was written before mlloss.checkpointing)")
    try:
        record = json.loads(marker.read_text())
        files = dict(record["files"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"its completion marker {marker} is not readable ({error})"
    for name, size in files.items():
        item = path / name
        if not item.is_file():
            return f"its completion marker lists {name}, which is missing"
        if item.stat().st_size != size:
            return f"its completion marker lists {name} with {size} bytes, which has {item.stat().st_size}"
    return None


def _global_rank() -> int:
    """This process's global rank: ``torch.distributed``'s once a process group is up; before that
    (a resolver runs before ``Trainer.fit`` starts one) the first of :data:`RANK_ENV_VARS` that a
    launcher set (torchrun sets ``RANK``; Lightning's launcher ``LOCAL_RANK``), else 0."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    for name in RANK_ENV_VARS:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _print_rank_zero(text: str) -> None:
    if _global_rank() == 0:
        print(text, flush=True)


def latest_complete_checkpoint(
    directory: str | os.PathLike, name: str = "last.ckpt", report: Optional[Callable[[str], None]] = None
) -> Path | None:
    """The newest complete checkpoint named ``name`` in ``directory``, or None (also when
    ``directory`` does not exist yet: a first run; NotADirectoryError when it is a file;
    ValueError when it is named ``.partial`` or ``.old``, :func:`_check_folder_name`).

    In order: ``.partial/<name>`` when it is a complete directory (killed after its marker, before
    the swap: newer than ``<name>``), ``<name>``, then ``.old/<name>`` (killed between the two
    renames of the swap). Every candidate passed over, and every temporary file of a write
    (never used), is reported (``report``, by default printed on global rank 0):
    ``"skipped <path>: <why>"``.
    """
    if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
        raise ValueError(f"latest_complete_checkpoint: name must be the file name of the checkpoints in directory "
                         f"(such as 'last.ckpt'; a folder goes in directory); got name={name!r}")
    if Path(directory).exists() and not Path(directory).is_dir():
        raise NotADirectoryError(f"latest_complete_checkpoint: directory {str(directory)!r} is a file, not the folder "
                                 f"of the checkpoints (pass its folder, and name= for a name other than {name})")
    report = _print_rank_zero if report is None else report
    final = Path(directory) / name
    _check_folder_name(final)
    unfinished = f"a checkpoint file whose write did not finish (it is renamed to {final} when it is complete)"
    for temporary in _temporary_files(final):
        report(f"skipped {temporary}: {unfinished}")
    for candidate in (staging_path(final), final, retired_path(final)):
        if not (candidate.exists() or candidate.is_symlink()):
            continue
        if candidate == staging_path(final) and not candidate.is_dir():  # left by mlloss < temporary names
            report(f"skipped {candidate}: {unfinished}")
            continue
        reason = incomplete_reason(candidate)
        if reason is not None:
            report(f"skipped {candidate}: {reason}")
            continue
        return candidate
    return None


def finish_interrupted_publish(path: str | os.PathLike, report: Optional[Callable[[str], None]] = None) -> Path:
    """After loading ``path``, a staging or retired copy that :func:`latest_complete_checkpoint`
    returned, finish the swap that a crash interrupted: move it to its visible name (a complete
    staging copy replaces the older visible one; a retired copy returns only where nothing is
    visible). Returns the visible name; any other path is returned unchanged. One process."""
    path = Path(path)
    final = _final_of(path)
    if final is None or not path.exists():
        return path
    report = _print_rank_zero if report is None else report
    if path.parent.name == STAGING_DIRNAME:
        if not path.is_dir() or incomplete_reason(path) is not None:
            return path
        publish(path, final)
    elif final.exists():
        return path
    else:
        os.replace(path, final)
        _fsync_directory(final.parent)
        _remove_if_empty(path.parent)
    report(f"finished the interrupted write of {final} (moved {path} there)")
    return final
