"""Lightning integration: LaALoss in a LightningModule (automatic optimisation, bf16-mixed on the CPU,
gradient accumulation), the RankingMetrics callback, and a 2-process DDP fit with
``LaALoss(cross_device=True)`` whose logged metrics and trained weights equal single-process ones."""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

import lightning_ddp_script as script
from ranks import ForkedRanks
from mlloss import AUCLoss, DictatorshipReport, LaALoss, PDAOMLoss, build_loss, label_dictatorship
from mlloss.integrations.lightning import RankingMetrics
from mlloss.metrics import binary_auc, group_auc, multipartite_auc

TRAIN_BATCHES = script.NUM_TRAIN // script.BATCH_SIZE  # one process: 8 batches per epoch


def quiet_trainer(**options) -> pl.Trainer:
    defaults = dict(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
    )
    return pl.Trainer(**{**defaults, **options})


def expected_metrics(scores, labels, groups, label_names=script.LABEL_NAMES, prefix="val/") -> dict[str, float]:
    """What RankingMetrics must log, recomputed in one process from the whole validation set."""
    per_label = [float(binary_auc(scores, labels[:, k])) for k in range(labels.shape[1])]
    values = {"num_items": scores.numel(), "diff_auc": max(per_label) - min(per_label), "min_auc": min(per_label)}
    for k, name in enumerate(label_names):
        values[f"auc/{name}"] = per_label[k]
        if groups is not None:
            values[f"gauc/{name}"] = float(group_auc(scores, labels[:, k], groups))
    values["multipartite_auc"] = float(multipartite_auc(scores, labels))
    report = label_dictatorship(labels, label_names=label_names)
    values["dictatorship/dominance_ratio"] = report.dominance_ratio
    values["dictatorship/dominant_index"] = label_names.index(report.dominant)
    for k, name in enumerate(label_names):
        values[f"dictatorship/prior/{name}"] = report.priors[k]
        values[f"dictatorship/effective_weight/{name}"] = report.effective_weights[k]
        values[f"dictatorship/share/{name}"] = report.shares[k]
    return {prefix + key: float(value) for key, value in values.items()}


def assert_metrics_equal(logged: dict[str, float], expected: dict[str, float]) -> None:
    logged = {key: value for key, value in logged.items() if key.startswith("val/")}
    assert sorted(logged) == sorted(expected)
    for key, value in expected.items():
        assert math.isclose(logged[key], value, rel_tol=0, abs_tol=1e-6), (key, logged[key], value)


# --------------------------------------------------------------------------- one process


@pytest.mark.parametrize(
    "options",
    [{}, {"precision": "bf16-mixed"}, {"accumulate_grad_batches": 2}],
    ids=["fp32", "bf16-mixed", "accumulate-2"],
)
def test_laa_loss_trains_in_a_lightning_module(options):
    model = script.Ranker(dtype=torch.float32, lr=0.1)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = quiet_trainer(limit_val_batches=0, num_sanity_val_steps=0, **options)
    trainer.fit(model)

    logged = trainer.callback_metrics
    assert math.isfinite(float(logged["train/laa"])) and float(logged["train/laa"]) > 0
    assert float(logged["train/valid_pairs"]) > 0 and float(logged["train/groups_with_pairs"]) > 0  # loss.parts
    assert all(torch.isfinite(p).all() for p in model.parameters())
    changed = {name: not torch.equal(p, initial[name]) for name, p in model.named_parameters()}
    # Every weight moved. The output bias shifts every score alike, to which pairwise losses are
    # blind: its gradient is 0 up to rounding.
    assert all(moved for name, moved in changed.items() if name != "net.2.bias"), changed
    assert trainer.global_step == TRAIN_BATCHES // options.get("accumulate_grad_batches", 1)
    expected_dtype = torch.bfloat16 if options.get("precision") == "bf16-mixed" else torch.float32
    assert model.score_dtypes == {expected_dtype}  # autocast really ran the net in bf16


