"""Seeded generator of Ali-CCP-like impression logs with known click/purchase probabilities.

Ali-CCP (Alibaba Click and Conversion Prediction) logs impressions of items to users, with
a click label and a purchase ("conversion") label that can only be 1 after a click. This
module draws a synthetic log with the same shape:

* ``num_users`` users, each with a long-tailed number of impressions (1 + a Poisson count
  whose rate is log-normal), spread uniformly over time [0, 1);
* items drawn with Zipf popularity; every item has a category, every user a segment;
* sparse id fields ``user``, ``item``, ``category``, ``segment``, ``slot`` (display slot);
* dense features: log item popularity, log user activity, a price and the slot position;
* ``P(click)`` and ``P(purchase | click)`` from logistic models of latent user/item factors
  (users near their segment's centroid, items near their category's centroid) plus the
  features; click ~ Bernoulli(P(click)), purchase = click AND Bernoulli(P(purchase | click)).

The intercepts are calibrated (bisection) so that the expected click rate and purchase rate
match the configuration exactly, whatever the other parameters. The true probabilities are
returned with the data so that experiments can report an oracle ceiling.

The log is an :class:`~mlloss.data.impressions.ImpressionData` (``impressions.py``), the type the
real-data loaders of ``tabular.py`` return too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from mlloss.data.impressions import ImpressionData

__all__ = [
    "SPARSE_FIELDS",
    "DENSE_FEATURES",
    "SyntheticConfig",
    "generate_impressions",
    "split_by_time",
]

SPARSE_FIELDS: tuple[str, ...] = ("user", "item", "category", "segment", "slot")
DENSE_FEATURES: tuple[str, ...] = ("log_item_popularity", "log_user_activity", "price", "position")


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of the synthetic impression log.

    The defaults give about 240k impressions (4000 users x 60 on average), a click rate of
    7% and a purchase rate of 0.75% of impressions (about 11% of clicks convert).
    """

    num_users: int = 4000
    num_items: int = 2000
    num_categories: int = 40
    num_segments: int = 10
    num_slots: int = 8
    mean_impressions: float = 60.0
    activity_sigma: float = 1.0  # log-normal sigma of per-user activity: larger = longer tail
    zipf_exponent: float = 0.8
    latent_dim: int = 8
    click_rate: float = 0.07
    purchase_rate: float = 0.0075
    factor_noise: float = 0.5  # spread of user (item) factors around their segment (category) centroid
    interaction_scale: float = 1.5  # weight of the user-item latent match in the logits
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_users", "num_items", "num_categories", "num_segments", "num_slots", "latent_dim", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "seed" else 1):
                raise ValueError(f"SyntheticConfig.{name} must be an int >= {0 if name == 'seed' else 1}; got {value!r}")
        if not self.seed < 2**64:  # torch.Generator.manual_seed's range; its own error names no seed
            raise ValueError(f"SyntheticConfig.seed must be an int in [0, 2**64) (torch.Generator's seeds); got {self.seed}")
        # the comparisons below are written so that NaN fails them; inf is refused as well
        if not 1 <= self.mean_impressions < math.inf:
            raise ValueError(f"SyntheticConfig.mean_impressions must be finite and >= 1; got {self.mean_impressions}")
        if not 0 <= self.factor_noise < math.inf:
            raise ValueError(f"SyntheticConfig.factor_noise must be finite and >= 0; got {self.factor_noise}")
        for name in ("activity_sigma", "zipf_exponent", "interaction_scale"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"SyntheticConfig.{name} must be finite and > 0; got {getattr(self, name)}")
        if not 0 < self.click_rate < 1:
            raise ValueError(f"SyntheticConfig.click_rate must be in (0, 1); got {self.click_rate}")
        if not 0 < self.purchase_rate < self.click_rate:
            raise ValueError(
                f"SyntheticConfig.purchase_rate must be in (0, click_rate={self.click_rate}); "
                f"got {self.purchase_rate}"
            )


