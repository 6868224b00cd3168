"""RankingMetrics as a recommender engineer uses it, against float64 brute force over all pairs: the
metrics of a whole evaluation epoch (groups split across batches, ties, a user of one class), the
items a ``DistributedSampler`` repeats under DDP, a 2-process Lightning DDP run (padding, uneven
ranks, users on both ranks), checkpoint resume with a balanced LoALoss, logging without host
synchronisation per step, and the docs/lightning.md example."""

from __future__ import annotations

import json
import math
import re
import sys
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, Subset, TensorDataset

import lightning_probe_script as script
from ranks import ForkedRanks
from mlloss import AUCLoss, LoALoss
from mlloss.integrations.lightning import RankingMetrics
from mlloss.integrations.lightning_checkpoints import AtomicCheckpointIO

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-12  # float64 sums in another order


# --------------------------------------------------------------------------- references


def brute_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over (positive, negative) pairs of 1[s+ > s-] + 1/2 1[s+ = s-]; NaN without a pair."""
    scores, labels = scores.double(), labels.bool()
    diff = scores[labels][:, None] - scores[~labels][None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean()) if diff.numel() else math.nan


def brute_gauc(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> float:
    """Mean of the users' AUCs over the users with both classes."""
    aucs = [brute_auc(scores[groups == user], labels[groups == user]) for user in groups.unique()]
    aucs = [auc for auc in aucs if not math.isnan(auc)]
    return sum(aucs) / len(aucs)


