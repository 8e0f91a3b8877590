"""A step whose forward and backward run in a closure inside ``optimizer.step`` is one step."""
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradwire.cli.main import main
from gradwire.launch import free_port
from gradwire.profile.steps import BucketStamp, steps

HERE = Path(__file__).parent


def test_a_closure_step_is_one_step_with_its_forward_backward_and_optimizer():
    # step k: optimizer.step at 10k+1 .. 10k+9; closure 10k+2 .. 10k+7; backward 10k+4 .. 10k+6 (computed 10k+5)
    optimizer = [(10 * k + 1, 10 * k + 9) for k in range(3)]
    closures = [(10 * k + 2, 10 * k + 7) for k in range(3)]
    backwards = [(10 * k + 4, 10 * k + 5, 10 * k + 6) for k in range(3)]
    got = steps(backwards, optimizer, [], [], [], closures)
    assert len(got) == 2  # the first only starts the series, as without a closure
    for s in got:
        assert (s["forward"], s["backward"], s["backward_wait"]) == (5, 1, 1)  # 10(k-1)+9 .. 10k+4
        assert (s["after_backward"], s["optimizer"], s["step"], s["evaluations"]) == (1, 2, 10, 1)


def test_closure_evaluated_several_times_is_one_step():
    # LBFGS: three evaluations in one optimizer.step
    optimizer = [(0, 30), (31, 60)]
    closures = [(1, 5), (10, 15), (20, 25), (32, 36), (40, 45)]
    backwards = [(3, 4, 4.5), (12, 13, 14), (22, 23, 24), (34, 35, 35.5), (42, 43, 44)]
    (s,) = steps(backwards, optimizer, [], [], [], closures)
    assert s["evaluations"] == 2
    assert (s["forward"], s["backward"], s["after_backward"]) == (4, 1, 0.5)  # 30 .. 34, then the first closure
    assert s["optimizer"] == 60 - 36 and s["step"] == 30


def test_steps_without_closures_are_as_before():
    got = steps([(0, 1, 2), (5, 6, 7), (10, 11, 12)], [(3, 4), (8, 9), (13, 14)], [], [], [])
    assert [(s["forward"], s["after_backward"], s["optimizer"], s["step"]) for s in got] == [(1, 1, 1, 5)] * 2


@pytest.mark.parametrize("opt", ["sgd", "lbfgs"])
def test_profile_of_a_closure_script_records_its_steps(tmp_path, opt):
    out = tmp_path / "prof"
    env = dict(os.environ, OMP_NUM_THREADS="1", CLOSURE_OPT=opt)
    cmd = [sys.executable, "-m", "gradwire.cli.main", "profile", "--net", "1gbe", "--out", str(out), "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           f"--master-port={free_port()}", str(HERE / "closure_ddp.py")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=110)
    teardown_abort = "terminate called without an active exception" in proc.stderr
    assert proc.returncode == 0 or teardown_abort, proc.stderr[-3000:]
    for rank in range(2):
        record = json.loads((out / f"rank{rank}.json").read_text())
        assert len(record["steps"]) == 7, record["steps"]  # 8 optimizer steps; the first starts the series
        for s in record["steps"]:
            assert s["forward"] > 0 and s["backward"] > 0 and s["optimizer"] > 0 and s["buckets"]
            assert s["step"] >= s["forward"] + s["backward"] + s["optimizer"]
            assert (s["evaluations"] > 1) if opt == "lbfgs" else (s["evaluations"] == 1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["predict", "--profile", str(out)]) == 0
    assert "optimizer steps/s" in printed.getvalue()


def _accumulating(micro: int, n: int = 3):
    """``n`` optimizer steps of ``micro`` backwards each, 10 s apart; only the last backward has a bucket."""
    backwards, optimizer, stamps = [], [], []
    for k in range(n):
        t = 10.0 * micro * k
        for m in range(micro):
            backwards.append((t + 10 * m + 1, t + 10 * m + 2, t + 10 * m + 3))
        last = t + 10 * (micro - 1)
        stamps.append(BucketStamp(0, 4000, 4, last + 1.5, last + 1.6))
        optimizer.append((last + 4, last + 5))
    return backwards, optimizer, stamps


@pytest.mark.parametrize("micro", [1, 2, 8])
def test_micro_steps_belong_to_the_optimizer_step_they_lead_into(micro):
    backwards, optimizer, stamps = _accumulating(micro)
    got = steps(backwards, optimizer, stamps, [], [])
    assert len(got) == 2  # three optimizer steps; the first starts the series
    for s in got:
        assert s["micro_steps"] == micro and s["step"] == 10 * micro
        # each micro-step from the end of the one before (the previous step's optimizer: 8 s before)
        assert s["micro_seconds"] == ([8.0] + [10.0] * (micro - 2) if micro > 1 else [])
        # the synchronising backward's times; its forward from the last micro-step's return
        assert (s["forward"], s["backward"], s["optimizer"]) == (8.0 if micro > 1 else 6.0, 1, 1)
        assert [b["ready"] for b in s["buckets"]] == [0.5]
        assert s["forward"] + sum(s["micro_seconds"]) + s["backward"] + s["backward_wait"] + s["after_backward"] \
            + s["optimizer"] == s["step"]


def test_a_backward_that_synchronised_without_an_optimizer_is_a_step_and_trailing_micro_steps_stay():
    # backwards at 0, 10, 20 each with a bucket and no optimizer step: three steps as before
    backwards = [(0.0, 1.0, 2.0), (10.0, 11.0, 12.0), (20.0, 21.0, 22.0), (30.0, 31.0, 32.0)]
    stamps = [BucketStamp(0, 40, 4, t + 0.5, t + 0.6) for t in (0.0, 10.0, 20.0)]
    got = steps(backwards, [], stamps, [], [])
    assert [s["micro_steps"] for s in got] == [1, 1, 1]  # the last, unsynchronised, has nothing to lead into


def test_the_batch_is_the_leading_dimension_of_the_first_tensor_argument():
    import torch

    from gradwire.profile.steps import batch_of

    assert batch_of((torch.zeros(32, 64),), {}) == 32
    assert batch_of((), {"input_ids": torch.zeros(8, 64, dtype=torch.long), "labels": None}) == 8  # the HF Trainer's
    assert batch_of(([torch.zeros(4, 3), torch.zeros(4)], 0), {}) == 4  # Lightning's (batch, batch_idx)
    assert batch_of((3, "x"), {}) is None and batch_of((torch.tensor(1.0),), {}) is None
    backwards, optimizer, stamps = _accumulating(2)
    forwards = [(b[0] - 0.5, 16) for b in backwards]
    assert [s["batch"] for s in steps(backwards, optimizer, stamps, [], [], forwards=forwards)] == [16, 16]
    assert [s["batch"] for s in steps(backwards, optimizer, stamps, [], [])] == [None, None]
