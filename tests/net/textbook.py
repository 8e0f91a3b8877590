"""Textbook alpha-beta costs of every collective algorithm, written out by hand for p = 2, 3, 4, 8.

An independent reference for the tests of the network model and of what is
built on it (bench, fit, predict): nothing here imports gradwire. Sources:

- Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
  Operations in MPICH" (IJHPCA 19(1), 2005): ring, recursive doubling /
  halving, Rabenseifner, binomial tree; non-power-of-two ranks fold into a
  partner first (one step, one buffer) and get the result back at the end
  (one more step, one more buffer).
- van de Geijn's broadcast: binomial scatter, then ring all_gather.
- nccl-tests (doc/PERFORMANCE.md): bus-bandwidth factors and byte conventions
  (the full gathered buffer for all_gather / reduce_scatter / gather / scatter).

A row is ``(latency steps, bytes serialised / n, bytes the busiest rank sends / n)``:
the time is ``steps * alpha + volume * n * beta``. Each number was worked out
from the formula in the comment above its row.

    p            2    3    4    8
    lg p  (k)    1    1    2    3   floor
    clg p (c)    1    2    2    3   ceil
"""
from __future__ import annotations

import math

P = (2, 3, 4, 8)

#: (algorithm, op) -> {p: (steps, volume / n, sent / n)}
COEFFS: dict[tuple[str, str], dict[int, tuple[int, float, float]]] = {
    # ring all_reduce: 2(p-1) a + 2(p-1)/p n b; sends 2(p-1)/p n
    ("ring", "all_reduce"): {2: (2, 1, 1), 3: (4, 4 / 3, 4 / 3), 4: (6, 3 / 2, 3 / 2), 8: (14, 7 / 4, 7 / 4)},
    # ring all_gather / reduce_scatter: (p-1) a + (p-1)/p n b
    ("ring", "all_gather"): {2: (1, 1 / 2, 1 / 2), 3: (2, 2 / 3, 2 / 3), 4: (3, 3 / 4, 3 / 4), 8: (7, 7 / 8, 7 / 8)},
    ("ring", "reduce_scatter"): {2: (1, 1 / 2, 1 / 2), 3: (2, 2 / 3, 2 / 3), 4: (3, 3 / 4, 3 / 4),
                                 8: (7, 7 / 8, 7 / 8)},
    # scatter + ring all_gather: (c + p-1) a + 2(p-1)/p n b
    ("ring", "broadcast"): {2: (2, 1, 1), 3: (4, 4 / 3, 4 / 3), 4: (5, 3 / 2, 3 / 2), 8: (10, 7 / 4, 7 / 4)},
    # ring reduce_scatter + gather to the root: 2(p-1) a + 2(p-1)/p n b; a rank sends n in all
    ("ring", "reduce"): {2: (2, 1, 1), 3: (4, 4 / 3, 1), 4: (6, 3 / 2, 1), 8: (14, 7 / 4, 1)},
    # a barrier is a zero-byte all_reduce of the same algorithm
    ("ring", "barrier"): {2: (2, 0, 0), 3: (4, 0, 0), 4: (6, 0, 0), 8: (14, 0, 0)},
    # binomial broadcast: c (a + n b); the root sends n in each of its c rounds
    ("tree", "broadcast"): {2: (1, 1, 1), 3: (2, 2, 2), 4: (2, 2, 2), 8: (3, 3, 3)},
    # binomial reduce: c (a + n b); every rank sends its partial sum once
    ("tree", "reduce"): {2: (1, 1, 1), 3: (2, 2, 1), 4: (2, 2, 1), 8: (3, 3, 1)},
    # reduce + broadcast: 2c (a + n b); the root sends c n
    ("tree", "all_reduce"): {2: (2, 2, 1), 3: (4, 4, 2), 4: (4, 4, 2), 8: (6, 6, 3)},
    # binomial gather: c a + (p-1)/p n b; the busiest sender is the root's largest child:
    # subtrees 1 (p=2), 1 and 1 (p=3), 2 and 1 (p=4), 4, 2 and 1 (p=8) ranks
    ("tree", "gather"): {2: (1, 1 / 2, 1 / 2), 3: (2, 2 / 3, 1 / 3), 4: (2, 3 / 4, 2 / 4), 8: (3, 7 / 8, 4 / 8)},
    # binomial scatter: c a + (p-1)/p n b; the root sends all but its own block
    ("tree", "scatter"): {2: (1, 1 / 2, 1 / 2), 3: (2, 2 / 3, 2 / 3), 4: (2, 3 / 4, 3 / 4), 8: (3, 7 / 8, 7 / 8)},
    ("tree", "barrier"): {2: (2, 0, 0), 3: (4, 0, 0), 4: (4, 0, 0), 8: (6, 0, 0)},
    # recursive doubling all_reduce: lg p (a + n b); p = 3: fold in (a + n b), 1 exchange, hand back (a + n b)
    ("recursive_doubling", "all_reduce"): {2: (1, 1, 1), 3: (3, 3, 2), 4: (2, 2, 2), 8: (3, 3, 3)},
    # lg p a + (p-1)/p n b; p = 3: the extra rank's n/3 in, q = 2 ranks gather (1/2 n), the whole n back
    ("recursive_doubling", "all_gather"): {2: (1, 1 / 2, 1 / 2), 3: (3, 1 / 3 + 1 / 2 + 1, 1 / 2 + 1),
                                           4: (2, 3 / 4, 3 / 4), 8: (3, 7 / 8, 7 / 8)},
    # recursive halving: lg p a + (p-1)/p n b; p = 3: the whole n in, q = 2 ranks halve (1/2 n), n/3 back
    ("recursive_doubling", "reduce_scatter"): {2: (1, 1 / 2, 1 / 2), 3: (3, 1 + 1 / 2 + 1 / 3, 1 / 2 + 1 / 3),
                                               4: (2, 3 / 4, 3 / 4), 8: (3, 7 / 8, 7 / 8)},
    ("recursive_doubling", "barrier"): {2: (1, 0, 0), 3: (3, 0, 0), 4: (2, 0, 0), 8: (3, 0, 0)},
    # Rabenseifner: 2 lg p a + 2(p-1)/p n b; p = 3: fold n in, q = 2 ranks (2 steps, n), n back
    ("rabenseifner", "all_reduce"): {2: (2, 1, 1), 3: (4, 1 + 2, 1 + 1), 4: (4, 3 / 2, 3 / 2), 8: (6, 7 / 4, 7 / 4)},
    ("rabenseifner", "barrier"): {2: (2, 0, 0), 3: (4, 0, 0), 4: (4, 0, 0), 8: (6, 0, 0)},
    # hierarchical on a flat group (one rank per node): no intra-node phase, a ring among p leaders
    ("hierarchical", "all_reduce"): {2: (2, 1, 1), 3: (4, 4 / 3, 4 / 3), 4: (6, 3 / 2, 3 / 2),
                                     8: (14, 7 / 4, 7 / 4)},
    ("hierarchical", "barrier"): {2: (2, 0, 0), 3: (4, 0, 0), 4: (6, 0, 0), 8: (14, 0, 0)},
    # pairwise exchange: (p-1) a + (p-1)/p n b (n = one rank's whole input)
    ("pairwise", "all_to_all"): {2: (1, 1 / 2, 1 / 2), 3: (2, 2 / 3, 2 / 3), 4: (3, 3 / 4, 3 / 4),
                                 8: (7, 7 / 8, 7 / 8)},
    # direct gather: p-1 messages into the root's link: (p-1) a + (p-1)/p n b; a rank sends its n/p
    ("direct", "gather"): {2: (1, 1 / 2, 1 / 2), 3: (2, 2 / 3, 1 / 3), 4: (3, 3 / 4, 1 / 4), 8: (7, 7 / 8, 1 / 8)},
    # direct scatter: the root sends p-1 blocks
    ("direct", "scatter"): {2: (1, 1 / 2, 1 / 2), 3: (2, 2 / 3, 2 / 3), 4: (3, 3 / 4, 3 / 4),
                            8: (7, 7 / 8, 7 / 8)},
    # one message: a + n b
    ("direct", "send"): {2: (1, 1, 1), 3: (1, 1, 1), 4: (1, 1, 1), 8: (1, 1, 1)},
}

