"""The device model: the grammar, the named devices, roofline prices (pure, one process)."""
from __future__ import annotations

import pytest
import torch

from gradwire.device import DEVICES, Device, RooflineMode, op_seconds, parse_device


@pytest.mark.parametrize("text, kind, name", [
    ("a100", "roofline", "a100"), ("H100", "roofline", "h100"), ("cpu-core", "roofline", "cpu-core"),
    ("19.5/1555", "roofline", "19.5/1555"), ("19.5,1555", "roofline", "19.5/1555"),
    ("host", "host", None), ("host:x0.1", "host", None), ("step:35ms", "step", "cpu-core"),
    ("step=35ms", "step", "cpu-core"),
])
def test_the_grammar(text: str, kind: str, name: str | None) -> None:
    spec = parse_device(text)
    assert spec.kind == kind
    assert (spec.device.name if spec.device is not None else None) == name
    assert parse_device(spec.text) == spec  # the normalized text round-trips


@pytest.mark.parametrize("text, words", [
    ("a1000", "unknown device 'a1000': use one of cpu-core, t4, v100, a100, h100"),
    ("host:x0", "the factor must be a positive finite number"),
    ("host:x-1", "the factor must be a positive finite number"),
    ("host:xfast", "the factor after ':x' must be a number"),
    ("0/1555", "a custom device is TFLOPS/GBps, both positive"),
    ("step:0ms", "the step's time must be positive"),
    ("step:35", "a step's time is a number with us, ms or s"),
])
def test_bad_devices_say_what_would_be_right(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_device(text)


def test_a_factor_multiplies_every_op_time() -> None:
    a100, slow = parse_device("a100").device, parse_device("a100:x2").device
    assert a100 is not None and slow is not None
    for flops, nbytes in ((1e12, 1 << 20), (0.0, 1 << 30)):
        assert op_seconds(slow, flops, nbytes, False) == pytest.approx(2 * op_seconds(a100, flops, nbytes, False))


def test_the_roofline_takes_the_slower_of_compute_and_memory() -> None:
    d = Device("d", fp32_flops=1e12, half_flops=8e12, memory_bandwidth=1e9, efficiency=1.0,
               memory_efficiency=1.0, op_overhead=0.0)
    assert op_seconds(d, 2e12, 10, False) == pytest.approx(2.0)  # compute-bound
    assert op_seconds(d, 2e12, 10, True) == pytest.approx(0.25)  # tensor cores for half precision
    assert op_seconds(d, 1.0, 3e9, False) == pytest.approx(3.0)  # memory-bound


def test_the_mode_prices_a_matmul_by_its_flops_and_views_by_their_overhead() -> None:
    d = DEVICES["a100"]
    charged: list[float] = []
    a, b = torch.randn(64, 128), torch.randn(128, 32)
    with RooflineMode(d, charged.append, lambda: False):
        a @ b
        a.view(128, 64)
    matmul, view = charged
    assert matmul == pytest.approx(op_seconds(d, 2 * 64 * 128 * 32, (64 * 128 + 128 * 32 + 64 * 32) * 4, False))
    assert view == pytest.approx(d.op_overhead)


def test_the_mode_charges_nothing_while_paused() -> None:
    charged: list[float] = []
    with RooflineMode(DEVICES["t4"], charged.append, lambda: True):
        torch.randn(8, 8) @ torch.randn(8, 8)
    assert charged == []


def test_every_named_device_says_where_its_figures_come_from() -> None:
    assert all(d.source for d in DEVICES.values())
