"""The exit waits for gloo's workers to drop their last works."""
from __future__ import annotations

import ctypes
import os
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from gradwire.backend import teardown

needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc/self/task (Linux)")


def _named_thread(name: bytes, spin: threading.Event, stop: threading.Event) -> threading.Thread:
    """A thread that takes ``name`` as its kernel name, then spins while ``spin`` is set, until ``stop``."""
    def run() -> None:
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
        while not stop.is_set():
            if spin.is_set():
                sum(range(1000))  # busy: running and switching, as a worker dropping a work under the GIL
            else:
                stop.wait(0.5)  # asleep, as a worker on its empty queue
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@needs_proc
def test_a_gloo_group_s_idle_workers_are_found_and_quiet_at_once():
    store = dist.HashStore()
    gloo = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=10))
    x = torch.ones(4)
    gloo.allreduce([x]).wait()
    workers = teardown._workers()
    assert workers, workers  # torch starts worker threads per gloo group (two by default)
    start = time.monotonic()
    assert teardown.workers_quiet(limit=2.0)
    assert time.monotonic() - start < 1.0
    del gloo


@needs_proc
def test_a_worker_that_keeps_running_holds_the_exit_up_to_the_limit_only():
    spin, stop = threading.Event(), threading.Event()
    spin.set()
    t = _named_thread(teardown.WORKER.encode(), spin, stop)
    try:
        time.sleep(0.05)
        start = time.monotonic()
        assert not teardown.workers_quiet(limit=0.3)  # it ran through every poll
        waited = time.monotonic() - start
        assert 0.3 <= waited < 2.0, waited
        spin.clear()  # it goes to sleep: the wait ends
        assert teardown.workers_quiet(limit=2.0)
    finally:
        stop.set()
        t.join(5)
