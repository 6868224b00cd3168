"""Tests of the CTR/CVR recipe and its building blocks: the synthetic Ali-CCP-like
generator, the multi-task towers and the recipe end to end on small configurations (its batches:
tests/test_sampler.py)."""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import mlloss
from mlloss.data import SyntheticConfig, generate_impressions, split_by_time
from recipe_util import RECIPES, load_recipe, without_timing
from mlloss.models import CGC, PLE, DotInteraction, FieldEmbedding, MMoE, MultiTaskModel, SharedBottom, esmm_logits

RECIPE = RECIPES / "ctr_cvr.py"


@pytest.fixture(scope="module")
def recipe():
    return load_recipe("ctr_cvr")


@pytest.fixture(scope="module")
def data():
    return generate_impressions(SyntheticConfig(num_users=1500, seed=3))


# --------------------------------------------------------------------------- generator


def test_purchase_implies_click_and_rates_in_range(data):
    assert bool((data.purchase <= data.click).all())
    assert 0.05 <= float(data.click.mean()) <= 0.10
    assert 0.005 <= float(data.purchase.mean()) <= 0.01
    assert torch.allclose(data.p_click.mean(), torch.tensor(0.07), atol=1e-4)
    assert torch.allclose(data.p_purchase.mean(), torch.tensor(0.0075), atol=1e-5)
    assert bool((data.p_purchase <= data.p_click).all())


def test_generator_is_deterministic_given_seed():
    config = SyntheticConfig(num_users=200, seed=7)
    a, b = generate_impressions(config), generate_impressions(config)
    c = generate_impressions(SyntheticConfig(num_users=200, seed=8))
    for name in ("sparse", "dense", "click", "purchase", "user", "timestamp", "p_click", "p_purchase"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.p_click, c.p_click)


def test_generator_shapes_ids_and_order(data):
    n = len(data)
    assert data.sparse.shape == (n, len(data.field_names)) and data.sparse.dtype == torch.long
    assert data.dense.shape == (n, len(data.dense_names)) and data.dense.dtype == torch.float32
    assert bool((data.sparse >= 0).all())
    assert bool((data.sparse < torch.tensor(data.cardinalities)).all())
    assert torch.equal(data.sparse[:, data.field_names.index("user")], data.user)
    key = data.user.double() + data.timestamp.double()
    assert bool((key[1:] >= key[:-1]).all()), "rows must be sorted by user, then time"
    counts = torch.bincount(data.user).float()
    assert counts.max() > 5 * counts.median(), "impressions per user should be long-tailed"
    items = torch.bincount(data.sparse[:, 1]).sort(descending=True).values
    assert items[: len(items) // 100].sum() > 0.1 * n, "the top 1% of items should take > 10% of impressions"


def test_split_by_time_partitions_the_log(data):
    train, val, test = split_by_time(data, val_fraction=0.1, test_fraction=0.2)
    assert len(train) + len(val) + len(test) == len(data)
    assert train.timestamp.max() < val.timestamp.min() <= val.timestamp.max() < test.timestamp.min()
    assert 0.15 < len(test) / len(data) < 0.25
    with pytest.raises(ValueError, match="val_fraction"):
        split_by_time(data, val_fraction=0.6, test_fraction=0.5)
    for fractions in ({"val_fraction": float("nan")}, {"test_fraction": float("nan")}):  # lost rows silently
        with pytest.raises(ValueError, match="must be >= 0 and sum to less than 1"):
            split_by_time(data, **fractions)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"num_users": 0}, "num_users"), ({"purchase_rate": 0.2}, "purchase_rate"), ({"click_rate": 1.5}, "click_rate"),
     ({"num_users": 2.5}, "num_users must be an int"), ({"mean_impressions": float("nan")}, "mean_impressions"),
     ({"factor_noise": float("nan")}, "factor_noise"), ({"zipf_exponent": float("nan")}, "zipf_exponent"),
     ({"interaction_scale": float("inf")}, "interaction_scale must be finite")],
)
def test_config_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SyntheticConfig(**kwargs)


def test_a_log_of_one_item_or_one_impression_is_generated():
    # one value has no sample std (NaN), which reached torch.bernoulli
    for config in (SyntheticConfig(num_users=40, num_items=1), SyntheticConfig(num_users=1, mean_impressions=1)):
        data = generate_impressions(config)
        assert len(data) >= 1 and torch.isfinite(data.dense).all() and torch.isfinite(data.p_click).all()


# --------------------------------------------------------------------------- towers