def generate_impressions(config: SyntheticConfig | None = None) -> ImpressionData:
    """Draw an impression log; the same config (seed included) gives the same tensors with the
    same number of torch threads (the float32 means and standard deviations of the features are
    parallel reductions: other thread counts move them by a few ULPs)."""
    cfg = config or SyntheticConfig()
    gen = torch.Generator().manual_seed(cfg.seed)
    users = _draw_users(cfg, gen)
    items = _draw_items(cfg, gen)

    # Impressions, grouped by user and sorted by time within a user.
    user = torch.repeat_interleave(torch.arange(cfg.num_users), users.counts)
    n = user.shape[0]
    timestamp = torch.rand(n, generator=gen)
    order = torch.argsort(user.double() + timestamp.double())  # user-major, then time
    user, timestamp = user[order], timestamp[order]
    item = torch.multinomial(items.popularity, n, replacement=True, generator=gen)
    slot = torch.randint(cfg.num_slots, (n,), generator=gen)
    dense = torch.stack(
        [
            _standardize(torch.log(items.popularity.float() * cfg.num_items)[item]),  # log_item_popularity
            _standardize(torch.log(users.counts.float())[user]),  # log_user_activity
            items.price[item],  # price
            slot.float() / max(cfg.num_slots - 1, 1),  # position
        ],
        dim=1,
    )

    click_logit, cvr_logit = _logits(cfg, users, items, user, item, dense)
    p_click = torch.sigmoid(click_logit + _calibrate_intercept(click_logit, cfg.click_rate))
    conversion_rate = cfg.purchase_rate / cfg.click_rate
    p_cvr = torch.sigmoid(cvr_logit + _calibrate_intercept(cvr_logit, conversion_rate, weights=p_click))
    click = torch.bernoulli(p_click, generator=gen)
    purchase = click * torch.bernoulli(p_cvr, generator=gen)

    return ImpressionData(
        sparse=torch.stack([user, item, items.category[item], users.segment[user], slot], dim=1),
        dense=dense,
        click=click,
        purchase=purchase,
        user=user,
        timestamp=timestamp,
        field_names=SPARSE_FIELDS,
        cardinalities=(cfg.num_users, cfg.num_items, cfg.num_categories, cfg.num_segments, cfg.num_slots),
        dense_names=DENSE_FEATURES,
        p_click=p_click,
        p_purchase=p_click * p_cvr,
        item_field="item",
    )


class _Users(NamedTuple):
    segment: Tensor  # (U,) segment id
    factors: Tensor  # (U, latent_dim) taste
    counts: Tensor  # (U,) number of impressions, >= 1


class _Items(NamedTuple):
    category: Tensor  # (I,) category id
    factors: Tensor  # (I, latent_dim)
    popularity: Tensor  # (I,) float64 impression probabilities (Zipf, shuffled over ids)
    quality: Tensor  # (I,) appeal shared by all users, correlated with popularity
    price: Tensor  # (I,) standardized price


def _draw_users(cfg: SyntheticConfig, gen: torch.Generator) -> _Users:
    """Users: a segment, latent factors near the segment centroid, long-tailed activity."""
    segment = torch.randint(cfg.num_segments, (cfg.num_users,), generator=gen)
    centroids = torch.randn(cfg.num_segments, cfg.latent_dim, generator=gen)
    factors = _near(centroids[segment], cfg.factor_noise, gen)
    sigma = cfg.activity_sigma
    rates = torch.exp(sigma * torch.randn(cfg.num_users, generator=gen) - sigma**2 / 2) * (cfg.mean_impressions - 1)
    return _Users(segment, factors, 1 + torch.poisson(rates, generator=gen).long())


