import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gradwire.net import ALGORITHM_CHOICES, PRESETS, NetSpec, Straggler, parse_spec
from gradwire.net.spec import CLOCKS, JITTER_DISTS, PROTOCOLS


def test_none_and_empty_are_loopback():
    assert parse_spec(None) == parse_spec("") == parse_spec("loopback")
    assert parse_spec(None).name == "loopback"


def test_netspec_passes_through():
    spec = NetSpec(bandwidth=1e9)
    assert parse_spec(spec) is spec


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_parses_with_its_values(name):
    spec = parse_spec(name)
    preset = PRESETS[name]
    assert (spec.name, spec.bandwidth, spec.latency, spec.protocol) == (
        name, preset.bandwidth, preset.latency, preset.protocol)


def test_preset_values():
    assert PRESETS["1gbe"].bandwidth == 1e9 and PRESETS["1gbe"].protocol == "tcp"
    assert PRESETS["ib-hdr"].protocol == "rdma" and PRESETS["ib-hdr"].bandwidth == 200e9
    assert PRESETS["wan"].latency == 0.02
    assert PRESETS["nvlink"].bandwidth == 300e9 * 8


def test_keys_refine_a_preset():
    spec = parse_spec("10gbe,latency=200us")
    assert (spec.name, spec.bandwidth, spec.latency, spec.protocol) == ("10gbe", 10e9, 200e-6, "tcp")


def test_custom_spec_without_preset():
    spec = parse_spec("bandwidth=1gbit,latency=50us,jitter=10us,loss=0.01%")
    assert spec.name == "custom" and spec.protocol == "tcp"
    assert (spec.bandwidth, spec.latency, spec.jitter, spec.loss) == (1e9, 50e-6, 10e-6, 1e-4)


def test_later_tokens_win():
    assert parse_spec("latency=1ms,latency=2ms").latency == 0.002
    assert parse_spec("latency=1ms,10gbe").latency == 20e-6   # the preset comes later
    assert parse_spec("10gbe,1gbe").bandwidth == 1e9


def test_all_keys():
    spec = parse_spec(
        "1gbe,jitter_dist=pareto,protocol=rdma,algorithm=ring,topology=2x4,intra_bandwidth=300GB/s,"
        "intra_latency=3us,intra_protocol=none,clock=virtual,seed=7,straggler=3:link=0.5:compute=2.0,"
        "straggler=1:compute=3")
    assert spec.jitter_dist == "pareto" and spec.protocol == "rdma" and spec.algorithm == "ring"
    assert spec.topology == (2, 4) and spec.intra_bandwidth == 2.4e12 and spec.intra_latency == 3e-6
    assert spec.intra_protocol == "none" and spec.clock == "sim" and spec.seed == 7
    assert spec.stragglers == (Straggler(3, link=0.5, compute=2.0), Straggler(1, compute=3.0))


def test_intra_preset_and_flat_topology():
    spec = parse_spec("100gbe,intra=nvlink,topology=2x4,topology=flat")
    assert spec.topology is None
    assert (spec.intra_bandwidth, spec.intra_latency, spec.intra_protocol) == (2.4e12, 3e-6, "none")


def test_repeated_straggler_rank_keeps_the_last():
    assert parse_spec("straggler=2:link=0.5,straggler=2:link=0.25").stragglers == (Straggler(2, link=0.25),)


def test_default_intra_link_is_inter_link():
    spec = parse_spec("1gbe,loss=0.1%")
    assert spec.intra_link() == spec.inter_link()
    assert parse_spec("1gbe,loss=0.1%,intra=nvlink").intra_link().loss == 0