@pytest.mark.parametrize(
    "backbone",
    [
        lambda d, t: SharedBottom(d, t, bottom_hidden=(16, 8), tower_hidden=(4,)),
        lambda d, t: MMoE(d, t, num_experts=3, expert_hidden=(16, 8), tower_hidden=(4,)),
        lambda d, t: CGC(d, t, num_task_experts=1, num_shared_experts=2, expert_hidden=(8,)),
        lambda d, t: PLE(d, t, num_levels=3, num_task_experts=2, num_shared_experts=1, expert_hidden=(8,)),
    ],
    ids=["shared-bottom", "mmoe", "cgc", "ple"],
)
@pytest.mark.parametrize("num_tasks", [1, 3])
def test_towers_return_one_logit_per_task(backbone, num_tasks):
    embedding = FieldEmbedding([10, 20, 5], dim=4)
    model = MultiTaskModel(embedding, backbone(embedding.output_dim + 2, num_tasks))
    ids = torch.stack([torch.randint(c, (6,)) for c in (10, 20, 5)], dim=1)
    logits = model(ids, torch.randn(6, 2))
    assert logits.shape == (6, num_tasks)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_ple_gates_follow_the_paper():
    ple = PLE(8, num_tasks=2, num_levels=2, num_task_experts=3, num_shared_experts=2, expert_hidden=(4,))
    first, last = ple.levels
    assert first.task_gates.weight.shape == (2, 8, 3 + 2)  # per task: own + shared experts
    assert first.shared_gate.out_features == 2 * 3 + 2  # all experts
    assert last.shared_gate is None
    assert len(CGC(8, num_tasks=2).levels) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_esmm_logits_keep_their_order_and_gradient_at_large_logits(dtype):
    # log(1 - p) was taken from p capped at 1 - 1e-7: every CTCVR logit past ~16 was 16.118 (items
    # with high CTR and CVR logits tied on the CTCVR head), with a gradient of 1e-8 or less.
    from decimal import Decimal, getcontext

    getcontext().prec = 60

    def reference(a: float, b: float) -> float:  # logit(sigmoid(a) sigmoid(b)), 60 digits
        p = 1 / (1 + (-Decimal(a)).exp()) / (1 + (-Decimal(b)).exp())
        return float((p / (1 - p)).ln())

    pairs = [(16.0, 16.0), (17.0, 17.0), (20.0, 20.0), (30.0, 30.0), (40.0, 2.0), (-30.0, 25.0), (0.3, -0.7), (-50.0, -50.0)]
    ctr = torch.tensor([a for a, _ in pairs], dtype=dtype, requires_grad=True)
    cvr = torch.tensor([b for _, b in pairs], dtype=dtype, requires_grad=True)
    logits = esmm_logits(ctr, cvr)
    expected = torch.tensor([reference(a, b) for a, b in pairs], dtype=dtype)
    torch.testing.assert_close(logits, expected, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0)
    # BCE with label 0 on a confident CTCVR: the gradient pulls the CTR logit down by about p_cvr / 2
    torch.nn.functional.binary_cross_entropy_with_logits(logits[3], torch.zeros((), dtype=dtype)).backward()
    assert 0.49 < ctr.grad[3] < 0.51


def test_esmm_returns_ctr_and_ctcvr_logits():
    ctr, cvr = torch.randn(50) * 4, torch.randn(50) * 4
    expected = torch.sigmoid(ctr) * torch.sigmoid(cvr)
    assert torch.allclose(torch.sigmoid(esmm_logits(ctr, cvr)), expected, atol=1e-6)
    backbone = SharedBottom(4 * 2, 2, bottom_hidden=(8,))
    model = MultiTaskModel(FieldEmbedding([5, 5], dim=4), backbone, esmm=True)
    ids = torch.randint(5, (7, 2))
    raw = MultiTaskModel(model.embedding, backbone)(ids)
    out = model(ids)
    assert torch.equal(out[:, 0], raw[:, 0])
    assert torch.allclose(torch.sigmoid(out[:, 1]), torch.sigmoid(raw[:, 0]) * torch.sigmoid(raw[:, 1]), atol=1e-6)


def test_dot_interaction_appends_pairwise_dots():
    x = torch.randn(4, 3 * 5, generator=torch.Generator().manual_seed(0))
    out = DotInteraction(num_fields=3, dim=5)(x)
    e = x.view(4, 3, 5)
    assert out.shape == (4, 15 + 3)
    expected = torch.stack([(e[:, i] * e[:, j]).sum(1) for i, j in [(0, 1), (0, 2), (1, 2)]], dim=1)
    torch.testing.assert_close(out[:, :15], x, rtol=0, atol=0)
    torch.testing.assert_close(out[:, 15:], expected)  # float32 tolerances: a dot near 0 has no relative precision


def test_tower_errors_name_the_bad_argument():
    with pytest.raises(ValueError, match="num_experts"):
        MMoE(8, 2, num_experts=0)
    with pytest.raises(ValueError, match="combine"):
        FieldEmbedding([3], 2, combine="mean")
    with pytest.raises(ValueError, match=r"shape \(B, 2\)"):
        FieldEmbedding([3, 3], 2)(torch.zeros(4, 3, dtype=torch.long))


# --------------------------------------------------------------------------- recipe end to end


