import math

import pytest

from gradwire.net.algorithms import (
    ALGORITHMS, DEFAULT_ALGORITHM, OPS, Group, ceil_lg, choose, floor_lg,
)
from gradwire.net.link import Link

A = 1e-5                    # alpha, seconds
LINK = Link(8e9, A, "none")  # beta = 1 ns / byte
B = 1e-9
N = 1 << 20


def flat(p: int) -> Group:
    return Group(p, p, 1, LINK, LINK, LINK)


def cost(alg: str, op: str, p: int, n: int = N):
    return ALGORITHMS[alg].costs[op](flat(p), n)


def test_lg_helpers():
    assert [ceil_lg(p) for p in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]
    assert [floor_lg(p) for p in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("p", [2, 4, 8])
def test_power_of_two_formulas(p):
    lg = int(math.log2(p))
    frac = (p - 1) / p
    expected = {
        ("ring", "all_reduce"): (2 * (p - 1) * A + 2 * frac * N * B, 2 * frac * N),
        ("ring", "all_gather"): ((p - 1) * A + frac * N * B, frac * N),
        ("ring", "reduce_scatter"): ((p - 1) * A + frac * N * B, frac * N),
        ("recursive_doubling", "all_reduce"): (lg * (A + N * B), lg * N),
        ("rabenseifner", "all_reduce"): (2 * lg * A + 2 * frac * N * B, 2 * frac * N),
        ("tree", "broadcast"): (lg * (A + N * B), lg * N),
        ("tree", "reduce"): (lg * (A + N * B), N),
        ("tree", "all_reduce"): (2 * lg * (A + N * B), lg * N),
        ("pairwise", "all_to_all"): ((p - 1) * A + frac * N * B, frac * N),
        ("direct", "gather"): ((p - 1) * A + frac * N * B, N / p),
        ("direct", "scatter"): ((p - 1) * A + frac * N * B, frac * N),
        ("direct", "send"): (A + N * B, N),
        ("ring", "barrier"): (2 * (p - 1) * A, 0),
        ("recursive_doubling", "barrier"): (lg * A, 0),
    }
    for (alg, op), (seconds, sent) in expected.items():
        c = cost(alg, op, p)
        assert c.seconds == pytest.approx(seconds), (alg, op)
        assert c.sent_bytes == pytest.approx(sent), (alg, op)


def test_non_power_of_two_adds_fold_steps():
    # p = 6: 4 ranks run the algorithm, 2 fold in before and get the result after
    p, lg = 6, 2
    assert cost("recursive_doubling", "all_reduce", p).seconds == pytest.approx((lg + 2) * (A + N * B))
    assert cost("rabenseifner", "all_reduce", p).seconds == pytest.approx(
        (2 * lg + 2) * A + (2 * 3 / 4 * N + 2 * N) * B)
    assert cost("recursive_doubling", "all_gather", p).steps == lg + 2
    assert cost("tree", "broadcast", p).seconds == pytest.approx(3 * (A + N * B))


def test_one_rank_costs_nothing():
    for alg in ALGORITHMS.values():
        for op, fn in alg.costs.items():
            c = fn(flat(1), N)
            if op != "send":
                assert c.seconds == 0 and c.sent_bytes == 0, (alg.name, op)


def test_hierarchical_on_two_by_four():
    intra, inter = Link(8e11, 1e-6, "none"), Link(8e9, 1e-5, "none")
    g = Group(8, 2, 4, inter, intra, inter)
    c = ALGORITHMS["hierarchical"].costs["all_reduce"](g, N)
    reduce = 2 * (1e-6 + N / 1e11)                       # binomial reduce over 4 ranks
    leaders = 2 * 1 * 1e-5 + 2 * 1 / 2 * N / 1e9          # ring all_reduce of 2 leaders
    assert c.seconds == pytest.approx(reduce + leaders + reduce)
    assert c.sent_bytes == pytest.approx(N + 2 * N)        # leader: ring share + broadcast
    assert c.steps == 2 + 2 + 2


def test_auto_is_never_slower_than_a_fixed_choice():
    # exact values against hand-written formulas: tests/net/test_textbook_costs.py
    for op in OPS:
        for p in (2, 3, 5, 16):
            for n in (0, 4096, 1 << 20, 256 << 20):
                name, c = choose(op, "auto", flat(p), n)
                fixed = [choose(op, alg, flat(p), n)[1].seconds for alg in ALGORITHMS]
                assert c.seconds <= min(fixed) and ALGORITHMS[name].applies(op)
                assert choose(op, name, flat(p), n) == (name, c)


def test_auto_prefers_latency_bound_small_and_bandwidth_bound_large():
    assert choose("all_reduce", "auto", flat(8), 8)[0] == "recursive_doubling"
    assert choose("all_reduce", "auto", flat(8), 1 << 30)[0] in ("ring", "rabenseifner")


def test_fixed_algorithm_falls_back_to_the_op_default():
    assert choose("all_to_all", "ring", flat(4), N)[0] == DEFAULT_ALGORITHM["all_to_all"] == "pairwise"
    assert choose("all_reduce", "pairwise", flat(4), N)[0] == "ring"
    assert choose("all_reduce", "tree", flat(4), N)[0] == "tree"


def test_every_op_has_an_applicable_default():
    for op in OPS:
        assert ALGORITHMS[DEFAULT_ALGORITHM[op]].applies(op)


def test_unknown_op_and_algorithm():
    with pytest.raises(ValueError, match="valid ops: all_reduce"):
        choose("allreduce", "auto", flat(2), N)
    with pytest.raises(ValueError, match="valid: auto, ring"):
        choose("all_reduce", "fastest", flat(2), N)