def test_callback_logs_exact_metrics_of_the_validation_set():
    callback = RankingMetrics(script.LABEL_NAMES, print_report=False)
    model = script.Ranker()
    trainer = quiet_trainer(callbacks=[callback], limit_train_batches=2)  # with the default sanity check
    trainer.fit(model)

    features, labels, users = model.val_data.tensors
    with torch.no_grad():
        scores = model.net(features)[:, 0]
    logged = {key: float(value) for key, value in trainer.callback_metrics.items()}
    assert_metrics_equal(logged, expected_metrics(scores, labels, users))
    assert logged["val/num_items"] == script.NUM_VAL  # the sanity-check batches were not kept
    assert isinstance(callback.report, DictatorshipReport) and callback.report.label_names == script.LABEL_NAMES


def feed(callback: RankingMetrics, *outputs) -> None:
    for batch_idx, output in enumerate(outputs):
        callback.on_validation_batch_end(None, None, output, None, batch_idx)


def test_callback_without_groups_and_with_one_label():
    gen = torch.Generator().manual_seed(0)
    scores, labels = torch.randn(40, 1, generator=gen), torch.randint(0, 2, (40,), generator=gen)
    callback = RankingMetrics(["click"], prefix="eval/")
    feed(callback, {"scores": scores[:25], "labels": labels[:25]}, {"scores": scores[25:], "labels": labels[25:]})
    computed = {key: float(value) for key, value in callback.compute().items()}
    expected = expected_metrics(scores[:, 0], labels[:, None], None, label_names=("click",), prefix="eval/")
    assert sorted(computed) == sorted(expected) and not any("gauc" in key for key in computed)
    for key, value in expected.items():
        assert math.isclose(computed[key], value, abs_tol=1e-12), key


def test_callback_weighs_the_multipartite_auc_by_label_weights():
    """label_weights w_k: the multipartite AUC of the level sum_k w_k y_k with the linear cost, by brute
    force over the item pairs (the default, all ones, gives another value on these labels)."""
    gen = torch.Generator().manual_seed(11)
    scores, labels = torch.randn(50, generator=gen, dtype=torch.float64), torch.randint(0, 2, (50, 2), generator=gen)
    weights = torch.tensor([1.0, 3.0], dtype=torch.float64)

    def brute(levels):
        cost = levels[:, None] - levels[None, :]
        diff = scores[:, None] - scores[None, :]
        hits = (diff > 0).double() + 0.5 * (diff == 0).double()
        return float((cost * hits)[cost > 0].sum() / cost[cost > 0].sum())

    callback = RankingMetrics(["click", "purchase"], label_weights=weights.tolist(), print_report=False)
    feed(callback, {"scores": scores[:20], "labels": labels[:20]}, {"scores": scores[20:], "labels": labels[20:]})
    logged = float(callback.compute()["val/multipartite_auc"])
    assert math.isclose(logged, brute(labels.double() @ weights), rel_tol=0, abs_tol=1e-12)
    assert abs(brute(labels.double() @ weights) - brute(labels.double().sum(1))) > 1e-3  # the weights matter here


def test_callback_reports_the_dictatorship_under_loa_weights():
    """loa_weights a_k: the logged effective weights are a_k / (pi_k (1 - pi_k)) of the validation priors
    pi_k, and the shares their normalised values."""
    gen = torch.Generator().manual_seed(12)
    scores, labels = torch.randn(60, generator=gen), (torch.rand(60, 2, generator=gen) < torch.tensor([0.5, 0.2])).long()
    callback = RankingMetrics(["click", "purchase"], loa_weights=[1.0, 4.0], print_report=False)
    feed(callback, {"scores": scores, "labels": labels})
    computed = {key: float(value) for key, value in callback.compute().items()}
    priors = labels.double().mean(0)
    effective = torch.tensor([1.0, 4.0], dtype=torch.float64) / (priors * (1 - priors))
    for k, name in enumerate(("click", "purchase")):
        assert math.isclose(computed[f"val/dictatorship/effective_weight/{name}"], float(effective[k]), rel_tol=1e-12)
        assert math.isclose(computed[f"val/dictatorship/share/{name}"], float(effective[k] / effective.sum()),
                            rel_tol=1e-12)
    assert callback.report.mixing_weights == (1.0, 4.0)


