"""Collective algorithms and their alpha-beta (Hockney) costs.

Notation: ``p`` ranks, ``n`` bytes (nccl-tests buffer conventions, see
:mod:`gradwire.net.model`), ``a`` = link latency in seconds (alpha), ``b`` =
seconds per payload byte (beta, from the link's framed and loss-limited rate).
``lg`` is log2, ``clg`` = ceil(lg p), ``k`` = floor(lg p), ``q = 2**k``.

=====================  ==================================  ==============================
algorithm              op: time                            bytes one rank sends (max)
=====================  ==================================  ==============================
ring                   all_reduce: 2(p-1)a + 2(p-1)/p nb   2(p-1)/p n
                       all_gather, reduce_scatter:         (p-1)/p n
                       (p-1)a + (p-1)/p nb
                       broadcast: binomial scatter + ring  2(p-1)/p n
                       all_gather (van de Geijn):
                       (clg + p-1)a + 2(p-1)/p nb
                       reduce: ring reduce_scatter +       n
                       direct gather: 2(p-1)a + 2(p-1)/p nb
tree (binomial)        broadcast: clg (a + nb)             clg n (the root)
                       reduce: clg (a + nb)                n
                       all_reduce: reduce + broadcast      clg n
                       gather/scatter: clg a + (p-1)/p nb  root's largest subtree
recursive_doubling     all_reduce: lg p (a + nb)           lg p n
                       all_gather: lg p a + (p-1)/p nb     (p-1)/p n
                       reduce_scatter (recursive halving)
rabenseifner           all_reduce: 2 lg p a + 2(p-1)/p nb  2(p-1)/p n
hierarchical           all_reduce: intra-node tree reduce, inter-node ring all_reduce among
                       node leaders, intra-node tree broadcast (two different links)
pairwise               all_to_all: (p-1)a + (p-1)/p nb     (p-1)/p n
direct                 gather/scatter: (p-1)a + (p-1)/p nb (the root's link is the bound)
                       send: a + nb                        n
=====================  ==================================  ==============================

``barrier`` is a zero-byte all_reduce with any all_reduce algorithm (latency only).

Non-power-of-two ``p`` for recursive doubling/halving and Rabenseifner (as in
MPICH, Thakur et al. 2005): the ``p - q`` extra ranks first fold their data into
a partner (one step), the ``q`` remaining ranks run the power-of-two algorithm,
and the partners hand the result back (one more step). That adds two latency
steps and up to two buffer transfers. ``p = 1`` costs nothing everywhere.

Flat algorithms (all but ``hierarchical``) run on ``Group.flat``, the link that
bounds the group: the slowest hop of a ring or tree sets its pace.

TCP links (``Link.tcp``, :mod:`gradwire.net.tcp`): the ``nb`` terms above
assume the link runs at its rate from the first byte. On a TCP link each step
instead sends its ``volume / steps`` bytes through a window that is capped,
starts in slow start and restarts after idle, priced by
:meth:`gradwire.net.link.Link.steps_seconds`. A ring's steps all go to the same
neighbour, so the window one step grew carries into the next; a tree's,
recursive doubling's and pairwise exchange's steps go to a new peer each time
and each starts from the connection's state at the call (``Group.idle``: by
default 0, a warm connection at its steady window; the caller that knows how
long the group was quiet passes it, and one quiet for longer than the RTO
pays slow start again). The ring broadcast's binomial scatter is priced as
ring steps too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from gradwire.net.link import Link

#: collective operations the model knows, in display order
OPS: tuple[str, ...] = (
    "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
    "all_to_all", "gather", "scatter", "send", "barrier",
)


@dataclass(frozen=True)
class Group:
    """The shape of a (sub)group as the cost functions see it."""

    #: number of ranks in the group
    p: int
    #: number of distinct nodes the group spans
    nodes: int
    #: most ranks of the group on any one node
    per_node: int
    #: the link bounding a flat (topology-unaware) algorithm
    flat: Link
    #: link between ranks on the same node
    intra: Link
    #: link between nodes
    inter: Link
    #: seconds since the group's connections last sent (TCP: restart after an idle longer than the RTO);
    #: 0 = warm, as back-to-back collectives are; None = their first transfer (slow start from initcwnd)
    idle: float | None = 0.0


@dataclass(frozen=True)
class Cost:
    """Deterministic alpha-beta cost of one collective (before jitter)."""

    seconds: float
    #: payload bytes the busiest rank sends
    sent_bytes: float
    #: those bytes with framing and expected retransmissions
    wire_bytes: int
    #: sequential latency steps; jitter is drawn once per step
    steps: int


CostFn = Callable[[Group, int], Cost]


@dataclass(frozen=True)
class Algorithm:
    """A named algorithm family and its cost function per op it applies to."""

    name: str
    description: str
    costs: Mapping[str, CostFn]

    def applies(self, op: str) -> bool:
        return op in self.costs


def ceil_lg(p: int) -> int:
    """ceil(log2 p), 0 for p = 1."""
    return (p - 1).bit_length()


def floor_lg(p: int) -> int:
    """floor(log2 p)."""
    return p.bit_length() - 1


def _on(g: Group, steps: int, volume: float, sent: float, *, ring: bool, link: Link | None = None) -> Cost:
    """``steps`` sequential steps sending ``volume`` bytes in all on ``link`` (default ``g.flat``).

    Alpha-beta: ``steps`` latencies plus ``volume`` serialised bytes; TCP links
    price each step's share through their window (module doc). ``ring``: the
    steps reuse one connection to the same neighbour.
    """
    on = g.flat if link is None else link
    return Cost(on.steps_seconds(steps, volume, same_peer=ring, idle=g.idle), sent, on.wire_bytes(sent), steps)


def _plus(a: Cost, b: Cost) -> Cost:
    """Two phases one after the other, run by the same busiest rank."""
    return Cost(a.seconds + b.seconds, a.sent_bytes + b.sent_bytes, a.wire_bytes + b.wire_bytes, a.steps + b.steps)


def _fold(g: Group, pre: float, post: float) -> tuple[int, float]:
    """Extra (steps, bytes) for non-power-of-two recursive algorithms (see module doc)."""
    return (0, 0.0) if g.p == 1 << floor_lg(g.p) else (2, pre + post)


# ------------------------------------------------------------------ ring
def ring_all_reduce(g: Group, n: int) -> Cost:
    share = 2 * (g.p - 1) / g.p * n
    return _on(g, 2 * (g.p - 1), share, share, ring=True)


def ring_all_gather(g: Group, n: int) -> Cost:
    share = (g.p - 1) / g.p * n
    return _on(g, g.p - 1, share, share, ring=True)


def ring_broadcast(g: Group, n: int) -> Cost:
    share = 2 * (g.p - 1) / g.p * n
    return _on(g, ceil_lg(g.p) + g.p - 1, share, share, ring=True)


def ring_reduce(g: Group, n: int) -> Cost:
    return _on(g, 2 * (g.p - 1), 2 * (g.p - 1) / g.p * n, n if g.p > 1 else 0, ring=True)


# ------------------------------------------------------------------ binomial tree
def tree_broadcast(g: Group, n: int) -> Cost:
    c = ceil_lg(g.p)
    return _on(g, c, c * n, c * n, ring=False)


def tree_reduce(g: Group, n: int) -> Cost:
    c = ceil_lg(g.p)
    return _on(g, c, c * n, n if g.p > 1 else 0, ring=False)


def tree_all_reduce(g: Group, n: int) -> Cost:
    c = ceil_lg(g.p)
    return _on(g, 2 * c, 2 * c * n, c * n, ring=False)


def _largest_subtree(p: int) -> int:
    """Ranks under the root's biggest child in a binomial tree of ``p`` ranks."""
    return max((min(1 << j, p - (1 << j)) for j in range(ceil_lg(p))), default=0)


