"""TorchRec integration (mlloss.integrations.torchrec and .torchrec_strategy): the
EmbeddingBagCollection feature module against the plain FieldEmbedding, sharded models against
their unsharded copy on 2 gloo processes (also with a cross-device pairwise loss; every sharded
case of this file runs in one 2-process job, and both TorchRecStrategy cases in another, their
ranks forked from the test's process, which has imported TorchRec), and the CTR/CVR recipe with
TorchRec tables in one process. The recipe trained, checkpointed, killed and resumed with table-wise sharded tables on 2
gloo processes: tests/test_checkpoints.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrec", reason="the torchrec extra is not installed (docs/install.md)")

import torchrec_worker  # noqa: E402
from ranks import ForkedRanks, free_port  # noqa: E402
from recipe_util import load_recipe  # noqa: E402
from mlloss.checkpointing import incomplete_reason  # noqa: E402
from mlloss.integrations.torchrec import SHARDING_TYPES, TorchRecEmbedding, ids_to_kjt, shard_model  # noqa: E402
from mlloss.integrations.torchrec_strategy import TorchRecStrategy  # noqa: E402
from mlloss.models import FieldEmbedding  # noqa: E402


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


def test_embedding_takes_a_keyed_jagged_tensor_with_its_keys_in_any_order():
    module = TorchRecEmbedding(torchrec_worker.CARDINALITIES, 4, torchrec_worker.FIELDS)
    ids, _ = torchrec_worker.global_batch()
    expected = module(ids)
    for keys in torchrec_worker.KEY_ORDERS.values():  # other orders, and a key it has no table for
        torch.testing.assert_close(module(torchrec_worker.keyed_ids(keys, ids)), expected, rtol=0, atol=0)
    # (a bare KeyError 'item' from inside TorchRec before)
    with pytest.raises(ValueError, match=r"\['item'\] missing from its keys \['user', 'slot'\]"):
        module(torchrec_worker.keyed_ids(("user", "slot"), ids))


def test_a_variable_batch_keyed_jagged_tensor_in_another_key_order_keeps_its_rows():
    # KeyedJaggedTensor.permute drops the inverse indices of a variable-batch KJT (a key whose ids
    # several rows share): bringing the keys into field order failed ("Sizes of tensors must match").
    import torchrec

    module = TorchRecEmbedding((10, 12, 7), 4, ("user", "item", "slot"))

    def variable_batch(keys, strides, values, rows):
        return torchrec.KeyedJaggedTensor(
            keys=keys, values=torch.tensor(values), lengths=torch.ones(len(values), dtype=torch.int32),
            stride_per_key_per_rank=[[stride] for stride in strides], inverse_indices=(keys, torch.tensor(rows)))

    expected = module(torch.tensor([[1, 2, 3], [4, 2, 6]]))  # "item" 2 is one id for both rows
    in_order = variable_batch(["user", "item", "slot"], [2, 1, 2], [1, 4, 2, 3, 6], [[0, 1], [0, 0], [0, 1]])
    swapped = variable_batch(["slot", "user", "item"], [2, 2, 1], [3, 6, 1, 4, 2], [[0, 1], [0, 1], [0, 0]])
    torch.testing.assert_close(module(in_order), expected, rtol=0, atol=0)
    torch.testing.assert_close(module(swapped), expected, rtol=0, atol=0)


def test_embedding_of_zero_rows_and_errors_name_the_shape_given():
    import torchrec

    module = TorchRecEmbedding([5, 7], 4, ["a", "b"])
    with pytest.raises(ValueError, match=r"got \(0, 3\)"):  # it said (1, 3): the row it embeds instead
        module(torch.zeros(0, 3, dtype=torch.long))
    empty = torchrec.KeyedJaggedTensor(keys=["a", "b"], values=torch.zeros(0, dtype=torch.long),
                                       lengths=torch.zeros(0, dtype=torch.int32))
    out = module(empty)  # an IndexError inside TorchRec before
    assert out.shape == (0, 8)
    out.sum().backward()
    assert torch.equal(module.ebc.embedding_bags["t_a"].weight.grad, torch.zeros(5, 4))


def test_embedding_names_the_field_of_an_id_outside_its_table_like_field_embedding():
    # TorchRec's own error ("Index 7 of input ... out of bounds") named neither the field nor the table.
    module = TorchRecEmbedding([5, 7], 4, ["user", "item"])
    with pytest.raises(ValueError, match=r"ids\[:, 1\] \('item'\) must be in \[0, 7\); got 7"):
        module(torch.tensor([[1, 2], [4, 7]]))
    with pytest.raises(ValueError, match=r"ids\[:, 0\] \('user'\) must be in \[0, 5\); got -1"):
        module(torch.tensor([[-1, 2]]))


def test_embedding_names_the_key_of_a_keyed_id_outside_its_table():
    # A KeyedJaggedTensor's ids went unchecked: TorchRec's error ("Index 1 of input takes value 9 ...")
    # named no key (and a table-wise sharded table embedded the id without one: edge_results).
    import torchrec

    module = TorchRecEmbedding([6, 4], 4, ["a", "b"])
    for key, values, bad in (("a", [1, 6, 3, 0], 6), ("b", [1, -1, 3, 0], -1)):  # keys ("b", "a") for "b"
        kjt = torchrec.KeyedJaggedTensor(keys=["b", "a"] if key == "b" else ["a", "b"], values=torch.tensor(values),
                                         lengths=torch.tensor([2, 0, 1, 1]))
        with pytest.raises(ValueError, match=rf"ids of key '{key}' must be in \[0, {6 if key == 'a' else 4}\); got {bad}"):
            module(kjt)
    # a key without a table is not read, whatever its ids; empty bags embed to zeros
    kjt = torchrec.KeyedJaggedTensor(keys=["other", "a", "b"], values=torch.tensor([99, 5, 3]),
                                     lengths=torch.tensor([1, 0, 0, 1, 1, 0]))  # a: {}, {5}; b: {3}, {}
    a, b = (module.ebc.embedding_bags[f"t_{k}"].weight.detach() for k in "ab")
    torch.testing.assert_close(module(kjt), torch.stack([torch.cat([torch.zeros(4), b[3]]),
                                                         torch.cat([a[5], torch.zeros(4)])]))


def test_embedding_refuses_a_weighted_keyed_jagged_tensor():
    # The unsharded collection dropped the weights without a word (a sharded one does not).
    import torchrec

    module = TorchRecEmbedding([6, 4], 4, ["a", "b"])
    kjt = torchrec.KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 0, 1, 0]),
                                     weights=torch.tensor([2.0, 3.0, 5.0]))
    variable_batch = torchrec.KeyedJaggedTensor(  # keys in another order, "a" one id for both rows
        keys=["b", "a"], values=torch.tensor([1, 2, 3]), lengths=torch.ones(3, dtype=torch.int32),
        weights=torch.tensor([2.0, 3.0, 5.0]), stride_per_key_per_rank=[[2], [1]],
        inverse_indices=(["b", "a"], torch.tensor([[0, 1], [0, 0]])))
    for weighted in (kjt, variable_batch):
        with pytest.raises(ValueError, match="sparse is a weighted KeyedJaggedTensor"):
            module(weighted)


def test_embedding_output_has_the_tables_dtype_like_field_embedding():
    """``.double()``: float64 out, as FieldEmbedding gives (TorchRec's collection returned float32,
    which a float64 head refused); the values keep TorchRec's float32 pooling."""
    module = TorchRecEmbedding([5, 7], 4, ["a", "b"])
    ids = torch.tensor([[1, 2], [4, 6]])
    single = module(ids)
    plain = _twin_field_embedding(module, [5, 7])
    module.double()
    assert module(ids).dtype == plain.double()(ids).dtype == torch.float64
    torch.testing.assert_close(module(ids), single.double(), rtol=0, atol=0)
    assert torch.nn.Linear(8, 1).double()(module(ids)).dtype == torch.float64