#: the order ``auto`` breaks ties in (gradwire.net.algorithms.ALGORITHMS)
ORDER = ("ring", "tree", "recursive_doubling", "rabenseifner", "hierarchical", "pairwise", "direct")

#: what a fixed algorithm that does not implement an op falls back to
DEFAULT = {
    "all_reduce": "ring", "broadcast": "tree", "reduce": "tree", "all_gather": "ring", "reduce_scatter": "ring",
    "all_to_all": "pairwise", "gather": "direct", "scatter": "direct", "send": "direct",
    "barrier": "recursive_doubling",
}

OPS = tuple(DEFAULT)

#: nccl-tests bus-bandwidth factor per op at p = 1, 2, 3, 4, 8 (busbw = algbw * factor)
BUS_FACTOR = {
    "all_reduce": {1: 0, 2: 1, 3: 4 / 3, 4: 3 / 2, 8: 7 / 4},          # 2(p-1)/p
    "all_gather": {1: 0, 2: 1 / 2, 3: 2 / 3, 4: 3 / 4, 8: 7 / 8},      # (p-1)/p
    "reduce_scatter": {1: 0, 2: 1 / 2, 3: 2 / 3, 4: 3 / 4, 8: 7 / 8},
    "all_to_all": {1: 0, 2: 1 / 2, 3: 2 / 3, 4: 3 / 4, 8: 7 / 8},
    "gather": {1: 0, 2: 1 / 2, 3: 2 / 3, 4: 3 / 4, 8: 7 / 8},
    "scatter": {1: 0, 2: 1 / 2, 3: 2 / 3, 4: 3 / 4, 8: 7 / 8},
    "broadcast": {1: 1, 2: 1, 3: 1, 4: 1, 8: 1},
    "reduce": {1: 1, 2: 1, 3: 1, 4: 1, 8: 1},
    "send": {1: 1, 2: 1, 3: 1, 4: 1, 8: 1},
    "barrier": {1: 0, 2: 0, 3: 0, 4: 0, 8: 0},
}


