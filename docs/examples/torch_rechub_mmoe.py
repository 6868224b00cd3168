"""torch-rechub's MMOE (click and purchase towers) trained with mlloss, on batches of whole users.

Two objectives (``objective=``):

* ``"bce+pdaom"``: one loss per task. torch-rechub's towers end in a sigmoid, so the loss is told
  it gets probabilities; ``lam`` has one weight per task column (click, purchase).
* ``"ranking-head"``: a third tower with no sigmoid (a "regression" task in torch-rechub's terms)
  gives one ranking score, trained with ``LaALoss`` on both labels; the click and purchase towers
  keep their cross-entropy.

Needs ``pip install torch-rechub``. Run: ``python docs/examples/torch_rechub_mmoe.py``
(docs/integrations.md explains each step).
"""

import itertools

import torch
from torch.utils.data import DataLoader
from torch_rechub.basic.features import DenseFeature, SparseFeature
from torch_rechub.models.multi_task import MMOE
from torch_rechub.utils.data import TorchDataset

from mlloss import BCELoss, LaALoss, build_loss
from mlloss.data import GroupBatchSampler, SyntheticConfig, generate_impressions


def rechub_inputs(log):
    """The impression log as torch-rechub takes it: {feature name: column}, (N, 2) labels, features."""
    x = {name: log.sparse[:, f] for f, name in enumerate(log.field_names)}
    x |= {name: log.dense[:, d] for d, name in enumerate(log.dense_names)}
    y = torch.stack([log.click, log.purchase], dim=1)
    features = [SparseFeature(name, vocab_size=size, embed_dim=8) for name, size in zip(log.field_names, log.cardinalities)]
    features += [DenseFeature(name) for name in log.dense_names]
    return x, y, features


def main(steps=30, objective="bce+pdaom", seed=0):
    torch.manual_seed(seed)
    config = SyntheticConfig(num_users=300, num_items=500, mean_impressions=20, click_rate=0.2, purchase_rate=0.05, seed=seed)
    x, y, features = rechub_inputs(generate_impressions(config))

    # Whole users per batch, so that the per-user terms see every pair of a user's impressions.
    # TorchDataset takes a list of indices, so each batch is fetched in one indexing operation.
    sampler = GroupBatchSampler(x["user"], batch_size=512, seed=seed)
    loader = DataLoader(TorchDataset(x, y), sampler=sampler, batch_size=None)

    if objective == "bce+pdaom":  # one loss per task, on the towers' probabilities
        model = MMOE(features, ["classification", "classification"], n_expert=4,
                     expert_params={"dims": [32]}, tower_params_list=[{"dims": [16]}] * 2)
        loss_fn = build_loss("bce+pdaom", inputs="probabilities", lam=[1.0, 1.0])
    elif objective == "ranking-head":  # a third tower without sigmoid scores items for ranking
        model = MMOE(features, ["classification", "classification", "regression"], n_expert=4,
                     expert_params={"dims": [32]}, tower_params_list=[{"dims": [16]}] * 3)
        bce, laa = BCELoss(inputs="probabilities"), LaALoss(weights=[1.0, 2.0])
    else:
        raise ValueError(f"objective must be 'bce+pdaom' or 'ranking-head'; got {objective!r}")
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    losses = []
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        for x_batch, y_batch in loader:
            out = model(x_batch)  # (B, 2) probabilities; (B, 3) with the ranking score last
            users = x_batch["user"]
            if objective == "bce+pdaom":
                loss = loss_fn(out, y_batch, groups=users)
                parts = loss_fn.parts  # bce, ranking, bce/0, ranking/1, valid_pairs, ...
            else:
                ranking = laa(out[:, 2], y_batch, groups=users)  # one score against both labels
                loss = bce(out[:, :2], y_batch) + ranking
                parts = {"bce": bce.parts["bce"], "laa": ranking.detach(), **laa.parts}
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) % 10 == 0:
                print(f"step {len(losses)}: loss {loss.item():.4f}", {k: round(float(v), 4) for k, v in parts.items()})
            if len(losses) == steps:
                return losses


if __name__ == "__main__":
    for objective in ("bce+pdaom", "ranking-head"):
        print(objective)
        main(objective=objective)
