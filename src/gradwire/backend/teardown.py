"""Let the inner gloo groups release their works before the interpreter finalizes.

Every op an inner gloo group runs is an ``AsyncWork`` that holds the op's
tensors and a copy of the issuing thread's ``at::ThreadLocalState``; a
callback added to a torch future holds such a copy too. Dropping either
touches Python objects, so it takes the GIL: a tensor that Python has seen
decrefs its ``PyObject``, and torch's ``loss.backward()`` (2.13 here)
stashes a ``contextvars.Context`` in the thread's state
(``torch._C._stash_obj_in_tls("context", ...)``, torch/autograd/graph.py)
for the length of the backward pass, which is when DDP issues its
all_reduces.

The trap: gloo's worker thread (``pt_gloo_runloop``) drops its reference to
a work a moment after it completes the work's future. A script that returns
right after its last step can reach interpreter finalization inside that
moment; the worker's GIL acquire then ends the thread through a
``noexcept`` destructor and the process dies of SIGABRT ("terminate called
without an active exception") after its training finished. Measured with
plain gloo, no gradwire in the process: 11 of 30 two-rank DDP runs of
tests/compare/hang_ddp.py beside three busy loops on 2 cores (the general
case is pytorch issue 117762). torch offers no call that waits for a gloo
group's workers to let go; destroying the group would join them, but a
script's DDP module still holds the group at exit.

:func:`settle_at_exit` (registered with ``atexit``, which runs before
finalization) waits, with the GIL released, until every gloo worker thread
of the process sleeps and stays asleep over a poll: blocked on its empty
queue, done with its last work. A worker waiting for the GIL gets it while
this waits, so it shows up as running or switching. That covers whatever
Python object the work holds, so no op on the hot path pays for it (keeping
only the stash out of the inner ops cut the aborts of ``gradwire compare``
on that script from 9 to 3 in 30: the op's tensors remain). Linux only
(``/proc/self/task``); at most :data:`SETTLE_SECONDS`.
"""
from __future__ import annotations

import os
import time

__all__ = ["settle_at_exit", "workers_quiet"]

#: the name torch gives a gloo group's worker threads
WORKER = "pt_gloo_runloop"
#: the longest the exit waits for gloo's workers (a worker blocked in an op that never ends stays asleep: no wait)
SETTLE_SECONDS = 2.0
#: how long a worker must stay asleep, untouched, to count as done
QUIET_SECONDS = 0.005
_TASKS = "/proc/self/task"


def _workers() -> dict[str, tuple[str, str, str]]:
    """Each gloo worker thread's (state, voluntary and involuntary context switches), by thread id."""
    out: dict[str, tuple[str, str, str]] = {}
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # the thread ended
            continue
        if fields.get("Name", "").strip() == WORKER:
            out[tid] = (fields["State"].split()[0], fields["voluntary_ctxt_switches"].strip(),
                        fields["nonvoluntary_ctxt_switches"].strip())
    return out


def workers_quiet(limit: float = SETTLE_SECONDS) -> bool:
    """Wait until every gloo worker sleeps, unchanged over :data:`QUIET_SECONDS`; False if not within ``limit``.

    ``time.sleep`` releases the GIL, so a worker that needs it to drop a
    work runs meanwhile and is seen switching. True at once where there is
    no ``/proc`` (nothing to observe) or no worker.
    """
    deadline = time.monotonic() + limit
    before = _workers()
    while True:
        if not before:
            return True
        time.sleep(QUIET_SECONDS)
        now = _workers()
        if now == before and all(state == "S" for state, _, _ in now.values()):
            return True
        if time.monotonic() > deadline:
            return False
        before = now


def settle_at_exit() -> None:
    """At the interpreter's exit: let gloo's workers drop their last works first (module doc)."""
    workers_quiet()
