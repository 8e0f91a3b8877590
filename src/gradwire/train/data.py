"""The digits dataset that ships with scikit-learn, split and sharded deterministically.

``sklearn.datasets.load_digits`` holds 1797 8x8 grey images (values 0..16) of
the digits 0-9. It is small enough to train on in seconds on a CPU and needs
no download, which makes it the harness's default workload.

1. A fixed split: a permutation drawn from ``SPLIT_SEED`` (not the run's seed)
   puts 20% of the images in the test set, so every run, strategy and seed is
   scored on the same 359 images.
2. Per epoch, every rank draws the *same* permutation of the training set from
   ``(seed, epoch)`` and keeps every ``world``-th index starting at its rank.
   The remainder is dropped so that every rank runs the same number of steps:
   a rank with one batch more would issue a collective nobody answers (hang).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import torch
from torch import Tensor

__all__ = ["Digits", "IMAGE_SHAPE", "SPLIT_SEED", "TRAIN_SIZE", "load_digits", "shard_batches", "steps_per_epoch"]

SPLIT_SEED = 1797
TEST_FRACTION = 0.2
#: one sample's shape, as every bundled model takes it
IMAGE_SHAPE = (1, 8, 8)
#: images in the training split (1797 less the test fifth)
TRAIN_SIZE = 1797 - round(1797 * TEST_FRACTION)


@dataclass(frozen=True)
class Digits:
    """Train and test tensors: images ``(N, 1, 8, 8)`` float32 in [0, 1], labels int64."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor


@lru_cache(maxsize=1)
def load_digits() -> Digits:
    """Load sklearn's digits and split them with the fixed split (cached per process)."""
    from sklearn.datasets import load_digits as _sk_load

    bunch = _sk_load()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_test = int(round(len(y) * TEST_FRACTION))
    test, train = perm[:n_test], perm[n_test:]
    return Digits(x[train], y[train], x[test], y[test])


def steps_per_epoch(n_train: int, world: int, batch_size: int) -> int:
    """Optimizer steps per epoch on every rank (partial last batches are kept)."""
    per_rank = n_train // world
    return -(-per_rank // batch_size)


def shard_batches(
    data: Digits, rank: int, world: int, batch_size: int, seed: int, epoch: int,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield this rank's batches of one epoch; identical on every call with the same arguments."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(data.y_train)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n, generator=gen)
    per_rank = n // world
    mine = order[rank::world][:per_rank]
    for start in range(0, per_rank, batch_size):
        idx = mine[start:start + batch_size]
        yield data.x_train[idx], data.y_train[idx]