def _draw_items(cfg: SyntheticConfig, gen: torch.Generator) -> _Items:
    """Items: a category, latent factors near the category centroid, Zipf popularity,
    a quality correlated with popularity (popular items tend to be good ones) and a price."""
    category = torch.randint(cfg.num_categories, (cfg.num_items,), generator=gen)
    centroids = torch.randn(cfg.num_categories, cfg.latent_dim, generator=gen)
    factors = _near(centroids[category], cfg.factor_noise, gen)
    popularity = torch.arange(1, cfg.num_items + 1, dtype=torch.float64).pow(-cfg.zipf_exponent)
    popularity = (popularity / popularity.sum())[torch.randperm(cfg.num_items, generator=gen)]
    quality = 0.5 * _standardize(torch.log(popularity.float())) + 0.87 * torch.randn(cfg.num_items, generator=gen)
    return _Items(category, factors, popularity, quality, torch.randn(cfg.num_items, generator=gen))


def _near(centroids: Tensor, noise: float, gen: torch.Generator) -> Tensor:
    """Centroids plus Gaussian noise of scale ``noise``, rescaled to unit variance per coordinate."""
    return (centroids + noise * torch.randn(centroids.shape, generator=gen)) / (1 + noise**2) ** 0.5


def _logits(
    cfg: SyntheticConfig, users: _Users, items: _Items, user: Tensor, item: Tensor, dense: Tensor
) -> tuple[Tensor, Tensor]:
    """Click and conversion logits before the intercepts. Clicks follow the user-item match
    of all latent factors; conversion a partly different taste (the second half of the
    factors), quality and price."""
    log_pop, log_activity, price, position = dense.unbind(1)
    match = (users.factors[user] * items.factors[item]).sum(1) / cfg.latent_dim**0.5
    quality = items.quality[item]
    click = cfg.interaction_scale * match + 0.4 * quality + 0.2 * log_pop + 0.2 * log_activity - 0.8 * position
    half = cfg.latent_dim // 2
    taste = (users.factors[user, half:] * items.factors[item, half:]).sum(1) / (cfg.latent_dim - half) ** 0.5
    cvr = 0.5 * cfg.interaction_scale * taste + 0.3 * quality - 0.3 * price
    return click, cvr


def split_by_time(
    data: ImpressionData, val_fraction: float = 0.1, test_fraction: float = 0.1
) -> tuple[ImpressionData, ImpressionData, ImpressionData]:
    """Split into (train, val, test) by timestamp: the last ``test_fraction`` of the time
    range is test, the ``val_fraction`` before it validation, the rest training."""
    if not (0 <= val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):  # NaN fails too
        raise ValueError(
            f"val_fraction={val_fraction} and test_fraction={test_fraction} must be >= 0 "
            "and sum to less than 1"
        )
    test_start = 1.0 - test_fraction
    val_start = test_start - val_fraction
    t = data.timestamp
    return (
        data.subset(t < val_start),
        data.subset((t >= val_start) & (t < test_start)),
        data.subset(t >= test_start),
    )


def _standardize(x: Tensor) -> Tensor:
    # one value (one item, or one impression) is centred to 0: its sample std would be NaN
    return (x - x.mean()) / (x.std() if x.numel() > 1 else x.new_ones(())).clamp_min(1e-6)


def _calibrate_intercept(logits: Tensor, target: float, weights: Tensor | None = None) -> float:
    """The intercept b with weighted mean of sigmoid(logits + b) equal to ``target``, by bisection.
    The mean rises from 0 to 1 with b, so the bracket [-30, 30] is doubled until it holds b (a
    large ``interaction_scale`` spreads the logits far beyond 30)."""
    logits = logits.double()
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"the logits must be finite to calibrate the intercept (is SyntheticConfig.interaction_scale "
                         f"too large?); got {logits[~torch.isfinite(logits)][0].item()}")
    w = torch.ones_like(logits) if weights is None else weights.double()

    def mean(intercept: float) -> float:
        return float((w * torch.sigmoid(logits + intercept)).sum() / w.sum())

    lo, hi, steps = -30.0, 30.0, 60
    while mean(lo) > target or mean(hi) < target:
        lo, hi, steps = 2 * lo, 2 * hi, steps + 1  # one more halving keeps the final width
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if mean(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
