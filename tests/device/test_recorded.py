"""A recorded device (``profile:DIR``): keys, the recording's file, prices and refusals (pure, one process)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gradwire.device import DEVICES, RooflineMode, model_signature, op_key, parse_device
from gradwire.device.recorded import write_recording
from gradwire.profile.ops import OpRecorder


def _model(width: int = 16) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))


def _record(**over: object) -> dict:
    record = {"device": {"name": "cpu", "kind": "cpu", "description": "a CPU", "base": "cpu-core"},
              "torch": torch.__version__, "world_size": 2, "model": model_signature(_model().named_parameters()),
              "batch": 8, "step_seconds": 0.01, "scale": 1.0, "overhead": 1e-6, "roofline_ratio": 2.0,
              "ops": [{"key": "aten.mm.default(float32[8,8],float32[8,8])", "calls": 4, "seconds": 0.004}]}
    record.update(over)
    return record


def test_a_key_is_shapes_and_dtypes_not_values_or_device() -> None:
    a, b = torch.zeros(3, 4), torch.ones(3, 4)
    assert op_key(torch.ops.aten.add.Tensor, (a, b), {"alpha": 0.5}) == \
        op_key(torch.ops.aten.add.Tensor, (b, a), {"alpha": 0.1}) == "aten.add.Tensor(float32[3,4],float32[3,4],alpha=f)"
    assert op_key(torch.ops.aten.sum.dim_IntList, (a, [1]), {}) != op_key(torch.ops.aten.sum.dim_IntList, (a, [0]), {})
    assert op_key(torch.ops.aten.arange.default, (3,), {"device": torch.device("cpu")}).endswith("device=dev)")


def test_the_signature_drops_ddp_s_prefix_and_tells_models_apart() -> None:
    named = list(_model().named_parameters())
    assert model_signature(named) == model_signature((f"module.{n}", p) for n, p in named)
    assert model_signature(named)["hash"] != model_signature(_model(32).named_parameters())["hash"]
    assert model_signature(named)["parameters"] == sum(p.numel() for _, p in named)


def test_a_recording_prices_its_ops_and_leaves_the_others_to_the_scaled_roofline(tmp_path: Path) -> None:
    write_recording(tmp_path, "cpu", _record())
    spec = parse_device(f"profile:{tmp_path}")
    assert spec.kind == "recorded" and spec.text == f"profile:{tmp_path}@cpu"
    assert parse_device(spec.text).recording is spec.recording  # the text travels and loads once
    assert spec.recording.price("aten.mm.default(float32[8,8],float32[8,8])") == pytest.approx(0.001 + 1e-6)
    assert spec.recording.price("aten.mm.default(float32[9,8],float32[8,8])") is None
    assert spec.device is not None and spec.device.fp32_flops == pytest.approx(DEVICES["cpu-core"].fp32_flops / 2)
    charged: list[float] = []
    a, b, c = torch.ones(8, 8), torch.ones(8, 8), torch.ones(9, 8)
    with RooflineMode(spec.device, charged.append, lambda: False, spec.recording) as mode:
        torch.mm(a, b)
        torch.mm(c, b)
    assert charged[0] == pytest.approx(0.001 + 1e-6) and charged[1] != charged[0]
    assert (mode.recorded_ops, mode.roofline_ops) == (1, 1)


def test_what_a_recording_is_checked_against(tmp_path: Path) -> None:
    write_recording(tmp_path, "cpu", _record())
    rec = parse_device(f"profile:{tmp_path}@cpu").recording
    rec.check_world(2)
    rec.check_model(model_signature(_model().named_parameters()))
    with pytest.raises(ValueError, match="was recorded on 2 ranks and this job has 4"):
        rec.check_world(4)
    with pytest.raises(ValueError, match="was recorded on another model"):
        rec.check_model(model_signature(_model(32).named_parameters()))


def test_bad_folders_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    write_recording(tmp_path / "two", "cpu", _record())
    write_recording(tmp_path / "two", "nvidia-h100", _record())
    write_recording(tmp_path / "neg", "cpu", _record(overhead=-1.0))
    (tmp_path / "corrupt" / "ops").mkdir(parents=True)
    (tmp_path / "corrupt" / "ops" / "cpu.json").write_text("{not json")
    (tmp_path / "old" / "ops").mkdir(parents=True)
    (tmp_path / "old" / "ops" / "cpu.json").write_text(json.dumps({"ops": []}))
    for body, words in [("nope", "no such folder"), ("file", "is not a folder"), ("empty", "holds no ops/"),
                        ("two", "holds recordings of cpu, nvidia-h100; name one"),
                        ("two@a100", "holds no recording on a100; it holds cpu, nvidia-h100"),
                        ("neg", "negative or non-finite"), ("corrupt", "is not a JSON recording"),
                        ("old", "is not a gradwire-ops/1 recording")]:
        with pytest.raises(ValueError, match=words) as info:
            parse_device(f"profile:{tmp_path}/{body}")
        assert "\n" not in str(info.value)


def test_a_recorder_and_a_replay_agree_op_for_op() -> None:
    """The recorder's keys are the replay's: replaying the recorded steps charges exactly their recorded time."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    recorder = OpRecorder(steps=2, skip=1).start()
    try:
        for _ in range(6):  # steps 3 and 5 timed
            step()
    finally:
        recorder.stop()
    summary = recorder.summary()
    assert len(summary["per_step"]) == 2 and summary["model"] == model_signature(model.named_parameters())
    assert summary["device"]["name"] == "cpu" and all(o["calls"] > 0 for o in summary["ops"].values())
    seconds = {k: o["seconds"] / o["calls"] for k, o in summary["ops"].items()}

    class Table:  # the recording's price, without scale or overhead
        def price(self, key: str) -> float | None:
            return seconds.get(key)

    charged: list[float] = []
    with RooflineMode(DEVICES["cpu-core"], charged.append, lambda: False, Table()) as mode:
        step()
    assert mode.roofline_ops == 0 and mode.recorded_ops == summary["per_step"][0][1]
    assert sum(charged) == pytest.approx(sum(o["seconds"] for o in summary["ops"].values()) / 2, rel=1e-6)


