"""The network model against textbook costs written out by hand (tests/net/textbook.py).

Every algorithm and op at p = 2, 3, 4, 8: the latency and the bandwidth terms
apart (links with only one of them), both together with TCP framing, the bytes
the busiest rank sends, ``auto``'s choice, the fixed choices' fallbacks, the
whole ``NetworkModel`` pipeline and ``describe``'s bus bandwidth.
"""
from __future__ import annotations

import math

import pytest

from gradwire.net import ALGORITHMS, NetworkModel, busbw_factor, describe
from gradwire.net.algorithms import Group, choose
from gradwire.net.link import Link
from tests.net import textbook as tb

N = 3 << 20  # divisible by 3 and 8: every share below is a whole number of bytes
ALPHA, BW = 1e-5, 8e9  # 8 Gbit/s unframed: beta = 1 ns per byte
BETA = 8 / BW

CASES = [(alg, op, p) for (alg, op) in tb.COEFFS for p in tb.P]


def flat(p: int, link: Link) -> Group:
    return Group(p, p, 1, link, link, link)


def price(alg: str, op: str, p: int, link: Link, n: int = N):
    return ALGORITHMS[alg].costs[op](flat(p, link), n)


def test_every_algorithm_and_op_has_a_textbook_row() -> None:
    implemented = {(a.name, op) for a in ALGORITHMS.values() for op in a.costs}
    assert implemented == set(tb.COEFFS)
    assert tuple(ALGORITHMS) == tb.ORDER


@pytest.mark.parametrize("alg, op, p", CASES)
def test_latency_and_bandwidth_terms_apart(alg: str, op: str, p: int) -> None:
    steps, volume, sent = tb.COEFFS[(alg, op)][p]
    latency_only = price(alg, op, p, Link(math.inf, ALPHA, "none"))
    assert latency_only.seconds == pytest.approx(steps * ALPHA, rel=1e-12, abs=0)
    assert latency_only.steps == steps
    bytes_only = price(alg, op, p, Link(BW, 0.0, "none"))
    assert bytes_only.seconds == pytest.approx(volume * N * BETA, rel=1e-12, abs=0)
    assert bytes_only.sent_bytes == pytest.approx(sent * N, rel=1e-12, abs=0)
    assert bytes_only.wire_bytes == round(sent * N)  # unframed: one wire byte per payload byte


@pytest.mark.parametrize("alg, op, p", CASES)
def test_both_terms_on_a_framed_link(alg: str, op: str, p: int) -> None:
    link = Link(1e9, 50e-6, "tcp")
    c = price(alg, op, p, link)
    assert c.seconds == pytest.approx(tb.seconds(alg, op, p, N, 50e-6, tb.tcp_beta(1e9)), rel=1e-12, abs=0)
    assert c.wire_bytes == tb.tcp_wire(tb.sent(alg, op, p, N))


@pytest.mark.parametrize("p", tb.P)
@pytest.mark.parametrize("n", [0, 1, 4096, 65536, 1 << 20, 256 << 20])
def test_auto_takes_the_textbook_minimum(p: int, n: int) -> None:
    for op in tb.OPS:
        best, times = tb.auto(op, p, n, ALPHA, BETA)
        name, c = choose(op, "auto", flat(p, Link(BW, ALPHA, "none")), n)
        assert c.seconds == pytest.approx(best, rel=1e-12, abs=1e-18), (op, name, times)
        assert times[name] == pytest.approx(best, rel=1e-12, abs=1e-18), (op, name, times)
        # a tie goes to the earlier algorithm
        first = next(a for a in tb.ORDER if a in times and times[a] <= best * (1 + 1e-12))
        assert name == first, (op, times)


def test_auto_switches_from_latency_to_bandwidth_bound_where_the_formulas_cross() -> None:
    # p = 4: recursive doubling 2a + 2nb, Rabenseifner 4a + 1.5nb: equal at n = 4a / b = 40 000 bytes
    link = Link(BW, ALPHA, "none")
    assert choose("all_reduce", "auto", flat(4, link), 39_000)[0] == "recursive_doubling"
    assert choose("all_reduce", "auto", flat(4, link), 41_000)[0] == "rabenseifner"
    # p = 8 broadcast: tree 3a + 3nb, ring 10a + 1.75nb: equal at n = 7a / 1.25b = 56 000 bytes
    assert choose("broadcast", "auto", flat(8, link), 55_000)[0] == "tree"
    assert choose("broadcast", "auto", flat(8, link), 57_000)[0] == "ring"


