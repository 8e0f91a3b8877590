"""The experiment core: digits data, models by name, and the training worker.

``run_training(TrainConfig(strategy="onebit+delayed", net="1gbe"), world_size=4)``
returns one :class:`RunResult` per rank.
"""
from __future__ import annotations

from .data import Digits, load_digits, shard_batches, steps_per_epoch
from .loop import RunResult, TrainConfig, evaluate, run_training, train_rank, train_worker
from .models import MODELS, build_model, num_parameters

__all__ = [
    "MODELS", "Digits", "RunResult", "TrainConfig", "build_model", "evaluate", "load_digits",
    "num_parameters", "run_training", "shard_batches", "steps_per_epoch", "train_rank", "train_worker",
]