def _fused_tables(module: torch.nn.Module) -> list[str]:
    return [name for name, p in module.named_parameters() if hasattr(p, "_in_backward_optimizers")]


def test_shard_model_checks_its_arguments_and_dims_before_attaching_anything():
    """Checked before the process group (none here) and before the fused optimizers are attached:
    the bad sparse optimizer of a data-parallel model and a non-finite or bool learning rate were
    accepted; a dim fbgemm cannot shard failed inside it with an AssertionError naming no argument,
    leaving the optimizers on the caller's tables."""
    model = torchrec_worker.make_model()
    with pytest.raises(ValueError, match="sparse_optimizer must be one of .*; got 'bogus'"):
        shard_model(model, "data_parallel", sparse_optimizer="bogus")
    for sparse_lr in (True, float("inf"), 0.0):
        with pytest.raises(ValueError, match=f"sparse_lr must be a finite number > 0; got {sparse_lr!r}"):
            shard_model(model, "table_wise", sparse_lr=sparse_lr)
    narrow = TorchRecEmbedding([5, 4], 6, ["a", "b"])
    for sharding in ("table_wise", "column_wise"):
        with pytest.raises(ValueError, match=f"sharding='{sharding}' needs embedding dims that are multiples of 4.*"
                                             r"table 't_a' \(features \['a'\]\) has embedding_dim 6"):
            shard_model(narrow, sharding, sparse_optimizer="sgd")
    assert _fused_tables(narrow) == [] and _fused_tables(model) == []
    with pytest.raises(RuntimeError, match="process group"):  # data_parallel takes any dim
        shard_model(narrow, "data_parallel")
    with pytest.raises(ValueError, match="sparse_lr must be a finite number > 0; got -1"):
        TorchRecStrategy("table_wise", sparse_lr=-1)