def implements(alg: str, op: str) -> bool:
    return (alg, op) in COEFFS


def seconds(alg: str, op: str, p: int, n: float, alpha: float, beta: float) -> float:
    """Textbook time of one call: ``steps * alpha + volume * n * beta``."""
    steps, volume, _ = COEFFS[(alg, op)][p]
    return steps * alpha + volume * n * beta


def sent(alg: str, op: str, p: int, n: float) -> float:
    """Bytes the busiest rank sends."""
    return COEFFS[(alg, op)][p][2] * n


def fixed(alg: str, op: str) -> str:
    """The algorithm a fixed choice of ``alg`` runs for ``op``."""
    return alg if implements(alg, op) else DEFAULT[op]


def auto(op: str, p: int, n: float, alpha: float, beta: float) -> tuple[float, dict[str, float]]:
    """The cheapest time of ``op`` and every implementing algorithm's time."""
    times = {a: seconds(a, op, p, n, alpha, beta) for a in ORDER if implements(a, op)}
    return min(times.values()), times


def tcp_beta(bits_per_s: float) -> float:
    """Seconds per payload byte on TCP/IPv4 over Ethernet: 1448 payload bytes per 1514 on the wire."""
    return 8 / bits_per_s * 1514 / 1448


def tcp_wire(payload: float) -> int:
    """Bytes on the wire for a TCP payload: 66 header bytes per segment of up to 1448."""
    return math.ceil(payload + math.ceil(payload / 1448) * 66) if payload > 0 else 0
