"""Loaders for the real Ali-CCP and AliExpress click/conversion logs, as ImpressionData (``impressions.py``).

Both data sets come in the preprocessed CSV layout of torch-rechub's multi-task examples: a
header line, comma-separated values, sparse fields already label-encoded to 0, 1, 2, ...

* Ali-CCP (Alibaba Click and Conversion Prediction; Ma et al., "Entire Space Multi-Task
  Model", SIGIR 2018): files ``*train*.csv``, ``*val*.csv`` and ``*test*.csv`` with the labels
  ``click`` and ``purchase``, 23 sparse fields named by the data set's feature ids (``101``
  user id, ``205`` item id, ``206`` item category, ...) and 8 dense ``D*`` fields. The groups
  (for GAUC) are the users, field ``101``.
* AliExpress (search impressions): files ``*train*.csv`` and ``*test*.csv`` with the labels
  ``click`` and ``conversion`` (loaded as ``purchase``), 16 sparse ``categorical_*`` fields, 63
  dense ``numerical_*`` fields and the ``search_id`` of each impression's search, which is the
  group (it is not a feature: test searches are new searches). There is no validation file,
  so whole searches of the training file are held out as validation (``val_fraction``).

All splits of a data set share their ``cardinalities`` (max id + 1 over every split), so one
embedding table covers train, validation and test. ``timestamp`` is a row's position in its
file divided by the file's number of rows; ``p_click`` and ``p_purchase`` are None.

Reading: numpy's C parser reads each file with one dtype per column (int64 ids and labels,
float32 dense values, a one-character placeholder for the columns not used), every row with as
many fields as the header. When it rejects a file, or a value fails the checks (ids >= 0, labels
0 or 1, finite dense values), the file is read again with the ``csv`` module to name the
file, the 1-based line number and the column of the first bad value (or the row's number of
fields); that slower pass only runs on the error path. The files are UTF-8 text (a byte-order
mark allowed): a byte that is not is a ValueError naming the file, line and byte.
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from mlloss.data.impressions import ImpressionData

__all__ = [
    "ALI_CCP_SPARSE_FIELDS",
    "ALI_CCP_DENSE_FEATURES",
    "ALIEXPRESS_SPARSE_FIELDS",
    "ALIEXPRESS_DENSE_FEATURES",
    "load_ali_ccp",
    "load_aliexpress",
]

ALI_CCP_SPARSE_FIELDS: tuple[str, ...] = (
    "101", "121", "122", "124", "125", "126", "127", "128", "129",  # user: id, profile
    "205", "206", "207", "210", "216",  # item: id, category, shop, intention node, brand
    "508", "509", "702", "853",  # user-item combinations
    "301",  # scenario (position)
    "109_14", "110_14", "127_14", "150_14",  # user behaviour over 14 days
)
ALI_CCP_DENSE_FEATURES: tuple[str, ...] = (
    "D109_14", "D110_14", "D127_14", "D150_14", "D508", "D509", "D702", "D853",
)
ALIEXPRESS_SPARSE_FIELDS: tuple[str, ...] = tuple(f"categorical_{i}" for i in range(1, 17))
ALIEXPRESS_DENSE_FEATURES: tuple[str, ...] = tuple(f"numerical_{i}" for i in range(1, 64))

PathLike = str | os.PathLike
Splits = tuple[ImpressionData, ImpressionData, ImpressionData]
ColumnKind = Literal["id", "label", "dense"]
# How each kind of column is stored (None: a column the loader does not read).
_DTYPES = {"id": np.int64, "label": np.int64, "dense": np.float32, None: "U1"}
_INT64_MAX = int(np.iinfo(np.int64).max)


@dataclass(frozen=True)
class _Layout:
    """The columns of one data set's CSV files and how they map onto ImpressionData."""

    name: str
    file_prefix: str  # of the torch-rechub file names, e.g. ali_ccp_train_sample.csv
    sparse_fields: tuple[str, ...]
    dense_features: tuple[str, ...]
    click: str
    purchase: str
    group: str
    item_field: str | None

    def columns(self) -> dict[str, ColumnKind]:
        """Every column the loader reads, with its kind (the group may also be a sparse field)."""
        kinds: dict[str, ColumnKind] = {name: "id" for name in (self.group, *self.sparse_fields)}
        kinds.update({name: "dense" for name in self.dense_features})
        kinds.update({self.click: "label", self.purchase: "label"})
        return kinds


