"""recipes/ctr_cvr.py's training step (docs/recipe.md, "The training step"): under ``pl.Trainer``,
one batch or several per call, it does the work of a plain PyTorch loop, no more and no less (the comparison
benchmarks/bench_recipe.py's framework overhead rests on), and a non-finite training loss, which
the losses no longer check batch by batch, stops the run at the end of its epoch."""

from __future__ import annotations

import collections
import warnings

import pytest
import pytorch_lightning as pl
import torch

from mlloss.data import GroupDataModule, SyntheticConfig, TensorBatches, generate_impressions, split_by_time
from recipe_util import load_recipe, without_timing

SMALL = ["--num-users", "200", "--num-items", "100", "--mean-impressions", "20", "--batch-size", "256",
         "--epochs", "1", "--no-checkpoint", "--no-progress-bar"]


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("ctr_cvr")


@pytest.mark.parametrize(("loss", "steps_per_call"), [("bce", 1), ("laa", 3)])
def test_lightning_step_equals_a_plain_loop_bit_for_bit(recipe, loss, steps_per_call):
    args = recipe.parse_args([*SMALL, "--loss", loss, "--dropout", "0"])
    train = split_by_time(generate_impressions(SyntheticConfig(num_users=200, num_items=100, mean_impressions=20)))[0]

    def module():
        pl.seed_everything(0, verbose=False)
        objective = recipe.MultiTaskObjective(loss, None, validate_args=False)
        model = recipe.build_model(args, train, len(recipe.TASKS) + objective.uses_ranking_head)
        return recipe.CtrCvrModule(model, objective, args.lr, args.weight_decay, steps_per_call=steps_per_call)

    trained = module()
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_val_batches=0, num_sanity_val_steps=0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(trained, datamodule=GroupDataModule(train.columns(), batch_size=256, group_key="user", seed=0))

    plain = module()
    optimizer = plain.configure_optimizers()
    batches = TensorBatches(train.columns(), 256, group_key="user", seed=0, drop_last=True, pad="empty")
    steps = 0
    for epoch in range(2):
        batches.set_epoch(epoch)
        for batch in batches:
            plain.objective(plain(batch), batch["labels"], batch["user"]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
    assert trainer.global_step == steps > 2
    for (name, a), b in zip(trained.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_non_finite_training_loss_stops_the_run_naming_the_epoch(recipe, monkeypatch, tmp_path):
    load_data = recipe.load_data

    def with_a_nan_feature(args):
        (train, val, test), info = load_data(args)
        train.dense[5, 0] = float("nan")
        return (train, val, test), info

    monkeypatch.setattr(recipe, "load_data", with_a_nan_feature)
    with pytest.raises(FloatingPointError, match=r"training loss of epoch 1 is nan"):
        recipe.main([*SMALL, "--output-dir", str(tmp_path)])


def test_compile_gives_the_eager_run(recipe, tmp_path):
    """``--compile``: the training step's model and objective in one graph (bce+pdaom: the BCE and
    the pairwise op), over batches of varying size, gives the eager run's losses and metrics; with
    ``--fixed-batches`` too, and the step is compiled once for the whole run (one static shape:
    what a CUDA graph of ``--compile reduce-overhead`` needs)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    argv = [*SMALL, "--loss", "bce+pdaom", "--epochs", "2"]
    eager = recipe.main([*argv, "--output-dir", str(tmp_path / "eager")])
    for options in (["--compile"], ["--compile", "--fixed-batches"]):
        torch._dynamo.reset()
        counters.clear()
        compiled = recipe.main([*argv, *options, "--output-dir", str(tmp_path / "compiled")])
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] >= 2  # the training step's and the evaluation's
        assert len(_debug_get_cache_entry_list(recipe.CtrCvrModule.batch_loss.__code__)) == 1  # never recompiled
        for got, want in zip(without_timing(compiled["history"]), without_timing(eager["history"]), strict=True):
            assert got.keys() == want.keys()
            for key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6, nan_ok=True), (options, key)
        for key, value in eager["results"]["test"].items():
            assert compiled["results"]["test"][key] == pytest.approx(value, rel=1e-4, abs=1e-6, nan_ok=True), key


def test_fixed_batches_train_as_the_exact_batches(recipe, tmp_path):
    """``--fixed-batches``: every training batch padded to the batch size, the fillers masked out of
    the objective (bce+pdaom: the BCE mean, the per-user pairs and Eq. 7's N), trains the model
    of the unpadded run: same impressions, losses and metrics up to float rounding."""
    argv = [*SMALL, "--loss", "bce+pdaom", "--epochs", "2"]
    exact = recipe.main([*argv, "--output-dir", str(tmp_path / "exact")])
    padded = recipe.main([*argv, "--fixed-batches", "--output-dir", str(tmp_path / "padded")])
    assert [row["train_samples"] for row in exact["history"]] == [row["train_samples"] for row in padded["history"]]
    assert exact["history"][0]["train_samples"] > 2000
    for got, want in zip(without_timing(padded["history"]), without_timing(exact["history"]), strict=True):
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7, nan_ok=True), key
    for key, value in exact["results"]["test"].items():
        assert padded["results"]["test"][key] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), key


def test_compile_takes_torch_compiles_mode(recipe, capsys):
    assert recipe.parse_args([]).compile is None
    assert recipe.parse_args(["--compile", "--loss", "laa"]).compile == "default"
    assert recipe.parse_args(["--compile", "reduce-overhead"]).compile == "reduce-overhead"  # CUDA graphs on a GPU
    with pytest.raises(SystemExit):
        recipe.parse_args(["--compile", "fast"])
    assert "--compile: invalid choice: 'fast'" in capsys.readouterr().err


# Kernel-running aten ops of one training step (forward, objective, backward, Adam) at most: 64
# for bce (61 today), plus 30 per pairwise loss call (bce+X calls X once for all its tasks, on the
# (N, 2) task columns: AUCLoss.task_columns).
STEP_KERNELS = {"bce": 64, "bce+pdaom": 64 + 30, "bce+auc": 64 + 30, "laa": 64 + 30, "auc": 64 + 30,
                "pdaom": 64 + 30, "loa": 64 + 30, "balanced-loa": 64 + 30}


@pytest.mark.triton
@pytest.mark.parametrize("fixed_size", [False, True], ids=["exact", "fixed-size"])
@pytest.mark.parametrize("loss", sorted(STEP_KERNELS))
def test_a_training_step_never_waits_for_the_device(recipe, loss, fixed_size):
    """One optimizer step of the recipe (forward, objective, backward, Adam, the loss summed on the
    device) issues no op that synchronises with a GPU, with the pairwise losses on the Triton
    backend (the CUDA path; the interpreter runs it here): counted with benchmarks/host_path.py's
    dispatch mode. The plain-PyTorch tier, the CPU path, may read the host; there it costs nothing."""
    import os
    import sys
    from pathlib import Path

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the Triton tier in the interpreter: needs TRITON_INTERPRET=1 before triton is imported")
    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if benchmarks not in sys.path:  # once, not once per parametrized case
        sys.path.insert(0, benchmarks)
    import host_path

    args = recipe.parse_args([*SMALL, "--loss", loss])
    train = split_by_time(generate_impressions(SyntheticConfig(num_users=200, num_items=100, mean_impressions=20)))[0]
    objective = recipe.MultiTaskObjective(loss, None, validate_args=False)
    pairwise = [m for m in objective.modules() if hasattr(m, "backend")]
    for module in pairwise:
        module.backend = "triton"
    assert (len(pairwise) > 0) == (loss != "bce")
    module = recipe.CtrCvrModule(recipe.build_model(args, train, len(recipe.TASKS) + objective.uses_ranking_head),
                                 objective, args.lr, args.weight_decay)
    optimizer = module.configure_optimizers()
    batch = next(iter(TensorBatches(train.columns(), 128, group_key="user", fixed_size=fixed_size)))
    assert ("mask" in batch) == fixed_size
    for _ in range(2):  # the second step: Adam's state exists
        with host_path.kernels_uncounted(), host_path.OpCounter() as counter:
            loss_value = module.batch_loss(batch)
            loss_value.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            module.train_loss_sum.add_(loss_value.detach())
    assert "_fused_adam_" in counter.ops
    assert counter.syncs == [], counter.syncs
    # Launches, the GPU step's host cost: the MMoE's experts, gates and towers run stacked, the
    # field tables as one (127 kernel ops for bce with one module per expert and table), and
    # each pairwise loss adds its host path's <= 30 ops (tests/test_host_path.py).
    assert counter.ops.count("embedding_dense_backward") == 1
    # A padded batch's mask adds <= 12 ops per pairwise call (tests/test_host_path.py) and 6 to the BCE.
    budget = STEP_KERNELS[loss] + fixed_size * (6 + 12 * (STEP_KERNELS[loss] - STEP_KERNELS["bce"]) // 30)
    assert len(counter.kernels) <= budget, collections.Counter(counter.kernels)
