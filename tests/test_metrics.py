"""Tests of :mod:`mlloss.metrics` against independent brute-force references over all pairs (NumPy, float64)."""

from __future__ import annotations

import contextlib
import datetime
import math
import random
import warnings
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchmetrics import Metric, MetricCollection

from mlloss.metrics import (
    AUC,
    GroupAUC,
    MultiLabelAUC,
    MultipartiteAUC,
    UndefinedMetricWarning,
    aggregate_levels,
    binary_auc,
    group_auc,
    multilabel_auc,
    multipartite_auc,
)
from ranks import ForkedRanks
from triton_interpreter import warnings_as_errors

IGNORE_UNDEFINED = pytest.mark.filterwarnings("ignore::mlloss.metrics.UndefinedMetricWarning")
SEEDS = range(12)
TIED_SCORES = np.array([-1.5, 0.0, 0.25, 1.0, 3.0])


# ----------------------------------------------------------------------------------------------------------------
# Brute-force references: every ordered pair, float64
# ----------------------------------------------------------------------------------------------------------------


def credit_matrix(scores: np.ndarray) -> np.ndarray:
    """h[i, j] = 1[s_i > s_j] + 1/2 1[s_i == s_j]."""
    s = np.asarray(scores, dtype=np.float64)
    return (s[:, None] > s[None, :]) + 0.5 * (s[:, None] == s[None, :])


def ref_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    y = np.asarray(labels)
    pairs = (y[:, None] == 1) & (y[None, :] == 0)
    if not pairs.any():
        return math.nan
    return float((credit_matrix(scores) * pairs).sum() / pairs.sum())


def ref_multipartite(scores: np.ndarray, levels: np.ndarray, cost: str = "linear") -> float:
    y = np.asarray(levels, dtype=np.float64)
    gap = y[:, None] - y[None, :]
    weight = np.where(gap > 0, gap if cost == "linear" else 1.0, 0.0)
    if weight.sum() == 0:
        return math.nan
    return float((credit_matrix(scores) * weight).sum() / weight.sum())


def ref_group_mean(
    metric: Callable[..., float], scores: np.ndarray, target: np.ndarray, groups: np.ndarray, weighting: str
) -> float:
    values, weights = [], []
    for g in np.unique(groups):
        member = groups == g
        value = metric(scores[member], target[member])
        if not math.isnan(value):
            values.append(value)
            weights.append(1.0 if weighting == "uniform" else member.sum())
    return float(np.dot(values, weights) / np.sum(weights)) if values else math.nan


# ----------------------------------------------------------------------------------------------------------------
# Random cases with many ties, singleton and one-class groups
# ----------------------------------------------------------------------------------------------------------------


def random_case(seed: int, max_n: int = 60, k: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores drawn from a small set (many ties), 0/1 labels of K columns, sparse non-contiguous group ids."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, max_n))
    scores = rng.choice(TIED_SCORES, size=n)
    if seed % 3 == 0:  # some continuous scores too
        scores = np.where(rng.random(n) < 0.5, rng.normal(size=n), scores)
    labels = (rng.random((n, k)) < rng.uniform(0.1, 0.9, size=k)).astype(np.int64)
    groups = rng.integers(-3, max(2, n // 3), size=n) * 1_000_003 + 17  # many singletons and one-class groups
    return scores, labels, groups


def random_levels(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1000)
    if seed % 2:
        return rng.integers(0, 4, size=n).astype(np.float64)  # few ordinal levels
    return rng.choice([-2.5, 0.0, 0.125, 1.0, 7.75], size=n)  # arbitrary real levels


def t(x: np.ndarray, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x)).to(dtype)


def assert_close(actual: torch.Tensor, expected: float) -> None:
    assert actual.dtype == torch.float64
    if math.isnan(expected):
        assert torch.isnan(actual), f"expected NaN, got {actual}"
    else:
        assert actual.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Functional metrics against the references
# ----------------------------------------------------------------------------------------------------------------


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", SEEDS)
def test_binary_auc_matches_bruteforce(seed: int) -> None:
    scores, labels, _ = random_case(seed)
    assert_close(binary_auc(t(scores), t(labels[:, 0], torch.long)), ref_auc(scores, labels[:, 0]))


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("weighting", ["uniform", "size"])
def test_group_auc_matches_bruteforce(seed: int, weighting: str) -> None:
    scores, labels, groups = random_case(seed)
    expected = ref_group_mean(ref_auc, scores, labels[:, 0], groups, weighting)
    assert_close(group_auc(t(scores), t(labels[:, 0]), t(groups, torch.long), weighting), expected)


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_group_metrics_take_unsigned_ids(seed: int, dtype: type) -> None:
    # Hashed user ids often come as unsigned numpy arrays; uint64 ids above 2^63 included.
    scores, labels, groups = random_case(seed)
    rank = np.unique(groups, return_inverse=True)[1].astype(np.uint64)  # < 60: fits uint8
    ids = torch.from_numpy((np.uint64(2**64 - 1) - rank) if dtype is np.uint64 else rank.astype(dtype))
    levels = random_levels(seed, len(scores))
    streamed, streamed_levels = GroupAUC(), MultipartiteAUC(grouped=True)
    streamed.update(t(scores), t(labels[:, 0]), ids)
    streamed_levels.update(t(scores), t(levels), ids)
    expected = ref_group_mean(ref_auc, scores, labels[:, 0], groups, "uniform")
    expected_levels = ref_group_mean(lambda s, y: ref_multipartite(s, y, "linear"), scores, levels, groups, "uniform")
    assert_close(group_auc(t(scores), t(labels[:, 0]), ids), expected)
    assert_close(streamed.compute(), expected)
    assert_close(multipartite_auc(t(scores), t(levels), ids), expected_levels)
    assert_close(streamed_levels.compute(), expected_levels)


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", SEEDS)
def test_multilabel_auc_matches_bruteforce(seed: int) -> None:
    for k in range(1, 6):
        scores, labels, _ = random_case(seed, k=k)
        actual = multilabel_auc(t(scores), t(labels, torch.bool))
        assert actual.shape == (k,)
        for column in range(k):
            assert_close(actual[column], ref_auc(scores, labels[:, column]))


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cost", ["linear", "uniform"])
def test_multipartite_auc_matches_bruteforce(seed: int, cost: str) -> None:
    scores, _, _ = random_case(seed)
    levels = random_levels(seed, len(scores))
    expected = ref_multipartite(scores, levels, cost)
    assert_close(multipartite_auc(t(scores), t(levels), cost=cost), expected)


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cost", ["linear", "uniform"])
def test_grouped_multipartite_auc_matches_bruteforce(seed: int, cost: str) -> None:
    scores, _, groups = random_case(seed)
    levels = random_levels(seed, len(scores))

    def metric(s: np.ndarray, y: np.ndarray) -> float:
        return ref_multipartite(s, y, cost)

    for weighting in ("uniform", "size"):
        expected = ref_group_mean(metric, scores, levels, groups, weighting)
        actual = multipartite_auc(t(scores), t(levels), t(groups, torch.int32), cost=cost, weighting=weighting)
        assert_close(actual, expected)


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", range(8))
def test_multipartite_auc_aggregates_label_columns(seed: int) -> None:
    for k, cost in [(1, "linear"), (3, "linear"), (5, "linear"), (2, "uniform"), (4, "uniform")]:
        scores, labels, _ = random_case(seed, k=k)
        weights = np.random.default_rng(seed).uniform(0.0, 2.0, size=k)
        assert_close(multipartite_auc(t(scores), t(labels), cost=cost), ref_multipartite(scores, labels.sum(1), cost))
        actual = multipartite_auc(t(scores), t(labels), cost=cost, label_weights=weights.tolist())
        assert_close(actual, ref_multipartite(scores, labels @ weights, cost))


def test_aggregate_levels() -> None:
    columns = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1]])
    assert torch.equal(aggregate_levels(columns), torch.tensor([2.0, 0.0, 3.0], dtype=torch.float64))
    weighted = aggregate_levels(columns, torch.tensor([0.5, 2.0, 1.0]))
    assert torch.equal(weighted, torch.tensor([1.5, 0.0, 3.5], dtype=torch.float64))
    ordinal = torch.tensor([3, 1, 2])
    assert torch.equal(aggregate_levels(ordinal), ordinal.double())


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cost", ["linear", "uniform"])
def test_weighted_levels_equal_in_exact_arithmetic_are_one_level(seed: int, cost: str) -> None:
    """With weights 0.1, 0.2, 0.3 the float sums 0.1 + 0.2 and 0.3 differ in the last bit: they are one level,
    as in LaALoss. The AUCs are those of the integer weights 1, 2, 3 (the metric is scale-free)."""
    scores, labels, groups = random_case(seed, k=3)
    expected = ref_multipartite(scores, labels @ np.array([1, 2, 3]), cost)
    assert_close(multipartite_auc(t(scores), t(labels), cost=cost, label_weights=[0.1, 0.2, 0.3]), expected)
    grouped = ref_group_mean(lambda s, y: ref_multipartite(s, y @ np.array([1, 2, 3]), cost), scores, labels, groups, "uniform")
    g = t(groups, torch.long)
    assert_close(multipartite_auc(t(scores), t(labels), g, cost=cost, label_weights=[0.1, 0.2, 0.3]), grouped)


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", range(4))
def test_linear_multipartite_auc_is_exact_for_levels_far_from_zero(seed: int) -> None:
    """The linear cost's rank sums are measured from each group's median level: an offset of 1e15 (a
    different one per group) changes nothing, where it cancelled to values outside [0, 1] before."""
    scores, _, groups = random_case(seed)
    levels = random_levels(1, scores.size)  # small integers
    s, g = t(scores), t(groups, torch.long)
    offsets = 1e15 + 1e14 * (t(groups) % 7)
    assert_close(multipartite_auc(s, t(levels) + 1e15), ref_multipartite(scores, levels))
    expected = ref_group_mean(ref_multipartite, scores, levels, groups, "uniform")
    assert_close(multipartite_auc(s, t(levels) + offsets, g), expected)


