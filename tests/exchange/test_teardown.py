"""An exchange's callbacks end before its process group can go (:func:`gradwire.exchange.futures.drain_at_destroy`)."""
from __future__ import annotations

import threading
import time

import torch.distributed as dist

import gradwire  # noqa: F401 - installs the drain
from gradwire.exchange.futures import counted
from gradwire.launch import free_port


def test_destroy_process_group_waits_for_a_callback_still_running() -> None:
    """On plain gloo an exchange's callbacks run on the backend's thread, which the group's destructor joins
    holding the GIL: a callback still running then hangs the rank. destroy_process_group lets it end first."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    ended: list[float] = []
    started = threading.Event()

    def callback() -> None:
        started.set()
        time.sleep(0.3)
        ended.append(time.monotonic())

    thread = threading.Thread(target=counted(callback))
    thread.start()
    started.wait()
    try:
        assert getattr(dist.destroy_process_group, "_drains_gradwire", False)
    finally:
        dist.destroy_process_group()
    destroyed = time.monotonic()
    thread.join()
    assert ended and ended[0] <= destroyed