def test_callback_names_a_bad_group_weighting_as_ranking_metrics_does():
    with pytest.raises(ValueError, match="group_weighting must be one of 'uniform', 'size'; got 'items'"):
        RankingMetrics(["click"], group_weighting="items")
    # print_report="False" was taken for True, prefix=None logged 'Noneauc/click'
    with pytest.raises(TypeError, match="print_report must be a bool; got 'False'"):
        RankingMetrics(["click"], print_report="False")
    for name in ("prefix", "test_prefix", "score_key", "labels_key", "groups_key", "loss_attribute"):
        with pytest.raises(TypeError, match=f"{name} must be a str; got None"):
            RankingMetrics(["click"], **{name: None})


def test_callback_scores_one_column_per_label_as_task_heads():
    """(N, K) scores: column k is ranked against label k only (a multi-task model's heads), at
    validation and, with the test prefix, at test; no multipartite AUC (no single score)."""
    gen = torch.Generator().manual_seed(3)
    scores, labels = torch.randn(60, 2, generator=gen), torch.randint(0, 2, (60, 2), generator=gen)
    groups = torch.randint(0, 6, (60,), generator=gen)
    callback = RankingMetrics(["click", "purchase"], group_weighting="size", print_report=False)
    feed(callback, {"scores": scores[:35], "labels": labels[:35], "groups": groups[:35]},
         {"scores": scores[35:], "labels": labels[35:], "groups": groups[35:]})
    computed = callback.compute("test/")
    for k, name in enumerate(("click", "purchase")):
        assert float(computed[f"test/auc/{name}"]) == float(binary_auc(scores[:, k], labels[:, k]))
        assert float(computed[f"test/gauc/{name}"]) == float(group_auc(scores[:, k], labels[:, k], groups, "size"))
    per_label = [float(computed["test/auc/click"]), float(computed["test/auc/purchase"])]
    assert float(computed["test/min_auc"]) == min(per_label)
    assert "test/multipartite_auc" not in computed and "val/auc/click" not in computed


def test_callback_keeps_each_batch_of_an_output_buffer_refilled_in_place():
    """A validation_step that returns one buffer refilled in place (a CUDA graph's static output):
    the callback kept float64 scores, uint8 labels and int64 groups without a copy, so every batch it
    had seen became the last one."""
    gen = torch.Generator().manual_seed(5)
    batches = [(torch.randn(30, generator=gen, dtype=torch.float64), torch.randint(0, 2, (30, 2), generator=gen),
                torch.randint(0, 5, (30,), generator=gen)) for _ in range(2)]
    buffers = (torch.empty(30, dtype=torch.float64), torch.empty(30, 2, dtype=torch.uint8), torch.empty(30, dtype=torch.long))
    callback = RankingMetrics(script.LABEL_NAMES, print_report=False)
    for batch_idx, batch in enumerate(batches):
        for buffer, values in zip(buffers, batch):
            buffer.copy_(values)
        callback.on_validation_batch_end(None, None, dict(zip(("scores", "labels", "groups"), buffers)), None, batch_idx)
    for buffer in buffers:  # the next batch, written before the epoch's end
        buffer.copy_(buffer.flip(0))
    scores, labels, groups = (torch.cat(parts) for parts in zip(*batches))
    computed = {key: float(value) for key, value in callback.compute().items()}
    assert_metrics_equal(computed, expected_metrics(scores, labels, groups))


@pytest.mark.filterwarnings("ignore::mlloss.metrics.UndefinedMetricWarning")
@pytest.mark.parametrize("items", [0, 1])
def test_callback_on_an_evaluation_of_one_item_or_none(items):
    """One item (torchmetrics returned its outputs 0-dim: an IndexError) or none (the dictatorship
    report refused empty labels): the metrics are NaN, the report is left out when there is no item."""
    callback = RankingMetrics(["click"], print_report=False)
    feed(callback, {"scores": torch.randn(items, 1), "labels": torch.ones(items, 1), "groups": torch.arange(items)})
    computed = {key: float(value) for key, value in callback.compute().items()}
    assert computed["val/num_items"] == items
    assert math.isnan(computed["val/auc/click"])
    assert math.isnan(computed["val/gauc/click"]) if items else "val/gauc/click" not in computed  # no id, no groups
    assert (callback.report is None) == (items == 0)
    assert any(key.startswith("val/dictatorship/") for key in computed) == (items == 1)