def test_column_wise_shards_are_the_widest_multiple_of_4_that_gives_every_rank_a_shard():
    """The width cuts the table into at least world_size shards, each a multiple of 4 columns
    wide, and is the widest such: dim / world_size when that is a multiple of 4 (one shard per
    rank, not more, smaller ones)."""
    from mlloss.integrations.torchrec import _column_shard_width

    for dim in range(4, 65, 4):
        for world_size in (1, 2, 3, 4, 8):
            width = _column_shard_width(dim, world_size)
            fitting = [w for w in range(4, dim + 1, 4) if dim % w == 0 and dim // w >= world_size]
            assert width == (max(fitting) if fitting else 4), (dim, world_size, width)
            if dim % (4 * world_size) == 0:
                assert width == dim // world_size, (dim, world_size, width)


# --------------------------------------------------------------------------- 2 processes


@pytest.fixture(scope="module")
def shard_model_runs(tmp_path_factory) -> Path:
    """The folder of every ``shard_model`` case's results, one file per case and rank, from one
    2-process job (``torchrec_worker.run_shard_model_cases``)."""
    out_dir = tmp_path_factory.mktemp("torchrec")
    ForkedRanks(torchrec_worker.run_shard_model_cases, (str(out_dir),), log=out_dir / "ranks.log").join()
    return out_dir


def _ranks(out_dir: Path, case: str) -> list[dict]:
    return [torch.load(out_dir / f"{case}-rank{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.fixture(scope="module")
def sharded_results(shard_model_runs):
    return {sharding: _ranks(shard_model_runs, sharding) for sharding in SHARDING_TYPES}


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
def test_shard_model_uses_the_process_group_it_is_given_and_refuses_a_subset(shard_model_runs):
    # A group of one rank each: refused by name (DMP took the job's group and ignored it, and
    # TorchRec places shards by global rank). A group of every rank: the tables are split
    # table-wise over it, and the scores are the unsharded model's.
    model = torchrec_worker.make_model()
    ids, _ = torchrec_worker.global_batch()
    rows = {}
    for rank, result in enumerate(_ranks(shard_model_runs, "own-group")):
        assert "process_group must hold every rank of the job (2); got a group of 1" in result["refusal"]
        local = slice(rank * torchrec_worker.BATCH, (rank + 1) * torchrec_worker.BATCH)
        torch.testing.assert_close(result["scores"], model(ids[local]).detach(), rtol=1e-6, atol=1e-7)
        for name, count in result["rows"].items():
            rows[name] = rows.get(name, 0) + count
    assert rows == {f"embedding.ebc.embedding_bags.t_{key}.weight": c
                    for key, c in zip(torchrec_worker.FIELDS, torchrec_worker.CARDINALITIES)}


@pytest.fixture(scope="module")
def edge_results(shard_model_runs):
    return _ranks(shard_model_runs, "edge")


def _local_rows(rank: int) -> slice:
    return slice(rank * torchrec_worker.BATCH, (rank + 1) * torchrec_worker.BATCH)


@pytest.mark.distributed
def test_sharded_embedding_reads_keyed_jagged_tensors_in_any_key_order(edge_results):
    # A sharded collection fixes the feature order on its first call; it read later batches in
    # that order whatever their keys said, returning other tables' embeddings.
    embedding = torchrec_worker.make_model().embedding
    ids, _ = torchrec_worker.global_batch()
    for rank, result in enumerate(edge_results):
        expected = embedding(ids[_local_rows(rank)]).detach()
        for name in torchrec_worker.KEY_ORDERS:
            torch.testing.assert_close(result["orders"][name], expected, rtol=0, atol=0, msg=name)
        assert result["orders"]["missing key"].startswith("ValueError: the KeyedJaggedTensor must hold the keys")


@pytest.mark.distributed
def test_sharded_embedding_refuses_an_id_outside_its_table_and_weights(edge_results):
    # A table-wise sharded table on the CPU embedded the id one past its last row without an
    # error, and did not ignore the weights as the unsharded collection does: two models for one batch.
    for result in edge_results:
        assert result["id_outside_its_table"] == (
            "ValueError: the KeyedJaggedTensor's ids of key 'slot' must be in [0, 7); got 7"), result["id_outside_its_table"]
        assert str(result["weighted"]).startswith("ValueError: sparse is a weighted KeyedJaggedTensor"), result["weighted"]


@pytest.mark.distributed
def test_shard_model_replicas_are_rank_0s_when_ranks_built_different_models(edge_results):
    # Each rank's own weights were copied over the replicas DDP had synchronised: they stayed apart.
    # A strided buffer got a mix of both ranks' values from the broadcast, and extra state (not a
    # tensor) made shard_model fail.
    torch.manual_seed(0)
    rank_0 = {name: value for name, value in torchrec_worker.replica_model(0).state_dict().items()
              if isinstance(value, torch.Tensor)}
    assert set(edge_results[0]["replicas"]) == set(rank_0)  # data_parallel: every tensor is replicated
    assert edge_results[1]["replicas"]["every_other"].tolist() == [0.0, 2.0, 4.0, 6.0]
    for result in edge_results:
        for name, value in result["replicas"].items():
            torch.testing.assert_close(value, rank_0[name], rtol=0, atol=0, msg=name)


@pytest.mark.distributed
def test_column_wise_shards_split_a_dim_that_world_size_does_not_divide_into_fours(edge_results):
    # 12 columns on 2 ranks: shards of 6 cannot be (fbgemm needs multiples of 4), and the table
    # stayed whole on one rank; now three shards of 4, so both ranks hold part of every table.
    torch.manual_seed(0)
    embedding = TorchRecEmbedding(torchrec_worker.CARDINALITIES, 12, torchrec_worker.FIELDS)
    ids, _ = torchrec_worker.global_batch()
    shards: dict[str, list] = {}
    for rank, result in enumerate(edge_results):
        torch.testing.assert_close(result["column_wise_12"]["scores"], embedding(ids[_local_rows(rank)]).detach(),
                                   rtol=1e-6, atol=1e-7)
        for name, local in result["column_wise_12"]["shards"].items():
            assert local, f"rank {rank} holds no part of {name}"
            shards.setdefault(name, []).extend(local)
    for key, cardinality in zip(torchrec_worker.FIELDS, torchrec_worker.CARDINALITIES):
        name = f"ebc.embedding_bags.t_{key}.weight"
        assert sorted(shards[name]) == [([0, column], [cardinality, 4]) for column in (0, 4, 8)], name


@pytest.mark.distributed
def test_a_dim_fbgemm_cannot_shard_is_refused_by_name_and_data_parallel_takes_it(edge_results):
    torch.manual_seed(0)
    narrow = TorchRecEmbedding((5, 4), 6, ("a", "b"))
    for result in edge_results:
        assert result["dim_6_table_wise"].startswith(
            "ValueError: sharding='table_wise' needs embedding dims that are multiples of 4"), result["dim_6_table_wise"]
        torch.testing.assert_close(result["dim_6_data_parallel"], narrow(torch.tensor([[1, 2], [4, 3]])).detach())


@pytest.mark.distributed
def test_a_failed_sharding_leaves_the_callers_tables_as_they_were(edge_results):
    # The fused optimizers stayed attached: a plain backward of the unsharded model stepped its tables.
    for result in edge_results:
        failed = result["failed_sharding"]
        assert failed == {"error": "RuntimeError: DMP failed", "table_changed": False, "fused": []}, failed


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
def test_a_cross_device_ranking_loss_steps_sharded_tables_like_one_process_on_the_global_batch(shard_model_runs, sharding):
    """A pairwise loss with ``cross_device=True`` on a model whose tables are sharded: one step
    equals the gradient step of the loss over the global batch, by brute force over every pair in
    float64 in one process. Uneven local batches (20 and 12 rows), users on both ranks."""
    model = torchrec_worker.ranking_model().double()  # TorchRec pools in float32; the rest is float64
    ids, labels, groups = torchrec_worker.ranking_batch()
    loss = brute_force_laa(model(ids)[:, 0], labels.double(), groups)
    loss.backward()
    parameters = dict(model.named_parameters())
    results = [result[sharding] for result in _ranks(shard_model_runs, "ranking")]
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


@pytest.fixture(scope="module")
def strategy_runs(tmp_path_factory) -> Path:
    """The folder of the TorchRecStrategy cases' results, from one 2-process job."""
    out_dir = tmp_path_factory.mktemp("torchrec-strategy")
    ports: set[int] = set()
    while len(ports) < 4:  # a process group of its own per Lightning run
        ports.add(free_port())
    ForkedRanks(torchrec_worker.run_strategy_cases, (tuple(ports), str(out_dir)), log=out_dir / "ranks.log").join()
    return out_dir


@pytest.mark.distributed
def test_strategy_averages_the_gradients_of_parameters_outside_the_sharded_model(strategy_runs):
    """A learnable ``scale`` outside the sharded model, started at 1 + rank: rank 0's value on
    both ranks, and at the first step the gradient of the mean loss over both ranks' batches (the
    single-process gradient on the whole batch); it was left unsynchronised, and drifted apart."""
    ranks = _ranks(strategy_runs, "strategy")
    model, scale = torchrec_worker.make_model(), torch.nn.Parameter(torch.ones(()))
    ids, target = torchrec_worker.global_batch()
    torch.nn.functional.mse_loss(model(ids) * scale, target).backward()  # the order of the rows does not matter
    for result in ranks:
        assert len(result["scale_grads"]) == 2
        torch.testing.assert_close(result["scale_grads"][0], scale.grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(result["scale_grads"], ranks[0]["scale_grads"], rtol=0, atol=0)
        torch.testing.assert_close(result["scale"], ranks[0]["scale"], rtol=0, atol=0)
    assert ranks[0]["scale"] != 1  # it trained


def _average_gradients_outside_rank(rank: int, out_dir: str) -> None:
    """TorchRecStrategy's average of the gradients outside DMP on 2 gloo ranks: ``both`` has a
    gradient on both ranks, ``one`` on rank 0 only, ``none`` on neither."""
    import os
    import types

    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        both, one, none = (torch.nn.Parameter(torch.zeros(3, dtype=torch.float64)) for _ in range(3))
        both.grad = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) * (1 + rank)
        if rank == 0:
            one.grad = torch.tensor([4.0, -2.0, 6.0], dtype=torch.float64)
        strategy = types.SimpleNamespace(_outside_parameters=[both, one, none], world_size=dist.get_world_size())
        TorchRecStrategy._average_outside_gradients(strategy)
        torch.save({"both": both.grad, "one": one.grad, "none": none.grad}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_strategy_counts_a_missing_gradient_outside_the_sharded_model_as_zero(tmp_path):
    """As DDP does: a parameter without a gradient on a rank adds zero to the average over all the
    ranks (not an average over the ranks that have one), and keeps none where no rank has one."""
    ForkedRanks(_average_gradients_outside_rank, (str(tmp_path),), log=tmp_path / "ranks.log").join()
    for rank in range(2):
        grads = torch.load(tmp_path / f"rank{rank}.pt")
        torch.testing.assert_close(grads["both"], torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) * (1 + 2) / 2)
        torch.testing.assert_close(grads["one"], torch.tensor([4.0, -2.0, 6.0], dtype=torch.float64) / 2)
        assert grads["none"] is None


@pytest.mark.distributed
def test_a_checkpoint_that_fails_on_rank_zero_raises_on_every_rank(strategy_runs):
    """A full disk on rank 0 while it starts or finishes a TorchRecStrategy checkpoint: rank 0
    raises its error, the other rank an error that names the checkpoint, and the next checkpoint
    is written (the job's collectives stay in step). The other rank waited in a barrier for the
    collective timeout (30 minutes by default; 60 s here)."""
    ranks = _ranks(strategy_runs, "checkpoint-failures")
    for step, what in (("begin_directory", "start"), ("finish_directory", "finish")):
        assert ranks[0][step].startswith("OSError: [Errno 28] No space left on device (injected)"), ranks[0][step]
        assert ranks[1][step] == (f"RuntimeError: TorchRecStrategy.save_checkpoint: rank 0 could not {what} the checkpoint "
                                  f"{strategy_runs / (step + '.ckpt')} (its error is raised there)")
        assert not (strategy_runs / f"{step}.ckpt").exists()
    assert ranks[0][None] is None and ranks[1][None] is None
    assert incomplete_reason(strategy_runs / "None.ckpt") is None


@pytest.mark.distributed
def test_a_resumed_run_equals_the_uninterrupted_one_with_state_outside_the_sharded_model(strategy_runs):
    """TorchRecStrategy resumed from a checkpoint of step 2 ends where 4 uninterrupted steps end,
    for a module whose parameter and balanced LoALoss (unsized) come before the sharded model, with
    fused SGD. It did not load: DMP's state_dict had renamed them under its prefix ('missing
    [scale]'), the unsized counts met a size of 0 in DCP's in-place load, and SGD's empty state
    left no key DCP would load."""
    for rank, result in enumerate(_ranks(strategy_runs, "resume")):
        whole, first, resumed = result["whole"], result["first"], result["resumed"]
        assert whole["step"] == resumed["step"] == 4 and first["step"] == 2
        for name in ("head", "scale", "seen", "items"):
            assert torch.equal(resumed[name], whole[name]), (rank, name)
            assert not torch.equal(first[name], whole[name]), (rank, name)  # the steps after the checkpoint count
        for name, table in whole["tables"].items():
            assert torch.equal(resumed["tables"][name], table), (rank, name)
        assert whole["seen"].shape == (2,)


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
