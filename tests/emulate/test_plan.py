"""The pure core of emulation: names, addresses, the qdisc plan and its refusals, the torchrun command lines."""
import ipaddress
import math

import pytest

from gradwire.emulate.agents import EMULATED_NET_ENV, agent_env, torchrun_argv
from gradwire.emulate.host import host_problem
from gradwire.emulate.layout import NODE_IF, PREFIX, Layout, RunId, port_if
from gradwire.emulate.plan import (
    MIN_BURST, QUEUE_SECONDS, Capabilities, Unsupported, default_burst, model_spec, plan_network,
)
from gradwire.net import NetworkModel, parse_spec

RUN = RunId(4242, 987654)
ALL = Capabilities(frozenset({"tbf", "htb", "netem"}), frozenset({"u32"}))
NO_NETEM = Capabilities(frozenset({"tbf", "htb"}), frozenset({"u32"}))


def layout(nodes=2, per_node=2, **kw):
    return Layout(nodes, per_node, RUN, **kw)


def test_names_carry_the_prefix_and_the_owner():
    lay = layout(3, 1)
    assert lay.namespaces == (f"{PREFIX}4242-987654-sw", *(f"{PREFIX}4242-987654-n{i}" for i in range(3)))
    assert all(RunId.of_namespace(n) == RUN for n in lay.namespaces)
    assert RunId.of_namespace("gw-probe") is None and RunId.of_namespace("other-1-2-n0") is None
    assert all(len(n) <= 15 for n in (NODE_IF, port_if(999), "gw-br"))  # IFNAMSIZ


def test_addresses_are_hosts_of_the_private_subnet():
    lay = layout(2, 2, subnet=ipaddress.IPv4Network("192.168.7.0/29"))
    assert [str(lay.address(i)) for i in range(2)] == ["192.168.7.1/29", "192.168.7.2/29"]
    assert lay.rdzv_endpoint == "192.168.7.1:29400" and lay.world_size == 4
    with pytest.raises(ValueError, match="outside"):
        lay.address(2)


@pytest.mark.parametrize("subnet, match", [
    ("8.8.8.0/24", "not a private"), ("127.0.0.0/24", "not a private"), ("10.0.0.0/30", "fewer than 3"),
])
def test_bad_subnets_are_refused(subnet, match):
    with pytest.raises(ValueError, match=match):
        Layout(3, 1, RUN, ipaddress.IPv4Network(subnet))


def test_bandwidth_shapes_both_directions_of_every_node():
    plan = plan_network(parse_spec("bandwidth=100mbit"), layout(2, 2), NO_NETEM)
    assert [(p.namespace, p.device, p.direction) for p in plan.ports] == [
        (layout().node_ns(0), NODE_IF, "upload"), (layout().switch_ns, port_if(0), "download"),
        (layout().node_ns(1), NODE_IF, "upload"), (layout().switch_ns, port_if(1), "download"),
    ]
    rate = plan.ports[0].rate
    assert rate.kind == "htb" and rate.rate == 100e6 and rate.rate_bytes == 12_500_000
    assert rate.burst == MIN_BURST  # 2 ms at 100 Mbit/s is 25 KB, below the floor
    assert rate.limit == int(12.5e6 * QUEUE_SECONDS) + rate.burst
    assert all(p.impairment is None for p in plan.ports)


def test_burst_is_two_milliseconds_of_line_time_with_a_floor():
    assert default_burst(1e9) == 250_000
    assert default_burst(1e6) == MIN_BURST
    plan = plan_network(parse_spec("bandwidth=1gbit"), layout(), NO_NETEM, burst=64 << 10)
    assert {p.rate.burst for p in plan.ports} == {64 << 10}


def test_shaper_choice_follows_the_kernel():
    spec = parse_spec("bandwidth=1gbit")
    kind = lambda caps, limiter="auto": plan_network(spec, layout(), caps, limiter).ports[0].rate.kind  # noqa: E731
    assert kind(NO_NETEM) == "htb" and kind(NO_NETEM, "tbf") == "tbf"
    # htb's ACK class needs the u32 classifier: without it the FIFO of tbf is what is left
    assert kind(Capabilities(frozenset({"tbf", "htb"}))) == "tbf"
    with pytest.raises(Unsupported, match="shaper htb is not in this kernel"):
        kind(Capabilities(frozenset({"tbf", "htb"})), "htb")
    with pytest.raises(Unsupported, match="needs tbf, or htb with the u32 classifier"):
        plan_network(spec, layout(), Capabilities(frozenset()))
    # an unshaped network needs no qdisc at all
    plan = plan_network(parse_spec("loopback"), layout(), Capabilities(frozenset()))
    assert all(p.rate is None and p.impairment is None for p in plan.ports)


def test_latency_without_netem_is_refused_with_the_reason():
    with pytest.raises(Unsupported) as err:
        plan_network(parse_spec("1gbe"), layout(), NO_NETEM)
    assert "latency=50us" in str(err.value) and "netem" in str(err.value) and "latency=0s" in str(err.value)
    plan_network(parse_spec("1gbe,latency=0s"), layout(), NO_NETEM)  # the bandwidth alone runs