@pytest.mark.parametrize("p", tb.P)
def test_fixed_choices_and_their_fallbacks(p: int) -> None:
    link = Link(BW, ALPHA, "none")
    for alg in tb.ORDER:
        for op in tb.OPS:
            name, c = choose(op, alg, flat(p, link), N)
            assert name == tb.fixed(alg, op), (alg, op)
            assert c.seconds == pytest.approx(tb.seconds(name, op, p, N, ALPHA, BETA), rel=1e-12, abs=0)


@pytest.mark.parametrize("nodes, per_node", [(2, 2), (2, 4), (4, 2), (3, 1)])
def test_hierarchical_on_two_links(nodes: int, per_node: int) -> None:
    """Binomial reduce inside a node, ring all_reduce among the node leaders, binomial broadcast."""
    ai, bi = 1e-6, 8 / 8e11  # intra: 800 Gbit/s unframed
    ae, be = 1e-5, 8 / 8e9  # inter: 8 Gbit/s unframed
    spec = (f"bandwidth=8gbit,latency=10us,protocol=none,topology={nodes}x{per_node},intra_bandwidth=800gbit,"
            "intra_latency=1us,intra_protocol=none,algorithm=hierarchical")
    c = NetworkModel(spec, nodes * per_node).cost("all_reduce", N)
    # written out: 2x2: c = 1, 2 leaders; 2x4: c = 2, 2 leaders; 4x2: c = 1, 4 leaders; 3x1: no intra phase
    expected = {
        (2, 2): (2 * (ai + N * bi) + 2 * ae + N * be, N + N, 1 + 2 + 1),
        (2, 4): (4 * (ai + N * bi) + 2 * ae + N * be, N + 2 * N, 2 + 2 + 2),
        (4, 2): (2 * (ai + N * bi) + 6 * ae + 1.5 * N * be, 1.5 * N + N, 1 + 6 + 1),
        (3, 1): (4 * ae + 4 / 3 * N * be, 4 / 3 * N, 4),
    }[(nodes, per_node)]
    assert c.algorithm == "hierarchical"
    assert c.seconds == pytest.approx(expected[0], rel=1e-12, abs=0)
    assert c.sent_bytes == round(expected[1])


@pytest.mark.parametrize("p", tb.P)
def test_network_model_prices_every_op_on_1gbe(p: int) -> None:
    """The whole pipeline: preset -> TCP-framed link -> auto -> rounded bytes."""
    alpha, beta = 50e-6, tb.tcp_beta(1e9)
    model = NetworkModel("1gbe", p)
    for op in tb.OPS:
        for n in (4096, N):
            extra = {"src": 0, "dst": p - 1} if op == "send" else {}
            c = model.cost(op, n, **extra)
            nbytes = 0 if op == "barrier" else n
            best, times = tb.auto(op, p, nbytes, alpha, beta)
            assert c.seconds == pytest.approx(best, rel=1e-12), (op, n)
            assert c.payload_bytes == nbytes
            assert c.sent_bytes == math.ceil(tb.sent(c.algorithm, op, p, nbytes) - 1e-6)
            assert c.wire_bytes == tb.tcp_wire(c.sent_bytes)


@pytest.mark.parametrize("p", [1, *tb.P])
def test_bus_factors_are_nccl_tests(p: int) -> None:
    for op in tb.OPS:
        assert busbw_factor(op, p) == pytest.approx(tb.BUS_FACTOR[op][p], rel=1e-12, abs=0), op


def test_describe_rows_against_the_textbook() -> None:
    rows = describe("bandwidth=8gbit,latency=10us,protocol=none", world_sizes=(2, 3, 8), sizes=(4096, N))
    assert len(rows) == 3 * (9 * 2 + 1)
    for r in rows:
        best, _ = tb.auto(r.op, r.world_size, r.nbytes, ALPHA, BETA)
        assert r.seconds == pytest.approx(best, rel=1e-12), (r.op, r.world_size, r.nbytes)
        if r.op == "barrier":
            assert r.nbytes == 0 and r.algbw == 0 and r.busbw == 0
            continue
        assert r.algbw == pytest.approx(r.nbytes / best, rel=1e-12)
        factor = tb.BUS_FACTOR[r.op][2 if r.op == "send" else r.world_size]  # send: one link, factor 1
        assert r.busbw == pytest.approx(r.nbytes / best * factor, rel=1e-12)
