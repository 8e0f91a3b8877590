"""Identical replicas: after every step every rank holds the same parameters, bit for bit.

Over every compressor of the registry, the exchange's own momentum under
plain SGD (``hook``) and the SGD, momentum SGD and AdamW schemes, on 2 and 4
ranks; one spawn per world size runs every case. With the local correction
switched on (``correct=1``) the replicas differ: that is the option's trap,
and the check that the comparison can fail.
"""
from __future__ import annotations

import pytest

from gradwire.compress import COMPRESSORS
from gradwire.launch import spawn
from tests.exchange import replica_workers

CASES = [(name, scheme) for name in COMPRESSORS for scheme in replica_workers.SCHEMES]
CORRECTED = [("onebit:correct=1", "hook"), ("topk:0.1:correct=1", "adamw")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_holds_the_same_parameters_after_every_step(world):
    results = spawn(replica_workers.every_case, world, args=(CASES + CORRECTED,), timeout=110)
    got = results[0]
    for name, scheme in CASES:
        spreads = got[f"{name}/{scheme}"]
        if isinstance(spreads, str):  # a vote cannot run Adam's frozen-variance step; it says so
            assert name == "signum" and scheme == "adamw" and "vote" in spreads, spreads
            continue
        assert spreads == [0.0] * replica_workers.STEPS, f"{name} under {scheme}: replicas differ by {spreads}"
    for name, scheme in CORRECTED:
        spreads = got[f"{name}/{scheme}"]
        assert isinstance(spreads, list) and spreads[-1] > 0.0, f"{name} under {scheme}: {spreads}"