def brute_multipartite(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Pairs of different summed label, weighted by the level difference (linear cost)."""
    levels, scores = labels.double().sum(1), scores.double()
    cost = levels[:, None] - levels[None, :]
    diff = scores[:, None] - scores[None, :]
    hits = (diff > 0).double() + 0.5 * (diff == 0).double()
    ordered = cost > 0
    return float((cost * hits)[ordered].sum() / cost[ordered].sum())


def expected(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, prefix: str) -> dict[str, float]:
    values = {"num_items": float(scores.numel()), "multipartite_auc": brute_multipartite(scores, labels)}
    for k, name in enumerate(script.LABEL_NAMES):
        values[f"auc/{name}"] = brute_auc(scores, labels[:, k])
        values[f"gauc/{name}"] = brute_gauc(scores, labels[:, k], groups)
        values[f"dictatorship/prior/{name}"] = float(labels[:, k].double().mean())
    return {prefix + key: value for key, value in values.items()}


def assert_matches(logged: dict, reference: dict[str, float]) -> None:
    for key, value in reference.items():
        assert math.isclose(float(logged[key]), value, rel_tol=0, abs_tol=TOLERANCE), (key, float(logged[key]), value)


def scores_of(model: script.Scorer, items: TensorDataset | Subset) -> tuple[torch.Tensor, ...]:
    features, labels, users = (torch.stack(column) for column in zip(*items))
    with torch.no_grad():
        return model.scores(features)[:, 0], labels, users


def quiet_trainer(callback: RankingMetrics, **options) -> pl.Trainer:
    return pl.Trainer(**{**dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, callbacks=[callback]), **options})


# --------------------------------------------------------------------------- one process


def test_epoch_metrics_are_brute_force_over_the_whole_set_not_a_mean_of_batches():
    """Validation (after the sanity check) and test: batches of 64 split the users, quarter-rounded
    scores tie, user 99 has one class and user 1000 one item; the logged values are those of the
    whole set, which the mean of the per-batch GAUCs is not."""
    data, model = script.make_data(), script.Scorer()
    callback = RankingMetrics(script.LABEL_NAMES, print_report=False)
    trainer = quiet_trainer(callback, limit_train_batches=1)
    trainer.fit(model, DataLoader(data, batch_size=32), DataLoader(data, batch_size=64))
    scores, labels, users = scores_of(model, data)
    reference = expected(scores, labels, users, "val/")
    assert_matches(trainer.callback_metrics, reference)
    assert scores.unique().numel() < scores.numel() // 4  # many ties
    batches = [slice(start, start + 64) for start in range(0, len(data), 64)]
    per_batch = [brute_gauc(scores[part], labels[part, 0], users[part]) for part in batches]
    assert abs(sum(per_batch) / len(per_batch) - reference["val/gauc/click"]) > 0.01

    tested = trainer.test(model, DataLoader(data, batch_size=40), verbose=False)[0]
    assert_matches(tested, expected(scores, labels, users, "test/"))


class DuplicatingScorer(script.Scorer):
    """A validation_step that breaks the contract: two rows per item."""

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        outputs = super().validation_step(batch, batch_idx)
        return {key: torch.cat([value, value]) for key, value in outputs.items()}


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
@pytest.mark.parametrize("rank", [0, 1])
def test_items_a_distributed_sampler_repeats_are_not_counted(rank, shuffle):
    """Rank ``rank`` of 2 under a DistributedSampler of 301 items, which repeats one item so that
    each rank gets 151: rank 1's last item is the repeat. With a second, plain dataloader beside it,
    the metrics are those of the rank's share of the items (no repeat) and the plain loader's items."""
    data, model = script.make_data(), script.Scorer()
    sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=shuffle, seed=3)
    loaders = [DataLoader(data, batch_size=64, sampler=sampler), DataLoader(Subset(data, range(50)), batch_size=16)]
    callback = RankingMetrics(script.LABEL_NAMES, print_report=False)
    logged = quiet_trainer(callback, use_distributed_sampler=False).validate(model, loaders, verbose=False)[0]

    # The sampler's epoch before padding: a permutation (or 0..N-1), dealt out to the ranks in turn.
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(3)) if shuffle else torch.arange(len(data))
    items = [*order[rank::2].tolist(), *range(50)]
    assert len(list(sampler)) == 151 and len(items) == (151 if rank == 0 else 150) + 50
    assert_matches(logged, expected(*scores_of(model, Subset(data, items)), "val/"))

    with pytest.raises(ValueError, match=r"dataloader 0 gives this rank 151 items .* the steps returned 256 rows"):
        quiet_trainer(callback, use_distributed_sampler=False).validate(DuplicatingScorer(), loaders[0], verbose=False)


class Chunks(BatchSampler):
    """A batch sampler of its own (it could reorder the items)."""


def test_a_padding_sampler_behind_another_batch_sampler_is_reported():
    data = script.make_data()
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=False)
    callback = RankingMetrics(script.LABEL_NAMES, print_report=False)
    with pytest.warns(UserWarning, match="repeats 1 items to even out the ranks, behind a Chunks"):
        callback._start_epoch(script.Scorer(), DataLoader(data, batch_sampler=Chunks(sampler, 64, False)))
    assert callback._padding == [None]  # counted as they come


def test_a_distributed_sampler_that_repeats_nothing_is_neither_trimmed_nor_reported():
    """300 items on 2 ranks: 150 each, no repeat. Behind a batch sampler of its own there is nothing
    to warn about, and behind a BatchSampler nothing to drop: every row the steps return counts."""
    data = Subset(script.make_data(), range(300))
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=False)
    assert sampler.total_size == len(data)
    callback = RankingMetrics(script.LABEL_NAMES, print_report=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback._start_epoch(script.Scorer(), DataLoader(data, batch_sampler=Chunks(sampler, 64, False)))
        assert callback._padding == [None]
        callback._start_epoch(script.Scorer(), DataLoader(data, batch_size=64, sampler=sampler))
    assert not [str(w.message) for w in caught if "RankingMetrics" in str(w.message)]
    assert callback._padding == [None]
    assert callback._not_repeated(0, 1000) == 1000  # no repeat, no limit: every row is kept


# --------------------------------------------------------------------------- two processes


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    """tests/lightning_probe_script.py's ``main`` on 2 ranks forked from this process, in torchrun's
    environment (``ranks.ForkedRanks``; run as a script, Lightning would re-launch it for rank 1):
    each rank's results (empty if it wrote none), the ranks' exit statuses and the end of the output."""
    out_dir = tmp_path_factory.mktemp("lightning_probe")
    ranks = ForkedRanks(lambda rank: script.main(out_dir), log=out_dir / "ranks.log")
    exit_codes = ranks.wait()
    results = [json.loads(path.read_text()) if (path := out_dir / f"rank{rank}.json").exists() else {}
               for rank in range(2)]
    return results, exit_codes, ranks.output()[-5000:]


@pytest.mark.distributed
@pytest.mark.parametrize("run", ["fit", "test", "uneven"])
def test_ddp_metrics_are_brute_force_over_the_union_of_the_ranks(ddp_results, run):
    """fit: Lightning's DistributedSampler repeats an item for rank 1 (in order); test: the same,
    shuffled; uneven: rank 0 runs 4 batches and rank 1 2. Users have items on both ranks. Every rank
    logs the metrics of the 301 items, each once."""
    model = script.Scorer()
    prefix = "test/" if run == "test" else "val/"
    reference = expected(*scores_of(model, script.make_data()), prefix)
    per_rank, _, output = ddp_results
    for results in per_rank:
        assert run in results, output
        assert_matches(results[run], reference)


@pytest.mark.distributed
def test_ddp_groups_on_one_rank_only_raise_on_every_rank(ddp_results):
    # The gather agrees on each state's layout first: before, gloo aborted rank 1.
    per_rank, exit_codes, output = ddp_results
    assert exit_codes == [0, 0], output
    for results in per_rank:
        assert "mismatch" in results, output  # before, rank 1 died in the gather (SIGABRT)
        assert results["mismatch"] == "RankingMetrics: either every validation batch, on every rank, has groups or none has"


# --------------------------------------------------------------------------- checkpoints and logging


class BalancedRanker(pl.LightningModule):
    """A ranker trained with LoALoss(weights="balanced"): its running label counts are module state."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)
        self.loss = LoALoss("balanced")
        self.step_losses: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        features, labels, users = batch
        loss = self.loss(self.net(features), labels.float(), groups=users)
        self.step_losses.append(loss.detach().clone())
        self.log("train/loa", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        features, labels, users = batch
        return {"scores": self.net(features), "labels": labels, "groups": users}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


def test_resume_from_an_epoch_end_checkpoint_repeats_the_next_steps_bit_for_bit(tmp_path):
    data = script.make_data()
    loader = DataLoader(data, batch_size=64)

    def fit(epochs, callbacks=(), **options):
        model, callback = BalancedRanker(), RankingMetrics(script.LABEL_NAMES, print_report=False)
        trainer = quiet_trainer(callback, max_epochs=epochs, callbacks=[callback, *callbacks], **options)
        trainer.fit(model, loader, loader)
        return model, trainer

    whole, whole_trainer = fit(2)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="first")
    first, _ = fit(1, [checkpoint], enable_checkpointing=True, plugins=[AtomicCheckpointIO()])
    saved = torch.load(tmp_path / "first.ckpt", weights_only=False)
    assert torch.equal(saved["state_dict"]["loss.seen_items"], first.loss.seen_items)  # the running counts
    assert not any("RankingMetrics" in key for key in saved["callbacks"])  # it keeps no state (docs/lightning.md)

    resumed_trainer = quiet_trainer(RankingMetrics(script.LABEL_NAMES, print_report=False), max_epochs=2)
    resumed = BalancedRanker()
    resumed_trainer.fit(resumed, loader, loader, ckpt_path=tmp_path / "first.ckpt")
    per_epoch = len(whole.step_losses) // 2
    assert torch.equal(torch.stack(resumed.step_losses), torch.stack(whole.step_losses[per_epoch:]))
    assert torch.equal(resumed.loss.seen_positives, whole.loss.seen_positives)
    assert all(torch.equal(a, b) for a, b in zip(resumed.parameters(), whole.parameters(), strict=True))
    for name in ("val/auc/click", "val/gauc/purchase", "val/num_items"):
        assert float(resumed_trainer.callback_metrics[name]) == float(whole_trainer.callback_metrics[name])


class LoggingRanker(pl.LightningModule):
    """The docs' logging lines: the loss and ``loss.parts`` every step (or nothing logged). The loss
    takes no groups and checks nothing: its own syncing ops (on the CPU path) are the same every step."""

    def __init__(self, log: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net, self.loss, self.logs = torch.nn.Linear(3, 1), AUCLoss(validate_args=False), log

    def training_step(self, batch, batch_idx):
        features, labels, _ = batch
        loss = self.loss(self.net(features), labels[:, 0].float())
        if self.logs:
            self.log("train/auc", loss, on_epoch=True)
            self.log_dict({f"train/{k}": v.double() for k, v in self.loss.parts.items()})
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_logging_and_the_callback_add_no_host_synchronisation_per_step():
    """Syncing ops per training step (counted on the CPU as they would wait on a GPU; two more steps,
    less the one-off ones) are the loss's own: logging its value and parts every step with Lightning's
    defaults (no progress bar entry), and RankingMetrics, add none."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from op_count import OpCounter

    loader = DataLoader(script.make_data(), batch_size=32)

    def syncs(steps: int, instrumented: bool) -> int:
        callbacks = [RankingMetrics(script.LABEL_NAMES, print_report=False)] if instrumented else []
        trainer = pl.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
        counter = OpCounter()
        with counter, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the callback's "valid pairs per item" warning
            trainer.fit(LoggingRanker(instrumented), loader)
        return len(counter.syncs)

    per_step = {instrumented: syncs(4, instrumented) - syncs(2, instrumented) for instrumented in (False, True)}
    assert per_step[True] == per_step[False], per_step


# --------------------------------------------------------------------------- docs


def test_docs_one_device_example_runs_and_logs_the_validation_metrics(tmp_path, monkeypatch):
    """The first code block of docs/lightning.md, with the train_loader and val_loader it leaves to
    the reader (run in a temporary folder: the default logger writes lightning_logs/ there)."""
    block = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "lightning.md").read_text(), re.S)[0]
    gen = torch.Generator().manual_seed(0)

    def loader(num_items: int) -> DataLoader:
        labels = (torch.rand(num_items, 2, generator=gen) < torch.tensor([0.3, 0.1])).float()
        features = torch.randn(num_items, 16, generator=gen)
        return DataLoader(TensorDataset(features, labels, torch.randint(0, 20, (num_items,), generator=gen)), batch_size=64)

    monkeypatch.chdir(tmp_path)
    namespace = {"train_loader": loader(128), "val_loader": loader(150)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block, "docs/lightning.md", "exec"), namespace)
    model, logged = namespace["trainer"].lightning_module, namespace["trainer"].callback_metrics
    features, labels, users = namespace["val_loader"].dataset.tensors
    with torch.no_grad():
        scores = model.net(features)[:, 0]
    assert float(logged["val/num_items"]) == 150
    for k, name in enumerate(("click", "purchase")):
        assert math.isclose(float(logged[f"val/auc/{name}"]), brute_auc(scores, labels[:, k]), abs_tol=TOLERANCE)
        assert math.isclose(float(logged[f"val/gauc/{name}"]), brute_gauc(scores, labels[:, k], users), abs_tol=TOLERANCE)
    assert float(logged["train/valid_pairs"]) > 0  # the log_dict line of loss.parts