# Non-integer levels whose two rank sums (by score, by level) rounded apart: 1.0000000000000002 and -6e-17
OFF_GRID_LEVELS = [1.3, 0.7, 1.3, 1.3, 3.3333, 0.001, 0.001, 0.1, 0.7, 3.3333, 0.7, 2.9, 3.3333, 2.9, 3.3333, 0.1, 2.9, 2.9]


def test_linear_multipartite_auc_of_non_integer_levels_stays_in_the_unit_interval() -> None:
    levels = t(OFF_GRID_LEVELS)
    scores = levels + torch.arange(levels.numel(), dtype=torch.float64) * 1e-6  # ordered as the levels
    one_group = torch.zeros(levels.numel(), dtype=torch.long)
    assert ref_multipartite(scores.numpy(), levels.numpy()) == 1.0
    assert multipartite_auc(scores, levels).item() == 1.0
    assert multipartite_auc(-scores, levels).item() == 0.0
    assert multipartite_auc(scores, levels, one_group, weighting="size").item() == 1.0
    rng = np.random.default_rng(7)
    for _ in range(20):  # random rankings of random non-integer levels: inside [0, 1] and as the reference
        values = rng.uniform(-5.0, 5.0, size=int(rng.integers(2, 40)))
        random_levels_ = rng.choice(values, size=values.size * 2)
        random_scores = np.where(rng.random(random_levels_.size) < 0.7, random_levels_, rng.normal(size=random_levels_.size))
        value = multipartite_auc(t(random_scores), t(random_levels_))
        assert 0.0 <= value.item() <= 1.0
        assert_close(value, ref_multipartite(random_scores, random_levels_))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.uint32, torch.uint64])
