"""Tests of the real-data loaders (mlloss.data.tabular) on the shared Ali-CCP and AliExpress
samples, and of their error messages on small files written to tmp_path."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlloss.data import (
    ALI_CCP_DENSE_FEATURES,
    ALI_CCP_SPARSE_FIELDS,
    ALIEXPRESS_DENSE_FEATURES,
    ALIEXPRESS_SPARSE_FIELDS,
    ImpressionData,
    SyntheticConfig,
    generate_impressions,
    load_ali_ccp,
    load_aliexpress,
)

# The repository is cloned next to shared/, which holds the data (see shared/data/README.md).
SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ALI_CCP_DIR = SHARED_DATA / "ali-ccp-sample"
ALIEXPRESS_DIR = SHARED_DATA / "aliexpress-sample"
needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"shared data folder not found at {SHARED_DATA} (clone the repo next to shared/)"
)

ALI_CCP_HEADER = ["click", "purchase", *ALI_CCP_SPARSE_FIELDS, *ALI_CCP_DENSE_FEATURES]


def _csv_column(path: Path, column: str) -> list[str]:
    """One column of a CSV file read with the csv module: an independent reference."""
    with path.open(newline="") as file:
        return [row[column] for row in csv.DictReader(file)]


def _check_ids_within_cardinalities(*splits: ImpressionData) -> None:
    cardinalities = torch.tensor(splits[0].cardinalities)
    for split in splits:
        assert split.cardinalities == splits[0].cardinalities
        assert bool((split.sparse >= 0).all()) and bool((split.sparse < cardinalities).all())
    # Shared: max id + 1 over all splits, so every field's largest id is used somewhere.
    largest = torch.stack([split.sparse.max(0).values for split in splits]).max(0).values
    assert torch.equal(largest + 1, cardinalities)


# --------------------------------------------------------------------------- Ali-CCP sample


@needs_shared_data
def test_ali_ccp_sample_shapes_labels_and_groups():
    train, val, test = load_ali_ccp(ALI_CCP_DIR)
    for split, rows in ((train, 100), (val, 50), (test, 50)):
        assert len(split) == rows
        assert split.sparse.shape == (rows, 23) and split.sparse.dtype == torch.long
        assert split.dense.shape == (rows, 8) and split.dense.dtype == torch.float32
        assert split.labels.shape == (rows, 2) and split.labels.dtype == torch.float32
        assert split.field_names == ALI_CCP_SPARSE_FIELDS and split.dense_names == ALI_CCP_DENSE_FEATURES
        assert split.item_field == "205" and split.p_click is None and split.p_purchase is None
        assert torch.equal(split.user, split.sparse[:, split.field_names.index("101")])
        assert split.user.unique().tolist() == [1]  # one user in these samples (README)
        assert float(split.timestamp.min()) == 0.0 and float(split.timestamp.max()) < 1.0
        assert bool((split.timestamp.diff() > 0).all())
    assert train.click.mean().item() == pytest.approx(0.07)  # README: click 0.07, purchase 0.01
    assert train.purchase.mean().item() == pytest.approx(0.01)
    assert (val.click.sum().item(), val.purchase.sum().item()) == (3, 1)
    assert (test.click.sum().item(), test.purchase.sum().item()) == (2, 1)
    _check_ids_within_cardinalities(train, val, test)
    assert train.cardinalities[ALI_CCP_SPARSE_FIELDS.index("205")] == 120  # its largest id, 119, is in val


@needs_shared_data
def test_ali_ccp_values_match_the_csv_module():
    train, _, _ = load_ali_ccp(ALI_CCP_DIR)
    path = ALI_CCP_DIR / "ali_ccp_train_sample.csv"
    for field in ("101", "205", "853"):
        expected = [int(v) for v in _csv_column(path, field)]
        assert train.sparse[:, ALI_CCP_SPARSE_FIELDS.index(field)].tolist() == expected
    expected_dense = torch.tensor([float(v) for v in _csv_column(path, "D508")])
    assert torch.equal(train.dense[:, ALI_CCP_DENSE_FEATURES.index("D508")], expected_dense)
    assert train.purchase.tolist() == [float(v) for v in _csv_column(path, "purchase")]


@needs_shared_data
def test_ali_ccp_explicit_files_equal_the_directory_lookup():
    by_directory = load_ali_ccp(ALI_CCP_DIR)
    by_file = load_ali_ccp(
        train=ALI_CCP_DIR / "ali_ccp_train_sample.csv",
        val=str(ALI_CCP_DIR / "ali_ccp_val_sample.csv"),
        test=ALI_CCP_DIR / "ali_ccp_test_sample.csv",
    )
    for a, b in zip(by_directory, by_file):
        assert torch.equal(a.sparse, b.sparse) and torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)


@needs_shared_data
def test_real_data_subset_keeps_missing_probabilities_none():
    train, _, _ = load_ali_ccp(ALI_CCP_DIR)
    part = train.subset(train.click == 1)
    assert len(part) == 7 and part.p_click is None and part.p_purchase is None
    assert part.cardinalities == train.cardinalities and part.item_field == "205"


# --------------------------------------------------------------------------- AliExpress sample


@needs_shared_data
def test_aliexpress_sample_shapes_labels_and_groups():
    train, val, test = load_aliexpress(ALIEXPRESS_DIR)
    assert len(train) + len(val) == 100 and len(test) == 20
    for split in (train, val, test):
        assert split.sparse.shape == (len(split), 16) and split.dense.shape == (len(split), 63)
        assert split.field_names == ALIEXPRESS_SPARSE_FIELDS and split.dense_names == ALIEXPRESS_DENSE_FEATURES
        assert split.item_field is None and split.p_click is None
    train_file = ALIEXPRESS_DIR / "aliexpress_train_sample.csv"
    search_ids = [int(v) for v in _csv_column(train_file, "search_id")]
    assert len(set(search_ids)) == 41  # README
    assert sorted(torch.cat([train.user, val.user]).tolist()) == sorted(search_ids)
    assert test.user.unique().numel() == 10
    # README rates over the whole training file: click 0.60, conversion 0.02.
    labels = torch.cat([train.labels, val.labels])
    assert labels.mean(0).tolist() == pytest.approx([0.60, 0.02])
    assert test.labels.mean(0).tolist() == pytest.approx([0.5, 0.1])
    _check_ids_within_cardinalities(train, val, test)


@needs_shared_data
def test_aliexpress_validation_is_whole_searches_and_deterministic():
    train, val, _ = load_aliexpress(ALIEXPRESS_DIR)
    train_groups, val_groups = set(train.user.tolist()), set(val.user.tolist())
    assert not train_groups & val_groups
    assert len(val_groups) == round(0.1 * 41)
    # Validation rows keep their position in the training file; together the two cover it.
    positions = torch.cat([train.timestamp, val.timestamp]).sort().values
    assert torch.equal(positions, torch.arange(100, dtype=torch.float64).div(100).float())
    again = load_aliexpress(ALIEXPRESS_DIR)[1]
    assert torch.equal(again.user, val.user) and torch.equal(again.sparse, val.sparse)
    other_seed = load_aliexpress(ALIEXPRESS_DIR, seed=1)[1]
    assert set(other_seed.user.tolist()) != val_groups
    larger = load_aliexpress(ALIEXPRESS_DIR, val_fraction=0.5)[1]
    assert len(set(larger.user.tolist())) == round(0.5 * 41)


@pytest.mark.parametrize("val_fraction", [0.0, 1.0, -0.1, 1.5])
def test_aliexpress_rejects_a_val_fraction_outside_0_1(val_fraction):
    with pytest.raises(ValueError, match=r"val_fraction must be in \(0, 1\)"):
        load_aliexpress(ALIEXPRESS_DIR, val_fraction=val_fraction)


def test_aliexpress_needs_two_searches_to_hold_one_out(tmp_path):
    header = ["search_id", *ALIEXPRESS_SPARSE_FIELDS, *ALIEXPRESS_DENSE_FEATURES, "click", "conversion"]
    row = ["7"] + ["0"] * 16 + ["0.5"] * 63 + ["1", "0"]
    for split in ("train", "test"):
        _write_csv(tmp_path / f"aliexpress_{split}.csv", header, [row, row])
    with pytest.raises(ValueError, match="1 distinct search_id"):
        load_aliexpress(tmp_path)


# --------------------------------------------------------------------------- errors


def _ali_ccp_row(index: int) -> list[str]:
    return [str(index % 2), "0", *(str(index) for _ in ALI_CCP_SPARSE_FIELDS), *("0.25" for _ in ALI_CCP_DENSE_FEATURES)]


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    path.write_text("\n".join(",".join(line) for line in [header, *rows]) + "\n", encoding="utf-8")
    return path


def _write_ali_ccp(directory: Path, rows: int = 4) -> dict[str, Path]:
    """A valid three-split Ali-CCP folder of tiny files."""
    return {
        split: _write_csv(directory / f"ali_ccp_{split}.csv", ALI_CCP_HEADER, [_ali_ccp_row(i) for i in range(rows)])
        for split in ("train", "val", "test")
    }


def test_tiny_ali_ccp_folder_loads(tmp_path):
    _write_ali_ccp(tmp_path)
    train, val, test = load_ali_ccp(tmp_path)
    assert len(train) == len(val) == len(test) == 4
    assert train.cardinalities == (4,) * 23 and train.click.tolist() == [0, 1, 0, 1]


def test_missing_file_names_the_path_and_what_it_should_be(tmp_path):
    paths = _write_ali_ccp(tmp_path)
    absent = tmp_path / "nowhere" / "ali_ccp_val.csv"
    with pytest.raises(FileNotFoundError, match=r"Ali-CCP val file not found: .*nowhere.*columns click, purchase, 101"):
        load_ali_ccp(train=paths["train"], val=absent, test=paths["test"])
    paths["test"].unlink()
    with pytest.raises(FileNotFoundError, match=r"no Ali-CCP test file \(\*test\*\.csv\) in .*ali_ccp_test_sample\.csv"):
        load_ali_ccp(tmp_path)
    with pytest.raises(FileNotFoundError, match="AliExpress data directory not found: .*missing-dir"):
        load_aliexpress(tmp_path / "missing-dir")
    with pytest.raises(TypeError, match=r"needs a directory or the test file \(test=\.\.\.\)"):
        load_ali_ccp(train=paths["train"], val=paths["val"])


def test_several_matching_files_are_ambiguous(tmp_path):
    _write_ali_ccp(tmp_path)
    _write_csv(tmp_path / "ali_ccp_train_sample.csv", ALI_CCP_HEADER, [_ali_ccp_row(0)])
    with pytest.raises(ValueError, match=r"2 files match \*train\*\.csv .*ali_ccp_train\.csv, ali_ccp_train_sample\.csv"):
        load_ali_ccp(tmp_path)


def test_missing_columns_are_named_with_the_file(tmp_path):
    paths = _write_ali_ccp(tmp_path)
    keep = [i for i, name in enumerate(ALI_CCP_HEADER) if name not in ("205", "D508")]
    rows = [[row[i] for i in keep] for row in (_ali_ccp_row(0), _ali_ccp_row(1))]
    _write_csv(paths["val"], [ALI_CCP_HEADER[i] for i in keep], rows)
    with pytest.raises(ValueError, match=r"ali_ccp_val\.csv: missing column\(s\) '205', 'D508' of the Ali-CCP layout"):
        load_ali_ccp(tmp_path)


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("205", "abc", "'abc' is not a non-negative integer id"),
        ("205", "-3", "'-3' is not a non-negative integer id"),
        ("205", "1.5", "'1.5' is not a non-negative integer id"),
        ("101", "nan", "'nan' is not a non-negative integer id"),
        ("click", "2", "'2' is not a 0/1 label"),
        ("purchase", "", "'' is not a 0/1 label"),
        ("D508", "nan", "'nan' is not a finite number"),
        ("D853", "inf", "'inf' is not a finite number"),
        ("D853", "x", "'x' is not a number"),
        # out of the range of the int64 / float32 arrays the values are stored in (numpy's message,
        # naming a 0-based row among the read columns, came through)
        ("205", str(2**63), f"'{2**63}' is larger than the largest int64 id ({2**63 - 1})"),
        ("D508", "1e39", "'1e39' overflows float32, which dense values are stored in"),
        ("D508", "-1e39", "'-1e39' overflows float32, which dense values are stored in"),
        # Python's int() and float() read these, numpy does not: numpy's message (a 0-based row and a
        # column number, not the line and the column's name) came through
        ("205", "1_000", "'1_000' is not a non-negative integer id"),
        ("D508", "1_000", "'1_000' is not a number"),
        ("101", "\u0663", "'\u0663' is not a non-negative integer id"),  # ARABIC-INDIC DIGIT THREE
        ("click", "\uff11", "'\uff11' is not a 0/1 label"),  # FULLWIDTH DIGIT ONE
    ],
)
def test_bad_value_names_file_line_and_column(tmp_path, column, value, problem):
    paths = _write_ali_ccp(tmp_path)
    rows = [_ali_ccp_row(i) for i in range(4)]
    rows[2][ALI_CCP_HEADER.index(column)] = value  # data row 3 is line 4 (the header is line 1)
    _write_csv(paths["test"], ALI_CCP_HEADER, rows)
    with pytest.raises(ValueError) as error:
        load_ali_ccp(tmp_path)
    assert str(error.value) == f"{paths['test']}, line 4, column {column!r}: {problem}"


def test_a_column_named_twice_is_ambiguous(tmp_path):
    # the first of the two was read, whichever the user meant
    paths = _write_ali_ccp(tmp_path)
    _write_csv(paths["val"], [*ALI_CCP_HEADER, "click"], [[*_ali_ccp_row(i), "1"] for i in range(2)])
    with pytest.raises(ValueError) as error:
        load_ali_ccp(tmp_path)
    assert str(error.value) == (f"{paths['val']}: column 'click' appears 2 times in the header (fields 1, 34); which "
                                "one to read is ambiguous: rename or drop the others")


def test_a_missing_column_error_shows_the_header_it_read(tmp_path):
    # a ;-separated file (as Bank Marketing's) reads as one field: every column was reported missing, not why
    paths = _write_ali_ccp(tmp_path)
    paths["test"].write_text("\n".join(";".join(line) for line in (ALI_CCP_HEADER, _ali_ccp_row(0))) + "\n")
    with pytest.raises(ValueError) as error:
        load_ali_ccp(tmp_path)
    assert str(error.value).startswith(f"{paths['test']}: missing column(s) '101', '121',")
    assert str(error.value).endswith("of the Ali-CCP layout; the header line has 1 comma-separated field(s): "
                                     f"{';'.join(ALI_CCP_HEADER)!r}")


def test_windows_line_endings_quotes_and_a_byte_order_mark_read_the_same_values(tmp_path):
    for folder in ("plain", "windows"):
        (tmp_path / folder).mkdir()
    _write_ali_ccp(tmp_path / "plain")
    plain = load_ali_ccp(tmp_path / "plain")
    lines = [ALI_CCP_HEADER, *(_ali_ccp_row(i) for i in range(4))]
    for split in ("train", "val", "test"):  # every field quoted, CRLF line ends, UTF-8 with a byte-order mark
        text = "\r\n".join(",".join(f'"{field}"' for field in line) for line in lines) + "\r\n"
        (tmp_path / "windows" / f"ali_ccp_{split}.csv").write_bytes(b"\xef\xbb\xbf" + text.encode())
    for ours, reference in zip(load_ali_ccp(tmp_path / "windows"), plain):
        for name in ("sparse", "dense", "click", "purchase", "user", "timestamp"):
            assert torch.equal(getattr(ours, name), getattr(reference, name)), name
        assert ours.cardinalities == reference.cardinalities


def test_line_numbers_count_blank_lines_and_short_rows_are_named(tmp_path):
    paths = _write_ali_ccp(tmp_path)
    lines = [",".join(ALI_CCP_HEADER), ",".join(_ali_ccp_row(0)), "", ",".join(_ali_ccp_row(1)[:-1])]
    paths["train"].write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"ali_ccp_train\.csv, line 4: 32 fields, the header has 33"):
        load_ali_ccp(tmp_path)
    lines[3] = ",".join(_ali_ccp_row(1)).replace(",0.25", ",bad", 1)
    paths["train"].write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"ali_ccp_train\.csv, line 4, column 'D109_14': 'bad' is not a number"):
        load_ali_ccp(tmp_path)


def test_a_row_with_a_field_too_many_is_named(tmp_path):
    # np.loadtxt(usecols=...) read it, every column after the extra field shifted by one
    paths = _write_ali_ccp(tmp_path)
    rows = [_ali_ccp_row(i) for i in range(4)]
    rows[1].insert(3, "7")
    _write_csv(paths["val"], ALI_CCP_HEADER, rows)
    with pytest.raises(ValueError, match=r"ali_ccp_val\.csv, line 3: 34 fields, the header has 33"):
        load_ali_ccp(tmp_path)
    extra = [*ALI_CCP_HEADER[:5], "note", *ALI_CCP_HEADER[5:]]  # a column the loader does not use is still read
    _write_csv(paths["val"], extra, [[*row[:5], '"a, b"', *row[5:]] for row in (_ali_ccp_row(1), _ali_ccp_row(2))])
    val = load_ali_ccp(tmp_path)[1]
    assert val.click.tolist() == [1, 0] and val.sparse[:, 3].tolist() == [1, 2]


@pytest.mark.parametrize("rows", [4, 400])  # the header read meets the byte, or (past its first block) numpy
def test_a_byte_that_is_not_utf8_names_the_file_and_line(tmp_path, rows):
    # a latin-1 "é" in a column the loader does not use: a bare UnicodeDecodeError named neither
    paths = _write_ali_ccp(tmp_path)
    lines = [",".join([*ALI_CCP_HEADER, "comment"]), *(",".join([*_ali_ccp_row(i), "ok"]) for i in range(rows))]
    lines[-1] = lines[-1][: -len("ok")] + "caf\xe9"
    paths["val"].write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    with pytest.raises(ValueError) as error:
        load_ali_ccp(tmp_path)
    position = len(lines[-1].encode("latin-1"))  # 1-based: the last byte of the line
    assert str(error.value) == (f"{paths['val']}, line {rows + 1}: not UTF-8 text (byte {position} of the line, 0xe9: "
                                "invalid continuation byte); save the file as UTF-8")
    paths["val"].write_text("\ufeff" + "\n".join(lines[:-1]) + "\n")  # UTF-8 with a byte-order mark: read
    assert len(load_ali_ccp(tmp_path)[1]) == rows - 1


def test_empty_files_are_rejected(tmp_path):
    paths = _write_ali_ccp(tmp_path)
    paths["val"].write_text("")
    with pytest.raises(ValueError, match=r"ali_ccp_val\.csv is empty: expected a header line and data rows"):
        load_ali_ccp(tmp_path)
    paths["val"].write_text(",".join(ALI_CCP_HEADER) + "\n\n")
    with pytest.raises(ValueError, match=r"ali_ccp_val\.csv has a header but no data rows"):
        load_ali_ccp(tmp_path)


def test_impression_data_rejects_an_unknown_item_field():
    data = ImpressionData(
        sparse=torch.zeros(2, 1, dtype=torch.long),
        dense=torch.zeros(2, 0),
        click=torch.zeros(2),
        purchase=torch.zeros(2),
        user=torch.zeros(2, dtype=torch.long),
        timestamp=torch.zeros(2),
        field_names=("user",),
        cardinalities=(1,),
        dense_names=(),
    )
    assert data.p_click is None and data.item_field is None and len(data.subset(torch.tensor([1]))) == 1
    with pytest.raises(ValueError, match=r"item_field='item' is not one of field_names \('user',\)"):
        ImpressionData(**{**data.__dict__, "item_field": "item"})


def test_impression_data_checks_every_column_against_the_rows():
    # Only sparse was checked: a short click column made len() 3 for 4 rows, and stacking the
    # labels, batching or splitting failed later with torch's messages.
    import torch

    from mlloss.data import ImpressionData

    columns = dict(sparse=torch.zeros(4, 1, dtype=torch.long), dense=torch.zeros(4, 2), click=torch.zeros(4),
                   purchase=torch.zeros(4), user=torch.zeros(4, dtype=torch.long), timestamp=torch.rand(4),
                   field_names=("user",), cardinalities=(1,), dense_names=("a", "b"))
    assert len(ImpressionData(**columns)) == 4
    for bad, words in ((dict(click=torch.zeros(3)), r"click must have shape \(4,\)"),
                       (dict(timestamp=torch.rand(2)), r"timestamp must have shape \(4,\)"),
                       (dict(dense=torch.zeros(4, 5)), r"dense must have shape \(4, 2\) for dense_names"),
                       (dict(user=-torch.ones(4, dtype=torch.long)), "user must hold non-negative ids; got -1")):
        with pytest.raises(ValueError, match=words):
            ImpressionData(**{**columns, **bad})


@pytest.mark.parametrize(("field", "value", "wanted"), [
    ("sparse", torch.tensor([[0.5], [1.5]], dtype=torch.float64), "integer ids of dtype torch.int64"),
    ("sparse", torch.tensor([[0], [1]], dtype=torch.uint8), "integer ids of dtype torch.int64"),
    ("sparse", torch.tensor([[False], [True]]), "integer ids of dtype torch.int64"),
    ("user", torch.tensor([0.0, 1.0]), "integer ids"),
    ("user", torch.tensor([False, True]), "integer ids"),
    ("dense", torch.zeros(2, 1, dtype=torch.long), "a floating-point tensor"),
    ("click", torch.tensor([0, 1]), "a floating-point tensor"),
    ("purchase", torch.tensor([False, True]), "a floating-point tensor"),
    ("timestamp", torch.tensor([0, 1]), "a floating-point tensor"),
    ("p_click", torch.tensor([0, 1]), "a floating-point tensor"),
])
def test_impression_data_checks_the_dtypes_the_models_rely_on(field, value, wanted):
    # fractional ids (float64) passed the range check, and FieldEmbedding(validate_args=False), which
    # relies on it, failed in torch.nn.Embedding with a message naming no field
    columns = dict(sparse=torch.tensor([[0], [1]]), dense=torch.zeros(2, 1), click=torch.tensor([0.0, 1.0]),
                   purchase=torch.zeros(2), user=torch.tensor([0, 1]), timestamp=torch.tensor([0.0, 0.5]),
                   field_names=("item",), cardinalities=(2,), dense_names=("d",))
    assert len(ImpressionData(**columns)) == 2 and len(ImpressionData(**{**columns, "sparse": columns["sparse"].int()}))
    with pytest.raises(TypeError, match=re.escape(f"ImpressionData.{field} must ") + f".*{wanted}.*; got dtype {value.dtype}$"):
        ImpressionData(**{**columns, field: value})


def test_the_loaders_and_the_generator_give_the_documented_dtypes():
    data = generate_impressions(SyntheticConfig(num_users=20))
    loaded = load_ali_ccp(Path(__file__).resolve().parents[1] / "recipes" / "data" / "ali-ccp-sample")
    for split in (data, *loaded):
        assert (split.sparse.dtype, split.user.dtype) == (torch.int64, torch.int64)
        assert {split.dense.dtype, split.click.dtype, split.purchase.dtype, split.timestamp.dtype} == {torch.float32}


# --------------------------------------------------------------------------- synthetic log, package


@pytest.mark.parametrize("interaction_scale", [1.5, 30.0, 100.0])
def test_synthetic_rates_are_exact_whatever_the_interaction_scale(interaction_scale):
    # the intercepts were searched in [-30, 30] only: a scale of 100 gave a click rate of 0.37
    config = SyntheticConfig(num_users=300, interaction_scale=interaction_scale)
    data = generate_impressions(config)
    assert data.p_click.double().mean().item() == pytest.approx(config.click_rate, abs=1e-6)
    assert data.p_purchase.double().mean().item() == pytest.approx(config.purchase_rate, abs=1e-6)


def test_star_import_of_mlloss_data_needs_no_lightning():
    # GroupDataModule was in __all__ although it needs the lightning extra (imported on first use)
    script = (
        "import sys\n"
        "sys.modules['pytorch_lightning'] = sys.modules['lightning'] = None  # not installed\n"
        "from mlloss.data import *\n"
        "assert 'GroupDataModule' not in dir() and 'TensorBatches' in dir()\n"
        "import mlloss.data\n"
        "try:\n"
        "    mlloss.data.GroupDataModule\n"
        "except ImportError as error:\n"
        "    assert 'mlloss[lightning]' in str(error)\n"
        "else:\n"
        "    raise AssertionError('GroupDataModule without Lightning')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