@pytest.mark.parametrize("text, message", [
    ("ethernet", "unknown preset 'ethernet'; valid presets: loopback, 1gbe"),
    ("speed=1gbit", "unknown spec key 'speed'.*valid keys: bandwidth"),
    ("bandwidth=1gallon", "unknown bandwidth unit"),
    ("bandwidth=0gbit", "bandwidth must be > 0"),
    ("bandwidth=-1gbit", "bandwidth must be > 0"),
    ("intra_bandwidth=0mbit", "intra_bandwidth must be > 0"),
    ("latency=5", "no unit; valid units: ns, us, ms, s"),
    ("latency=-5us", "latency must be a finite time >= 0"),
    ("jitter=-1ms", "jitter must be a finite time >= 0"),
    ("intra_latency=-1ms", "intra_latency must be"),
    ("loss=100%", r"loss must be in \[0, 100%\)"),
    ("loss=2", r"loss must be in \[0, 100%\)"),
    ("loss=-1%", r"loss must be in \[0, 100%\)"),
    ("loss=some", "percentage"),
    ("topology=0x4", "topology must be"),
    ("topology=2by4", "bad topology '2by4'"),
    ("topology=2x", "bad topology"),
    ("protocol=udp", "unknown protocol 'udp'; valid: tcp, rdma, none"),
    ("intra_protocol=udp", "unknown intra_protocol"),
    ("jitter_dist=cauchy", "unknown jitter_dist 'cauchy'; valid: uniform, normal, pareto"),
    ("algorithm=magic", "unknown algorithm 'magic'; valid: auto, ring, tree"),
    ("clock=wall", "unknown clock 'wall'; valid: realtime, sim"),
    ("seed=abc", "seed must be an integer"),
    ("seed=-1", "seed must be an int >= 0"),
    ("intra=fast", "unknown intra preset 'fast'"),
    ("straggler=x", "must start with a rank"),
    ("straggler=1:speed=2", "bad straggler part"),
    ("straggler=1:link=fast", "not a number"),
    ("straggler=1:link=0", "link factor must be"),
    ("straggler=-1", "straggler rank must be"),
])
def test_errors_say_what_and_what_is_valid(text, message):
    with pytest.raises(ValueError, match=message):
        parse_spec(text)


def test_netspec_checks_direct_construction():
    with pytest.raises(ValueError, match="preset name"):
        NetSpec(name="mine")
    with pytest.raises(ValueError, match="one straggler entry per rank"):
        NetSpec(stragglers=(Straggler(1), Straggler(1)))
    with pytest.raises(ValueError, match="bandwidth"):
        NetSpec(bandwidth=math.nan)
    assert NetSpec(bandwidth=10**9).bandwidth == 1e9 and isinstance(NetSpec(bandwidth=10**9).bandwidth, float)


@pytest.mark.parametrize("text", [
    "10gbe,latency=200us", "bandwidth=1gbit,latency=50us,jitter=10us,loss=0.01%", "loopback", "custom",
    "100gbe,topology=2x4,intra=nvlink,algorithm=hierarchical", "1gbe,straggler=3:link=0.5:compute=2",
    "wan,bandwidth=12.5GB/s,clock=virtual,seed=3,jitter_dist=normal,protocol=rdma",
])
def test_to_string_round_trips(text):
    spec = parse_spec(text)
    assert parse_spec(spec.to_string()) == spec


def test_to_string_is_short():
    assert parse_spec("10gbe,latency=200us").to_string() == "10gbe,latency=200us"
    assert parse_spec("").to_string() == "loopback"


_times = st.floats(min_value=0, max_value=10, allow_nan=False)
_rates = st.one_of(st.just(math.inf), st.floats(min_value=1.0, max_value=1e13, allow_nan=False))
_specs = st.builds(
    NetSpec,
    name=st.sampled_from(["custom", *PRESETS]),
    bandwidth=_rates, latency=_times, protocol=st.sampled_from(PROTOCOLS), jitter=_times,
    jitter_dist=st.sampled_from(JITTER_DISTS), loss=st.floats(min_value=0, max_value=0.99),
    algorithm=st.sampled_from(ALGORITHM_CHOICES),
    topology=st.one_of(st.none(), st.tuples(st.integers(1, 64), st.integers(1, 16))),
    intra_bandwidth=st.one_of(st.none(), _rates), intra_latency=st.one_of(st.none(), _times),
    intra_protocol=st.one_of(st.none(), st.sampled_from(PROTOCOLS)),
    clock=st.sampled_from(CLOCKS), seed=st.integers(0, 2**32),
    stragglers=st.lists(
        st.builds(Straggler, rank=st.integers(0, 100), link=st.floats(0.01, 10), compute=st.floats(0.1, 10)),
        max_size=3, unique_by=lambda s: s.rank).map(tuple),
)


@given(_specs)
def test_any_spec_round_trips(spec):
    assert parse_spec(spec.to_string()) == spec


@given(_specs)
def test_replace_keeps_checks(spec):
    with pytest.raises(ValueError):
        replace(spec, loss=1.0)