def tree_gather(g: Group, n: int) -> Cost:
    return _on(g, ceil_lg(g.p), (g.p - 1) / g.p * n, _largest_subtree(g.p) / g.p * n, ring=False)


def tree_scatter(g: Group, n: int) -> Cost:
    return _on(g, ceil_lg(g.p), (g.p - 1) / g.p * n, (g.p - 1) / g.p * n, ring=False)


# ------------------------------------------------------------------ recursive doubling / halving
def recursive_doubling_all_reduce(g: Group, n: int) -> Cost:
    k = floor_lg(g.p)
    extra_steps, extra_bytes = _fold(g, n, n)
    return _on(g, k + extra_steps, k * n + extra_bytes, (k + extra_steps // 2) * n, ring=False)


def recursive_doubling_all_gather(g: Group, n: int) -> Cost:
    q = 1 << floor_lg(g.p)
    extra_steps, extra_bytes = _fold(g, n / g.p, n)
    share = (q - 1) / q * n
    return _on(g, floor_lg(g.p) + extra_steps, share + extra_bytes, share + (n if extra_steps else 0), ring=False)


def recursive_halving_reduce_scatter(g: Group, n: int) -> Cost:
    q = 1 << floor_lg(g.p)
    extra_steps, extra_bytes = _fold(g, n, n / g.p)
    share = (q - 1) / q * n
    return _on(g, floor_lg(g.p) + extra_steps, share + extra_bytes, share + (n / g.p if extra_steps else 0), ring=False)


def rabenseifner_all_reduce(g: Group, n: int) -> Cost:
    q = 1 << floor_lg(g.p)
    extra_steps, extra_bytes = _fold(g, n, n)
    share = 2 * (q - 1) / q * n
    return _on(g, 2 * floor_lg(g.p) + extra_steps, share + extra_bytes, share + (n if extra_steps else 0), ring=False)


# ------------------------------------------------------------------ hierarchical
def hierarchical_all_reduce(g: Group, n: int) -> Cost:
    """Reduce to a leader per node, ring all_reduce among leaders, broadcast back.

    The node leader is the busiest rank: it sends the inter-node ring share and
    the intra-node broadcast.
    """
    c, leaders = ceil_lg(g.per_node), g.nodes
    reduce = _on(g, c, c * n, 0, ring=False, link=g.intra)
    share = 2 * (leaders - 1) / leaders * n
    inter = _on(g, 2 * (leaders - 1), share, share, ring=True, link=g.inter)
    bcast = _on(g, c, c * n, c * n, ring=False, link=g.intra)
    return _plus(_plus(reduce, inter), bcast)


# ------------------------------------------------------------------ direct / pairwise
def pairwise_all_to_all(g: Group, n: int) -> Cost:
    share = (g.p - 1) / g.p * n
    return _on(g, g.p - 1, share, share, ring=False)


def direct_gather(g: Group, n: int) -> Cost:
    return _on(g, g.p - 1, (g.p - 1) / g.p * n, n / g.p if g.p > 1 else 0, ring=False)


def direct_scatter(g: Group, n: int) -> Cost:
    share = (g.p - 1) / g.p * n
    return _on(g, g.p - 1, share, share, ring=False)


def direct_send(g: Group, n: int) -> Cost:
    return _on(g, 1, n, n, ring=False)


def _barrier(fn: CostFn) -> CostFn:
    """A barrier priced as a zero-byte all_reduce of the same algorithm."""
    return lambda g, n: fn(g, 0)


def _with_barrier(costs: dict[str, CostFn]) -> dict[str, CostFn]:
    return {**costs, "barrier": _barrier(costs["all_reduce"])}


#: algorithms by name; ``Algorithm.costs`` says which ops each one implements
ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("ring", "bandwidth-optimal ring: data passes p-1 neighbours in chunks", _with_barrier({
            "all_reduce": ring_all_reduce, "all_gather": ring_all_gather, "reduce_scatter": ring_all_gather,
            "broadcast": ring_broadcast, "reduce": ring_reduce,
        })),
        Algorithm("tree", "binomial tree: ceil(lg p) rounds, whole buffer per round", _with_barrier({
            "all_reduce": tree_all_reduce, "broadcast": tree_broadcast, "reduce": tree_reduce,
            "gather": tree_gather, "scatter": tree_scatter,
        })),
        Algorithm("recursive_doubling", "lg p pairwise exchanges (recursive halving for reduce_scatter)",
                  _with_barrier({
                      "all_reduce": recursive_doubling_all_reduce, "all_gather": recursive_doubling_all_gather,
                      "reduce_scatter": recursive_halving_reduce_scatter,
                  })),
        Algorithm("rabenseifner", "reduce_scatter by recursive halving + all_gather by recursive doubling",
                  _with_barrier({"all_reduce": rabenseifner_all_reduce})),
        Algorithm("hierarchical", "intra-node reduce, inter-node ring among leaders, intra-node broadcast",
                  _with_barrier({"all_reduce": hierarchical_all_reduce})),
        Algorithm("pairwise", "p-1 rounds, each rank exchanges with rank +/- i", {"all_to_all": pairwise_all_to_all}),
        Algorithm("direct", "one message per peer straight from/to the root", {
            "gather": direct_gather, "scatter": direct_scatter, "send": direct_send,
        }),
    )
}

