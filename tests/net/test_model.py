import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradwire.net import OPS, NetworkModel, OpCost, describe

MiB = 1 << 20


def test_ring_all_reduce_1gbit_tcp_16mib_two_ranks():
    # 2(p-1)/p * n = n bytes at 1 Gbit/s after TCP framing, plus 2 latencies of 0
    cost = NetworkModel("bandwidth=1gbit,algorithm=ring", 2).cost("all_reduce", 16 * MiB)
    assert cost.seconds == pytest.approx(16 * MiB * 8 / 1e9 * 1514 / 1448, rel=1e-12)
    assert cost.seconds == pytest.approx(0.14033538687, rel=1e-10)
    assert cost == OpCost(cost.seconds, 16 * MiB, 16 * MiB, 16 * MiB + math.ceil(16 * MiB / 1448) * 66, "ring")


def test_1gbe_four_ranks_matches_the_measured_ballpark():
    # DESIGN.md: tbf-shaped veth, n=4, 16 MB, gloo ring: 212 ms measured, 201 ms unframed model
    seconds = NetworkModel("1gbe,algorithm=ring", 4).cost("all_reduce", 16 * MiB).seconds
    assert 0.205 < seconds < 0.215


def test_loopback_is_zero_but_counts_bytes():
    model = NetworkModel(None, 4)
    assert model.is_zero
    for op in OPS:
        cost = model.cost(op, 4 * MiB, src=0, dst=3)
        assert cost.seconds == 0.0
        assert cost.payload_bytes == (0 if op == "barrier" else 4 * MiB)
    assert model.cost("all_reduce", 4 * MiB).sent_bytes == 6 * MiB
    assert not NetworkModel("latency=1us", 2).is_zero


def test_one_rank_costs_nothing():
    assert NetworkModel("wan", 1).cost("all_reduce", MiB).seconds == 0.0


def test_payload_conventions():
    model = NetworkModel("10gbe", 4)
    assert model.cost("all_gather", 16 * MiB).sent_bytes == 12 * MiB   # full buffer, (p-1)/p of it sent
    assert model.cost("send", MiB, src=0, dst=1).sent_bytes == MiB
    assert model.cost("send", MiB, src=2, dst=2).seconds == 0.0


def test_fixed_algorithm_and_fallback_are_reported():
    model = NetworkModel("10gbe,algorithm=ring", 4)
    assert model.cost("all_reduce", MiB).algorithm == "ring"
    assert model.cost("all_to_all", MiB).algorithm == "pairwise"


def test_hierarchical_beats_flat_ring_on_2x4_with_fast_intra():
    model = NetworkModel("10gbe,topology=2x4,intra=nvlink", 8)
    auto = model.cost("all_reduce", 256 * MiB)
    assert auto.algorithm == "hierarchical"
    ring = NetworkModel("10gbe,topology=2x4,intra=nvlink,algorithm=ring", 8).cost("all_reduce", 256 * MiB)
    assert auto.seconds < ring.seconds
    intra, inter = model.intra_link, model.inter_link
    n = 256 * MiB
    expected = 2 * 2 * (intra.latency + n * intra.beta) + 2 * inter.latency + n * inter.beta
    assert auto.seconds == pytest.approx(expected)


def test_subgroup_inside_one_node_uses_the_intra_link():
    model = NetworkModel("10gbe,topology=2x4,intra=nvlink,algorithm=ring", 8)
    inside = model.cost("all_reduce", 16 * MiB, ranks=[4, 5, 6, 7])
    across = model.cost("all_reduce", 16 * MiB, ranks=[0, 1, 4, 5])
    n, link = 16 * MiB, model.intra_link
    assert inside.seconds == pytest.approx(6 * link.latency + 1.5 * n * link.beta)
    assert across.seconds > 10 * inside.seconds
    assert model.cost("send", MiB, src=0, dst=1).seconds < model.cost("send", MiB, src=0, dst=4).seconds


def test_flat_topology_puts_every_rank_on_its_own_node():
    model = NetworkModel("1gbe,intra=nvlink", 4)
    assert model.cost("all_reduce", MiB, ranks=[0, 1]).seconds == NetworkModel("1gbe", 2).cost("all_reduce", MiB).seconds


def test_straggler_link_slows_the_groups_it_is_in():
    slow = NetworkModel("1gbe,straggler=3:link=0.5:compute=2", 4)
    fast = NetworkModel("1gbe", 4)
    n = 16 * MiB
    assert slow.cost("all_reduce", n).seconds > 1.9 * fast.cost("all_reduce", n).seconds
    assert slow.cost("all_reduce", n, ranks=[0, 1]).seconds == fast.cost("all_reduce", n, ranks=[0, 1]).seconds
    assert slow.cost("send", n, src=0, dst=3).seconds > slow.cost("send", n, src=0, dst=1).seconds
    assert slow.compute_factor(3) == 2.0 and slow.compute_factor(0) == 1.0