_ALI_CCP = _Layout(
    name="Ali-CCP",
    file_prefix="ali_ccp",
    sparse_fields=ALI_CCP_SPARSE_FIELDS,
    dense_features=ALI_CCP_DENSE_FEATURES,
    click="click",
    purchase="purchase",
    group="101",
    item_field="205",
)
_ALIEXPRESS = _Layout(
    name="AliExpress",
    file_prefix="aliexpress",
    sparse_fields=ALIEXPRESS_SPARSE_FIELDS,
    dense_features=ALIEXPRESS_DENSE_FEATURES,
    click="click",
    purchase="conversion",
    group="search_id",
    item_field=None,
)


def load_ali_ccp(
    directory: PathLike | None = None,
    *,
    train: PathLike | None = None,
    val: PathLike | None = None,
    test: PathLike | None = None,
) -> Splits:
    """Load the Ali-CCP train, validation and test files as ``(train, val, test)``.

    Args:
        directory: a folder holding exactly one ``*train*.csv``, one ``*val*.csv`` and one
            ``*test*.csv`` (e.g. ``ali_ccp_train_sample.csv`` or torch-rechub's full
            ``ali_ccp_train.csv``).
        train, val, test: the files themselves; each one given replaces the directory lookup.

    ``user`` is field ``101`` and ``item_field`` is ``"205"`` (the item id in the data set's
    feature list). Extra columns are ignored; ``purchase`` implying ``click`` is not checked.

    Raises:
        FileNotFoundError: a file or the directory does not exist, or no file matches.
        ValueError: several files match a split, a column is missing (the message shows the
            header line's fields) or named twice, the file is empty, a value is bad (the message
            names the file, line and column), or the file is not UTF-8 text (the message names
            the file, line and byte).
    """
    paths = _resolve_paths(_ALI_CCP, directory, {"train": train, "val": val, "test": test})
    tables = {split: _read_table(path, _ALI_CCP) for split, path in paths.items()}
    cardinalities = _shared_cardinalities(_ALI_CCP, tables.values())
    return (
        _to_impressions(_ALI_CCP, tables["train"], cardinalities),
        _to_impressions(_ALI_CCP, tables["val"], cardinalities),
        _to_impressions(_ALI_CCP, tables["test"], cardinalities),
    )


def load_aliexpress(
    directory: PathLike | None = None,
    *,
    train: PathLike | None = None,
    test: PathLike | None = None,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> Splits:
    """Load the AliExpress train and test files as ``(train, val, test)``.

    Args:
        directory: a folder holding exactly one ``*train*.csv`` and one ``*test*.csv``.
        train, test: the files themselves; each one given replaces the directory lookup.
        val_fraction: the share of the training file's distinct ``search_id`` values held
            out, whole, as validation: ``round(val_fraction * G)`` of the G searches, at
            least 1 and at most G - 1.
        seed: seeds the permutation of the sorted search ids that picks the held-out ones;
            the same files, fraction and seed give the same split.

    ``user`` is ``search_id`` (not a sparse field), ``purchase`` is ``conversion`` and
    ``item_field`` is None (no column is an item id). The validation rows keep their
    ``timestamp`` (position in the training file).

    Raises:
        ValueError: ``val_fraction`` is not in (0, 1), the training file has fewer than two
            searches, or as for :func:`load_ali_ccp`.
        FileNotFoundError: as for :func:`load_ali_ccp`.
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1); got {val_fraction}")
    paths = _resolve_paths(_ALIEXPRESS, directory, {"train": train, "test": test})
    tables = {split: _read_table(path, _ALIEXPRESS) for split, path in paths.items()}
    cardinalities = _shared_cardinalities(_ALIEXPRESS, tables.values())
    train_file = _to_impressions(_ALIEXPRESS, tables["train"], cardinalities)
    held_out = _held_out_groups(train_file.user, val_fraction, seed, paths["train"])
    return (
        train_file.subset(~held_out),
        train_file.subset(held_out),
        _to_impressions(_ALIEXPRESS, tables["test"], cardinalities),
    )


def _resolve_paths(
    layout: _Layout, directory: PathLike | None, given: Mapping[str, PathLike | None]
) -> dict[str, Path]:
    """The file of each split: the one given, else the one found in ``directory``."""
    paths = {}
    for split, path in given.items():
        if path is not None:
            paths[split] = Path(path)
        elif directory is None:
            raise TypeError(f"load_{layout.file_prefix}() needs a directory or the {split} file ({split}=...)")
        else:
            paths[split] = _find_split_file(layout, Path(directory), split)
        if not paths[split].is_file():
            raise FileNotFoundError(
                f"{layout.name} {split} file not found: {paths[split]} (expected a CSV in torch-rechub's "
                f"layout with columns {layout.click}, {layout.purchase}, {layout.group}, ...)"
            )
    return paths


def _find_split_file(layout: _Layout, directory: Path, split: str) -> Path:
    """The single ``*<split>*.csv`` file in ``directory``."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{layout.name} data directory not found: {directory}")
    pattern = f"*{split}*.csv"
    matches = sorted(directory.glob(pattern))
    if not matches:
        raise FileNotFoundError(
            f"no {layout.name} {split} file ({pattern}) in {directory}; expected e.g. "
            f"{layout.file_prefix}_{split}_sample.csv"
        )
    if len(matches) > 1:
        names = ", ".join(match.name for match in matches)
        raise ValueError(f"{len(matches)} files match {pattern} in {directory} ({names}): pass {split}=<file>")
    return matches[0]