def _rank(per_step: list, steps: list) -> dict:
    ops = {"aten.mm.default(float32[8,8],float32[8,8])": {"calls": 10, "seconds": 0.01, "roofline": 0.0005}}
    return {"steps": steps, "op_record": {"ops": ops, "per_step": per_step, "model": {"hash": "h"}, "world_size": 2,
                                          "device": {"name": "cpu", "kind": "cpu", "description": "c", "base": "cpu-core"},
                                          "torch": "t", "spans": [[1.0, 2.0], [3.0, 4.0]], "meter": "wall time"}}


def _step(origin: float, step: float, wait: float) -> dict:
    return {"origin": origin, "step": step, "backward_wait": wait, "waited": 0.0, "batch": 8}


def test_merge_spreads_the_framework_s_time_or_scales_the_ops() -> None:
    """The recorded step is the untimed steps between timed ones; its compute less the ops' median is spread."""
    from gradwire.profile.ops import merge

    steps = [_step(1.5, 0.05, 0.01), _step(2.5, 0.012, 0.002), _step(3.5, 0.05, 0.01), _step(5.0, 0.03, 0.0)]
    record = merge([_rank([(0.008, 100), (0.009, 100)], steps)] * 2, "1gbe")
    assert record["clean_steps"] == 1 and record["step_seconds"] == pytest.approx(0.012)  # only the step at 2.5
    assert record["compute_seconds"] == pytest.approx(0.010) and record["scale"] == 1.0
    assert record["overhead"] == pytest.approx((0.010 - 0.0085) / 100)
    assert record["roofline_ratio"] == pytest.approx(2.0) and record["world_size"] == 2 and record["batch"] == 8
    slow = merge([_rank([(0.02, 100)], steps)] * 2, "1gbe")  # ops add up past the step: scaled down instead
    assert slow["overhead"] == 0.0 and slow["scale"] == pytest.approx(0.010 / 0.02)


def test_predict_refuses_a_recorded_device_for_a_bundled_model(tmp_path: Path) -> None:
    from gradwire.predict.priced import device_of
    write_recording(tmp_path, "cpu", _record())
    with pytest.raises(ValueError, match="prices the recorded script's own ops, not a bundled model") as err:
        device_of(f"profile:{tmp_path}")
    assert "\n" not in str(err.value)


def test_merge_keeps_each_rank_s_compute_step_by_step() -> None:
    """Per rank, its clean steps' compute over the recorded compute: what a replay multiplies its steps by."""
    from gradwire.profile.ops import merge

    def steps(c1: float, c2: float) -> list:  # clean steps at 2.5 and 2.7 between the timed ones at 1-2 and 3-4
        return [_step(2.5, c1 + 0.005, 0.005), _step(2.7, c2 + 0.004, 0.004), _step(5.0, 0.03, 0.0)]

    fast, slow = _rank([(0.008, 100)] * 2, steps(0.008, 0.010)), _rank([(0.008, 100)] * 2, steps(0.012, 0.010))
    record = merge([dict(fast, rank=0), dict(slow, rank=1)], "1gbe")
    assert record["step_factors"] == {"0": pytest.approx([0.8, 1.0]), "1": pytest.approx([1.2, 1.0])}
    assert record["compute_spread_seconds"] == pytest.approx((0.012 - 0.010 + 0.0) / 2)
    alike = merge([dict(fast, rank=0), dict(fast, rank=1)], "1gbe")
    assert alike["compute_spread_seconds"] == 0.0


def test_a_replay_computes_each_step_as_its_recorded_rank_did(tmp_path: Path) -> None:
    from gradwire.backend.simclock import SimClock

    write_recording(tmp_path, "cpu", _record(step_factors={"0": [0.8, 1.0], "1": [1.2, 0.5, 2.0]}))
    rec = parse_device(f"profile:{tmp_path}").recording
    assert [rec.factor(1, n) for n in range(4)] == [1.2, 0.5, 2.0, 1.2] and rec.factor(5, 0) == 1.0
    write_recording(tmp_path / "bad", "cpu", _record(step_factors={"0": [1.0, -1.0]}))
    with pytest.raises(ValueError, match="negative or non-finite"):
        parse_device(f"profile:{tmp_path / 'bad'}")

    clock, a = SimClock(), torch.ones(8, 8)
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    clock.enable(parse_device(f"profile:{tmp_path}"))
    try:
        clock.replay_steps(1)
        charged = []
        for _ in range(4):
            before = clock.computed
            torch.mm(a, a)
            charged.append(clock.computed - before)
            with clock.backend_work():  # the optimizer's own ops: not this comparison's
                param.grad = torch.ones(2)
                optimizer.step()
    finally:
        clock.disable()
    price = rec.price("aten.mm.default(float32[8,8],float32[8,8])")
    assert charged == pytest.approx([1.2 * price, 0.5 * price, 2.0 * price, 1.2 * price])
    optimizer.step()  # the hook left with the clock
