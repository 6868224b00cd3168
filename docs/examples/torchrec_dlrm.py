"""TorchRec's DLRM (or DeepFM) on KeyedJaggedTensor batches, trained with BCE + a per-user AUC loss.

DLRM returns logits, one column; TorchRec's ``SimpleDeepFMNN`` ends in a sigmoid (its docstring
says logits): probabilities, which the BCE must be told. The user ids go to the loss as
``groups``, beside the ``KeyedJaggedTensor`` (the loss never reads the sparse features). Batches
hold whole users.

Needs TorchRec (docs/torchrec.md: ``pip install fbgemm-gpu-cpu==1.8.0 tensordict pyre-extensions
tqdm && pip install --no-deps torchrec==1.8.0``). Run: ``python docs/examples/torchrec_dlrm.py``.
"""

import itertools

import torch
from torch.utils.data import DataLoader, TensorDataset
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.models.deepfm import SimpleDeepFMNN
from torchrec.models.dlrm import DLRM

from mlloss import AUCLoss, BCELoss
from mlloss.data import GroupBatchSampler, SyntheticConfig, generate_impressions


def to_kjt(ids, keys):
    """A KeyedJaggedTensor with one id per row and key, from a (B, F) id matrix (column f is keys[f])."""
    return KeyedJaggedTensor.from_lengths_sync(
        keys=list(keys), values=ids.t().reshape(-1), lengths=torch.ones(ids.numel(), dtype=torch.int32)
    )


def main(steps=30, arch="dlrm", seed=0):
    torch.manual_seed(seed)
    log = generate_impressions(SyntheticConfig(num_users=300, num_items=500, mean_impressions=20, click_rate=0.2, seed=seed))
    keys = log.field_names  # user, item, category, segment, slot

    tables = [EmbeddingBagConfig(name=f"t_{key}", embedding_dim=8, num_embeddings=size, feature_names=[key])
              for key, size in zip(keys, log.cardinalities)]
    ebc = EmbeddingBagCollection(tables=tables)
    if arch == "dlrm":  # (B, 1) logits
        model = DLRM(embedding_bag_collection=ebc, dense_in_features=log.dense.shape[1],
                     dense_arch_layer_sizes=[32, 8], over_arch_layer_sizes=[32, 1])  # 8: the embedding dim
        bce = BCELoss()
    elif arch == "deepfm":  # (B, 1) probabilities: the over arch ends in nn.Sigmoid
        model = SimpleDeepFMNN(num_dense_features=log.dense.shape[1], embedding_bag_collection=ebc,
                               hidden_layer_size=32, deep_fm_dimension=8)
        bce = BCELoss(inputs="probabilities")
    else:
        raise ValueError(f"arch must be 'dlrm' or 'deepfm'; got {arch!r}")
    auc = AUCLoss()  # all (click, no-click) pairs within each user; it ranks logits and probabilities alike
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    sampler = GroupBatchSampler(log.user, batch_size=512, seed=seed)
    data = TensorDataset(log.sparse, log.dense, log.click, log.user)
    loader = DataLoader(data, sampler=sampler, batch_size=None)

    losses = []
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        for ids, dense, click, users in loader:
            scores = model(dense, to_kjt(ids, keys))  # (B, 1)
            loss = bce(scores, click) + auc(scores, click, groups=users)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) % 10 == 0:
                print(f"step {len(losses)}: loss {loss.item():.4f}, bce {bce.parts['bce']:.4f}, "
                      f"valid pairs {int(auc.parts['valid_pairs'])} in {int(auc.parts['groups_with_pairs'])} users")
            if len(losses) == steps:
                return losses


if __name__ == "__main__":
    for arch in ("dlrm", "deepfm"):
        print(arch)
        main(arch=arch)