def _read_table(path: Path, layout: _Layout) -> dict[str, np.ndarray]:
    """The layout's columns of one CSV file as contiguous numpy arrays, checked."""
    try:
        return _read_utf8_table(path, layout)
    except UnicodeDecodeError:  # from the header read, numpy or the csv pass, whichever reads the byte first
        raise _encoding_error(path) from None


def _encoding_error(path: Path) -> ValueError:
    """A ValueError naming the line and the byte of the first non-UTF-8 byte of ``path``."""
    with path.open("rb") as file:
        for line_number, line in enumerate(file, start=1):  # b"\n" is never part of a UTF-8 multi-byte character
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                return ValueError(f"{path}, line {line_number}: not UTF-8 text (byte {error.start + 1} of the line, "
                                  f"{line[error.start]:#04x}: {error.reason}); save the file as UTF-8")
    return ValueError(f"{path}: not UTF-8 text; save the file as UTF-8")


def _read_utf8_table(path: Path, layout: _Layout) -> dict[str, np.ndarray]:
    """:func:`_read_table` of a UTF-8 file (UnicodeDecodeError otherwise)."""
    columns = layout.columns()
    header = _read_header(path)
    _check_header(path, header, columns, layout)
    # Every field is read (the unused ones as one character, a cheap placeholder), so that numpy
    # rejects a row with a field too many, which with usecols it would read shifted.
    kinds = {header.index(name): kind for name, kind in columns.items()}
    dtype = np.dtype([(f"f{i}", _DTYPES[kinds.get(i)]) for i in range(len(header))])
    try:
        # NumPy 1.23-2.2 read "1.5" into an integer column as 1, with a DeprecationWarning (later
        # versions raise): as an error, it names the cell below like any other bad value.
        with warnings.catch_warnings():
            warnings.filterwarnings("error", category=DeprecationWarning)
            rows = np.loadtxt(
                path,
                dtype=dtype,
                delimiter=",",
                quotechar='"',
                comments=None,
                skiprows=1,
                ndmin=1,
                encoding="utf-8",
            )
    except (ValueError, DeprecationWarning) as error:
        raise _bad_value_error(path, header, columns, numpy_message=str(error)) from None
    table = {name: np.ascontiguousarray(rows[f"f{header.index(name)}"]) for name in columns}
    if not all(_all_valid(table[name], kind) for name, kind in columns.items()):
        raise _bad_value_error(path, header, columns, numpy_message="a value failed the checks")
    return table


def _read_header(path: Path) -> list[str]:
    """The column names of the header line; ValueError if there is no header or no data row."""
    with path.open(newline="", encoding="utf-8-sig") as file:
        reader = csv.reader(file)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path} is empty: expected a header line and data rows")
        if not any(row for row in reader):
            raise ValueError(f"{path} has a header but no data rows")
    return [name.strip() for name in header]


def _check_header(path: Path, header: list[str], columns: Mapping[str, ColumnKind], layout: _Layout) -> None:
    """Every column the loader reads is in the header exactly once."""
    missing = [name for name in columns if name not in header]
    if missing:
        shown = ", ".join(repr(name) for name in header[:5]) + (", ..." if len(header) > 5 else "")
        raise ValueError(
            f"{path}: missing column(s) {', '.join(map(repr, missing))} of the {layout.name} layout; the header line "
            f"has {len(header)} comma-separated field(s): {shown or 'none'}"
        )
    for name in columns:
        if header.count(name) > 1:
            fields = ", ".join(str(i + 1) for i, field in enumerate(header) if field == name)
            raise ValueError(f"{path}: column {name!r} appears {header.count(name)} times in the header (fields "
                             f"{fields}); which one to read is ambiguous: rename or drop the others")


def _all_valid(values: np.ndarray, kind: ColumnKind) -> bool:
    if kind == "id":
        return bool((values >= 0).all())
    if kind == "label":
        return bool(((values == 0) | (values == 1)).all())
    return bool(np.isfinite(values).all())