def test_unsigned_integer_scores(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(5)
    step = {torch.uint8: 2**6, torch.uint16: 2**14, torch.uint32: 2**30, torch.uint64: 2**62}[dtype]
    scores = rng.integers(0, 4, size=50)  # ties; as uint64, values at and above 2^63
    labels = rng.integers(0, 2, size=50)
    s = torch.tensor([int(v) * step + 1 for v in scores], dtype=dtype)
    assert_close(binary_auc(s, t(labels, torch.long)), ref_auc(scores, labels))
    assert_close(group_auc(s, t(labels, torch.long), t(labels * 0, torch.long)), ref_auc(scores, labels))


@IGNORE_UNDEFINED
def test_a_one_column_level_is_an_ordinal_label_like_laa_takes_it() -> None:
    scores, _, _ = random_case(3)
    levels = random_levels(1, scores.size)
    expected = ref_multipartite(scores, levels)
    assert_close(multipartite_auc(t(scores), t(levels)[:, None]), expected)
    assert_close(multipartite_auc(t(scores), t(levels)[:, None], label_weights=[2.5]), expected)
    metric = MultipartiteAUC()
    metric.update(t(scores), t(levels)[:, None])
    assert_close(metric.compute(), expected)


def test_multipartite_metric_keeps_the_label_layout_across_batches() -> None:
    metric = MultipartiteAUC()
    metric.update(S3, torch.stack([Y3, Y3], 1))
    with pytest.raises(ValueError, match=r"levels must keep their layout across batches: 2 column\(s\) before, got shape \(3, 3\)"):
        metric.update(S3, torch.stack([Y3, Y3, Y3], 1))
    with pytest.raises(ValueError, match="2 column"):
        metric.update(S3, Y3.double())
    metric.reset()
    metric.update(S3, Y3.double())  # a new layout after reset()
    assert_close(metric.compute(), ref_multipartite(S3.numpy(), Y3.numpy()))


def test_multipartite_metric_keeps_the_label_layout_in_forward_and_after_load_state_dict() -> None:
    """forward() resets the state before updating on the batch, and load_state_dict() restores only the
    states: the layout is read off the kept levels, so both still refuse a batch of another layout."""
    two, three = torch.stack([Y3, Y3], 1), torch.stack([Y3, Y3, 1 - Y3], 1)
    expected = ref_multipartite(S3.numpy(), two.sum(1).numpy())
    assert not math.isnan(expected)
    metric = MultipartiteAUC()
    metric(S3, two)
    with pytest.raises(ValueError, match=r"2 column\(s\) before, got shape \(3, 3\)"):
        metric(S3, three)
    with pytest.raises(ValueError, match=r"2 column\(s\) before, got shape \(3,\)"):
        metric(S3, Y3.double())
    assert_close(metric.compute(), expected)  # the refused batches left the state as it was
    metric.persistent(True)
    restored = MultipartiteAUC()
    restored.persistent(True)
    restored.load_state_dict(metric.state_dict())
    with pytest.raises(ValueError, match=r"2 column\(s\) before, got shape \(3, 3\)"):
        restored.update(S3, three)
    with pytest.raises(ValueError, match=r"2 column\(s\) before, got shape \(3, 3\)"):
        restored(S3, three)
    assert_close(restored.compute(), expected)


def test_a_refused_batch_leaves_the_state_as_it_was() -> None:
    for metric, good, bad in [
        (AUC(), (S3, Y3), (S3, torch.tensor([0, 2, 1]))),
        (GroupAUC(), (S3, Y3, G3), (S3, torch.tensor([0, 2, 1]), G3)),
        (MultiLabelAUC(1), (S3, Y3), (S3, torch.tensor([0, 2, 1]))),
        (MultipartiteAUC(), (S3, Y3), (S3, torch.tensor([0.0, math.nan, 1.0]))),
    ]:
        metric.update(*good)
        with pytest.raises(ValueError):
            metric.update(*bad)
        result = metric.compute()
        value = result["min_auc"] if isinstance(result, dict) else result
        assert_close(value, ref_auc(S3.numpy(), Y3.numpy()))


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", range(10))
def test_binary_levels_reduce_to_auc(seed: int) -> None:
    scores, labels, groups = random_case(seed)
    s, y, g = t(scores), t(labels[:, 0]), t(groups, torch.long)
    for cost in ("linear", "uniform"):
        assert torch.allclose(multipartite_auc(s, y, cost=cost), binary_auc(s, y), equal_nan=True)
        assert torch.allclose(multipartite_auc(s, y, g, cost=cost), group_auc(s, y, g), equal_nan=True)


def test_known_values() -> None:
    scores = torch.tensor([0.9, 0.5, 0.5, 0.1])
    labels = torch.tensor([1, 1, 0, 0])
    assert binary_auc(scores, labels).item() == 0.875
    assert binary_auc(scores, 1 - labels).item() == 0.125
    assert binary_auc(torch.arange(4.0), torch.tensor([0, 0, 1, 1])).item() == 1.0
    assert binary_auc(torch.ones(4), labels).item() == 0.5
    # levels 0 < 1 < 2 scored 0, 2, 1: pairs (1,0) right with cost 1, (2,0) right with cost 2, (2,1) wrong
    s, y = torch.tensor([0.0, 2.0, 1.0]), torch.tensor([0.0, 1.0, 2.0])
    assert multipartite_auc(s, y).item() == 0.75
    assert multipartite_auc(s, y, cost="uniform").item() == pytest.approx(2 / 3, rel=1e-15)
    # GAUC: group 7 has AUC 1, group -2 has AUC 0.5 (tie), group 3 is one-class and ignored
    groups = torch.tensor([7, 7, -2, -2, 3, 3])
    gauc = group_auc(torch.tensor([2.0, 1.0, 0.0, 0.0, 1.0, 5.0]), torch.tensor([1, 0, 1, 0, 1, 1]), groups)
    assert gauc.item() == 0.75


@pytest.mark.parametrize("score_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("label_dtype", [torch.bool, torch.uint8, torch.int32, torch.float32])
def test_input_dtypes_and_column_shapes(score_dtype: torch.dtype, label_dtype: torch.dtype) -> None:
    scores, labels, groups = random_case(4)
    scores = np.round(scores)  # representable in every score dtype
    s, y, g = t(scores, score_dtype), t(labels[:, 0], label_dtype), t(groups, torch.int64)
    assert_close(binary_auc(s, y), ref_auc(scores, labels[:, 0]))
    assert_close(binary_auc(s[:, None], y[:, None]), ref_auc(scores, labels[:, 0]))
    expected = ref_group_mean(ref_auc, scores, labels[:, 0], groups, "uniform")
    assert_close(group_auc(s[:, None], y[:, None], g[:, None]), expected)
    assert_close(multilabel_auc(s, y)[0], ref_auc(scores, labels[:, 0]))


def test_exact_on_large_input_with_ties() -> None:
    rng = np.random.default_rng(123)
    n = 2500
    scores = rng.choice(TIED_SCORES, size=n)
    labels = (rng.random(n) < 0.3).astype(np.int64)
    groups = rng.integers(0, 40, size=n) * 7919
    assert_close(binary_auc(t(scores), t(labels)), ref_auc(scores, labels))
    assert_close(group_auc(t(scores), t(labels), t(groups, torch.long), "size"),
                 ref_group_mean(ref_auc, scores, labels, groups, "size"))
    levels = rng.integers(0, 5, size=n)
    assert_close(multipartite_auc(t(scores), t(levels)), ref_multipartite(scores, levels))


# ----------------------------------------------------------------------------------------------------------------
# Properties (hypothesis)
# ----------------------------------------------------------------------------------------------------------------

SPECIAL_SCORES = st.sampled_from([-math.inf, -1.0, -0.0, 0.0, 0.5, 1.0, math.inf])
SCORES = st.one_of(SPECIAL_SCORES, st.floats(-10, 10, allow_nan=False, width=32))


@st.composite
def scored_items(draw: st.DrawFn, max_n: int = 30) -> tuple[list[float], list[int], list[int], list[float]]:
    n = draw(st.integers(0, max_n))
    items = st.lists(st.tuples(SCORES, st.integers(0, 1), st.integers(-3, 3), st.sampled_from([0.0, 0.5, 1.0, 4.0])),
                     min_size=n, max_size=n)
    rows = draw(items)
    scores, labels, groups, levels = (list(column) for column in zip(*rows)) if rows else ([], [], [], [])
    return scores, labels, groups, levels


@IGNORE_UNDEFINED
@settings(max_examples=40, deadline=None)
@given(scored_items())
def test_property_matches_bruteforce(data: tuple[list[float], list[int], list[int], list[float]]) -> None:
    scores, labels, groups = np.array(data[0]), np.array(data[1], dtype=np.int64), np.array(data[2], dtype=np.int64)
    levels = np.array(data[3])
    s, y, g = t(scores, torch.float32), t(labels, torch.long), t(groups, torch.long)
    assert_close(binary_auc(s, y), ref_auc(scores, labels))
    assert_close(group_auc(s, y, g), ref_group_mean(ref_auc, scores, labels, groups, "uniform"))
    for cost in ("linear", "uniform"):
        assert_close(multipartite_auc(s, t(levels), cost=cost), ref_multipartite(scores, levels, cost))


@IGNORE_UNDEFINED
@settings(max_examples=30, deadline=None)
@given(scored_items(), st.randoms(use_true_random=False))
def test_property_invariant_to_permutation_and_monotone_maps(
    data: tuple[list[float], list[int], list[int], list[float]], rnd: random.Random
) -> None:
    s, y, g, levels = t(data[0]), t(data[1], torch.long), t(data[2], torch.long), t(data[3])
    perm = torch.tensor(rnd.sample(range(len(s)), len(s)), dtype=torch.long)
    mapped = s**3 * 8  # strictly increasing and exact enough in float64 to keep every tie and every order
    for fn in (
        lambda s_, y_, g_, l_: binary_auc(s_, y_),
        lambda s_, y_, g_, l_: group_auc(s_, y_, g_, "size"),
        lambda s_, y_, g_, l_: multipartite_auc(s_, l_, g_),
        lambda s_, y_, g_, l_: multipartite_auc(s_, l_, cost="uniform"),
    ):
        reference = fn(s, y, g, levels)
        assert torch.allclose(fn(s[perm], y[perm], g[perm], levels[perm]), reference, equal_nan=True, atol=1e-12)
        assert torch.equal(fn(mapped, y, g, levels).isnan(), reference.isnan())
        assert torch.allclose(fn(mapped, y, g, levels), reference, equal_nan=True, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Undefined metrics: NaN and a warning, never an exception
# ----------------------------------------------------------------------------------------------------------------


def test_one_class_gives_nan_and_warns() -> None:
    s = torch.tensor([0.3, 0.1, 0.2])
    with pytest.warns(UndefinedMetricWarning, match="AUC is undefined"):
        assert torch.isnan(binary_auc(s, torch.ones(3)))
    with pytest.warns(UndefinedMetricWarning):
        assert torch.isnan(binary_auc(torch.empty(0), torch.empty(0)))
    with pytest.warns(UndefinedMetricWarning, match="GAUC"):
        assert torch.isnan(group_auc(s, torch.tensor([1, 0, 1]), torch.tensor([0, 1, 2])))
    with pytest.warns(UndefinedMetricWarning):
        per_label = multilabel_auc(s, torch.tensor([[1, 0], [0, 0], [1, 0]]))
    assert per_label[0].item() == 1.0 and torch.isnan(per_label[1])
    with pytest.warns(UndefinedMetricWarning, match="multipartite"):
        assert torch.isnan(multipartite_auc(s, torch.full((3,), 2.0)))
    with pytest.warns(UndefinedMetricWarning):
        assert torch.isnan(multipartite_auc(s, torch.full((3,), 2.0), cost="uniform"))
    metric = AUC()
    metric.update(s, torch.zeros(3))
    with pytest.warns(UndefinedMetricWarning):
        assert torch.isnan(metric.compute())


def test_undefined_metric_warnings_name_the_callers_line_and_the_metrics() -> None:
    """A metric class's warning named torchmetrics' compute wrapper (metric.py), or mlloss's own
    classes.py for a forward call, as its location; it names the line that called the metric.
    ``ranking_metrics`` (RankingMetrics, the recipes) names which of its metrics are undefined."""
    import inspect
    import warnings

    from mlloss.evaluation import ranking_metrics

    def located(call) -> list[tuple[str, int, str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        return [(w.filename, w.lineno, str(w.message)) for w in caught if w.category is UndefinedMetricWarning]

    here = __file__
    line = inspect.currentframe().f_lineno
    calls = [
        lambda: AUC().compute(),  # no samples
        lambda: AUC()(torch.randn(5), torch.ones(5)),  # forward: one class
        lambda: GroupAUC()(torch.randn(4), torch.ones(4), torch.tensor([0, 0, 1, 1])),
        lambda: binary_auc(torch.randn(5), torch.ones(5)),
    ]
    for offset, call in enumerate(calls, start=2):
        [(filename, lineno, _)] = located(call)
        assert (filename, lineno) == (here, line + offset)
    labels = torch.stack([torch.tensor([0, 1] * 10), torch.zeros(20, dtype=torch.long)], 1)
    [(filename, _, message)] = located(lambda: ranking_metrics(torch.randn(20, 2), labels, torch.arange(20) // 5,
                                                               label_names=["click", "purchase"]))
    assert filename == here and message.startswith("auc/purchase, gauc/purchase undefined:")
    assert not located(lambda: ranking_metrics(torch.randn(20, 2), labels, torch.arange(20) // 5,
                                               label_names=["click", "purchase"], quiet=True))


def test_defined_metrics_do_not_warn() -> None:
    s = torch.tensor([0.3, 0.1, 0.2, 0.2])
    with warnings_as_errors():
        binary_auc(s, torch.tensor([1, 0, 1, 0]))
        group_auc(s, torch.tensor([1, 0, 1, 1]), torch.tensor([5, 5, 9, 9]))  # one valid group is enough
        multipartite_auc(s, torch.tensor([0.0, 1.0, 1.0, 1.0]), torch.tensor([1, 1, 2, 2]))


# ----------------------------------------------------------------------------------------------------------------
# Input validation
# ----------------------------------------------------------------------------------------------------------------

S3 = torch.tensor([0.1, 0.2, 0.3])
Y3 = torch.tensor([0, 1, 1])
G3 = torch.tensor([1, 1, 2])


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: binary_auc([0.1, 0.2], Y3[:2]), TypeError, "scores must be a torch.Tensor; got list"),
        (lambda: binary_auc(S3, [0, 1, 1]), TypeError, "labels must be a torch.Tensor; got list"),
        (lambda: binary_auc(S3.to(torch.complex64), Y3), TypeError, "scores must be real; got dtype torch.complex64"),
        (
            lambda: binary_auc(S3.reshape(1, 3), Y3),
            ValueError,
            r"scores must have shape \(N,\) or \(N, 1\); got \(1, 3\)",
        ),
        (
            lambda: binary_auc(torch.tensor([0.1, 0.2, math.nan]), Y3),
            ValueError,
            r"scores must not contain NaN; scores\[2\] = nan",
        ),
        (lambda: binary_auc(S3, Y3[:2]), ValueError, r"labels must have one row per score \(3\); got shape \(2,\)"),
        (lambda: binary_auc(S3, torch.tensor([0, 2, 1])), ValueError, r"labels must be binary \(0 or 1\); labels\[1\] = 2"),
        (lambda: binary_auc(S3, torch.tensor([0.0, 0.5, 1.0])), ValueError, r"labels\[1\] = 0.5"),
        (lambda: binary_auc(S3, torch.tensor([0.0, math.nan, 1.0])), ValueError, r"labels\[1\] = nan"),
        (
            lambda: binary_auc(S3, torch.tensor([[0, 1], [1, 0], [1, 1]])),
            ValueError,
            r"labels must have shape \(N,\) or \(N, 1\); got \(3, 2\)",
        ),
        (lambda: group_auc(S3, Y3, G3.float()), TypeError, "groups must hold integer ids; got dtype torch.float32"),
        (lambda: group_auc(S3, Y3, G3.bool()), TypeError, "groups must hold integer ids; got dtype torch.bool$"),  # no mask= to point to
        (lambda: group_auc(S3, Y3, G3[:2]), ValueError, r"groups must have one row per score \(3\); got shape \(2,\)"),
        (lambda: group_auc(S3, Y3, G3, weighting="mean"), ValueError, "weighting must be one of .*; got 'mean'"),
        (lambda: multilabel_auc(S3, torch.zeros(3, 2, 1)), ValueError, r"labels must have shape \(N,\) or \(N, K\); got \(3, 2, 1\)"),
        (lambda: multilabel_auc(S3, torch.tensor([[0, 1], [3, 0], [1, 1]])), ValueError, r"labels must be binary \(0 or 1\); labels\[1, 0\] = 3"),
        (lambda: multipartite_auc(S3, Y3, cost="log"), ValueError, "cost must be one of .*; got 'log'"),
        (lambda: multipartite_auc(S3, Y3, weighting="max"), ValueError, "weighting must be one of .*; got 'max'"),
        (
            lambda: multipartite_auc(S3, torch.tensor([0.0, math.nan, 1.0])),
            ValueError,
            r"levels must be finite; levels\[1\] = nan",
        ),
        (
            lambda: multipartite_auc(S3, torch.tensor([0.0, math.inf, 1.0])),
            ValueError,
            r"levels must be finite; levels\[1\] = inf",
        ),
        (
            lambda: multipartite_auc(S3, torch.tensor([0.0, 1.0])),
            ValueError,
            r"levels must have one row per score \(3\); got shape \(2,\)",
        ),
        (
            lambda: multipartite_auc(S3, torch.zeros(3, 1, 1)),
            ValueError,
            r"levels must have shape \(N,\) or \(N, K\); got \(3, 1, 1\)",
        ),
        (
            lambda: multipartite_auc(S3, torch.tensor([[0, 2], [1, 0], [1, 1]])),
            ValueError,
            r"levels must be binary \(0 or 1\); levels\[0, 1\] = 2",
        ),
        (lambda: multipartite_auc(S3, Y3, label_weights=[1.0]), ValueError, r"label_weights needs levels of shape \(N, K\) .*; got levels of shape \(N,\)"),
        (
            lambda: multipartite_auc(S3, Y3[:, None], label_weights=[1.0, 2.0]),
            ValueError,
            r"label_weights has 2 entries but labels have 1 columns; got label_weights=\[1.0, 2.0\]",
        ),
        (
            lambda: multipartite_auc(S3, Y3[:, None], label_weights=[math.inf]),
            ValueError,
            r"label_weights must be finite; got \[inf\]",
        ),
        (
            lambda: multipartite_auc(S3, torch.stack([Y3, Y3], 1), label_weights=[1.0, -1.0]),
            ValueError,
            r"label_weights must all be > 0; got \[1.0, -1.0\]",
        ),
        (lambda: multipartite_auc(S3, torch.stack([Y3, Y3], 1), label_weights="ab"), ValueError, "label_weights must be a sequence of numbers"),
        (lambda: MultipartiteAUC(label_weights=[0.0, 1.0]), ValueError, r"label_weights must all be > 0; got \[0.0, 1.0\]"),
        (lambda: multipartite_auc(S3, Y3.to(torch.complex64)), TypeError, "levels must be real; got dtype torch.complex64"),
        (lambda: multipartite_auc(S3, Y3, G3.double()), TypeError, "groups must hold integer ids; got dtype torch.float64"),
        (lambda: MultiLabelAUC(num_labels=0), ValueError, "num_labels must be a positive integer; got 0"),
        (lambda: MultiLabelAUC(num_labels=True), ValueError, "num_labels must be a positive integer; got True"),
        (lambda: binary_auc(S3, Y3.to("meta")), ValueError, r"labels must be on the scores' device \(cpu\); got meta"),
        (lambda: GroupAUC().update(S3, Y3, G3.to("meta")), ValueError, r"groups must be on the scores' device \(cpu\); got meta"),
        (lambda: MultipartiteAUC(grouped=True).update(S3, Y3, G3.to("meta")), ValueError, "groups must be on the scores' device"),
        (
            lambda: MultiLabelAUC(num_labels=2).update(S3, Y3),
            ValueError,
            r"labels must have 2 columns \(num_labels\); got 1",
        ),
        (lambda: GroupAUC(weighting="sqrt"), ValueError, "weighting must be one of .*; got 'sqrt'"),
        (lambda: MultipartiteAUC(cost="exp"), ValueError, "cost must be one of .*; got 'exp'"),
        (
            lambda: MultipartiteAUC().update(S3, Y3, G3),
            ValueError,
            "groups must be given if and only if grouped=True; got grouped=False and groups=a tensor",
        ),
        (lambda: MultipartiteAUC(grouped=True).update(S3, Y3), ValueError, "got grouped=True and groups=None"),
        (lambda: AUC().update(S3, torch.tensor([0, -1, 1])), ValueError, r"labels must be binary \(0 or 1\); labels\[1\] = -1"),
        (lambda: GroupAUC().update(S3, Y3, G3.half()), TypeError, "groups must hold integer ids; got dtype torch.float16"),
    ],
)
def test_bad_inputs_raise(call: Callable[[], object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


# ----------------------------------------------------------------------------------------------------------------
# Streaming metrics
# ----------------------------------------------------------------------------------------------------------------


def batches(n: int, seed: int) -> list[slice]:
    """Uneven contiguous batches (some of size one) covering range(n)."""
    rng = np.random.default_rng(seed)
    cuts = np.unique(np.concatenate([[0, n, 1], rng.integers(0, n, size=4)]))
    return [slice(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", range(6))
def test_auc_metric_streams(seed: int) -> None:
    scores, labels, _ = random_case(seed, max_n=120)
    s, y = t(scores, torch.float32), t(labels[:, 0], torch.bool)
    metric = AUC()
    for part in batches(len(s), seed):
        metric.update(s[part], y[part])
    result = metric.compute()
    assert torch.equal(result, binary_auc(s, y)) or torch.isnan(result)
    assert_close(result, ref_auc(scores, labels[:, 0]))


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("weighting", ["uniform", "size"])
def test_group_auc_metric_streams(seed: int, weighting: str) -> None:
    scores, labels, groups = random_case(seed, max_n=120)
    s, y, g = t(scores), t(labels[:, 0]), t(groups, torch.long)
    metric = GroupAUC(weighting=weighting)
    for part in batches(len(s), seed):
        metric.update(s[part], y[part], g[part])
    assert_close(metric.compute(), ref_group_mean(ref_auc, scores, labels[:, 0], groups, weighting))


def test_group_auc_metric_joins_groups_across_batches() -> None:
    """Each batch holds one class only, so every per-batch GAUC is undefined, but the groups span both."""
    metric = GroupAUC()
    with pytest.warns(UndefinedMetricWarning):
        batch_value = metric(torch.tensor([0.9, 0.2]), torch.tensor([1, 1]), torch.tensor([10, -4]))
    assert torch.isnan(batch_value)
    metric.update(torch.tensor([0.1, 0.2, 0.5]), torch.tensor([0, 0, 0]), torch.tensor([10, -4, -4]))
    assert metric.compute().item() == pytest.approx((1.0 + 0.25) / 2, rel=1e-15)


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 2, 5])
def test_multilabel_auc_metric_streams(seed: int, k: int) -> None:
    scores, labels, _ = random_case(seed, max_n=120, k=k)
    s, y = t(scores), t(labels, torch.uint8)
    metric = MultiLabelAUC(num_labels=k)
    for part in batches(len(s), seed):
        metric.update(s[part], y[part])
    result = metric.compute()
    assert set(result) == {"per_label_auc", "diff_auc", "min_auc"}
    per_label = result["per_label_auc"].reshape(-1)  # torchmetrics squeezes a one-element result to a scalar
    expected = np.array([ref_auc(scores, labels[:, column]) for column in range(k)])
    for column in range(k):
        assert_close(per_label[column], expected[column])
    assert_close(result["diff_auc"], expected.max() - expected.min() if not np.isnan(expected).any() else math.nan)
    assert_close(result["min_auc"], expected.min() if not np.isnan(expected).any() else math.nan)


def test_multilabel_auc_metric_nan_propagates_to_summaries() -> None:
    metric = MultiLabelAUC(num_labels=2)
    metric.update(torch.tensor([0.3, 0.1, 0.2]), torch.tensor([[1, 0], [0, 0], [1, 0]]))
    with pytest.warns(UndefinedMetricWarning):
        result = metric.compute()
    assert result["per_label_auc"][0].item() == 1.0
    assert torch.isnan(result["per_label_auc"][1])
    assert torch.isnan(result["diff_auc"]) and torch.isnan(result["min_auc"])


@IGNORE_UNDEFINED
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cost", ["linear", "uniform"])
def test_multipartite_auc_metric_streams(seed: int, cost: str) -> None:
    scores, labels, groups = random_case(seed, max_n=120, k=3)
    weights = [1.0, 0.5, 2.0]
    s, y, g = t(scores), t(labels), t(groups, torch.long)
    plain = MultipartiteAUC(cost=cost, label_weights=weights)
    grouped = MultipartiteAUC(cost=cost, label_weights=torch.tensor(weights), grouped=True, weighting="size")
    for part in batches(len(s), seed):
        plain.update(s[part], y[part])
        grouped.update(s[part], y[part], g[part])
    levels = labels @ np.array(weights)

    def metric(s_: np.ndarray, y_: np.ndarray) -> float:
        return ref_multipartite(s_, y_, cost)

    assert_close(plain.compute(), ref_multipartite(scores, levels, cost))
    assert_close(grouped.compute(), ref_group_mean(metric, scores, levels, groups, "size"))


def test_forward_returns_batch_value_and_accumulates() -> None:
    scores, labels, _ = random_case(3, max_n=80)
    s, y = t(scores), t(labels[:, 0])
    half = len(s) // 2
    metric = AUC()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        first = metric(s[:half], y[:half])
        second = metric(s[half:], y[half:])
        assert torch.allclose(first, binary_auc(s[:half], y[:half]), equal_nan=True)
        assert torch.allclose(second, binary_auc(s[half:], y[half:]), equal_nan=True)
        assert torch.allclose(metric.compute(), binary_auc(s, y), equal_nan=True)


def test_merge_state_equals_one_shot() -> None:
    scores, labels, groups = random_case(9, max_n=100)
    s, y, g = t(scores), t(labels[:, 0]), t(groups, torch.long)
    half = len(s) // 2
    left, right, whole = GroupAUC(), GroupAUC(), GroupAUC()
    left.update(s[:half], y[:half], g[:half])
    right.update(s[half:], y[half:], g[half:])
    whole.update(s, y, g)
    left.merge_state(right)
    assert torch.allclose(left.compute(), whole.compute(), equal_nan=True)


def test_merge_state_of_grouped_label_columns_equals_one_shot_from_a_metric_and_from_its_state_dict() -> None:
    scores, labels, groups = random_case(4, max_n=120, k=3)
    s, y, g = t(scores), t(labels, torch.long), t(groups, torch.long)
    half = len(s) // 2
    options = {"label_weights": [1.0, 2.0, 0.5], "grouped": True}
    whole = MultipartiteAUC(**options)
    whole.update(s, y, g)
    for incoming_as_state in (False, True):
        left, right = MultipartiteAUC(**options), MultipartiteAUC(**options)
        left.update(s[:half], y[:half], g[:half])
        right.update(s[half:], y[half:], g[half:])
        left.merge_state(right.metric_state if incoming_as_state else right)
        assert torch.equal(left.compute(), whole.compute())


_SCORES = torch.linspace(-1, 1, 10, dtype=torch.float64)
_COLUMNS = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 0], [0, 1, 0], [0, 0, 1]] * 2)
_GROUPS = torch.arange(10) // 4
# case: (this metric, its batch, the incoming metric, its batch)
_UNMERGEABLE = {
    "2 columns beside 3": (MultipartiteAUC(), (_COLUMNS[:, :2],), MultipartiteAUC(), (_COLUMNS,)),
    "ordinal beside columns": (MultipartiteAUC(), (_COLUMNS.sum(1).double(),), MultipartiteAUC(), (_COLUMNS,)),
    "groups missing": (MultipartiteAUC(grouped=True), (_COLUMNS, _GROUPS), MultipartiteAUC(), (_COLUMNS,)),
    "groups extra": (MultipartiteAUC(), (_COLUMNS,), MultipartiteAUC(grouped=True), (_COLUMNS, _GROUPS)),
    "num_labels": (MultiLabelAUC(num_labels=2), (_COLUMNS[:, :2],), MultiLabelAUC(num_labels=3), (_COLUMNS,)),
}


@pytest.mark.parametrize("case", list(_UNMERGEABLE))
def test_merge_state_refuses_batches_that_cannot_join_and_keeps_its_own(case: str) -> None:
    """A merged state whose batches cannot be concatenated with the kept ones (2 label columns beside 3,
    ordinal levels beside label columns), or that lacks the group ids this metric needs, failed only at
    compute with torch.cat's shape error, after the merge had already changed the metric."""
    template, batch, incoming_template, incoming_batch = _UNMERGEABLE[case]
    metric, incoming = template.clone(), incoming_template.clone()
    metric.update(_SCORES, *batch)
    incoming.update(_SCORES, *incoming_batch)
    before = metric.compute()
    for merged in (incoming, incoming.metric_state):
        with pytest.raises(ValueError, match=r"merge_state: .*(labels|levels|groups)"):
            metric.merge_state(merged)
    torch.testing.assert_close(metric.compute(), before, rtol=0, atol=0)  # a tensor, or MultiLabelAUC's dict
    assert sum(kept.shape[0] for kept in metric.scores) == len(_SCORES)


@IGNORE_UNDEFINED
def test_metrics_with_different_options_in_one_collection_keep_their_own_values() -> None:
    """MetricCollection lets metrics whose states are equal after the first batch share one state. The
    first batch's second label column is all zero, so its levels were equal under weights (1, 1) and
    (1, 3), and the (1, 3) metric reported the (1, 1) value: the states now hold the label columns and
    every option is applied at compute."""
    weights = {"w11": [1.0, 1.0], "w13": [1.0, 3.0], "w13-uniform": [1.0, 3.0]}
    collection = MetricCollection({
        "w11": MultipartiteAUC(label_weights=weights["w11"]),
        "w13": MultipartiteAUC(label_weights=torch.tensor(weights["w13"])),
        "w13-uniform": MultipartiteAUC(cost="uniform", label_weights=weights["w13-uniform"]),
    })
    by_weighting = MetricCollection({"uniform": GroupAUC(), "size": GroupAUC(weighting="size")})
    scores, labels, groups = random_case(5, max_n=60, k=2)
    labels[:2] = [[0, 0], [1, 0]]  # the first batch
    first = slice(0, 2)
    for part in [first, slice(2, len(scores))]:
        collection.update(t(scores[part]), t(labels[part], torch.uint8))
        by_weighting.update(t(scores[part]), t(labels[part, 0]), t(groups[part], torch.long))
    result = collection.compute()
    for name, cost in [("w11", "linear"), ("w13", "linear"), ("w13-uniform", "uniform")]:
        assert_close(result[name], ref_multipartite(scores, labels @ np.array(weights[name]), cost))
    for weighting, value in by_weighting.compute().items():
        assert_close(value, ref_group_mean(ref_auc, scores, labels[:, 0], groups, weighting))


BUFFER_CASES = [  # (name, metric factory, two batches of equal shapes and the dtypes a buffer would have)
    ("AUC", lambda: AUC(), lambda s, y, g, l: (s.float(), y[:, 0].to(torch.uint8))),
    ("GroupAUC", lambda: GroupAUC(), lambda s, y, g, l: (s, y[:, 0].bool(), g)),
    ("MultiLabelAUC", lambda: MultiLabelAUC(num_labels=3), lambda s, y, g, l: (s[:, None], y.to(torch.uint8))),
    ("MultipartiteAUC-columns", lambda: MultipartiteAUC(label_weights=[1.0, 2.0, 0.5]),
     lambda s, y, g, l: (s.half(), y.to(torch.uint8))),
    ("MultipartiteAUC-ordinal", lambda: MultipartiteAUC(cost="uniform", grouped=True), lambda s, y, g, l: (s, l, g)),
]


@pytest.mark.parametrize("make, inputs", [case[1:] for case in BUFFER_CASES], ids=[case[0] for case in BUFFER_CASES])
def test_streaming_metrics_keep_batches_of_a_buffer_refilled_in_place(
    make: Callable[[], Metric], inputs: Callable[..., tuple[torch.Tensor, ...]]
) -> None:
    """Fixed-size batches written into one preallocated buffer (a CUDA graph's static output): the metric
    kept views of the buffer, so every batch it had seen became the last one."""
    rng = np.random.default_rng(11)
    batches = []
    for _ in range(2):
        scores, labels = np.round(rng.normal(size=16), 1), rng.integers(0, 2, size=(16, 3))
        labels[:2] = [[1, 1, 1], [0, 0, 0]]  # both classes in every column
        batches.append(inputs(t(scores), t(labels, torch.long), t(rng.integers(0, 3, size=16), torch.long),
                              t(rng.choice([0.0, 0.5, 2.0], size=16))))
    buffers = [x.clone() for x in batches[0]]
    streamed, expected = make(), make()
    for batch in batches:
        for buffer, x in zip(buffers, batch):
            buffer.copy_(x)
        streamed.update(*buffers)
        expected.update(*(x.clone() for x in batch))
    for buffer in buffers:  # the caller's next batch
        buffer.copy_(buffer.flip(0))
    actual, wanted = streamed.compute(), expected.compute()
    for key in wanted if isinstance(wanted, dict) else [None]:
        pair = (actual, wanted) if key is None else (actual[key], wanted[key])
        assert torch.equal(*pair), (key, pair)


@contextlib.contextmanager
def _gloo_rank(rank: int, out: Path) -> Iterator[dict]:
    """One rank of a 2-process gloo job (``ranks.ForkedRanks``: the environment gives the group):
    the results dict the body fills, saved as ``out/rank<rank>.pt``."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        results: dict = {}
        yield results
        torch.save(results, out / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _sync_metrics_of_a_rank(rank: int, out: Path) -> None:
    with _gloo_rank(rank, out) as results:
        scores, labels, groups = torch.load(out / f"batch{rank}.pt")
        for name, metric, batch in [
            ("auc", AUC(), (scores, labels[:, 0])),
            ("gauc", GroupAUC(weighting="size"), (scores, labels[:, 0], groups)),
            ("multilabel", MultiLabelAUC(num_labels=2), (scores, labels)),
            ("multipartite", MultipartiteAUC(label_weights=[1.0, 3.0], grouped=True), (scores, labels, groups)),
        ]:
            metric.update(*batch)
            results[name] = metric.compute()
        metric = MultipartiteAUC()  # 2 label columns on rank 0, 3 on rank 1
        metric.update(scores, labels if rank == 0 else torch.cat([labels, labels[:, :1]], 1))
        try:
            metric.compute()
        except ValueError as error:
            results["layout"] = str(error)


# Integer and float batches of one metric: (scores, labels) per batch, the values exact in float64.
# 2^24 + 1 and 2^24 tie in float32, which one process's int64 and fp32 batches were gathered in.
MIXED_BATCHES = [
    (torch.tensor([5], dtype=torch.uint64), [1]),  # kept with its top bit flipped: below every float
    (torch.tensor([1.0, 2.5]), [0, 1]),
    (torch.tensor([-1, 2**24 + 1, 2**24], dtype=torch.int64), [0, 1, 0]),
    (torch.tensor([-3], dtype=torch.int8), [0]),
    (torch.tensor([200], dtype=torch.uint8), [1]),  # int8 beside uint8: int16, which gloo cannot gather
]


def mixed_reference(batches: list) -> float:
    return ref_auc(np.concatenate([s.double().numpy() for s, _ in batches]), np.concatenate([y for _, y in batches]))


def test_streaming_metrics_compare_integer_and_float_batches_by_value() -> None:
    """uint64 scores were kept with their top bit flipped (as the functions take them), so a positive
    at uint64 5 ranked below a negative at 1.0 of another batch; int64 scores beside float ones meet in
    float64, exact up to 2^53: beyond, they are refused rather than rounded into ties."""
    metric = AUC()
    for scores, labels in MIXED_BATCHES:
        metric.update(scores, torch.tensor(labels))
    assert_close(metric.compute(), mixed_reference(MIXED_BATCHES))
    with pytest.raises(ValueError, match=r"uint64 scores of a streaming metric must be below 2\^63 .*scores\[1\] = 9223372036854775808"):
        metric.update(torch.tensor([1, 2**63], dtype=torch.uint64), torch.tensor([0, 1]))
    assert_close(binary_auc(torch.tensor([1, 2**63], dtype=torch.uint64), torch.tensor([0, 1])), 1.0)  # one tensor: all of uint64
    metric = AUC()
    metric.update(torch.tensor([2**53 + 1, 2**53]), torch.tensor([1, 0]))
    assert_close(metric.compute(), 1.0)  # int64 alone: exact
    metric.update(torch.tensor([0.5]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"int64 scores beyond 2\^53 in magnitude cannot be compared exactly with the floating-point scores"):
        metric.compute()


def _sync_integer_scores_of_a_rank(rank: int, out: Path) -> None:
    """One rank of a 2-process gloo job: rank 0 holds the integer and float batches of MIXED_BATCHES
    but the last, rank 1 the int8/uint8 ones; then int64 scores beyond 2^53 on rank 0 beside floats."""
    with _gloo_rank(rank, out) as results:
        metric = AUC()
        for scores, labels in MIXED_BATCHES[:3] if rank == 0 else MIXED_BATCHES[3:]:
            metric.update(scores, torch.tensor(labels))
        results["auc"] = metric.compute()
        metric = AUC()
        metric.update(torch.tensor([2**60, 0]) if rank == 0 else torch.tensor([0.5, 0.25]), torch.tensor([1, 0]))
        try:
            metric.compute()
        except ValueError as error:
            results["wide"] = str(error)


@IGNORE_UNDEFINED
@pytest.mark.distributed
def test_streaming_metrics_sync_integer_scores_across_processes(tmp_path) -> None:
    """int16 scores (int8 beside uint8) made gloo fail ('Invalid scalar type'), one process's int64
    and fp32 batches were gathered in float32 (2^24 + 1 and 2^24 tied), and int64 scores beyond 2^53
    beside another process's floats were rounded: now the values of all items, and the same refusal
    on every process."""
    ForkedRanks(_sync_integer_scores_of_a_rank, (tmp_path,), log=tmp_path / "ranks.log").join(timeout=120)
    for rank in range(2):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        assert_close(results["auc"], mixed_reference(MIXED_BATCHES))
        assert results["wide"].startswith("int64 scores beyond 2^53 in magnitude cannot be compared exactly")


@IGNORE_UNDEFINED
@pytest.mark.distributed
def test_streaming_metrics_sync_scores_of_different_dtypes_across_processes(tmp_path) -> None:
    """fp16 scores on rank 0 and fp32 on rank 1 (gloo aborted the job in compute): both ranks get the
    metrics of all items, the fp16 scores taken exactly; label layouts that differ are refused by name."""
    rng = np.random.default_rng(4)
    ranks = []
    for rank, dtype in enumerate([torch.float16, torch.float32]):
        n = 25 + 10 * rank
        batch = (t(rng.normal(size=n), dtype), t(rng.integers(0, 2, size=(n, 2)), torch.long),
                 t(rng.integers(0, 4, size=n), torch.long))
        torch.save(batch, tmp_path / f"batch{rank}.pt")
        ranks.append(batch)
    ForkedRanks(_sync_metrics_of_a_rank, (tmp_path,), log=tmp_path / "ranks.log").join(timeout=120)
    scores = np.concatenate([batch[0].double().numpy() for batch in ranks])  # fp16 values exactly
    labels = np.concatenate([batch[1].numpy() for batch in ranks])
    groups = np.concatenate([batch[2].numpy() for batch in ranks])
    levels = labels @ np.array([1.0, 3.0])
    per_label = [ref_auc(scores, labels[:, k]) for k in range(2)]
    for rank in range(2):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        assert_close(results["auc"], ref_auc(scores, labels[:, 0]))
        assert_close(results["gauc"], ref_group_mean(ref_auc, scores, labels[:, 0], groups, "size"))
        for k in range(2):
            assert_close(results["multilabel"]["per_label_auc"][k], per_label[k])
        assert_close(results["multilabel"]["min_auc"], min(per_label))
        assert_close(results["multipartite"], ref_group_mean(ref_multipartite, scores, levels, groups, "uniform"))
        assert results["layout"] == ("MultipartiteAUC needs levels of one layout on every process; "
                                     "got shape (N, 2) on rank 0 and (N, 3) on rank 1")


def test_states_do_not_keep_the_graph() -> None:
    scores = torch.tensor([0.1, 0.9, 0.4], requires_grad=True) * 2
    metric = AUC()
    metric.update(scores, torch.tensor([0, 1, 1]))
    assert not metric.scores[0].requires_grad
    assert metric.compute().item() == 1.0


def test_reset_clears_state() -> None:
    metric = AUC()
    metric.update(torch.tensor([0.1, 0.9]), torch.tensor([1, 0]))
    assert metric.compute().item() == 0.0
    metric.reset()
    metric.update(torch.tensor([0.1, 0.9]), torch.tensor([0, 1]))
    assert metric.compute().item() == 1.0


def test_metric_conventions() -> None:
    for metric in (AUC(), GroupAUC(), MultiLabelAUC(num_labels=2), MultipartiteAUC()):
        assert metric.is_differentiable is False
        assert metric.higher_is_better is True
        assert metric.full_state_update is False
        assert all(fx is not None and fx.__name__ == "dim_zero_cat" for fx in metric._reductions.values())


# ----------------------------------------------------------------------------------------------------------------
# Streaming metrics without samples: NaN in the usual output structure and a warning, never an exception
# ----------------------------------------------------------------------------------------------------------------

STREAM_SCORES = torch.tensor([0.3, 0.1, 0.2, 0.7])
STREAM_LABELS = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 1, 1]])
STREAM_GROUPS = torch.tensor([4, 4, 9, 9])
# (name, metric factory, a batch with a defined value) for every streaming metric class
STREAMING_CASES = [
    ("AUC", lambda: AUC(), (STREAM_SCORES, STREAM_LABELS[:, 0])),
    ("GroupAUC", lambda: GroupAUC(weighting="size"), (STREAM_SCORES, STREAM_LABELS[:, 0], STREAM_GROUPS)),
    ("MultiLabelAUC-1", lambda: MultiLabelAUC(num_labels=1), (STREAM_SCORES, STREAM_LABELS[:, 0])),
    ("MultiLabelAUC-3", lambda: MultiLabelAUC(num_labels=3), (STREAM_SCORES, STREAM_LABELS)),
    ("MultipartiteAUC", lambda: MultipartiteAUC(), (STREAM_SCORES, STREAM_LABELS)),
    (
        "MultipartiteAUC-grouped",
        lambda: MultipartiteAUC(cost="uniform", grouped=True),
        (STREAM_SCORES, STREAM_LABELS, STREAM_GROUPS),
    ),
]
STREAMING = pytest.mark.parametrize(
    "make, batch", [case[1:] for case in STREAMING_CASES], ids=[case[0] for case in STREAMING_CASES]
)


def assert_nan_like(value: object, defined: object) -> None:
    """``value`` has the structure (dict keys, shapes, dtype, device) of ``defined`` and is NaN throughout."""
    if isinstance(defined, dict):
        assert isinstance(value, dict) and set(value) == set(defined)
        for key in defined:
            assert_nan_like(value[key], defined[key])
        return
    assert isinstance(value, torch.Tensor) and isinstance(defined, torch.Tensor)
    assert (value.shape, value.dtype, value.device) == (defined.shape, defined.dtype, defined.device)
    assert torch.isnan(value).all(), value


def defined_value(make: Callable[[], Metric], batch: tuple[torch.Tensor, ...]) -> object:
    metric = make()
    metric.update(*batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UndefinedMetricWarning)
        return metric.compute()


@STREAMING
def test_compute_before_any_update_gives_nan_and_warns(make: Callable[[], Metric], batch: tuple) -> None:
    with pytest.warns(UndefinedMetricWarning, match="no samples"):
        value = make().compute()
    assert_nan_like(value, defined_value(make, batch))


@STREAMING
def test_compute_after_reset_gives_nan_and_warns(make: Callable[[], Metric], batch: tuple) -> None:
    metric = make()
    metric.update(*batch)
    metric.reset()
    with pytest.warns(UndefinedMetricWarning, match="no samples"):
        value = metric.compute()
    assert_nan_like(value, defined_value(make, batch))


@STREAMING
def test_forward_on_an_empty_batch_gives_nan_and_keeps_the_state(make: Callable[[], Metric], batch: tuple) -> None:
    """The batch value of an empty batch is NaN (no samples); the items seen before still count."""
    metric = make()
    metric.update(*batch)
    with pytest.warns(UndefinedMetricWarning, match="no samples"):
        value = metric(*(x[:0] for x in batch))
    assert_nan_like(value, defined_value(make, batch))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UndefinedMetricWarning)
        after = metric.compute()
    expected = defined_value(make, batch)
    for key in expected if isinstance(expected, dict) else [None]:
        pair = (after, expected) if key is None else (after[key], expected[key])
        assert torch.equal(*pair)


def test_only_empty_batches_count_as_no_samples() -> None:
    metric = MultiLabelAUC(num_labels=2)
    metric.update(torch.empty(0), torch.empty(0, 2))
    with pytest.warns(UndefinedMetricWarning, match="no samples"):
        result = metric.compute()
    assert result["per_label_auc"].shape == (2,) and torch.isnan(result["per_label_auc"]).all()


# ----------------------------------------------------------------------------------------------------------------
# CUDA: same values as on CPU, and nothing non-deterministic (runs only where a GPU is present)
# ----------------------------------------------------------------------------------------------------------------


@IGNORE_UNDEFINED
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed", range(4))
def test_cuda_matches_cpu_in_deterministic_mode(seed: int) -> None:
    scores, labels, groups = random_case(seed, max_n=500, k=3)
    levels = random_levels(seed, len(scores))
    cpu = (t(scores, torch.float32), t(labels, torch.long), t(groups, torch.long), t(levels))
    calls: list[Callable[..., torch.Tensor]] = [
        lambda s, y, g, l: binary_auc(s, y[:, 0]),
        lambda s, y, g, l: group_auc(s, y[:, 0], g, "size"),
        lambda s, y, g, l: multilabel_auc(s, y),
        lambda s, y, g, l: multipartite_auc(s, l, g),
        lambda s, y, g, l: multipartite_auc(s, y, cost="uniform", label_weights=[1.0, 2.0, 0.5]),
    ]
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for call in calls:
            on_gpu = call(*(x.cuda() for x in cpu))
            assert on_gpu.is_cuda
            assert torch.allclose(on_gpu.cpu(), call(*cpu), equal_nan=True, rtol=1e-12, atol=1e-12)
            assert torch.equal(call(*(x.cuda() for x in cpu)).isnan(), on_gpu.isnan())
    finally:
        torch.use_deterministic_algorithms(previous)


def test_ranking_metrics_refuse_options_they_would_ignore():
    # group_weighting was checked only when groups came; label_weights were dropped for (N, K) scores.
    from mlloss.evaluation import ranking_metrics

    gen = torch.Generator().manual_seed(0)
    scores, labels = torch.randn(30, 2, generator=gen), (torch.rand(30, 2, generator=gen) < 0.5).long()
    with pytest.raises(ValueError, match="group_weighting must be one of 'uniform', 'size'; got 'bogus'"):
        ranking_metrics(scores[:, 0], labels, label_names=["a", "b"], group_weighting="bogus")
    with pytest.raises(ValueError, match=r"label_weights weigh the labels of one score's multipartite AUC; got "
                                         r"label_weights=\[1, 3\]"):
        ranking_metrics(scores, labels, label_names=["a", "b"], label_weights=[1, 3])
    one_score = ranking_metrics(scores[:, 0], labels, label_names=["a", "b"], label_weights=[1, 3])
    assert one_score["multipartite_auc"] == multipartite_auc(scores[:, 0], labels, label_weights=[1, 3])
    for k, name in enumerate("ab"):
        assert one_score[f"auc/{name}"] == binary_auc(scores[:, 0], labels[:, k])
