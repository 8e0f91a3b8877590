"""The network model: pure functions of (op, bytes, world, spec) -> seconds.

No torch.distributed here; the backend calls :class:`NetworkModel`::

    from gradwire.net import NetworkModel
    model = NetworkModel("10gbe,latency=200us", world_size=4)
    cost = model.cost("all_reduce", 16 << 20, seq=0)
    cost.seconds, cost.wire_bytes, cost.algorithm

Modules: :mod:`~gradwire.net.spec` (NetSpec, presets, grammar),
:mod:`~gradwire.net.link` (framing, loss), :mod:`~gradwire.net.algorithms`
(alpha-beta costs), :mod:`~gradwire.net.model` (topology, stragglers, jitter).
"""
from __future__ import annotations

from gradwire.net.algorithms import ALGORITHM_CHOICES, ALGORITHMS, DEFAULT_ALGORITHM, OPS, Algorithm
from gradwire.net.link import FRAMINGS, Link
from gradwire.net.model import DescribeRow, NetworkModel, OpCost, busbw_factor, describe
from gradwire.net.spec import PRESETS, NetSpec, Preset, Straggler, parse_spec

__all__ = [
    "ALGORITHMS", "ALGORITHM_CHOICES", "Algorithm", "DEFAULT_ALGORITHM", "DescribeRow", "FRAMINGS", "Link",
    "NetSpec", "NetworkModel", "OPS", "OpCost", "PRESETS", "Preset", "Straggler", "busbw_factor",
    "describe", "parse_spec",
]
