"""A plain PyTorch training loop with an mlloss loss picked by name.

The model is any ``nn.Module`` that returns logits: here two columns (click, purchase) for
``"bce+<name>"`` losses, which apply cross-entropy and the pairwise term to each task column. A
single-score loss (``"auc"``, ``"pdaom"`` on one label, ``"laa"`` / ``"loa"`` on both labels)
takes one column instead. Run: ``python docs/examples/plain_pytorch.py [loss name]``.
"""

import itertools
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mlloss import build_loss
from mlloss.registry import SINGLE_LABEL
from mlloss.data import GroupBatchSampler, SyntheticConfig, generate_impressions


class ScoreNet(nn.Module):
    """Field embeddings and dense features into an MLP with ``num_scores`` outputs (logits)."""

    def __init__(self, cardinalities, num_dense, num_scores, dim=8):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(size, dim) for size in cardinalities)
        self.mlp = nn.Sequential(nn.Linear(len(cardinalities) * dim + num_dense, 32), nn.ReLU(), nn.Linear(32, num_scores))

    def forward(self, ids, dense):
        return self.mlp(torch.cat([table(ids[:, f]) for f, table in enumerate(self.tables)] + [dense], dim=1))


def main(steps=30, loss_name="bce+auc", seed=0):
    torch.manual_seed(seed)
    log = generate_impressions(SyntheticConfig(num_users=300, num_items=500, mean_impressions=20, click_rate=0.2, purchase_rate=0.05, seed=seed))
    labels = torch.stack([log.click, log.purchase], dim=1)  # (N, 2): click, purchase

    loss_fn = build_loss(loss_name)  # e.g. "bce+auc", "bce+pdaom" (lam=...), "laa", "loa", "auc"
    num_scores = 2 if loss_name.startswith("bce") else 1  # bce+...: one logit per task; else one score
    if loss_name in SINGLE_LABEL:  # "auc", "pdaom": one binary label, the click
        labels = labels[:, :1]
    model = ScoreNet(log.cardinalities, log.dense.shape[1], num_scores)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    sampler = GroupBatchSampler(log.user, batch_size=512, seed=seed)  # whole users per batch
    loader = DataLoader(TensorDataset(log.sparse, log.dense, labels, log.user), sampler=sampler, batch_size=None)

    losses = []
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        for ids, dense, y, users in loader:
            loss = loss_fn(model(ids, dense), y, groups=users)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) % 10 == 0:  # loss.parts: detached batch facts, computed when read
                print(f"step {len(losses)}: {loss.item():.4f}", {k: round(float(v), 4) for k, v in loss_fn.parts.items()})
            if len(losses) == steps:
                return losses


if __name__ == "__main__":
    main(loss_name=sys.argv[1] if len(sys.argv) > 1 else "bce+auc")