def test_help_runs_without_importing_lightning():
    # ``python recipes/ctr_cvr.py --help``, as a script (run_path as __main__), and what it imported
    code = (f"import runpy, sys\nsys.argv = [{str(RECIPE)!r}, '--help']\n"
            f"try:\n    runpy.run_path({str(RECIPE)!r}, run_name='__main__')\nexcept SystemExit as done:\n"
            "    print('exit', done.code, 'lightning', 'pytorch_lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--model" in out.stdout and "--loss" in out.stdout and "--lambda" in out.stdout
    assert out.stdout.rstrip().endswith("exit 0 lightning False"), out.stdout[-500:]


@pytest.mark.parametrize(("model", "loss", "extra"), [("mmoe", "bce", []), ("ple", "laa", ["--esmm"])])
def test_recipe_runs_and_writes_results(recipe, tmp_path, model, loss, extra):
    argv = ["--model", model, "--loss", loss, "--epochs", "1", "--num-users", "300", "--num-items", "200",
            "--mean-impressions", "30", "--batch-size", "512", "--output-dir", str(tmp_path), *extra]
    report = recipe.main(argv)
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["config"]["model"] == model and written["config"]["loss"] == loss
    assert len(written["history"]) == 1
    for split in ("val", "test"):
        results = written["results"][split]
        for scorer in ("model", "popularity", "oracle"):
            assert 0.0 <= results[f"{scorer}/auc/click"] <= 1.0
        assert ("model:rank/auc/click" in results) == (loss == "laa")
    assert report["results"]["test"].keys() == written["results"]["test"].keys()
    assert "| test | model |" in (tmp_path / "results.md").read_text()


def test_recipe_beats_the_popularity_baseline_and_prints_no_lightning_notices(recipe, tmp_path, capfd, caplog):
    argv = ["--num-users", "2000", "--epochs", "2", "--batch-size", "256", "--lr", "5e-3", "--seed", "1",
            "--output-dir", str(tmp_path)]
    logger = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    filters = list(logger.filters)
    # Lightning's info lines reach pytest's log capture here (the root logger has its handler)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        results = recipe.main(argv)["results"]["test"]
    assert results["model/auc/click"] > results["popularity/auc/click"] + 0.05
    assert results["model/auc/click"] < results["oracle/auc/click"]
    # Lightning's warnings about the dataloader_iter step the recipe takes on purpose (every epoch),
    # a deprecated pytree call and a cloud-logger tip are not the run's news (ctr_cvr_report.MUTED_*)
    printed = capfd.readouterr()
    output = "\n".join([printed.out, printed.err, caplog.text, *(str(warning.message) for warning in caught)])
    for notice in ("dataloader_iter", "LeafSpec", "litlogger"):
        assert notice not in output, notice
    assert "epoch  2 |" in printed.out and "GPU available" in caplog.text  # the run and Lightning's other lines
    assert logger.filters == filters  # the filter went with the run


@pytest.mark.parametrize("option,value,message", [
    ("--num-experts", "0", "--num-experts must be >= 1; got 0"),
    ("--num-shared-experts", "0", "--num-shared-experts must be >= 1; got 0"),
    ("--num-task-experts", "-1", "--num-task-experts must be >= 0; got -1"),
    ("--lr", "0", "--lr must be finite and > 0; got 0.0"),
    ("--lr", "nan", "--lr must be finite and > 0; got nan"),
    ("--weight-decay", "-1", "--weight-decay must be finite and >= 0; got -1.0"),
    ("--dropout", "1", "--dropout must be in [0, 1); got 1.0"),
])
def test_model_and_optimizer_options_are_checked_before_the_data_are_made(recipe, capsys, option, value, message):
    # These reached the towers (an error naming num_experts, after the data were generated) or
    # trained nothing (--lr 0) without a word.
    with pytest.raises(SystemExit):
        recipe.parse_args([option, value])
    assert message in capsys.readouterr().err


def test_recipe_rejects_bad_arguments(recipe, capsys):
    with pytest.raises(SystemExit):
        recipe.parse_args(["--epochs", "0"])
    assert "--epochs must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        recipe.parse_args(["--loss", "hinge"])
    with pytest.raises(SystemExit):
        recipe.parse_args(["--loss", "bce", "--lambda", "2"])
    assert "--lambda" in capsys.readouterr().err
    for loss in ("laa", "bce+pdaom"):  # laa took -1 and trained its ranking head to anti-rank (test AUC 0.36)
        with pytest.raises(SystemExit):
            recipe.parse_args(["--loss", loss, "--lambda", "-1"])
        assert "--lambda must be finite and >= 0; got -1.0" in capsys.readouterr().err


SMALL = ["--num-users", "300", "--num-items", "200", "--mean-impressions", "30", "--batch-size", "512",
         "--no-progress-bar"]


def test_resume_from_a_checkpoint_continues_identically(recipe, tmp_path):
    """2 epochs in one run equal 1 epoch, a checkpoint, and a resumed second epoch: the same
    history, test metrics and weights (dropout on, so the saved RNG state matters too)."""
    args = [*SMALL, "--loss", "bce+auc", "--dropout", "0.2"]
    straight = recipe.main([*args, "--epochs", "2", "--output-dir", str(tmp_path / "a")])
    recipe.main([*args, "--epochs", "1", "--output-dir", str(tmp_path / "b")])
    first_epoch = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = recipe.main([*args, "--epochs", "2", "--output-dir", str(tmp_path / "b"), "--resume", "last"])
    # Lightning's "Checkpoint directory ... exists and is not empty": the folder holds last.ckpt by design
    assert not [str(w.message) for w in caught if "exists and is not empty" in str(w.message)]
    assert len(resumed["history"]) == 2
    assert without_timing(resumed["history"]) == without_timing(straight["history"])
    assert resumed["results"]["test"] == straight["results"]["test"]
    final_a = torch.load(tmp_path / "a" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    final_b = torch.load(tmp_path / "b" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert final_a.keys() == final_b.keys()
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)
    assert not all(torch.equal(final_a[k], first_epoch[k]) for k in final_a), "the second epoch must train"


def test_a_run_that_replaces_an_earlier_runs_checkpoint_says_so(recipe, tmp_path, capsys):
    """Without --resume, a run into a --checkpoint-dir that holds last.ckpt replaces it: a note
    says so (Lightning's own warning, that the folder is not empty, is muted: a resumed run writes
    there too); with --resume, or without a checkpoint there, no note."""
    import ctr_cvr_resume

    folder = tmp_path / "checkpoints"
    options = recipe.parse_args(["--checkpoint-dir", str(folder)])
    assert ctr_cvr_resume.resume_path(options) is None and "note:" not in capsys.readouterr().out
    folder.mkdir()
    torch.save({}, folder / "last.ckpt")
    assert ctr_cvr_resume.resume_path(options) is None
    assert f"note: this run replaces {folder / 'last.ckpt'}, an earlier run's checkpoint" in capsys.readouterr().out
    ctr_cvr_resume.resume_path(recipe.parse_args(["--checkpoint-dir", str(folder), "--no-checkpoint"]))
    assert "note:" not in capsys.readouterr().out


def test_a_resumed_run_takes_the_command_lines_learning_rate(recipe, tmp_path):
    """Lightning restores the optimizer with the checkpoint's lr and weight decay: --lr 0.05 on
    --resume must train the second epoch with 0.05 (it silently kept 0.002 while results.json
    said 0.05)."""
    args = [*SMALL, "--loss", "bce"]
    recipe.main([*args, "--epochs", "1", "--output-dir", str(tmp_path / "a")])
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    same = recipe.main([*args, "--epochs", "2", "--output-dir", str(tmp_path / "a"), "--resume", "last"])
    faster = recipe.main([*args, "--epochs", "2", "--output-dir", str(tmp_path / "b"), "--resume", "last",
                          "--lr", "0.05"])
    assert faster["config"]["lr"] == 0.05
    assert without_timing(faster["history"])[0] == without_timing(same["history"])[0]
    assert faster["history"][1]["train_loss"] != same["history"][1]["train_loss"]


def test_a_checkpoint_resumes_with_or_without_compile(recipe, tmp_path):
    """--compile compiles the model in place: its checkpoints keep the plain keys (they were
    saved under model._orig_mod.* and loaded only with --compile again)."""
    args = [*SMALL, "--loss", "bce"]
    recipe.main([*args, "--epochs", "1", "--compile", "--output-dir", str(tmp_path)])
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert not any("_orig_mod" in key for key in state)
    resumed = recipe.main([*args, "--epochs", "2", "--output-dir", str(tmp_path), "--resume", "last"])
    assert len(resumed["history"]) == 2 and math.isfinite(resumed["history"][1]["train_loss"])


def test_resume_errors_name_the_missing_checkpoint(recipe, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        recipe.main([*SMALL, "--output-dir", str(tmp_path), "--resume", "last"])
    with pytest.raises(SystemExit):
        recipe.parse_args(["--resume", "last", "--no-checkpoint"])


def test_ranking_head_reports_diff_min_auc_and_the_dictatorship(recipe, tmp_path):
    report = recipe.main([*SMALL, "--loss", "loa", "--epochs", "1", "--output-dir", str(tmp_path)])
    row = report["history"][0]
    per_label = [row["model:rank/auc/click"], row["model:rank/auc/purchase"]]
    assert row["model:rank/diff_auc"] == pytest.approx(max(per_label) - min(per_label))
    assert row["model:rank/min_auc"] == pytest.approx(min(per_label))
    assert 0.0 <= row["model:rank/multipartite_auc"] <= 1.0
    assert row["train_samples_per_s"] > 0
    dictatorship = report["label_dictatorship"]
    assert dictatorship["dominant"] == "purchase"  # the rarer label dominates LoA
    assert dictatorship["share/purchase"] > dictatorship["share/click"]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ranking head: DiffAUC" in (tmp_path / "results.md").read_text()


SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"shared data not found at {SHARED_DATA}")
@pytest.mark.parametrize(("source", "folder"), [("ali-ccp", "ali-ccp-sample"), ("aliexpress", "aliexpress-sample")])
def test_recipe_trains_on_the_real_csv_layouts(recipe, tmp_path, source, folder):
    report = recipe.main(["--data", source, "--data-dir", str(SHARED_DATA / folder), "--epochs", "1",
                          "--batch-size", "32", "--loss", "laa", "--no-progress-bar", "--output-dir", str(tmp_path)])
    assert report["data"]["source"] == source
    sizes = report["data"]["sizes"]
    if source == "ali-ccp":  # three files of 100 / 50 / 50 rows
        assert (sizes["train"], sizes["val"], sizes["test"]) == (100, 50, 50)
    else:  # validation searches are held out of the 100-row training file
        assert sizes["train"] + sizes["val"] == 100 and sizes["val"] > 0 and sizes["test"] == 20
    assert not any(key.startswith("oracle/") for key in report["results"]["test"]), "real data has no true probabilities"
    assert any(key.startswith("popularity/") for key in report["results"]["test"]) == (source == "ali-ccp")


def test_recipe_data_errors_are_clear(recipe, tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        recipe.main(["--data", "ali-ccp", "--data-dir", str(tmp_path / "nowhere"), "--output-dir", str(tmp_path)])
    with pytest.raises(SystemExit):
        recipe.parse_args(["--data-dir", str(tmp_path)])  # a directory without --data ali-ccp/aliexpress


def test_fewer_training_batches_than_processes_is_an_error_before_training(recipe, tmp_path):
    # the multi-gpu config's batch of 8,192 on a log of 100 users, 2 processes: GroupDataModule's
    # drop_last left each process 0 batches, Lightning only warned, and run() ended in an IndexError
    argv = ["--config", "multi-gpu", "--accelerator", "cpu", "--devices", "2", "--num-users", "100", "--epochs", "1",
            "--no-progress-bar", "--no-checkpoint", "--output-dir", str(tmp_path)]
    with pytest.raises(ValueError) as error:
        recipe.main(argv)
    train = split_by_time(generate_impressions(SyntheticConfig(num_users=100)))[0]
    message = str(error.value)
    assert message.startswith(f"--batch-size 8192 packs the training split's {len(train)} impressions into 1 batch(es), "
                              "fewer than the 2 processes (--devices x --num-nodes)")
    assert message.endswith(f"give --batch-size {len(train) // 2} or less")
    args = recipe.parse_args([*argv, "--batch-size", str(len(train) // 2)])
    recipe.check_batches((train, train, train), args, 2)  # the advised size passes
    assert not (tmp_path / "results.json").exists()


def test_an_empty_split_is_named_before_training(recipe, tmp_path):
    # 2 users of about 1 impression each leave no validation rows: the run trained, then failed with
    # an IndexError on its empty history
    with pytest.raises(ValueError, match=r"the validation split is empty \(train/val/test: \d+/0/\d+ impressions\): "
                                         r"it needs more data \(--num-users, --mean-impressions\)"):
        recipe.main(["--num-users", "2", "--mean-impressions", "1", "--epochs", "1", "--no-progress-bar",
                     "--no-checkpoint", "--output-dir", str(tmp_path)])


def test_a_run_without_a_validation_epoch_says_so(recipe, tmp_path, monkeypatch):
    monkeypatch.setattr(recipe.CtrCvrModule, "on_validation_epoch_end", lambda self: None)  # records no epoch
    with pytest.raises(RuntimeError, match="training ended before its first validation epoch"):  # not an IndexError
        recipe.main([*SMALL, "--num-users", "60", "--epochs", "1", "--no-checkpoint", "--output-dir", str(tmp_path)])


def _epoch_on_rank_zero_of_two(recipe, monkeypatch, train, *, loss_sum, samples, others):
    """The history row of an epoch that ends on rank 0 of 2, after training_step summed ``loss_sum``
    and counted ``samples`` rows in 4 steps here; ``others`` is rank 1's (loss sum, rows). The
    strategy is a stand-in: a sum adds rank 1's value, a mean is the two ranks' mean."""
    import types

    args = recipe.parse_args(SMALL)
    module = recipe.CtrCvrModule(recipe.build_model(args, train, 2), recipe.MultiTaskObjective("bce", None), 1e-3, 0.0)
    other_rank = dict(zip((torch.float64, torch.int64), others))

    class TwoRanks:
        @staticmethod
        def reduce(value, reduce_op):
            total = value + other_rank[value.dtype]
            return total if reduce_op == "sum" else total / 2

    module.trainer = types.SimpleNamespace(strategy=TwoRanks(), world_size=2, current_epoch=0, is_global_zero=True,
                                           progress_bar_callback=None)
    monkeypatch.setattr(recipe, "scorer_results", lambda metrics: {})
    monkeypatch.setattr(recipe, "format_epoch", str)
    module.on_train_epoch_start()
    module.train_loss_sum.add_(loss_sum)
    module.epoch_counts.update(steps=4, samples=samples)
    module.on_validation_epoch_start()
    module.on_validation_epoch_end()
    return module.history[-1]


def test_train_samples_are_the_sum_of_the_ranks_rows(recipe, monkeypatch):
    """Under DDP the ranks run equal numbers of steps, not of rows: the epoch's impressions are the sum
    of the ranks' (rank 0's count times the world size reported 7,876 impressions of a 7,138-row split)."""
    from mlloss.data import GroupBatchSampler

    train = split_by_time(generate_impressions(SyntheticConfig(num_users=150)))[0]
    rows = [sum(map(len, GroupBatchSampler(train.user, 1024, drop_last=True, num_replicas=2, rank=rank)))
            for rank in range(2)]
    assert rows[0] != rows[1]
    row = _epoch_on_rank_zero_of_two(recipe, monkeypatch, train, loss_sum=0.0, samples=rows[0], others=(0.0, rows[1]))
    assert row["train_samples"] == sum(rows)  # every row of both ranks, each once
    assert row["train_samples_per_s"] == pytest.approx(sum(rows) / row["train_seconds"])


def test_config_file_sets_options_and_the_command_line_overrides_it(recipe, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("loss: laa\nmodel: ple\nbatch-size: 256\nexpert_hidden: [32, 16]\nesmm: true\n"
                      "progress-bar: false\n")
    args = recipe.parse_args(["--config", str(config), "--batch-size", "128"])
    assert (args.loss, args.model, args.batch_size, args.expert_hidden) == ("laa", "ple", 128, [32, 16])
    assert args.esmm is True and args.progress_bar is False
    (tmp_path / "bad.json").write_text('{"loss": "hinge"}')
    with pytest.raises(SystemExit):  # choices are checked as on the command line
        recipe.parse_args(["--config", str(tmp_path / "bad.json")])
    (tmp_path / "unknown.yaml").write_text("learning-rate: 0.1\n")
    with pytest.raises(SystemExit):
        recipe.parse_args(["--config", str(tmp_path / "unknown.yaml")])
    # a config's flags can be turned off, and its ranking options go with its loss when the command
    # line picks one without them (they stopped the run with an error about options nobody typed)
    args = recipe.parse_args(["--config", str(config), "--no-esmm"])
    assert args.esmm is False
    for name, loss in (("laa", "bce"), ("multi-gpu", "bce")):
        args = recipe.parse_args(["--config", name, "--loss", loss])
        assert (args.loss, args.lam, args.cross_device) == (loss, None, False)
    args = recipe.parse_args(["--config", "multi-gpu", "--loss", "auc"])  # AUC takes pairs across ranks
    assert args.cross_device is True and recipe.parse_args(["--config", "multi-gpu", "--no-cross-device"]).cross_device is False
    for typed in (["--lambda", "2"], ["--cross-device"]):  # typed, they are still errors
        with pytest.raises(SystemExit):
            recipe.parse_args(["--config", "laa", "--loss", "bce", *typed])


@pytest.mark.parametrize("name", ["bce", "laa", "bce+pdaom", "sharded", "multi-gpu"])
def test_named_configs_parse_and_say_what_they_set(recipe, name):
    """Every config of recipes/configs/ is read by name through the recipe's parser (types and
    choices checked as on the command line), and the command line still overrides it."""
    import yaml

    values = yaml.safe_load((RECIPES / "configs" / f"{name}.yaml").read_text())
    args = recipe.parse_args(["--config", name, "--epochs", "1"])
    for key, value in values.items():
        if key == "epochs":
            continue  # overridden below
        dest = {"lambda": "lam"}.get(key, key.replace("-", "_"))
        got = getattr(args, dest)
        assert (str(got) if key == "devices" else got) == (str(value) if key == "devices" else value), key
    assert args.epochs == 1
    with pytest.raises(SystemExit):
        recipe.parse_args(["--config", "no-such-config"])


def test_bad_layer_widths_are_named_before_the_data_are_made(recipe, capsys):
    for option, widths in (("--tower-hidden", ["0"]), ("--expert-hidden", ["16", "0"])):
        with pytest.raises(SystemExit):
            recipe.parse_args([option, *widths])
        assert f"{option} widths must be >= 1; got {[int(w) for w in widths]}" in capsys.readouterr().err


@pytest.mark.parametrize("loss", ["bce+pdaom", "bce+auc", "auc", "laa", "balanced-loa"])
def test_the_pairwise_losses_are_told_the_users_are_contiguous_unless_gathered_across_ranks(recipe, loss):
    """The group-keeping batches hold each user's rows consecutively (contiguous_groups=True: no sort
    of the user ids on the Triton kernels); a batch gathered across ranks may hold two ranks'
    pieces of one user, so cross_device leaves the ids as they are."""
    def pairwise(objective):
        return [m for m in objective.modules() if hasattr(m, "contiguous_groups")]

    assert pairwise(recipe.MultiTaskObjective(loss, None)) and all(
        m.contiguous_groups for m in pairwise(recipe.MultiTaskObjective(loss, None)))
    assert not any(m.contiguous_groups for m in pairwise(recipe.MultiTaskObjective(loss, None, cross_device=True)))
    assert not pairwise(recipe.MultiTaskObjective("bce", None))


@pytest.mark.parametrize(("loss", "lam", "cross_device"), [
    ("laa", 0.3, False), ("loa", None, False), ("bce+pdaom", 0.3, False), ("bce+auc", 2.5, False), ("auc", None, True),
    ("bce+auc", 0.3, True),
])
def test_the_objective_is_the_task_losses_plus_lambda_times_the_ranking_heads(recipe, loss, lam, cross_device):
    """``--loss`` and ``--lambda`` as docs/recipe.md says: a per-task objective on the click and purchase
    logits (its ``lam`` when it is a ``bce+`` one; one call per task column when the pairs are taken
    across ranks), or BCE on them plus lambda (default 1) times the ranking loss of the third logit."""
    generator = torch.Generator().manual_seed(0)
    users = torch.arange(10).repeat_interleave(6)
    click = (torch.rand(60, generator=generator) < 0.4).float()
    labels = torch.stack([click, click * (torch.rand(60, generator=generator) < 0.5).float()], 1)
    objective = recipe.MultiTaskObjective(loss, lam, cross_device)
    logits = torch.randn(60, 2 + objective.uses_ranking_head, generator=generator)
    pairs = {"cross_device": True} if cross_device else {"contiguous_groups": True}
    if objective.uses_ranking_head:
        ranking = mlloss.build_loss(loss, **pairs)(logits[:, 2], labels, groups=users)
        expected = mlloss.build_loss("bce")(logits[:, :2], labels) + (1.0 if lam is None else lam) * ranking
    else:
        task_loss = mlloss.build_loss(loss, **({} if lam is None else {"lam": lam}), **pairs)
        if cross_device:
            expected = sum(task_loss(logits[:, t], labels[:, t], groups=users) for t in range(2))
        else:
            expected = task_loss(logits, labels, groups=users)
    torch.testing.assert_close(objective(logits, labels, users), expected)


@pytest.fixture(scope="module")
def two_epochs_run(recipe, tmp_path_factory):
    """One small run of 2 epochs: its report, parsed options and output folder (checkpoints kept)."""
    out = tmp_path_factory.mktemp("two_epochs_run")
    argv = [*SMALL, "--epochs", "2", "--output-dir", str(out)]
    return recipe.main(argv), recipe.parse_args(argv), out


def test_val_results_are_the_last_epochs_click_and_purchase_heads_on_the_validation_split(recipe, two_epochs_run):
    """results["val"]["model/auc/<task>"] is the AUC of the trained model's <task> logit on the validation
    split, scored here from the final checkpoint's weights by counting pairs (2 epochs: the last one's)."""
    report, args, out = two_epochs_run
    (train, val, _), _ = recipe.load_data(args)
    model = recipe.build_model(args, train, len(recipe.TASKS))
    state = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    model.load_state_dict({key.removeprefix("model."): value for key, value in state.items() if key.startswith("model.")})
    model.eval()
    with torch.no_grad():
        scores = model(val.sparse, val.dense)
    for t, task in enumerate(recipe.TASKS):
        labels = val.labels[:, t]
        difference = scores[labels == 1, t][:, None] - scores[labels == 0, t][None, :]
        auc = float((difference > 0).double().mean() + 0.5 * (difference == 0).double().mean())
        assert report["results"]["val"][f"model/auc/{task}"] == pytest.approx(auc, abs=1e-6), task


def test_the_epochs_training_loss_is_the_mean_over_its_steps_and_the_ranks(recipe, monkeypatch):
    """train_loss: each rank sums its steps' losses on the device; the epoch's loss is their mean over
    the ranks (which run equal numbers of steps) divided by the steps."""
    train = split_by_time(generate_impressions(SyntheticConfig(num_users=60)))[0]
    row = _epoch_on_rank_zero_of_two(recipe, monkeypatch, train, loss_sum=6.0, samples=40, others=(10.0, 50))
    assert row["train_loss"] == pytest.approx((6.0 + 10.0) / 2 / 4)
    assert row["train_samples"] == 90


def _pair_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """AUC by counting every (positive, negative) pair, ties one half."""
    difference = scores[labels == 1][:, None].double() - scores[labels == 0][None, :].double()
    return float((difference > 0).double().mean() + 0.5 * (difference == 0).double().mean())


def test_the_report_describes_the_splits_it_was_given(recipe, two_epochs_run):
    """What the report says beside the model's own results, each recomputed from the splits: their
    sizes, the label dictatorship of the training labels, and on each evaluated split the baselines'
    AUC: item popularity counted in the training impressions, the true click and purchase
    probabilities (synthetic data). A mix-up of splits or columns there had no test."""
    report, args, _ = two_epochs_run
    (train, val, test), _ = recipe.load_data(args)
    assert report["data"]["sizes"] == {"train": len(train), "val": len(val), "test": len(test)}
    assert len(val) != len(test)  # a swap would show
    assert report["label_dictatorship"] == mlloss.label_dictatorship(train.labels, label_names=recipe.TASKS).as_dict()
    item = train.field_names.index(train.item_field)
    popularity = torch.bincount(train.sparse[:, item], minlength=train.cardinalities[item])
    for name, split in (("val", val), ("test", test)):
        results = report["results"][name]
        for t, (task, truth) in enumerate(zip(recipe.TASKS, (split.p_click, split.p_purchase))):
            labels = split.labels[:, t]
            assert results[f"oracle/auc/{task}"] == pytest.approx(_pair_auc(truth, labels), abs=1e-9), (name, task)
            assert results[f"popularity/auc/{task}"] == pytest.approx(
                _pair_auc(popularity[split.sparse[:, item]], labels), abs=1e-9), (name, task)


def test_the_optimizer_takes_the_learning_rate_and_weight_decay(recipe):
    train = split_by_time(generate_impressions(SyntheticConfig(num_users=60)))[0]
    args = recipe.parse_args([*SMALL, "--weight-decay", "0.125", "--lr", "0.0625"])
    module = recipe.CtrCvrModule(recipe.build_model(args, train, 2), recipe.MultiTaskObjective("bce", None), args.lr,
                                 args.weight_decay)
    [group] = module.configure_optimizers().param_groups
    assert (group["lr"], group["weight_decay"]) == (0.0625, 0.125)
    assert {id(p) for p in group["params"]} == {id(p) for p in module.parameters()}


def test_the_results_table_and_epoch_line_put_each_value_in_its_place(recipe):
    """results.md's columns are METRICS in their order, its ranking-head line DiffAUC, MinAUC and the
    multipartite AUC, and the epoch line each task's AUC then GAUC: values chosen all different."""
    import ctr_cvr_report as report

    names = ["auc/click", "gauc/click", "auc/purchase", "gauc/purchase"]
    assert list(report.METRICS) == names
    flat = {f"{scorer}/{name}": 0.5 + 0.01 * i + 0.1 * s for s, scorer in enumerate(("model", "popularity", "model:rank"))
            for i, name in enumerate(names)}
    flat |= {"model:rank/diff_auc": 0.0123, "model:rank/min_auc": 0.4567, "model:rank/multipartite_auc": 0.789}
    lines = report.markdown_table({"test": flat}).splitlines()
    assert lines[0] == "| split | scorer | auc/click | gauc/click | auc/purchase | gauc/purchase |"
    assert "| test | model | 0.5000 | 0.5100 | 0.5200 | 0.5300 |" in lines
    assert "| test | popularity | 0.6000 | 0.6100 | 0.6200 | 0.6300 |" in lines
    assert "| test | model:rank | 0.7000 | 0.7100 | 0.7200 | 0.7300 |" in lines
    assert "test, ranking head: DiffAUC 0.0123, MinAUC 0.4567, multipartite AUC 0.7890" in lines
    row = {"epoch": 2, "train_loss": 0.25, "seconds": 1.5, "train_samples_per_s": 1000.0,
           **{f"model/{name}": 0.6 + 0.01 * i for i, name in enumerate(names)}}
    assert ("val click AUC 0.6000 GAUC 0.6100 | val purchase AUC 0.6200 GAUC 0.6300"
            in report.format_epoch(row)), report.format_epoch(row)


def test_gauc_weighs_each_users_auc_by_the_users_impressions(recipe):
    """GAUC as DIN defines it: the users with both labels, each AUC weighted by the user's rows."""
    import ctr_cvr_report as report

    split = split_by_time(generate_impressions(SyntheticConfig(num_users=40, seed=5)))[1]
    scores = torch.randn(len(split), 2, generator=torch.Generator().manual_seed(0))
    got = report.evaluate(scores, split)
    for t, task in enumerate(recipe.TASKS):
        labels = split.labels[:, t]
        weighted = total = 0.0
        for user in split.user.unique():
            rows = split.user == user
            if 0 < labels[rows].sum() < rows.sum():
                weighted += int(rows.sum()) * _pair_auc(scores[rows, t], labels[rows])
                total += int(rows.sum())
        assert got[f"gauc/{task}"] == pytest.approx(weighted / total, abs=1e-9), task
        assert got[f"auc/{task}"] == pytest.approx(_pair_auc(scores[:, t], labels), abs=1e-9), task


def test_the_training_batches_follow_the_seed(recipe, monkeypatch, tmp_path):
    """--seed reaches the data module (its epochs' user order), not only the model's initialisation."""
    seeds = []
    original = recipe.GroupDataModule

    def recorded(*args, **kwargs):
        seeds.append(kwargs["seed"])
        return original(*args, **kwargs)

    monkeypatch.setattr(recipe, "GroupDataModule", recorded)
    recipe.main([*SMALL, "--epochs", "1", "--seed", "7", "--output-dir", str(tmp_path), "--no-checkpoint"])
    assert seeds == [7]