def test_callback_rejects_outputs_that_break_the_contract():
    callback = RankingMetrics(script.LABEL_NAMES)
    scores, labels, groups = torch.randn(4), torch.tensor([[1, 0], [0, 0], [1, 1], [0, 0]]), torch.arange(4)
    with pytest.raises(TypeError, match="validation_step to return a mapping"):
        feed(callback, scores)
    with pytest.raises(TypeError, match="'labels'"):
        feed(callback, {"scores": scores})
    with pytest.raises(ValueError, match=r"\(4, 2\)"):
        feed(callback, {"scores": scores, "labels": labels[:, :1]})
    with pytest.raises(ValueError, match=r"outputs\['labels'\] must be binary \(0 or 1\); outputs\['labels'\]\[0, 0\] = 2"):
        feed(callback, {"scores": scores, "labels": labels * 2})
    with pytest.raises(ValueError, match=r"label_weights weigh the labels of one ranking score .* shape \(4, 2\)"):
        feed(RankingMetrics(script.LABEL_NAMES, label_weights=[1.0, 2.0]), {"scores": torch.randn(4, 2), "labels": labels})
    with pytest.raises(TypeError, match=r"outputs\['groups'\] must hold integer ids; got dtype torch.float32"):
        feed(callback, {"scores": scores, "labels": labels, "groups": groups.float()})
    with pytest.raises(TypeError, match="got dtype torch.bool"):
        feed(callback, {"scores": scores, "labels": labels, "groups": groups > 1})
    with pytest.raises(ValueError, match=r"one id per item \(4\); got 3"):
        feed(callback, {"scores": scores, "labels": labels, "groups": groups[:3]})
    with pytest.raises(ValueError, match="shape"):
        RankingMetrics(script.LABEL_NAMES, score_key="logits").on_validation_batch_end(
            None, None, {"logits": torch.randn(4, 3), "labels": labels}, None, 0
        )
    with pytest.raises(ValueError, match="distinct"):
        RankingMetrics(["click", "click"])
    # The weights are checked at construction, not after the first validation epoch.
    with pytest.raises(ValueError, match=r"loa_weights must have one entry per label name \(2\); got loa_weights=\[1.0\]"):
        RankingMetrics(["click", "purchase"], loa_weights=[1.0])
    with pytest.raises(ValueError, match=r"label_weights must have one entry per label name \(2\)"):
        RankingMetrics(["click", "purchase"], label_weights=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"label_weights must all be > 0; got \[1.0, 0.0\]"):
        RankingMetrics(["click", "purchase"], label_weights=[1.0, 0.0])
    with pytest.raises(ValueError, match=r"loa_weights must all be >= 0; got \[1.0, -1.0\]"):
        RankingMetrics(["click", "purchase"], loa_weights=[1.0, -1.0])
    feed(callback, {"scores": scores, "labels": labels, "groups": groups}, {"scores": scores, "labels": labels})
    with pytest.raises(ValueError, match="every validation batch"):
        callback.compute()


# --------------------------------------------------------------------------- two processes


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """tests/lightning_ddp_script.py's ``main`` on 2 ranks forked from this process, in torchrun's
    environment (``ranks.ForkedRanks``; run as a script, its Trainer(devices=2, strategy="ddp")
    would re-launch it for rank 1)."""
    out_dir = tmp_path_factory.mktemp("lightning_ddp")
    ForkedRanks(lambda rank: script.main(out_dir), log=out_dir / "ranks.log").join()
    return json.loads((out_dir / "metrics.json").read_text()), torch.load(out_dir / "run.pt")