def test_netem_carries_latency_jitter_and_loss_on_upload_only():
    plan = plan_network(parse_spec("bandwidth=1gbit,latency=1ms,jitter=200us,loss=0.1%"), layout(), ALL)
    up = [p for p in plan.ports if p.direction == "upload"]
    down = [p for p in plan.ports if p.direction == "download"]
    imp = up[0].impairment
    # the model's jitter is uniform in [0, J]; netem's is delay +- jitter
    assert imp.delay == pytest.approx(1.1e-3) and imp.jitter == pytest.approx(1e-4) and imp.loss == pytest.approx(1e-3)
    assert all(p.impairment == imp for p in up) and all(p.impairment is None for p in down)
    # latency alone, no rate: netem without a rate limiter
    plan = plan_network(parse_spec("latency=2ms"), layout(), ALL)
    assert plan.ports[0].rate is None and plan.ports[0].impairment.delay == pytest.approx(2e-3)


def test_every_refusal_is_named_at_once():
    spec = parse_spec("ib-hdr,jitter=1us,jitter_dist=normal,intra=nvlink,clock=sim,straggler=1:compute=2,"
                      "straggler=9:link=0.5,topology=4x1")
    with pytest.raises(Unsupported) as err:
        plan_network(spec, layout(2, 2), ALL)
    reasons = " | ".join(err.value.reasons)
    for part in ("protocol=rdma", "jitter_dist=normal", "intra-node link", "clock=sim", "compute stragglers",
                 "straggler ranks [9]", "topology=4x1"):
        assert part in reasons, part
    assert len(err.value.reasons) == 7
    # ib-hdr's 200 Gbit/s is beyond tbf's 32-bit rate (htb takes it)
    with pytest.raises(Unsupported, match="tbf takes at most"):
        plan_network(parse_spec("ib-hdr,protocol=tcp,latency=0s"), layout(2, 2), ALL, limiter="tbf")


def test_jumbo_frames_are_refused_on_veth_links():
    with pytest.raises(Unsupported, match="mtu=9000: the emulated veth links carry 1500-byte packets"):
        plan_network(parse_spec("bandwidth=1gbit,mtu=9000"), layout(2, 1), NO_NETEM)
    plan_network(parse_spec("bandwidth=1gbit,mtu=1500"), layout(2, 1), NO_NETEM)


def test_intra_loopback_and_topology_auto_pass():
    plan = plan_network(parse_spec("bandwidth=1gbit,intra=loopback,topology=auto"), layout(2, 2), NO_NETEM)
    assert len(plan.ports) == 4
    plan_network(parse_spec("bandwidth=1gbit,topology=2x2"), layout(2, 2), NO_NETEM)


def test_a_link_straggler_slows_its_node():
    plan = plan_network(parse_spec("bandwidth=1gbit,straggler=3:link=0.25"), layout(2, 2), NO_NETEM)
    rates = {(p.node, p.direction): p.rate.rate for p in plan.ports}
    assert rates == {(0, "upload"): 1e9, (0, "download"): 1e9, (1, "upload"): 2.5e8, (1, "download"): 2.5e8}


def test_model_spec_prices_the_emulated_layout():
    spec = parse_spec("bandwidth=1gbit,algorithm=ring")
    two_by_two = model_spec(spec, layout(2, 2))
    assert two_by_two.topology == (2, 2) and math.isinf(two_by_two.intra_link().bandwidth)
    assert model_spec(spec, layout(4, 1)).topology is None
    # gloo's ring crosses the inter-node link: 2(p-1)/p * n bytes at the framed rate
    n = 16 << 20
    seconds = NetworkModel(two_by_two, 4).cost("all_reduce", n).seconds
    assert seconds == pytest.approx(1.5 * n / (1e9 / 8 * 1448 / 1514))
    lines = plan_network(spec, layout(2, 2), NO_NETEM).describe()
    assert lines[-1].startswith("model of this network: --net bandwidth=1gbit,algorithm=ring,topology=2x2")


def test_torchrun_command_of_each_node():
    lay = layout(2, 3)
    argv = torchrun_argv(lay, 1, ["train.py", "--epochs", "1"], python="/py")
    assert argv[:3] == ["/py", "-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--node-rank=1", "--nproc-per-node=3", "--rdzv-backend=static",
            "--rdzv-endpoint=10.250.0.1:29400", "--local-addr=10.250.0.2", "--no-python"} <= set(argv)
    assert argv[-4:] == ["/py", "train.py", "--epochs", "1"]
    assert torchrun_argv(lay, 0, ["gradwire", "bench"])[-2:] == ["gradwire", "bench"]
    with pytest.raises(ValueError, match="no command"):
        torchrun_argv(lay, 0, [])
    env = agent_env({"PATH": "/bin"}, "bandwidth=1gbit", world_size=2, cores=8)
    assert env == {"PATH": "/bin", "GLOO_SOCKET_IFNAME": NODE_IF, EMULATED_NET_ENV: "bandwidth=1gbit",
                   "OMP_NUM_THREADS": "4"}
    assert agent_env({}, "x", world_size=4, cores=2)["OMP_NUM_THREADS"] == "1"
    assert agent_env({"OMP_NUM_THREADS": "3"}, "x", world_size=4, cores=2)["OMP_NUM_THREADS"] == "3"


def test_what_the_host_needs_is_one_line():
    assert "run it as root" in host_problem(1000, True)
    assert "CONFIG_NET_NS" in host_problem(0, False)
    assert host_problem(0, True) is None
    assert "\n" not in host_problem(1000, True)


def test_cli_without_root_says_what_is_needed(monkeypatch, capsys):
    from gradwire.cli.main import main

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert main(["emulate", "--net", "bandwidth=1gbit", "--nodes", "2", "--", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0]


def test_cli_refuses_a_missing_command(capsys):
    from gradwire.cli.main import main

    assert main(["emulate", "--net", "bandwidth=1gbit"]) == 2
    assert "no command after --" in capsys.readouterr().err
