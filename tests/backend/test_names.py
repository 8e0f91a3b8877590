"""A gradwire group standing in for gloo reports "gloo" wherever torch and its libraries read a backend name."""
import pytest

from gradwire.backend.names import group_level_name, requested_name
from gradwire.launch import spawn
from tests.backend import names_workers


def test_names_as_torch_stores_them():
    assert requested_name("GLOO") == "gloo" and requested_name(None) == "undefined"
    assert group_level_name("cpu:gloo,cuda:gloo") == "gloo" and group_level_name("cpu:gloo,cuda:nccl") == "undefined"


@pytest.mark.parametrize("asked", ["gloo", None])
def test_a_stand_in_reports_the_name_the_script_asked_for(asked):
    ref = spawn(names_workers.names, 2, (asked, False), timeout=90)
    got = spawn(names_workers.names, 2, (asked, True), timeout=90)
    for rank in range(2):
        r, g = ref[rank], got[rank]
        assert g["world"] == r["world"] and g["sub"] == r["sub"], (g, r)
        assert g["ddp_backend_name"] == r["ddp_backend_name"]
        # and the groups still simulate the network, a subgroup of the default group too
        assert g["world_is_gradwire"] and g["sub_is_gradwire"] and g["same_name_is_gradwire"]
        assert g["sub_sum"] == r["sub_sum"] == [3.0, 3.0]
    if asked == "gloo":  # Lightning's gloo path: SUM, then an integer division
        assert [g["lightning_mean"] for g in got] == [r["lightning_mean"] for r in ref] == [[1, 10]] * 2


def test_a_script_that_asks_for_gradwire_sees_gradwire():
    got = spawn(names_workers.names, 2, ("gradwire", False), timeout=90)
    for g in got:
        assert g["world"] == g["sub"] == ("gradwire", "cpu:gradwire,cuda:gradwire", "gradwire", "gradwire")
        assert g["world_is_gradwire"] and g["sub_is_gradwire"] and g["ddp_backend_name"] == "gradwire"