def test_jitter_is_deterministic_per_seed_and_seq():
    spec = "1gbe,jitter=100us,seed=5"
    a, b = NetworkModel(spec, 4), NetworkModel(spec, 4)
    assert a.cost("all_reduce", MiB, seq=3) == b.cost("all_reduce", MiB, seq=3)
    assert a.cost("all_reduce", MiB, seq=3).seconds != a.cost("all_reduce", MiB, seq=4).seconds
    other_seed = NetworkModel("1gbe,jitter=100us,seed=6", 4)
    assert a.cost("all_reduce", MiB, seq=3).seconds != other_seed.cost("all_reduce", MiB, seq=3).seconds


@pytest.mark.parametrize("dist", ["uniform", "normal", "pareto"])
def test_jitter_adds_a_bounded_positive_delay(dist):
    base = NetworkModel("1gbe,algorithm=ring", 4).cost("all_reduce", MiB).seconds
    model = NetworkModel(f"1gbe,algorithm=ring,jitter=10us,jitter_dist={dist}", 4)
    extra = [model.cost("all_reduce", MiB, seq=s).seconds - base for s in range(200)]
    assert min(extra) > 0
    mean_per_step = sum(extra) / len(extra) / 6   # a ring all_reduce on 4 ranks has 6 latency steps
    expected = {"uniform": 5e-6, "normal": 10e-6 * math.sqrt(2 / math.pi), "pareto": 5e-6}[dist]
    assert mean_per_step == pytest.approx(expected, rel=0.25)
    if dist == "uniform":
        assert max(extra) <= 6 * 10e-6


def test_loss_slows_tcp_once_mathis_is_below_the_link_rate():
    # RTT 40 us: Mathis allows ~4.4 GB/s > 10 Gbit/s, loss changes nothing; RTT 2 ms: ~89 MB/s
    clean, lossy = (NetworkModel(s, 2).cost("all_reduce", 16 * MiB).seconds
                    for s in ("10gbe", "10gbe,loss=0.01%"))
    assert lossy == clean
    clean, lossy = (NetworkModel(s, 2).cost("all_reduce", 16 * MiB).seconds
                    for s in ("10gbe,latency=1ms", "10gbe,latency=1ms,loss=0.01%"))
    assert lossy > 10 * clean


@pytest.mark.parametrize("spec, world, message", [
    ("1gbe,topology=2x4", 4, "topology 2x4 holds 8 ranks but world_size is 4"),
    ("1gbe,straggler=4:link=0.5", 4, "straggler rank 4 is outside"),
    ("1gbe", 0, "world_size must be"),
])
def test_model_construction_errors(spec, world, message):
    with pytest.raises(ValueError, match=message):
        NetworkModel(spec, world)


def test_cost_argument_errors():
    model = NetworkModel("1gbe", 4)
    with pytest.raises(ValueError, match="valid ops: all_reduce, broadcast"):
        model.cost("allreduce", 1)
    with pytest.raises(ValueError, match="nbytes"):
        model.cost("all_reduce", -1)
    with pytest.raises(ValueError, match="seq"):
        model.cost("all_reduce", 1, seq=-1)
    with pytest.raises(ValueError, match="outside the world"):
        model.cost("all_reduce", 1, ranks=[0, 4])
    with pytest.raises(ValueError, match="distinct"):
        model.cost("all_reduce", 1, ranks=[1, 1])


def test_describe_rows():
    rows = describe("10gbe", world_sizes=(2, 4), sizes=(4096, MiB))
    assert {r.world_size for r in rows} == {2, 4}
    assert len(rows) == 2 * (9 * 2 + 1)
    row = next(r for r in rows if (r.op, r.world_size, r.nbytes) == ("all_reduce", 4, MiB))
    assert row.algbw == pytest.approx(MiB / row.seconds)
    assert row.busbw == pytest.approx(row.algbw * 1.5)
    assert {r.world_size for r in describe("10gbe,topology=2x4")} == {8}


_op = st.sampled_from(OPS)
_spec = st.sampled_from(["1gbe", "10gbe,loss=0.1%", "wan,jitter=1ms,jitter_dist=pareto", "ib-hdr,topology=2x2,intra=nvlink",
                         "100gbe,straggler=1:link=0.1", "loopback"])


@settings(max_examples=200, deadline=None)
@given(spec=_spec, op=_op, n=st.integers(0, 1 << 32), extra=st.integers(1, 1 << 30), seq=st.integers(0, 2**31),
       ranks=st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True))
def test_cost_is_never_negative_and_monotone_in_bytes(spec, op, n, extra, seq, ranks):
    model = NetworkModel(spec.replace("jitter=1ms,", ""), 4)   # monotone only holds without jitter
    small = model.cost(op, n, ranks=ranks, src=ranks[0], dst=ranks[-1])
    large = model.cost(op, n + extra, ranks=ranks, src=ranks[0], dst=ranks[-1])
    assert 0 <= small.seconds <= large.seconds
    assert small.sent_bytes <= large.sent_bytes and small.wire_bytes <= large.wire_bytes
    jittery = NetworkModel(spec, 4).cost(op, n, ranks=ranks, seq=seq, src=ranks[0], dst=ranks[-1])
    assert jittery.seconds >= small.seconds >= 0