@pytest.mark.distributed
def test_ddp_callback_metrics_equal_single_process_evaluation(ddp_run):
    logged, run = ddp_run
    assert logged["val/num_items"] == script.NUM_VAL  # each item seen once: no padding, no duplicates
    expected = expected_metrics(run["scores"], run["labels"], run["users"])
    assert_metrics_equal(logged, expected)
    assert 0.55 < expected["val/auc/click"] < 1 and 0.55 < expected["val/gauc/purchase"] < 1  # it learned


@pytest.mark.distributed
def test_ddp_cross_device_training_equals_single_process_on_concatenated_batches(ddp_run):
    """Each DDP step took pairs across both ranks' batches, with the exact gradient scale: plain SGD
    in one process on the concatenation of the ranks' batches ends at the same weights."""
    _, run = ddp_run
    model = script.Ranker()
    for name, value in model.net.state_dict().items():
        torch.testing.assert_close(value, run["initial"][name], rtol=0, atol=0)
    optimizer = torch.optim.SGD(model.net.parameters(), lr=script.LR)
    loss_fn = LaALoss()
    loaders = [
        DataLoader(script.shard(model.train_data, rank, script.WORLD), batch_size=script.BATCH_SIZE)
        for rank in range(script.WORLD)
    ]
    for _ in range(script.EPOCHS):
        for rank_batches in zip(*loaders, strict=True):
            features, labels, users = (torch.cat(parts) for parts in zip(*rank_batches))
            optimizer.zero_grad()
            loss_fn(model.net(features), labels, users).backward()
            optimizer.step()
    moved = 0.0
    for name, value in model.net.state_dict().items():
        torch.testing.assert_close(run["final"][name], value, rtol=1e-9, atol=1e-11)
        moved = max(moved, float((value - run["initial"][name]).abs().max()))
    assert moved > 1e-2


def test_callback_reports_the_valid_pairs_the_training_loss_saw():
    # 400 users of 5 items: shuffled batches of 40 split almost every user (few within-user pairs,
    # a warning); GroupBatchSampler keeps users whole.
    from mlloss.data import GroupBatchSampler

    gen = torch.Generator().manual_seed(0)
    users = torch.arange(400).repeat_interleave(5)
    features = torch.randn(len(users), 4, generator=gen)
    labels = torch.randint(0, 2, (len(users),), generator=gen).float()
    dataset = torch.utils.data.TensorDataset(features, labels, users)

    class Ranker(pl.LightningModule):
        def __init__(self, loss, masked=False):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)
            self.loss, self.masked = loss, masked

        def training_step(self, batch, batch_idx):
            x, y, g = batch
            if self.masked:  # a fixed-size batch: 8 filler rows that count for nothing
                x, y, g = torch.cat([x, x[:8]]), torch.cat([y, y[:8]]), torch.cat([g, g[:8]])
                mask = torch.arange(len(y)) < len(y) - 8
                return self.loss(self.net(x), y, g, mask=mask)
            return self.loss(self.net(x), y, g)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(loader, loss=None, masked=False):
        trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[RankingMetrics(label_names=("click",))])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(Ranker(AUCLoss() if loss is None else loss, masked), loader)
        starved = any("valid pairs per item" in str(w.message) for w in caught)
        return float(trainer.callback_metrics["train/valid_pairs_per_item"]), starved

    shuffled = torch.utils.data.DataLoader(dataset, batch_size=40, shuffle=True,
                                           generator=torch.Generator().manual_seed(1))
    grouped = torch.utils.data.DataLoader(dataset, sampler=GroupBatchSampler(users, 40), batch_size=None)
    shuffled_pairs, shuffled_warned = fit(shuffled)
    grouped_pairs, grouped_warned = fit(grouped)
    # Per item, a user of 5 items with both labels gives about 6 / 5 pairs whole and almost none split.
    assert grouped_pairs > 0.8 and shuffled_pairs < 0.1 * grouped_pairs
    assert shuffled_warned and not grouped_warned
    # The mask's fillers are not items: the same pairs per item as without them.
    assert fit(grouped, masked=True) == pytest.approx((grouped_pairs, False), rel=1e-12)
    # A max-violation loss counts one pair per user with both labels, under one per item however
    # the batches are made: logged, never blamed on split users.
    for loss in (PDAOMLoss(surrogate="logistic"), build_loss("bce+pdaom")):  # logits: a bounded surrogate
        hardest_pairs, hardest_warned = fit(grouped, loss)
        assert 0 < hardest_pairs <= 0.2 and not hardest_warned


