"""cross_device=True under DistributedDataParallel on 2 CPU processes (gloo): the loss and the
parameter gradients equal the single-process ones on the concatenated batch (loss spec,
"Distributed batches"), with uneven local batches, a rank without items, and users on both ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ddp_worker
import mlloss
from ranks import ForkedRanks

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """The folder of every case's results, one file per case and rank, from the file's one
    2-process job (``ddp_worker.run``, forked from this process)."""
    out_dir = tmp_path_factory.mktemp("ddp")
    ForkedRanks(ddp_worker.run, (str(out_dir),), log=out_dir / "ranks.log").join()
    return out_dir


def _ranks(job: Path, case: str) -> list[dict]:
    return [torch.load(job / f"{case}-rank{rank}.pt") for rank in range(2)]


@pytest.fixture(scope="module")
def rank_results(job):
    return _ranks(job, "losses")


@pytest.mark.parametrize("split", ddp_worker.SPLITS)
@pytest.mark.parametrize("name", list(ddp_worker.LOSSES))
def test_cross_device_loss_and_gradients_equal_single_process(rank_results, split, name):
    features, labels, groups = ddp_worker.global_batch()
    expected_loss, expected_grads = ddp_worker.loss_and_grads(
        ddp_worker.make_model(), name, features, labels, groups
    )
    assert expected_loss > 0
    for results in rank_results:
        loss, grads = results[split, name]
        torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-12)
        for grad, expected in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("grouped", [True, False], ids=["groups", "no-groups"])
@pytest.mark.parametrize("split", ddp_worker.SPLITS)
@pytest.mark.parametrize("name", ddp_worker.MASKED)
def test_cross_device_masked_loss_equals_single_process_on_the_kept_items(rank_results, split, name, grouped):
    # Without groups the mask's fillers get a group of their own inside the op: the ranks must
    # still compute the whole batch (there are no user groups to split), not a share each.
    features, labels, groups = ddp_worker.global_batch()
    keep = ddp_worker.global_mask()
    expected_loss, expected_grads = ddp_worker.loss_and_grads(
        ddp_worker.make_model(), name, features[keep], labels[keep], groups[keep] if grouped else None
    )
    assert expected_loss > 0
    for results in rank_results:
        loss, grads = results[split, name, "masked", grouped]
        torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-12)
        for grad, expected in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("split", ddp_worker.SPLITS)
def test_cross_device_loa_reports_each_labels_whole_term(rank_results, split):
    # The ranks compute shares of the groups' pairs: each label's term L_k in parts is their sum.
    features, labels, groups = ddp_worker.global_batch()
    expected = ddp_worker.loa_label_losses(ddp_worker.make_model(), features, labels, groups)
    for results in rank_results:
        torch.testing.assert_close(results[split, "loa-parts"], expected, rtol=1e-10, atol=0)


@pytest.mark.parametrize("split", ddp_worker.SPLITS)
def test_cross_device_mixing_weights_are_the_gathered_batchs(rank_results, split):
    # mixing_weights read only this rank's labels: each rank reported other a_k than forward used.
    _, labels, _ = ddp_worker.global_batch()
    expected = mlloss.LoALoss("balanced").mixing_weights(labels)
    for results in rank_results:
        torch.testing.assert_close(results[split, "mixing-weights"], expected, rtol=1e-12, atol=0)


def test_streaming_metrics_sync_when_a_process_saw_no_batch(job):
    # Its empty states were gathered as float32 vectors beside uint8 labels, int64 groups and
    # (N, K) labels: gloo aborted the job. Every rank now gets the metrics of rank 0's data.
    from mlloss.metrics import AUC, GroupAUC, MultiLabelAUC, MultipartiteAUC

    features, labels, groups = ddp_worker.global_batch()
    scores = features[:, 0].float()
    expected = {"auc": AUC()(scores, labels[:, 0]), "gauc": GroupAUC()(scores, labels[:, 0], groups),
                "multilabel": MultiLabelAUC(2)(scores, labels),
                "multipartite": MultipartiteAUC(grouped=True)(scores, labels, groups)}
    for rank in range(2):
        torch.testing.assert_close(torch.load(job / f"metrics-rank{rank}.pt"), expected, rtol=0, atol=0)


def test_cross_device_widens_int16_labels_and_group_ids_and_names_ranks_with_other_label_dtypes(job):
    features, labels, groups = ddp_worker.global_batch()
    expected = mlloss.AUCLoss()(features[:, 0], labels[:, 0].long(), groups)
    for rank in range(2):
        results = torch.load(job / f"dtype-rank{rank}.pt")
        torch.testing.assert_close(results["int16"], expected, rtol=1e-12, atol=0)
        torch.testing.assert_close(results["mixed ids"], expected, rtol=1e-12, atol=0)
        assert "ranks pass labels of different dtypes: ['torch.bool', 'torch.float64']" in results["mixed"]
        # a bad entry is named in the gathered batch, and each rank says where its own items are
        assert "scores[39] = nan" in results["nan"]
        own = "positions 0 to 36" if rank == 0 else "positions 37 to 59"
        assert f"in rank order; this rank's items are {own})" in results["nan"], results["nan"]
        # ranks that disagree on the batch's form raise by name instead of waiting in a gather of their own
        assert results["mask"] == "cross_device=True: some ranks pass a mask and others pass mask=None"
        assert results["groups"] == "cross_device=True: some ranks pass groups and others pass groups=None"
        assert results["columns"] == "cross_device=True: ranks disagree on the number of label columns: [1, 2]"


def test_cross_device_is_a_no_op_in_a_single_process():
    features, labels, groups = ddp_worker.global_batch()
    model = ddp_worker.make_model()
    scores = model(features)[:, 0]
    torch.testing.assert_close(
        mlloss.LaALoss(cross_device=True)(scores, labels, groups), mlloss.LaALoss()(scores, labels, groups)
    )


def test_cross_device_in_a_single_process_raises_the_batchs_own_error():
    scores, labels, groups = torch.tensor([-1.0, 1.0]), torch.tensor([1.0]), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="labels have 1 rows but scores have 2 items"):
        mlloss.AUCLoss(cross_device=True)(scores, labels, groups)


def _rank_zero_of_three(monkeypatch, failures: dict) -> None:
    """Rank 0 of 3 (the collectives mocked): ranks 1 and 2 join sum_shares' all-reduce through
    share_failed with ``failures[rank]`` (a rank not in it computed its share), and rank 0's
    all-reduce adds what they sent."""
    from mlloss import distributed

    rank, sent = [0], []
    monkeypatch.setattr(distributed, "world_size", lambda: 3)
    monkeypatch.setattr(distributed.dist, "get_rank", lambda group=None: rank[0])
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda packed: sent.append(packed.clone()))
    for other in (1, 2):
        rank[0] = other
        if other in failures:
            distributed.share_failed(failures[other], 1, torch.device("cpu"))
        else:
            distributed.sum_shares(torch.tensor(0.25, dtype=torch.float64), torch.tensor([0.25], dtype=torch.float64))
    rank[0] = 0
    monkeypatch.setattr(distributed.dist, "all_reduce", lambda packed: packed.add_(sum(sent)))


@pytest.mark.parametrize(("failures", "kind", "ranks"), [
    ({1: OverflowError("not finite"), 2: RuntimeError("out of memory")}, OverflowError, "[1, 2]"),
    ({1: KeyError("x"), 2: ValueError("bad")}, ValueError, "[1, 2]"),
    ({2: RuntimeError("out of memory")}, RuntimeError, "[2]"),
])
def test_the_ranks_whose_share_succeeded_raise_the_kind_of_the_lowest_failure(monkeypatch, failures, kind, ranks):
    # On 2 ranks the other rank only ever sees one failure: 3 ranks, the collectives mocked.
    from mlloss import distributed

    _rank_zero_of_three(monkeypatch, failures)
    with pytest.raises(kind) as error:
        distributed.sum_shares(torch.tensor(0.5, dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64))
    assert type(error.value) is kind
    assert str(error.value).startswith(f"cross_device=True: rank(s) {ranks} failed to compute their share")


def test_sum_shares_adds_the_ranks_shares_and_scales_the_gradient_by_the_world_size(monkeypatch):
    from mlloss import distributed

    _rank_zero_of_three(monkeypatch, {})
    share = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    loss, problems = distributed.sum_shares(share * 2, torch.tensor([0.5], dtype=torch.float64))
    assert float(loss.detach()) == 2 * 0.25 + 1.0 and problems.tolist() == [2 * 0.25 + 0.5]
    assert not problems.requires_grad, "the problems' losses are reported, never differentiated"
    loss.backward()
    assert float(share.grad) == 3 * 2.0


def test_bce_plus_pdaom_across_devices_equals_single_process(rank_results):
    """Eq. 7 over N with N counted over all ranks: the mean of the ranks' losses and the
    DDP-averaged gradients equal the single-process ones on the concatenated batch."""
    features, labels, groups = ddp_worker.global_batch()
    model = ddp_worker.make_model()
    expected_loss, expected_grads = ddp_worker.bce_pdaom_loss_and_grads(model, features, labels, groups)
    losses = torch.stack([results["bce+pdaom"][0] for results in rank_results])
    torch.testing.assert_close(losses.mean(), expected_loss, rtol=1e-6, atol=1e-12)
    for results in rank_results:
        for grad, expected in zip(results["bce+pdaom"][1], expected_grads):
            torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-10)


def test_group_partition_covers_every_group_once_with_balanced_work():
    from mlloss.ops.torch_tier import _owned_groups

    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(1, 60, (500,), generator=gen)
    sizes[7] = 400  # one very large user
    for world in (2, 3, 8):
        owners = torch.stack([_owned_groups(sizes.double() ** 2, rank, world) for rank in range(world)])
        assert torch.equal(owners.sum(0), torch.ones(500, dtype=torch.long)), "each group on exactly one rank"
        work = (owners * sizes.double() ** 2).sum(1)
        fair = work.sum() / world
        assert float(work.max()) <= float(fair + 400**2), "no rank gets more than its share plus one group"
    single = torch.stack([_owned_groups(torch.tensor([25.0]), rank, 4) for rank in range(4)])
    assert int(single.sum()) == 1  # one group: exactly one rank computes it
    nothing = torch.stack([_owned_groups(torch.zeros(3, dtype=torch.float64), rank, 2) for rank in range(2)])
    assert torch.equal(nothing.sum(0), torch.ones(3, dtype=torch.long))  # no pair anywhere: still one owner each


def test_a_masks_fillers_do_not_count_as_pair_work_in_the_split():
    # The rows outside a mask form one group of their own without a valid pair: counted as n^2 of work,
    # it outweighed every real group, and one rank computed all the pairs while the other idled.
    from mlloss.ops.dispatch import pair_loss

    gen = torch.Generator().manual_seed(3)
    n = 3000
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (n, 1), generator=gen).double()
    groups = torch.randint(0, 60, (n,), generator=gen)
    mask = torch.rand(n, generator=gen) > 0.3
    options = dict(mixing=None, label_weights=None, cost="uniform", surrogate="logistic", margin=1.0, pairs="all",
                   temperature=None, reduction="mean", backend="torch", validate=True)
    whole = pair_loss(scores, labels, groups, mask, **options).loss
    shares = [pair_loss(scores, labels, groups, mask, partition=(rank, 2), **options).loss for rank in range(2)]
    torch.testing.assert_close(sum(shares), whole, rtol=1e-12, atol=0)
    # each rank's share of the loss is about half (60 groups of similar size), not all or nothing
    assert all(0.25 < float(share / whole) < 0.75 for share in shares), [float(share / whole) for share in shares]


def test_a_rank_that_fails_makes_every_rank_raise_and_the_job_goes_on(job):
    # Rank 1's own batch check (or its cross-entropy's), or rank 0's overflowing share of the pairs,
    # raised on that rank only: the other rank waited in the gather (or the sum of the shares)
    # until the job died, or, when the failed rank went on, paired its next batch with this one.
    results = _ranks(job, "errors")
    raised = [{name: str(value) for name, value in result.items()} for result in results]
    assert raised[1]["refused"].startswith("ValueError: labels have 1 rows but scores have 2 items")
    assert raised[0]["refused"].startswith("ValueError: cross_device=True: rank(s) [1] refused their local batch")
    assert raised[1]["columns"].startswith("ValueError: PDAOMLoss(cross_device=True) takes one score column per call")
    assert raised[0]["columns"].startswith("ValueError: cross_device=True: rank(s) [1] refused their local batch")
    assert raised[0]["overflow"].startswith("OverflowError: the pairwise loss is not finite")
    assert raised[1]["overflow"].startswith("OverflowError: cross_device=True: rank(s) [0] failed to compute")
    assert raised[1]["bce"].startswith("ValueError: scores must be finite; scores[0, 0] = ")
    assert raised[0]["bce"].startswith("ValueError: cross_device=True: rank(s) [1] refused their local batch")
    # the good batch after both errors: float64 brute force, mean over users of softplus(-(s_pos - s_neg))
    batches = [ddp_worker.error_batch(rank) for rank in range(2)]
    expected = torch.stack([torch.nn.functional.softplus(-(s[0] - s[1])) for s, _, _ in batches]).mean()
    for result in results:
        torch.testing.assert_close(result["good"], expected, rtol=1e-12, atol=0)
