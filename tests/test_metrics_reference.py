"""More tests of :mod:`mlloss.metrics` against independent references: a float64 count over all pairs,
scikit-learn's ``roc_auc_score`` and, for a million items, an exact count in Python integers; and of the
streaming classes' states (batches of different dtypes, ``load_state_dict``, ``merge_state`` of a gathered
state)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from mlloss.evaluation import ranking_metrics
from mlloss.metrics import (
    AUC,
    GroupAUC,
    MultiLabelAUC,
    MultipartiteAUC,
    UndefinedMetricWarning,
    binary_auc,
    group_auc,
    multilabel_auc,
    multipartite_auc,
)
from mlloss.metrics.counting import prefix_dominance

IGNORE_UNDEFINED = pytest.mark.filterwarnings("ignore::mlloss.metrics.UndefinedMetricWarning")


def pair_auc(scores, labels) -> float:
    """AUC over every (positive, negative) pair in float64, ties one half; NaN without both classes."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels)
    pos, neg = s[y == 1], s[y == 0]
    if pos.size == 0 or neg.size == 0:
        return math.nan
    return float(((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean())


def pair_gauc(scores, labels, groups, weighting: str) -> float:
    """Mean of :func:`pair_auc` over the groups with both classes, weighted 1 or by the group's items."""
    s, y, g = np.asarray(scores, dtype=np.float64), np.asarray(labels), np.asarray(groups)
    total = weight_sum = 0.0
    for gid in set(g.tolist()):  # Python ints: ids near 2^63 stay distinct
        member = g == gid
        value = pair_auc(s[member], y[member])
        if not math.isnan(value):
            weight = 1.0 if weighting == "uniform" else float(member.sum())
            total, weight_sum = total + weight * value, weight_sum + weight
    return total / weight_sum if weight_sum else math.nan


def pair_multipartite(scores, levels, cost: str) -> float:
    """Cost-weighted multipartite AUC over every pair with distinct levels, float64."""
    s, v = np.asarray(scores, dtype=np.float64), np.asarray(levels, dtype=np.float64)
    gap = v[:, None] - v[None, :]
    weight = np.where(gap > 0, gap if cost == "linear" else 1.0, 0.0)
    credit = (s[:, None] > s[None, :]) + 0.5 * (s[:, None] == s[None, :])
    return float((credit * weight).sum() / weight.sum())


def exact_auc_of_small_integers(scores: np.ndarray, labels: np.ndarray, num_values: int) -> Fraction:
    """The AUC of integer scores in [0, num_values) as an exact fraction, counted in Python integers."""
    pos = np.bincount(scores[labels == 1], minlength=num_values).tolist()
    neg = np.bincount(scores[labels == 0], minlength=num_values).tolist()
    twice_wins, below = 0, 0
    for p, q in zip(pos, neg):
        twice_wins += p * (2 * below + q)
        below += q
    return Fraction(twice_wins, 2 * sum(pos) * sum(neg))


def tied_case(seed: int, n: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randint(-3, 4, (n,), generator=generator).double() / 4  # few distinct values: many ties
    labels = (torch.rand(n, generator=generator) < 0.3).long()
    return scores, labels


# ----------------------------------------------------------------------------------------------------------------
# Binary AUC: ties, extreme values, dtypes and layouts, against all pairs and scikit-learn
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_binary_auc_with_ties_matches_all_pairs_and_sklearn(seed: int) -> None:
    scores, labels = tied_case(seed)
    value = binary_auc(scores, labels)
    assert value.dtype == torch.float64
    assert value.item() == pytest.approx(pair_auc(scores, labels), abs=1e-15)
    assert value.item() == pytest.approx(roc_auc_score(labels.numpy(), scores.numpy()), abs=1e-12)


def test_equal_scores_give_one_half_and_one_class_gives_nan_with_a_warning() -> None:
    labels = torch.tensor([0, 1, 1, 0, 1])
    assert binary_auc(torch.full((5,), 0.3), labels).item() == 0.5
    with pytest.warns(UndefinedMetricWarning, match="labels"):
        assert math.isnan(binary_auc(torch.rand(5), torch.ones(5)).item())
    with pytest.warns(UndefinedMetricWarning):
        assert math.isnan(binary_auc(torch.zeros(0), torch.zeros(0)).item())


def test_infinite_scores_count_and_tie_like_any_other_value() -> None:
    inf = math.inf
    scores = torch.tensor([inf, inf, -inf, -inf, 0.0, -0.0])
    labels = torch.tensor([1, 0, 1, 0, 1, 0])
    # the reference compares values (inf == inf and 0.0 == -0.0 tie) and never subtracts them
    assert binary_auc(scores, labels).item() == pair_auc(scores.numpy(), labels.numpy())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_nan_score_is_refused_naming_the_entry(dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match=r"scores\[1\] = nan"):
        binary_auc(torch.tensor([0.1, math.nan, 0.3], dtype=dtype), torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match=r"scores\[1\] = nan"):
        AUC().update(torch.tensor([0.1, math.nan, 0.3], dtype=dtype), torch.tensor([0, 1, 1]))


@pytest.mark.parametrize("labels", [[0, 2, 1], [-1, 1, 0], [0.5, 1.0, 0.0]])
def test_labels_other_than_0_and_1_are_refused(labels: list) -> None:
    with pytest.raises(ValueError, match="labels must be binary"):
        binary_auc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor(labels))


@pytest.mark.parametrize("score_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8,
                                         torch.int32, torch.int64, torch.bool])
@pytest.mark.parametrize("label_dtype", [torch.bool, torch.uint8, torch.int64, torch.float32])
def test_score_and_label_dtypes_match_all_pairs(score_dtype: torch.dtype, label_dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(5)
    raw = torch.randint(0, 2 if score_dtype == torch.bool else 100, (200,), generator=generator)
    if score_dtype.is_floating_point:
        raw = (raw - 50) / 8  # exact in every float dtype here
    elif score_dtype not in (torch.bool, torch.uint8):
        raw = raw - 50
    scores = raw.to(score_dtype)
    labels = torch.randint(0, 2, (200,), generator=generator)
    expected = pair_auc(scores.double().numpy(), labels.numpy())  # the values as given, exact in float64
    assert binary_auc(scores, labels.to(label_dtype)).item() == pytest.approx(expected, abs=1e-15)


def test_non_contiguous_columns_match_all_pairs() -> None:
    generator = torch.Generator().manual_seed(6)
    scores, labels = torch.rand(3, 400, generator=generator).t(), torch.randint(0, 2, (400, 3), generator=generator)
    strided_scores, strided_labels = scores[::3, 1], labels.t()[2, ::3]
    assert not strided_scores.is_contiguous() and not strided_labels.is_contiguous()
    assert binary_auc(strided_scores, strided_labels).item() == pytest.approx(
        pair_auc(strided_scores.numpy(), strided_labels.numpy()), abs=1e-15)
    assert multilabel_auc(scores[:, 0], labels).tolist() == pytest.approx(
        [pair_auc(scores[:, 0].numpy(), labels[:, k].numpy()) for k in range(3)], abs=1e-15)


@IGNORE_UNDEFINED
def test_a_million_items_are_counted_exactly() -> None:
    # 10^6 items over 1000 score values: ~10^11 pairs, far above float32's 2^24 and int32's 2^31. The
    # value must be the float64 rounding of the exact fraction, counted here in Python integers; the
    # same for a one-group GAUC and a one-label MultiLabelAUC, which count through the group segments.
    generator = torch.Generator().manual_seed(7)
    scores = torch.randint(0, 1000, (1_000_000,), generator=generator)
    labels = (torch.rand(1_000_000, generator=generator) < 0.3).long()
    expected = float(exact_auc_of_small_integers(scores.numpy(), labels.numpy(), 1000))
    assert binary_auc(scores.float(), labels).item() == expected
    assert group_auc(scores.float(), labels, torch.zeros_like(labels)).item() == expected
    assert multilabel_auc(scores.float(), labels[:, None]).tolist() == [expected]


# ----------------------------------------------------------------------------------------------------------------
# GAUC: weighting, group ids
# ----------------------------------------------------------------------------------------------------------------

EXTREME_IDS = [2**62, 2**62 + 1, -(2**62), -(2**63), 2**63 - 1, 0, -1, 2**40 + 3]


@IGNORE_UNDEFINED
@pytest.mark.parametrize("weighting", ["uniform", "size"])
def test_gauc_with_extreme_unsorted_group_ids_split_across_batches_matches_all_pairs(weighting: str) -> None:
    scores, labels = tied_case(8, n=400)
    generator = torch.Generator().manual_seed(8)
    groups = torch.tensor(EXTREME_IDS)[torch.randint(0, len(EXTREME_IDS), (400,), generator=generator)]
    expected = pair_gauc(scores.numpy(), labels.numpy(), groups.numpy(), weighting)
    assert group_auc(scores, labels, groups, weighting).item() == pytest.approx(expected, abs=1e-15)
    metric = GroupAUC(weighting)
    for start in range(0, 400, 37):  # every group spans several batches
        metric.update(scores[start:start + 37], labels[start:start + 37], groups[start:start + 37])
    assert metric.compute().item() == group_auc(scores, labels, groups, weighting).item()


# ----------------------------------------------------------------------------------------------------------------
# Streaming: batches of different score dtypes
# ----------------------------------------------------------------------------------------------------------------


def mixed_dtype_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches whose scores torch.cat alone would round: int64 beside fp16 (to fp16) and fp32 (to fp32)."""
    return [
        (torch.tensor([0.5, 0.25], dtype=torch.float16), torch.tensor([0, 1])),
        (torch.tensor([100_000, 100_001, 2**24 + 1, 2**24]), torch.tensor([0, 1, 1, 0])),
        (torch.tensor([0.75, 70_000.0], dtype=torch.float32), torch.tensor([1, 0])),
    ]


def test_streaming_metrics_keep_the_values_of_batches_of_different_dtypes() -> None:
    batches = mixed_dtype_batches()
    scores = torch.cat([batch.double() for batch, _ in batches])  # every value exactly
    labels = torch.cat([label for _, label in batches])
    expected = pair_auc(scores.numpy(), labels.numpy())
    metrics = [AUC(), GroupAUC(), MultiLabelAUC(1), MultipartiteAUC()]
    for batch_scores, batch_labels in batches:
        metrics[0].update(batch_scores, batch_labels)
        metrics[1].update(batch_scores, batch_labels, torch.zeros_like(batch_labels))
        metrics[2].update(batch_scores, batch_labels)
        metrics[3].update(batch_scores, batch_labels.double())
    assert metrics[0].compute().item() == expected
    assert metrics[1].compute().item() == expected
    assert metrics[2].compute()["per_label_auc"].item() == expected
    assert metrics[3].compute().item() == expected


def test_streaming_auc_takes_integer_scores_of_exactly_2_to_the_53_beside_float_batches():
    """Integer scores of magnitude 2^53 are floats exactly: kept beside a float batch (the bound
    refuses only the integers past it, which float64 would merge)."""
    metric = AUC()
    metric.update(torch.tensor([2**53, -(2**53), 7]), torch.tensor([1, 0, 1]))
    metric.update(torch.tensor([0.5, 3.0], dtype=torch.float32), torch.tensor([0, 1]))
    assert metric.compute().item() == roc_auc_score([1, 0, 1, 0, 1], [2.0**53, -(2.0**53), 7.0, 0.5, 3.0])


# ----------------------------------------------------------------------------------------------------------------
# States: load_state_dict, merge_state of a gathered state
# ----------------------------------------------------------------------------------------------------------------


def saved_state(seed: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    scores, labels = tied_case(seed, n=100)
    metric = AUC()
    metric.persistent(True)
    metric.update(scores[:50], labels[:50])
    return metric.state_dict(), scores, labels


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric AUC was called before the ``update``")
def test_load_state_dict_leaves_the_callers_state_dict_as_it_was() -> None:
    state, scores, labels = saved_state(9)
    first = AUC()
    first.load_state_dict(state)
    first.update(scores[50:], labels[50:])  # must not append to state["scores"]
    assert [batch.numel() for batch in state["scores"]] == [50]
    second = AUC()
    second.load_state_dict(state)  # a second metric from the same checkpoint sees the saved items only
    assert second.compute().item() == pytest.approx(pair_auc(scores[:50], labels[:50]), abs=1e-15)
    assert first.compute().item() == pytest.approx(pair_auc(scores, labels), abs=1e-15)


def test_a_state_saved_gathered_loads_and_takes_more_batches() -> None:
    scores, labels = tied_case(10, n=100)
    metric = AUC()
    # the form torchmetrics gives a list state once gathered across processes: one tensor
    metric.load_state_dict({"scores": scores[:50].clone(), "labels": labels[:50].to(torch.uint8)})
    metric.update(scores[50:], labels[50:])
    assert metric.compute().item() == pytest.approx(pair_auc(scores, labels), abs=1e-15)


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric AUC was called before the ``update``")
@pytest.mark.parametrize("empty_first", [False, True])
def test_merge_state_takes_a_gathered_state(empty_first: bool) -> None:
    scores, labels = tied_case(11, n=100)
    metric = AUC()
    if not empty_first:
        metric.update(scores[:50], labels[:50])
    metric.merge_state({"scores": scores[50:].clone(), "labels": labels[50:].to(torch.uint8)})
    kept = slice(50, None) if empty_first else slice(None)
    assert metric.compute().item() == pytest.approx(pair_auc(scores[kept], labels[kept]), abs=1e-15)
    metric.update(scores[:10], labels[:10])
    more = torch.cat([scores[kept], scores[:10]]), torch.cat([labels[kept], labels[:10]])
    assert metric.compute().item() == pytest.approx(pair_auc(*more), abs=1e-15)


def test_merge_state_into_a_metric_synced_across_processes() -> None:
    """After ``sync()`` (a one-process gloo group here) a metric's own states are gathered tensors;
    merging another metric's batches into it joins both, as one call over the union gives."""
    import torch.distributed as dist

    from ranks import free_port

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        scores, labels = tied_case(13, n=80)
        groups = torch.randint(0, 6, (80,), generator=torch.Generator().manual_seed(13))
        mine, other = AUC(sync_on_compute=False), AUC()
        mine.update(scores[:50], labels[:50])
        other.update(scores[50:], labels[50:])
        mine.sync()
        assert isinstance(mine.scores, torch.Tensor)  # gathered
        mine.merge_state(other)
        assert mine.compute().item() == pytest.approx(pair_auc(scores, labels), abs=1e-15)
        grouped, more = GroupAUC(weighting="size", sync_on_compute=False), GroupAUC(weighting="size")
        grouped.update(scores[:50], labels[:50], groups[:50])
        more.update(scores[50:], labels[50:], groups[50:])
        grouped.sync()
        grouped.merge_state(more.metric_state)
        assert grouped.compute().item() == group_auc(scores, labels, groups, "size").item()
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------------------
# Multipartite AUC and the ranking report
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cost", ["linear", "uniform"])
def test_multipartite_auc_of_distinct_real_levels_matches_all_pairs(cost: str) -> None:
    generator = torch.Generator().manual_seed(12)
    scores = torch.randint(0, 20, (300,), generator=generator).double()
    levels = torch.rand(300, generator=generator, dtype=torch.float64) * 10  # every level distinct
    assert multipartite_auc(scores, levels, cost=cost).item() == pytest.approx(
        pair_multipartite(scores, levels, cost), rel=1e-12)


@pytest.mark.parametrize("cost", ["uniform", "linear"])
def test_streaming_multipartite_auc_keeps_float64_levels_apart(cost: str) -> None:
    """Ordinal levels that differ below float32's resolution (1 and 1 + 2^-30, 1e8 and 1e8 + 1) are
    distinct levels, over two batches as in one call, as the brute force over all pairs counts them."""
    levels = torch.tensor([0.0, 1.0, 1.0 + 2**-30, 1e8, 1e8 + 1], dtype=torch.float64)
    scores = torch.tensor([0.0, 2.0, 1.0, 5.0, 4.0])
    metric = MultipartiteAUC(cost=cost)
    metric.update(scores[:3], levels[:3])
    metric.update(scores[3:], levels[3:])
    value = metric.compute().item()
    assert value == pytest.approx(pair_multipartite(scores, levels, cost), rel=1e-12, abs=0)
    assert value == multipartite_auc(scores, levels, cost=cost).item()


def fraction_multipartite_linear(scores: list[float], levels: list[float]) -> Fraction:
    """The linear-cost multipartite AUC in exact rational arithmetic (no overflow, no rounding)."""
    credit = total = Fraction(0)
    for s_i, y_i in zip(scores, levels):
        for s_j, y_j in zip(scores, levels):
            if y_i > y_j:
                gap = Fraction(y_i) - Fraction(y_j)
                credit += gap * (1 if s_i > s_j else Fraction(1, 2) if s_i == s_j else 0)
                total += gap
    return credit / total


@pytest.mark.parametrize("seed", range(3))
def test_linear_multipartite_auc_of_levels_near_the_float64_maximum_is_finite_and_exact(seed: int) -> None:
    # differences of such levels (1.7e308 - -1.7e308) overflow float64: the value was NaN, with a warning
    # that no two levels differ
    rng = np.random.default_rng(seed)
    levels = rng.choice([-1.7e308, -1e300, 0.0, 3.0, 1e308, 1.7e308], size=24).tolist()
    scores = rng.integers(0, 5, size=24).astype(float).tolist()
    value = multipartite_auc(torch.tensor(scores), torch.tensor(levels, dtype=torch.float64))
    assert value.item() == pytest.approx(float(fraction_multipartite_linear(scores, levels)), rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 100])
def test_prefix_dominance_counts_match_a_direct_count(n: int) -> None:
    generator = torch.Generator().manual_seed(n)
    ranks = torch.randint(0, n + 1, (n,), generator=generator)
    stops = torch.cat([torch.tensor([0, n]), torch.randint(0, n + 1, (50,), generator=generator)])
    bounds = torch.cat([torch.tensor([n + 1, 0]), torch.randint(0, n + 2, (50,), generator=generator)])
    expected = [int((ranks[:stop] < bound).sum()) for stop, bound in zip(stops.tolist(), bounds.tolist())]
    assert prefix_dominance(ranks, stops, bounds).tolist() == expected


def pair_grouped_multipartite_uniform(scores, levels, groups) -> float:
    """Unit-cost multipartite AUC of each group over its pairs of distinct levels, mean over the groups that have one."""
    g = np.asarray(groups)
    values = [pair_multipartite(np.asarray(scores)[g == gid], np.asarray(levels)[g == gid], "uniform")
              for gid in set(g.tolist()) if len(set(np.asarray(levels)[g == gid].tolist())) > 1]
    return float(np.mean(values))


@pytest.mark.parametrize("score_dtype", [torch.float64, torch.float16, torch.bool])
@pytest.mark.parametrize("seed", range(3))
def test_uniform_multipartite_auc_of_many_levels_in_groups_matches_all_pairs(seed: int, score_dtype: torch.dtype) -> None:
    # more distinct levels than log2(N): counted by dominance rather than level by level
    generator = torch.Generator().manual_seed(14 + seed)
    n = 240
    scores = (torch.randint(0, 2 if score_dtype == torch.bool else 12, (n,), generator=generator)).to(score_dtype)
    levels = torch.randint(0, 60, (n,), generator=generator).double() / 4  # ties in levels too
    groups = torch.randint(-3, 5, (n,), generator=generator) * 2**58
    expected = pair_grouped_multipartite_uniform(scores.double().numpy(), levels.numpy(), groups.numpy())
    assert multipartite_auc(scores, levels, groups, cost="uniform").item() == pytest.approx(expected, abs=1e-14)
    assert multipartite_auc(scores, levels, cost="uniform").item() == pytest.approx(
        pair_multipartite(scores.double(), levels, "uniform"), abs=1e-15)


@IGNORE_UNDEFINED
def test_ranking_metrics_match_all_pairs() -> None:
    generator = torch.Generator().manual_seed(13)
    scores = torch.randint(0, 9, (200, 2), generator=generator).double()
    labels = torch.randint(0, 2, (200, 2), generator=generator)
    groups = torch.randint(-4, 15, (200,), generator=generator) * 2**50
    per_task = ranking_metrics(scores, labels, groups, label_names=["click", "buy"], group_weighting="size")
    aucs = [pair_auc(scores[:, k], labels[:, k]) for k in range(2)]
    for k, name in enumerate(["click", "buy"]):
        assert per_task[f"auc/{name}"].item() == pytest.approx(aucs[k], abs=1e-15)
        assert per_task[f"gauc/{name}"].item() == pytest.approx(
            pair_gauc(scores[:, k], labels[:, k], groups, "size"), abs=1e-15)
    assert per_task["diff_auc"].item() == pytest.approx(max(aucs) - min(aucs), abs=1e-15)
    one = ranking_metrics(scores[:, 0], labels, label_names=["click", "buy"], label_weights=[1.0, 3.0])
    assert one["multipartite_auc"].item() == pytest.approx(
        pair_multipartite(scores[:, 0], labels.double() @ torch.tensor([1.0, 3.0], dtype=torch.float64), "linear"),
        rel=1e-12)


@pytest.mark.parametrize("argument", ["scores", "labels"])
def test_ranking_metrics_refuse_a_non_tensor_by_name(argument: str) -> None:
    inputs = {"scores": torch.rand(4), "labels": torch.tensor([0, 1, 0, 1])}
    inputs[argument] = inputs[argument].numpy()
    with pytest.raises(TypeError, match=f"{argument} must be a torch.Tensor; got ndarray"):
        ranking_metrics(inputs["scores"], inputs["labels"], label_names=["click"])