def test_callback_reads_no_device_value_per_training_step():
    # A masked call's item count is a device tensor: the callback adds it up without reading it.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from op_count import OpCounter

    callback, module = RankingMetrics(label_names=("click",)), torch.nn.Module()
    module.loss = AUCLoss(validate_args=False)
    scores, labels, users = torch.randn(12), torch.arange(12) % 2, torch.arange(12) // 4
    callback.on_train_epoch_start(None, module)
    counter = OpCounter()
    for step in range(3):
        module.loss(scores, labels, users, mask=torch.arange(12) < 8 + step)
        with counter:
            callback.on_train_batch_end(None, module, None, None, step)
    assert counter.ops and not counter.syncs, counter.syncs
    assert callback._items_seen.item() == 8 + 9 + 10


class _LoggingModule(torch.nn.Module):
    """The part of a LightningModule the callback's training hooks use: its loss and ``log``."""

    def __init__(self, loss):
        super().__init__()
        self.loss, self.logged = loss, {}

    def log(self, name, value, **options):
        self.logged[name] = float(value)


def _brute_pairs(labels, users):
    """Pairs (positive, negative) inside each user: what AUCLoss averages over."""
    same_user = users[:, None] == users[None, :]
    return int((same_user & (labels[:, None] == 1) & (labels[None, :] == 0)).sum())


@pytest.mark.filterwarnings("ignore:the training loss saw")  # few pairs per item here: not what is tested
def test_callback_counts_valid_pairs_per_item_and_per_batch_of_each_training_epoch():
    """Each epoch's train/valid_pairs_per_item and train/valid_pairs_per_batch are its own (the
    counts start again every epoch), by brute force over the users' pairs."""
    gen = torch.Generator().manual_seed(4)
    callback, module = RankingMetrics(label_names=("click",)), _LoggingModule(AUCLoss())
    for batches in (3, 2):  # epoch 1, then epoch 2 with fewer batches
        callback.on_train_epoch_start(None, module)
        pairs = items = 0
        for step in range(batches):
            users = torch.arange(12) // 4
            labels, scores = torch.randint(0, 2, (12,), generator=gen), torch.randn(12, generator=gen)
            module.loss(scores, labels, users)
            callback.on_train_batch_end(None, module, None, None, step)
            pairs, items = pairs + _brute_pairs(labels, users), items + 12
        callback.on_train_epoch_end(None, module)
        assert module.logged["train/valid_pairs_per_item"] == pytest.approx(pairs / items, rel=1e-12)
        assert module.logged["train/valid_pairs_per_batch"] == pytest.approx(pairs / batches, rel=1e-12)


@pytest.mark.parametrize("positives,warned", [(1, True), (2, False)])
def test_callback_warns_when_the_training_loss_saw_fewer_valid_pairs_than_items(positives, warned):
    """One user: 1 positive among 3 items gives 2 pairs, fewer than the items (a warning); 2 positives
    among 4 items give 4 pairs, as many as the items (none)."""
    size = 3 if positives == 1 else 4
    labels, users = (torch.arange(size) < positives).long(), torch.zeros(size, dtype=torch.long)
    assert _brute_pairs(labels, users) / size == (2 / 3 if positives == 1 else 1.0)
    callback, module = RankingMetrics(label_names=("click",)), _LoggingModule(AUCLoss())
    callback.on_train_epoch_start(None, module)
    module.loss(torch.randn(size), labels, users)
    callback.on_train_batch_end(None, module, None, None, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.on_train_epoch_end(None, module)
    assert any("valid pairs per item" in str(w.message) for w in caught) == warned
