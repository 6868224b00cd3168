"""A pairwise loss with ``cross_device=True`` on a model whose TorchRec tables are sharded over 2
gloo processes: one step equals the gradient step of the loss over the global batch, computed by
brute force over every pair in float64 in one process (tests/test_torchrec.py checks the sharding
with a pointwise loss)."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("torchrec", reason="the torchrec extra is not installed (README, 'TorchRec')")

import torchrec_worker  # noqa: E402
from ports import free_port  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Each rank's record of torchrec_worker.run_ranking_loss."""
    out_dir = tmp_path_factory.mktemp("torchrec-ranking")
    mp.spawn(torchrec_worker.run_ranking_loss, args=(2, free_port(), str(out_dir)), nprocs=2, join=True)
    return [torch.load(out_dir / f"ranking-rank{rank}.pt", weights_only=False) for rank in range(2)]


def brute_force_laa(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """LaA with linear costs and the logistic surrogate (docs/loss-spec.md), per user over every
    pair, averaged over the users with a valid pair."""
    level = labels.sum(1)
    per_user = []
    for user in groups.unique():
        rows = groups == user
        s, y = scores[rows], level[rows]
        cost = (y[:, None] - y[None, :]).clamp(min=0)
        if cost.sum() > 0:
            per_user.append((cost * torch.nn.functional.softplus(s[None, :] - s[:, None])).sum() / cost.sum())
    return torch.stack(per_user).mean()


@pytest.mark.distributed
@pytest.mark.parametrize("sharding", ["table_wise", "column_wise"])
def test_a_cross_device_ranking_loss_steps_sharded_tables_like_one_process_on_the_global_batch(ranks, sharding):
    """Uneven local batches (20 and 12 rows), users on both ranks."""
    model = torchrec_worker.ranking_model().double()  # TorchRec pools in float32; the rest is float64
    ids, labels, groups = torchrec_worker.ranking_batch()
    loss = brute_force_laa(model(ids)[:, 0], labels.double(), groups)
    loss.backward()
    parameters = dict(model.named_parameters())
    results = [result[sharding] for result in ranks]
    for result in results:  # every rank returns the global loss, and DDP's average is its gradient
        torch.testing.assert_close(result["loss"].double(), loss.detach(), rtol=1e-5, atol=0)
        assert result["gradients"].keys() == {name for name in parameters if "embedding_bags" not in name}
        for name, gradient in result["gradients"].items():
            torch.testing.assert_close(gradient.double(), parameters[name].grad, rtol=1e-4, atol=1e-7, msg=name)
    for key in torchrec_worker.FIELDS:
        weight = model.embedding.ebc.embedding_bags[f"t_{key}"].weight
        after = sum(result["after"][f"embedding.ebc.embedding_bags.t_{key}.weight"] for result in results)
        assert weight.grad.abs().max() > 1e-4  # the step moves the tables
        torch.testing.assert_close(after.double(), weight.detach() - torchrec_worker.SPARSE_LR * weight.grad,
                                   rtol=1e-5, atol=1e-7, msg=key)
