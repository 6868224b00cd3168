"""TorchRec integration (mlloss.integrations.torchrec and .torchrec_strategy): the
EmbeddingBagCollection feature module against the plain FieldEmbedding, sharded models against
their unsharded copy on 2 gloo processes, and the CTR/CVR recipe with TorchRec tables in one
process. The recipe trained, checkpointed, killed and resumed with table-wise sharded tables on 2
gloo processes: tests/test_checkpoints.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("torchrec", reason="the torchrec extra is not installed (README, 'TorchRec')")

import torchrec_worker  # noqa: E402
from recipe_util import load_recipe  # noqa: E402
from mlloss.integrations.torchrec import SHARDING_TYPES, TorchRecEmbedding, ids_to_kjt, shard_model  # noqa: E402
from mlloss.integrations.torchrec_strategy import TorchRecStrategy  # noqa: E402
from mlloss.models import FieldEmbedding  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- the embedding module


def _twin_field_embedding(module: TorchRecEmbedding, cardinalities) -> FieldEmbedding:
    plain = FieldEmbedding(cardinalities, module.output_dim // len(cardinalities))
    with torch.no_grad():
        for table, key in zip(plain.tables(), module.keys):
            table.copy_(module.ebc.embedding_bags[f"t_{key}"].weight)
    return plain


def test_embedding_equals_field_embedding_with_the_same_weights():
    cardinalities = (5, 7, 3)
    module = TorchRecEmbedding(cardinalities, 4, ["user", "item", "slot"])
    plain = _twin_field_embedding(module, cardinalities)
    gen = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randint(0, c, (9,), generator=gen) for c in cardinalities], dim=1)
    out, expected = module(ids), plain(ids)
    assert module.output_dim == plain.output_dim == 12
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    weights = torch.randn(out.shape, generator=gen)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    for grad, key in zip(plain.tables(plain.weight.grad), module.keys):
        torch.testing.assert_close(module.ebc.embedding_bags[f"t_{key}"].weight.grad, grad)


def test_embedding_sum_pools_several_ids_from_a_keyed_jagged_tensor():
    import torchrec

    module = TorchRecEmbedding((6, 4), 3, ["a", "b"])
    # row 0: a = {1, 2}, b = {3}; row 1: a = {}, b = {0, 1, 2}
    kjt = torchrec.KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3, 0, 1, 2]), lengths=torch.tensor([2, 0, 1, 3])
    )
    a, b = (module.ebc.embedding_bags[f"t_{k}"].weight.detach() for k in "ab")
    expected = torch.stack([torch.cat([a[1] + a[2], b[3]]), torch.cat([torch.zeros(3), b[0] + b[1] + b[2]])])
    torch.testing.assert_close(module(kjt), expected)
    roundtrip = ids_to_kjt(torch.tensor([[1, 3], [5, 0]]), ["a", "b"])
    assert roundtrip.keys() == ["a", "b"] and roundtrip.values().tolist() == [1, 5, 3, 0]


def test_embedding_errors_name_the_bad_argument():
    with pytest.raises(ValueError, match="cardinalities"):
        TorchRecEmbedding([5, 0], 4)
    with pytest.raises(ValueError, match="dim"):
        TorchRecEmbedding([5], 0)
    with pytest.raises(ValueError, match="field_names"):
        TorchRecEmbedding([5, 6], 4, ["a", "a"])
    module = TorchRecEmbedding([5, 6], 4, ["a", "b"])
    with pytest.raises(ValueError, match=r"shape \(B, 2\)"):
        module(torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="int32 or int64"):
        module(torch.zeros(3, 2))


def test_sharding_arguments_are_checked():
    with pytest.raises(RuntimeError, match="process group"):
        shard_model(torchrec_worker.make_model(), "table_wise")
    with pytest.raises(ValueError, match="sharding must be one of"):
        TorchRecStrategy("row_wise")
    with pytest.raises(ValueError, match="sparse_optimizer must be one of"):
        TorchRecStrategy("table_wise", sparse_optimizer="lamb")


# --------------------------------------------------------------------------- 2 processes


@pytest.fixture(scope="module")
def sharded_results(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("torchrec")
    results = {}
    for sharding in SHARDING_TYPES:
        mp.spawn(torchrec_worker.run, args=(2, free_port(), str(out_dir), sharding), nprocs=2, join=True)
        results[sharding] = [
            torch.load(out_dir / f"{sharding}-rank{rank}.pt", weights_only=False) for rank in range(2)
        ]
    return results


@pytest.mark.distributed
@pytest.mark.parametrize("sharding", SHARDING_TYPES)
def test_sharded_model_equals_the_unsharded_one(sharded_results, sharding):
    """Same weights, same scores, and one fused SGD step on the tables equals a single-process
    SGD step on the concatenated batch (the mean loss over both ranks)."""
    ranks = sharded_results[sharding]
    model = torchrec_worker.make_model()
    ids, target = torchrec_worker.global_batch()
    scores = model(ids)
    torch.nn.functional.mse_loss(scores, target).backward()
    for rank, result in enumerate(ranks):
        local = slice(rank * torchrec_worker.BATCH, (rank + 1) * torchrec_worker.BATCH)
        torch.testing.assert_close(result["scores"], scores[local].detach(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(result["head_grad"], model.head.weight.grad, rtol=1e-5, atol=1e-7)
    if sharding == "column_wise":
        plan = ranks[0]["plan"]  # each 8-wide table split in two 4-wide column shards, one per rank
        assert "column_wise" in plan and "[0, 4]" in plan and "table_wise" not in plan
    for key in model.embedding.keys:
        name = f"embedding.ebc.embedding_bags.t_{key}.weight"
        weight = model.embedding.ebc.embedding_bags[f"t_{key}"].weight
        before = sum(result["before"][name] for result in ranks)
        after = sum(result["after"][name] for result in ranks)
        torch.testing.assert_close(before, weight.detach(), rtol=0, atol=0)
        if sharding == "data_parallel":  # replicated tables are left to the dense optimizer
            torch.testing.assert_close(after, before, rtol=0, atol=0)
        else:
            expected = weight.detach() - torchrec_worker.SPARSE_LR * weight.grad
            torch.testing.assert_close(after, expected, rtol=1e-5, atol=1e-7)
            assert not torch.equal(after, before)


@pytest.mark.distributed
def test_shard_model_uses_the_process_group_it_is_given_and_refuses_a_subset(tmp_path):
    # A group of one rank each: refused by name (DMP took the job's group and ignored it, and
    # TorchRec places shards by global rank). A group of every rank: the tables are split
    # table-wise over it, and the scores are the unsharded model's.
    mp.spawn(torchrec_worker.run_in_own_group, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    model = torchrec_worker.make_model()
    ids, _ = torchrec_worker.global_batch()
    rows = {}
    for rank in range(2):
        result = torch.load(tmp_path / f"own-group-rank{rank}.pt", weights_only=False)
        assert "process_group must hold every rank of the job (2); got a group of 1" in result["refusal"]
        local = slice(rank * torchrec_worker.BATCH, (rank + 1) * torchrec_worker.BATCH)
        torch.testing.assert_close(result["scores"], model(ids[local]).detach(), rtol=1e-6, atol=1e-7)
        for name, count in result["rows"].items():
            rows[name] = rows.get(name, 0) + count
    assert rows == {f"embedding.ebc.embedding_bags.t_{key}.weight": c
                    for key, c in zip(torchrec_worker.FIELDS, torchrec_worker.CARDINALITIES)}


def test_an_empty_batch_embeds_to_zero_rows_that_reach_the_tables():
    # The short rank's empty batch under DDP: TorchRec's collection cannot take zero rows.
    cardinalities = (5, 6, 7)
    module = TorchRecEmbedding(cardinalities, 4)
    out = module(torch.zeros(0, 3, dtype=torch.long))
    assert out.shape == (0, 12) and out.shape == _twin_field_embedding(module, cardinalities)(
        torch.zeros(0, 3, dtype=torch.long)).shape
    out.sum().backward()
    for key in module.keys:  # the tables take part in the graph, with a zero gradient
        assert torch.equal(module.ebc.embedding_bags[f"t_{key}"].weight.grad, torch.zeros(cardinalities[module.keys.index(key)], 4))


def test_recipe_runs_with_torchrec_embeddings_in_one_process(tmp_path):
    """No process group: the EmbeddingBagCollection model trains like the plain one."""
    recipe = load_recipe("ctr_cvr")
    argv = ["--num-users", "1000", "--epochs", "2", "--batch-size", "256", "--lr", "5e-3", "--seed", "1",
            "--embedding", "torchrec", "--no-progress-bar", "--no-checkpoint", "--output-dir", str(tmp_path)]
    results = recipe.main(argv)["results"]["test"]
    assert results["model/auc/click"] > results["popularity/auc/click"] + 0.03


def test_docs_example_builds():
    """The example of docs/torchrec.md defines a module that builds, and a trainer with the strategy."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "torchrec.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    code = next(block for block in blocks if "class Recommender" in block)
    namespace: dict = {}
    exec(compile(code, "docs/torchrec.md", "exec"), namespace)
    module = namespace["Recommender"]([10, 20], ["user", "item"], num_dense=3)
    logits = module.model(torch.tensor([[1, 2], [3, 4]]), torch.zeros(2, 3))
    assert logits.shape == (2, 3)
    assert isinstance(namespace["trainer"].strategy, TorchRecStrategy)