#: the algorithm a fixed choice falls back to when it does not implement an op
DEFAULT_ALGORITHM: dict[str, str] = {
    "all_reduce": "ring", "broadcast": "tree", "reduce": "tree", "all_gather": "ring",
    "reduce_scatter": "ring", "all_to_all": "pairwise", "gather": "direct", "scatter": "direct",
    "send": "direct", "barrier": "recursive_doubling",
}

#: values the ``algorithm`` spec key accepts
ALGORITHM_CHOICES: tuple[str, ...] = ("auto", *ALGORITHMS)


def check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown collective op {op!r}; valid ops: {', '.join(OPS)}")


def choose(op: str, requested: str, group: Group, nbytes: int) -> tuple[str, Cost]:
    """Pick the algorithm for one call and return ``(name, cost)``.

    ``auto`` takes the cheapest algorithm that implements ``op`` at this size
    and group (ties go to the earlier entry of :data:`ALGORITHMS`), as NCCL's
    tuner does. A fixed choice that does not implement ``op`` (``pairwise``
    for an all_reduce, say) falls back to ``DEFAULT_ALGORITHM[op]``.
    """
    check_op(op)
    if requested == "auto":
        priced = [(a.costs[op](group, nbytes), a.name) for a in ALGORITHMS.values() if a.applies(op)]
        cost, name = min(priced, key=lambda item: item[0].seconds)
        return name, cost
    if requested not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {requested!r}; valid: {', '.join(ALGORITHM_CHOICES)}")
    name = requested if ALGORITHMS[requested].applies(op) else DEFAULT_ALGORITHM[op]
    return name, ALGORITHMS[name].costs[op](group, nbytes)