def _bad_value_error(
    path: Path, header: list[str], columns: Mapping[str, ColumnKind], numpy_message: str
) -> ValueError:
    """A ValueError naming the first bad row (1-based line number) and column, found by reading
    the file again with the csv module; numpy's message if that pass finds nothing wrong."""
    position = {name: header.index(name) for name in columns}
    with path.open(newline="", encoding="utf-8-sig") as file:
        reader = csv.reader(file)
        next(reader)  # the header
        for row in reader:
            if not row:  # a blank line; numpy skips these too
                continue
            if len(row) != len(header):
                return ValueError(f"{path}, line {reader.line_num}: {len(row)} fields, the header has {len(header)}")
            for name, kind in columns.items():
                problem = _value_problem(row[position[name]], kind)
                if problem is not None:
                    return ValueError(f"{path}, line {reader.line_num}, column {name!r}: {problem}")
    return ValueError(f"{path}: {numpy_message}")


def _value_problem(raw: str, kind: ColumnKind) -> str | None:
    """Why one CSV cell is not a valid value of its kind, or None if it is one; ids are stored as
    int64 and dense values as float32, so a value out of their range is a problem too."""
    if "_" in raw or not raw.isascii():  # Python's int() and float() read 1_000 and non-ASCII digits, numpy does not
        return f"{raw!r} is not a number" if kind == "dense" else _integer_problem(raw, None, kind)
    if kind == "dense":
        try:
            value = float(raw)
        except ValueError:
            return f"{raw!r} is not a number"
        if not math.isfinite(value):
            return f"{raw!r} is not a finite number"
        with np.errstate(over="ignore"):
            return None if np.isfinite(np.float32(value)) else f"{raw!r} overflows float32, which dense values are stored in"
    try:
        integer: int | None = int(raw)
    except ValueError:
        integer = None
    return _integer_problem(raw, integer, kind)


def _integer_problem(raw: str, integer: int | None, kind: ColumnKind) -> str | None:
    """Why the cell ``raw``, read as ``integer`` (None: not an integer), is not a valid id or label."""
    if kind == "id":
        if integer is None or integer < 0:
            return f"{raw!r} is not a non-negative integer id"
        if integer > _INT64_MAX:
            return f"{raw!r} is larger than the largest int64 id ({_INT64_MAX})"
    if kind == "label" and integer not in (0, 1):
        return f"{raw!r} is not a 0/1 label"
    return None


def _shared_cardinalities(layout: _Layout, tables: Iterable[dict[str, np.ndarray]]) -> tuple[int, ...]:
    """Max id + 1 of each sparse field over all splits, so that one embedding table covers them."""
    tables = list(tables)
    return tuple(max(int(table[name].max()) for table in tables) + 1 for name in layout.sparse_fields)


def _to_impressions(layout: _Layout, table: dict[str, np.ndarray], cardinalities: tuple[int, ...]) -> ImpressionData:
    num_rows = len(table[layout.click])
    return ImpressionData(
        sparse=torch.from_numpy(np.stack([table[name] for name in layout.sparse_fields], axis=1)),
        dense=torch.from_numpy(np.stack([table[name] for name in layout.dense_features], axis=1)),
        click=torch.from_numpy(table[layout.click]).float(),
        purchase=torch.from_numpy(table[layout.purchase]).float(),
        user=torch.from_numpy(table[layout.group]),
        timestamp=_row_positions(num_rows),
        field_names=layout.sparse_fields,
        cardinalities=cardinalities,
        dense_names=layout.dense_features,
        item_field=layout.item_field,
    )


def _row_positions(num_rows: int) -> Tensor:
    """i / num_rows for row i, as float32 kept below 1 (float32 rounds (n - 1) / n up to 1
    once n exceeds 2**24)."""
    positions = torch.arange(num_rows, dtype=torch.float64) / num_rows
    return positions.float().clamp_max(1 - 2**-24)


def _held_out_groups(groups: Tensor, val_fraction: float, seed: int, path: Path) -> Tensor:
    """Mask of the rows whose group is held out: ``round(val_fraction * G)`` of the G distinct
    groups (at least 1, at most G - 1), taken from a seeded permutation of the sorted ids."""
    distinct = torch.unique(groups)
    if len(distinct) < 2:
        raise ValueError(
            f"{path}: {len(distinct)} distinct search_id; at least 2 are needed to hold out whole "
            "searches as validation"
        )
    num_held_out = min(max(round(val_fraction * len(distinct)), 1), len(distinct) - 1)
    order = torch.randperm(len(distinct), generator=torch.Generator().manual_seed(seed))
    return torch.isin(groups, distinct[order[:num_held_out]])
