"""The completion machinery survives failing callbacks, owns its threads, and holds no lock across a wait."""
import threading
import time

import pytest

from gradwire.backend.completer import Completer
from gradwire.backend.work import _Deliveries, _Waiters
from gradwire.launch import spawn
from tests.backend import completion_workers


def test_a_raising_callback_does_not_end_the_completer_and_reaches_its_on_error():
    completer = Completer()
    errors: list[BaseException] = []
    ran = threading.Event()
    now = time.perf_counter()
    completer.at(now, lambda: 1 / 0, errors.append)
    completer.at(now + 0.01, ran.set)
    assert ran.wait(5), "the completer thread died with the first callback"
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    thread = completer._thread
    completer.close()
    assert thread is not None and not thread.is_alive()
    again = threading.Event()
    completer.at(time.perf_counter(), again.set)  # a closed completer starts again when needed
    assert again.wait(5)
    completer.close()


def test_a_raising_delivery_reaches_its_on_error_and_the_threads_close():
    deliveries = _Deliveries()
    errors: list[BaseException] = []
    ran = threading.Event()
    deliveries.submit(lambda: 1 / 0, on_error=errors.append)
    deliveries.submit(ran.set)
    assert ran.wait(5) and isinstance(errors[0], ZeroDivisionError)
    threads = list(deliveries._threads)
    deliveries.close()
    assert threads and not any(t.is_alive() for t in threads)


def test_the_wait_pool_is_made_once_under_concurrent_first_use(monkeypatch):
    import concurrent.futures

    made = []

    class SlowPool(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            made.append(self)
            time.sleep(0.05)  # widens the window in which a racy lazy global makes a second one
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ThreadPoolExecutor", SlowPool)
    waiters = _Waiters()
    start = threading.Barrier(8)
    ran = []

    def first_use():
        start.wait()
        waiters.submit(ran.append, 1)

    users = [threading.Thread(target=first_use) for _ in range(8)]
    for u in users:
        u.start()
    for u in users:
        u.join(10)
    assert len(made) == 1
    waiters.close()
    assert waiters._executor is None and made[0]._shutdown


def test_a_failing_hand_off_fails_its_op_and_later_ops_complete():
    res = spawn(completion_workers.failing_hand_off, 2, ("bandwidth=100mbit,latency=1ms",), timeout=90)
    for r in res:
        assert r["first"] is not None and r["first"][0] == "RuntimeError", r
        assert "can't start new thread" in r["first"][1] and r["first"][2] < 4, r
        assert r["second"] == [2.0, 2.0, 2.0], r


def test_asking_for_the_future_does_not_wait_for_an_inline_wait():
    """1 MiB at 10 Mbit/s: ~0.84 s in flight; the future is handed over at once and completes with the op."""
    res = spawn(completion_workers.future_during_inline_wait, 2, ("bandwidth=10mbit,latency=1ms", 1 << 20),
                timeout=90)
    for r in res:
        assert r["op"] > 0.6, r
        assert r["get_future"] < 0.3, r  # it waited for the whole op while the inline wait held the lock
        assert r["value"] == [2.0, 2.0] and r["completed"]


class _InnerWork:
    """What the inner backend's Work offers the completion path: its future, and a wait that raises its error."""

    def __init__(self, future) -> None:
        self._future = future

    def get_future(self):
        return self._future

    def wait(self) -> bool:
        self._future.wait()
        return True


@pytest.mark.parametrize("path", ["future", "inline"])
def test_an_inner_timeout_of_an_op_the_network_holds_past_its_timeout_names_the_network(path):
    """A peer held by an outage leaves this rank's real collective waiting as long as the op's own timeout:
    whichever fires first, the caller reads the simulated network's reason, with the inner error as its cause."""
    import torch.distributed as dist
    from torch.futures import Future

    from gradwire.backend.accounting import OpRecord
    from gradwire.backend.completer import CLOCK
    from gradwire.backend.work import Pending

    now = CLOCK.now()
    timeout = 0.2
    event = OpRecord("all_reduce", "0", 7, 1024, 1100, "ring", 5.0, now, now, now + 5.0)
    inner_future: Future = Future()
    pending = Pending(event, 1100, _InnerWork(inner_future), None, False, "gloo", timeout, "the simulated link is down from 1 s")
    gloo_error = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 200ms for send")
    threading.Timer(timeout + 0.05, inner_future.set_exception, (gloo_error,)).start()
    # the future carries it as torch's futures do (a RuntimeError with the error's text), wait() as it is
    with pytest.raises(RuntimeError, match="down from 1 s"):
        if path == "future":
            pending.chain().wait()
        else:
            pending.wait_inline()
    assert isinstance(pending.error, dist.DistBackendError) and pending.error.__cause__ is gloo_error
    assert event.error is not None and "down from 1 s" in event.error


def test_an_inner_failure_before_the_timeout_is_the_callers_error_even_when_the_network_is_slower():
    """A peer that died fails the op at once with gloo's own error, not later as a timeout of the network."""
    import torch.distributed as dist
    from torch.futures import Future

    from gradwire.backend.accounting import OpRecord
    from gradwire.backend.completer import CLOCK
    from gradwire.backend.work import Pending

    now = CLOCK.now()
    event = OpRecord("all_reduce", "0", 8, 1024, 1100, "ring", 5.0, now, now, now + 5.0)
    inner_future: Future = Future()
    pending = Pending(event, 1100, _InnerWork(inner_future), None, False, "gloo", 2.0, "")
    inner_future.set_exception(RuntimeError("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        pending.chain().wait()
