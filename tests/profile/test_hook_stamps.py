"""When the profile's hook recorder says a bucket's exchange completed (``BucketStamp.done``)."""
from __future__ import annotations

import pytest
import torch

from gradwire.backend.simclock import SIMCLOCK
from gradwire.device.catalog import parse_device
from gradwire.profile.steps import HookRecorder, _wrap


class _Bucket:
    def buffer(self) -> torch.Tensor:
        return torch.ones(4)

    def index(self) -> int:
        return 0


@pytest.mark.parametrize("already_done", [True, False])
def test_on_the_simulated_clock_a_bucket_completes_at_its_future_s_instant(already_done):
    """A future that completed before the recorder attached its callback runs that callback at once, on the
    training thread: the stamp is still the future's own instant on the clock, not that thread's reading."""
    SIMCLOCK.enable(parse_device("host"))
    fut: torch.futures.Future = torch.futures.Future()
    instant = SIMCLOCK.now() + 0.25
    SIMCLOCK.stamp(fut, instant)
    if already_done:
        fut.set_result([torch.ones(4)])
    recorder = HookRecorder().start()
    try:
        out = _wrap(lambda state, bucket: fut)(None, _Bucket())
        if not already_done:
            fut.set_result([torch.ones(4)])
        out.wait()
    finally:
        recorder.stop()
        SIMCLOCK.disable()
    (stamp,) = recorder.buckets
    assert stamp.done == pytest.approx(instant)
    assert stamp.done > stamp.returned
