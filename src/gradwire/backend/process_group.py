"""The ``gradwire`` process group: real collectives, simulated network time.

Each op runs on a real inner backend (gloo for CPU tensors, nccl for CUDA
tensors, created lazily on first use), so every result is exactly what that
backend computes. NCCL refuses two ranks on one GPU ("Duplicate GPU
detected"), yet simulating 4 ranks on a one-GPU workstation is a main use: at
the first CUDA op the ranks exchange their devices' identities, and where two
share a GPU (or nccl is missing) CUDA tensors run on gloo, which takes CUDA
tensors for the collectives and stages them through host memory (send/recv,
which gloo takes on the CPU only, are staged here). What the simulation adds
is *when* the op completes:

1. At issue, the network model prices the op (seconds, bytes on the wire) for
   this group's ranks, and the op queues on the link of its rank set: it
   starts at ``max(now, busy_until)`` and the link is busy until
   ``start + seconds`` (full duplex: sends hold the transmit side, recvs the
   receive side). Groups over the same ranks share that link (``link.py``).
2. The inner collective is launched at once; the caller gets a
   :class:`GradwireWork` whose future is not yet complete.
3. When the inner collective finishes, its callback completes our future at
   the modelled time (realtime clock, via the completer thread) or at once
   (simulated clock: the rank's clock moves to the modelled end where the rank
   observes the op, simclock.py). The caller's thread never sleeps.

On the simulated clock an op starts at the instant the *last* rank of the
group issued it: at issue the ranks agree on that instant with a MAX
all_reduce of one number on a gloo group of their own (the clock group), in
the same order as the ops themselves. Point-to-point ops start at the
issuing rank's own instant.

On the ``local`` network none of this runs for a reduction: it is answered at
once from the rank's own data (``local.py``), at 0 s and 0 bytes on the wire;
the other ops run on the inner group at 0 s, as on ``loopback``.

Traps:
- Ranks price ops independently and identically: the modelled time is a pure
  function of (op, bytes, group, seq, spec), and jitter is drawn from
  (seed, seq), so a collective completes as one event for the whole group.
- Realtime clock: a rank that arrives early at a collective completes at
  ``max(own start + model, real end of the inner op)``: the realtime clock does
  not exchange issue times, so skew between ranks is not added to the modelled
  time (the real inner op's wait for the late rank shows it).
- CUDA: an inner work's future completes when its kernels are queued, and our
  futures carry no CUDA events; a helper thread waits for the device before
  our future completes (``work.Pending._on_inner``). Without that, a hook reading
  the result in a ``then`` callback (PyTorch's fp16 hook, local SGD's average)
  read it before gloo's copy back to the GPU landed: ranks diverged.
- Python process groups bypass the dispatcher, so torch.profiler shows the
  inner group's events (``c10d::allreduce_``, ``gloo:all_reduce``), not ours;
  the simulated network's own events are in the ledger's trace.

What model-parallel libraries expect of a group, and where it is met:
- a name and a description (``group.group_name``, ``group.group_desc``):
  DeviceMesh, ``new_subgroups``, ``destroy_process_group(group)`` and the
  functional collectives (which find a group by name from C++) read them.
  torch stores the name in a group's C++ backends, which a Python group has
  none of ("ProcessGroup name not set"), so the group keeps it itself.
- coalesced ops (``_coalescing_manager``, FSDP, functional collectives):
  ``allreduce_coalesced``, ``all_gather_single_coalesced`` and
  ``reduce_scatter_single_coalesced`` each run as one op of the inner backend
  and are priced as one collective of their total bytes (one set of latency
  steps, all the bytes); ``start_coalescing`` / ``end_coalescing`` collect
  point-to-point ops into one Work, each still priced on the link as it is.
- timeouts: the group's (or an op's ``opts.timeout``) applies to the
  simulated time, and ``Work.wait(timeout)`` bounds the wait (see ``work.py``).
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace
import socket
import threading
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch.futures import Future

from gradwire.backend import local
from gradwire.backend.accounting import OpRecord
from gradwire.backend.completer import CLOCK
from gradwire.backend.link import NicQueue, link_for
from gradwire.backend.simclock import SIMCLOCK
from gradwire.backend.shared import SharedLink
from gradwire.backend.work import CoalescedWork, GradwireWork, Pending, seconds_of, translate
from gradwire.net import NetSpec, NetworkModel, OpCost, busbw_factor

__all__ = ["GradwireProcessGroup", "GradwireWork", "cuda_inner_for"]

_AVG = dist.ReduceOp.AVG
_LOG = logging.getLogger("gradwire")


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class GradwireProcessGroup(dist.ProcessGroup):
    """A torch.distributed ProcessGroup that simulates the network it runs on.

    Created by ``init_process_group("gradwire")`` / ``new_group`` through the
    registered creator; users do not construct it directly.
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        global_ranks: Sequence[int],
        group_id: str,
        model: NetworkModel,
        origin: float = 0.0,
        job: str = "",
    ) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # torch's stub lacks the (rank, size) constructor
        from torch.distributed.distributed_c10d import ProcessGroupGloo

        self._store = store
        self._timeout = timeout
        self._timeout_s = seconds_of(timeout) or math.inf
        self._ranks = tuple(global_ranks) if global_ranks else tuple(range(size))
        self._group_id = group_id
        #: torch names every group (``setGroupName``); functional collectives find it by that name
        self._group_name = group_id
        self._model = model
        #: the clock's time at t = 0 of the network's schedule (the default group's creation)
        self._origin = origin
        #: ops priced at the instant they start, not at issue: a network that changes, or TCP links whose
        #: window restarts after an idle (this group's own connections: when their last op ended)
        tcp = model.inter_link.tcp
        #: the named bottleneck this job shares with others on the machine (shared.py), if any
        self._shared = SharedLink(model.spec.link, job) if model.spec.link is not None else None
        self._priced_at_start = model.schedule is not None or self._shared is not None or (
            tcp is not None and tcp.enabled and tcp.slow_start_after_idle)
        self._last_end: float | None = None
        #: an idle this short never restarts TCP's window (the RTO is at least rto_min)
        self._warm_idle = tcp.rto_min if tcp is not None else math.inf
        self._simulated = model.spec.clock == "sim"
        #: the ``local`` network: ops answered from this rank's data, no inner op runs (local.py)
        self._local = model.spec.is_local
        gloo = ProcessGroupGloo(dist.PrefixStore("gradwire/gloo/", store), rank, size, timeout)
        self._gloo_backend = gloo
        self._gloo = _inner_group(gloo, "cpu", store, rank, size, timeout)
        #: the simulated clock's agreement on issue instants, apart from the data's ops (module doc)
        self._clock_group: Any = (ProcessGroupGloo(dist.PrefixStore("gradwire/clock/", store), rank, size, timeout)
                             if self._simulated and size > 1 else None)
        #: an op's clock agreement and its launch are one step: every rank enqueues both in the same order
        self._issue_lock = threading.Lock()
        self._nccl: Any = None
        #: the inner backend of CUDA tensors, chosen at the first CUDA op: "nccl" or "gloo"
        self.cuda_inner: str | None = None
        self._lock = threading.Lock()
        self._cuda_lock = threading.Lock()
        self._seq = 0
        #: the rank set's NIC, shared with every group of the same ranks (link.py)
        # on the simulated clock each group queues on a link of its own: ops of two groups reach a shared queue in
        # the order their threads really issue them, which varies from run to run, and the simulated clock's
        # figures must not (contention between groups of the same ranks is then not modelled)
        self._link = NicQueue() if self._simulated else link_for(model, self._ranks)
        #: works launched between start_coalescing and end_coalescing
        self._coalesced: list[GradwireWork] | None = None
        # a plain dict, not functools.lru_cache on a bound method: that would make
        # a reference cycle, leaving the inner gloo group to the cyclic GC, which can
        # free it on one of gloo's own threads and abort the process at exit
        self._priced: dict[tuple, OpCost] = {}
        self._deterministic = model.is_zero or not _has_randomness(model.spec)
        #: the backend name torch's get_backend reports for this group, and what getBackendName says (names.py)
        self._reported = self._group_level = "gradwire"

    # ---- plumbing -------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name, behind ``name()`` and ``_get_backend_name()``
        return self._group_level

    @property
    def reported_backend(self) -> str:
        """The backend name this group reports: ``gradwire``, or the one the script asked for (names.py)."""
        return self._reported

    def _set_reported(self, name: str, group_level: str) -> None:
        """Report ``name`` (names.py). A group that says ``gloo`` also lends torch its inner gloo backend:
        DDP's C++ logger, seeing the name ``gloo``, reads the gloo backend's thread count through
        ``getBackend(GLOO)`` and raises "Could not find backend type 1" on a group without one."""
        self._reported, self._group_level = name, group_level
        if group_level == "gloo":
            self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo_backend)

    def getGroupName(self) -> str:  # noqa: N802 - torch's name, read by ``group.group_name``
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name, called by init/new_group
        self._group_name = name

    def shutdown(self) -> None:
        """Shut the inner backends down from the calling thread (``destroy_process_group``).

        Left to garbage collection, an inner gloo group can be destroyed on one
        of its own worker threads, which aborts the process at exit
        ("terminate called without an active exception").
        """
        for inner in (self._gloo, self._nccl, self._clock_group):
            if inner is not None:
                inner.shutdown()

    @property
    def group_id(self) -> str:
        return self._group_id

    @property
    def network(self) -> NetworkModel:
        return self._model

    def network_now(self) -> tuple[float, float, float]:
        """The modelled link of this group at this moment, for code that adapts to the network (``auto``).

        ``(alpha, beta, next_change)``: the seconds of a one-element
        all_reduce, the seconds per bus byte of a large one beyond it (the
        nccl-tests convention: ``2 (n - 1) / n`` of the tensor's bytes), both on
        the condition the schedule is in now, warm connections and no
        background flows; and the seconds until that condition may next change
        (``inf`` on a network that never does). During an outage alpha and
        beta are ``inf``. What an op takes on this backend is at least this:
        it also waits for the inner backend (``max`` of the two, completer.py).
        """
        with SIMCLOCK.backend_work():
            now = CLOCK.now() - self._origin
        cond, change = self._model.condition(now)
        if cond.down:
            return math.inf, math.inf, change - now
        model = self._model.at(cond) if self._model.schedule is not None else self._model
        large = 1 << 22
        small_s = model.cost("all_reduce", 4, ranks=self._ranks).seconds
        large_s = model.cost("all_reduce", large, ranks=self._ranks).seconds
        busbytes = large * busbw_factor("all_reduce", len(self._ranks))
        return small_s, max(0.0, large_s - small_s) / busbytes if busbytes else 0.0, change - now

    @property
    def global_ranks(self) -> tuple[int, ...]:
        """The global ranks of this group, in group-rank order; the network prices ops on their nodes."""
        return self._ranks

    def _inner(self, tensors: Sequence[torch.Tensor], collective: bool = True) -> Any:
        """The inner backend of an op on ``tensors``.

        Only a collective (every rank takes part) may make the CUDA choice, which
        is an exchange between all ranks; point-to-point ops before it run on gloo,
        staged (the two peers are in the same state, so they agree).
        """
        if tensors and tensors[0].is_cuda:
            if self.cuda_inner is None:
                if not collective:
                    return self._gloo
                self._choose_cuda_inner(tensors[0].device)
            return self._nccl if self.cuda_inner == "nccl" else self._gloo
        return self._gloo

    def _choose_cuda_inner(self, device: torch.device) -> None:
        """nccl when every rank of the group has a GPU of its own, else gloo (module doc).

        Collective: every rank reaches its first CUDA op in the same order, so
        the exchange through the group's store lines up.
        """
        with self._cuda_lock:
            if self.cuda_inner is not None:
                return
            store = dist.PrefixStore("gradwire/cuda/", self._store)
            store.set(str(self.rank()), _device_identity(device))
            ids = [store.get(str(r)).decode() for r in range(self.size())]
            name, why = cuda_inner_for(ids, dist.is_nccl_available())
            if name == "nccl":
                from torch.distributed.distributed_c10d import ProcessGroupNCCL

                # torch's stub lacks the (store, rank, size, timeout=default) constructor
                nccl = ProcessGroupNCCL(  # type: ignore[call-arg]
                    dist.PrefixStore("gradwire/nccl/", self._store), self.rank(), self.size())
                self._nccl = _inner_group(nccl, "cuda", self._store, self.rank(), self.size(), self._timeout)
            elif self.rank() == 0:
                _LOG.info("gradwire group %s: CUDA tensors run on gloo (%s)", self._group_id, why)
            self.cuda_inner = name

    def _price(self, op: str, nbytes: int, seq: int, src: int | None, dst: int | None,
               inner: str = "gloo") -> OpCost:
        """The model's price of one op on the inner backend ``inner`` (its transport, when the spec's is auto);
        without jitter it depends on no seq, so it is cached."""
        model = self._model.for_inner(inner)
        if not self._deterministic:
            return model.cost(op, nbytes, ranks=self._ranks, seq=seq, src=src, dst=dst)
        key = (op, nbytes, src, dst, model is self._model)
        cost = self._priced.get(key)
        if cost is None:
            if len(self._priced) > 4096:
                self._priced.clear()
            cost = self._priced[key] = model.cost(op, nbytes, ranks=self._ranks, seq=0, src=src, dst=dst)
        return cost

    def _launch(
        self,
        op: str,
        nbytes: int,
        tensors: Sequence[torch.Tensor],
        start_inner: Callable[[Any], Any],
        *,
        post: Callable[[], Any] | None = None,
        src: int | None = None,
        dst: int | None = None,
        opts: Any = None,
        source_of: Callable[[], int] | None = None,
        label: str | None = None,
        answer: Callable[[], Any] | None = None,
    ) -> GradwireWork:
        """Price ``op``, queue it on the link, run it on the inner backend.

        ``label`` names the op in the accounting where it differs from the
        priced pattern: a receive is priced as the ``send`` it takes part in
        and counted as ``recv`` (bytes received, nothing sent). ``answer``
        computes a reduction from this rank's own data on the ``local``
        network (local.py), which runs it instead of the inner op, at 0 s
        and 0 bytes on the wire.
        """
        if not self._simulated or (self._local and answer is not None and op in local.ANSWERED):
            return self._launch_now(op, nbytes, tensors, start_inner, post, src, dst, opts, source_of, label, answer)
        with SIMCLOCK.backend_work():
            issued = SIMCLOCK.now()
            tag = SIMCLOCK.tag_for_issue()
            with self._issue_lock:
                now = self._agreed(issued) if op != "send" else issued
                work = self._launch_now(op, nbytes, tensors, start_inner, post, src, dst, opts, source_of, label,
                                        answer, now, tag)
        SIMCLOCK.issued(work._pending, tag, work._pending.event.modelled_done)
        return work

    def _agreed(self, issued: float) -> float:
        """The simulated instant the last rank of the group issued this op (a MAX over the clock group)."""
        if self._clock_group is None:
            return issued
        t = torch.tensor([issued], dtype=torch.float64)
        opts = c10d.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX  # type: ignore[assignment]  # torch's stub types the field as ReduceOp
        self._clock_group.allreduce([t], opts).wait()
        return float(t.item())

    def _launch_now(self, op: str, nbytes: int, tensors: Sequence[torch.Tensor], start_inner: Callable[[Any], Any],
                    post: Callable[[], Any] | None, src: int | None, dst: int | None, opts: Any,
                    source_of: Callable[[], int] | None, label: str | None, answer: Callable[[], Any] | None,
                    now: float | None = None, tag: Any = None) -> GradwireWork:
        """:meth:`_launch` from the instant ``now`` the op is issued at (default: the clock's now)."""
        if self._local and answer is not None and op in local.ANSWERED:
            return self._answer_locally(label or op, nbytes, answer, opts)
        inner = self._inner(tensors, collective=op != "send")
        me = self._ranks[self.rank()]
        sends, receives = (src == me, dst == me) if op == "send" else (True, True)
        cause = ""
        with self._lock:
            seq = self._seq
            self._seq += 1
            carrier = _backend_name(inner)
            cost = self._price(op, nbytes, seq, src, dst, carrier)
            # a full-duplex NIC: a send holds the transmit side, a recv the
            # receive side, a collective both; groups of the same ranks share it
            if now is None:
                now = CLOCK.now()
            if not self._priced_at_start:
                start, done = self._link.reserve(now, cost.seconds, sends, receives)
            else:  # priced from the instant the queue lets it start: a changing network, TCP's idle restart
                start, done = self._link.reserve(
                    now, lambda at: self._price_at(op, nbytes, seq, src, dst, at, carrier), sends, receives)
                self._last_end = done
                if self._model.schedule is not None:
                    cause = self._outage_in(start, done)
                if self._shared is not None:
                    self._shared.busy_until(done)
        event = OpRecord(label or op, self._group_id, seq, cost.payload_bytes, cost.wire_bytes, cost.algorithm,
                      done - start, now, start, done,
                      floating=not tensors or any(t.is_floating_point() for t in tensors))
        try:
            work = start_inner(inner)
        except RuntimeError as exc:
            new = translate(exc, op, _backend_name(inner))
            if new is exc:
                raise
            raise new from exc
        return self._track(event, cost.sent_bytes if sends else 0, work, post, _backend_name(inner), opts, source_of,
                           cause, tag)

    def _price_at(self, op: str, nbytes: int, seq: int, src: int | None, dst: int | None, at: float,
                  inner: str = "gloo") -> float:
        """Modelled seconds of an op that starts at ``at`` (the clock's time) on the network's schedule.

        One that ends past the group's timeout fails at the timeout, as gloo's
        would (work.py); one that would not end within a day (an outage
        without end) is priced just past that.
        """
        horizon = 24 * 3600.0  # an op that ends past its timeout fails at the timeout (work.py), with its real need
        # how long this group's connections were quiet: TCP restarts its window after an idle past the RTO
        idle = None if self._last_end is None else max(0.0, at - self._last_end)
        others = self._shared.others(at) if self._shared is not None else 0
        if others:  # a fair share of the named link, on the condition the op starts in
            cond = self._model.condition(at - self._origin)[0]
            rate = (self._model.spec.bandwidth if cond.bandwidth is None else cond.bandwidth) / (others + 1)
            return self._model.at(replace(cond, bandwidth=rate, down=False)).for_inner(inner).cost(
                op, nbytes, ranks=self._ranks, seq=seq, src=src, dst=dst, idle=idle).seconds
        if self._model.schedule is None and idle is not None and idle <= self._warm_idle:
            return self._price(op, nbytes, seq, src, dst, inner).seconds  # a warm connection: the cached price
        seconds = self._model.for_inner(inner).cost(op, nbytes, ranks=self._ranks, seq=seq, src=src, dst=dst,
                                                    start=at - self._origin, horizon=horizon, idle=idle).seconds
        return seconds if math.isfinite(seconds) else horizon * 2 + 1.0

    def _outage_in(self, start: float, done: float) -> str:
        """Words for an outage of the schedule that the op from ``start`` to ``done`` meets ("" if none)."""
        assert self._model.schedule is not None
        t, end = start - self._origin, min(done, start + self._timeout_s) - self._origin
        while t < end:
            cond, change = self._model.condition(t)
            if cond.down:
                return (f"the simulated link is down from {t:.3f} s to {change:.3f} s of the network's schedule "
                        f"(t = 0 when the default group was created)")
            t = change if change > t else math.nextafter(t, math.inf)  # a floating-point tie: step past it
        return ""

    def _answer_locally(self, op: str, nbytes: int, answer: Callable[[], Any], opts: Any) -> GradwireWork:
        """The ``local`` network's op: answered now from this rank's data, counted with 0 s and 0 wire bytes."""
        with self._lock:
            seq = self._seq
            self._seq += 1
        now = CLOCK.now()
        event = OpRecord(op, self._group_id, seq, nbytes, 0, "local", 0.0, now, now, now)
        done: Future = Future()
        done.set_result(answer())
        work = c10d._create_work_from_future(done)  # type: ignore[attr-defined]  # missing from torch's stub
        return self._track(event, 0, work, None, "local", opts, None)

    def _track(self, event: OpRecord, sent: int, work: Any, post: Callable[[], Any] | None, backend: str, opts: Any,
               source_of: Callable[[], int] | None, cause: str = "", tag: Any = None) -> GradwireWork:
        """The Work of a launched op: completes when its inner work and the modelled time are done."""
        timeout = seconds_of(getattr(opts, "timeout", None)) or self._timeout_s
        pending = Pending(event, sent, work, post, self._simulated, backend, timeout, cause, tag)
        if getattr(opts, "asyncOp", True):  # async callers get background completion
            pending.chain()
        result = GradwireWork(pending, event.op, source_of)
        if self._coalesced is not None:
            self._coalesced.append(result)
        return result

    def _reduction(self, opts: Any, outputs: list[torch.Tensor],
                   divided: list[torch.Tensor] | None = None) -> tuple[Any, Callable[[], Any] | None]:
        """The option hook of every reducing op: the options the inner backend gets, and what runs after it.

        ``ReduceOp.AVG`` runs as SUM, then a division of ``divided`` (default:
        ``outputs``) by the group size, with NCCL's semantics (``ncclAvg``):
        floating point and complex tensors are divided exactly; integer
        tensors are divided truncating toward zero (NCCL's ``x / n`` in C,
        ``torch.div(..., rounding_mode="trunc")``: -3 / 2 is -1, not the
        floor's -2), after a sum that wraps around as the dtype does.
        ``bool`` tensors are refused on every rank, as NCCL refuses them.
        The caller's options object is left as it is (DDP passes its own).
        """
        if opts.reduceOp != _AVG:
            return opts, None
        if self._local:  # answered from the own data, AVG as it is (local.py)
            _check_avg(outputs)
            return opts, None
        return _sum_then_divide(opts, outputs, outputs if divided is None else divided, self.size())

    # ---- collectives ----------------------------------------------------
    # Each op takes the (tensors, opts) form that distributed_c10d and the C++
    # dispatcher call. torch's stub also lists the binding's convenience
    # overloads (one tensor, op=..., timeout=...), which this group does not
    # accept: hence the ``override`` ignores. The aliases give an op torch's
    # other name; the stub names their parameters differently.
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> GradwireWork:  # type: ignore[override]
        opts, post = self._reduction(opts or c10d.AllreduceOptions(), tensors)
        return self._launch("all_reduce", _nbytes(tensors), tensors, lambda b: b.allreduce(tensors, opts), post=post,
                            opts=opts, answer=lambda: local.reduce_(tensors, opts.reduceOp, self.size()))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> GradwireWork:
        """One all_reduce of the tensors' total bytes, as the inner backend runs it (one flat buffer)."""
        opts, post = self._reduction(opts or c10d.AllreduceCoalescedOptions(), tensors)
        return self._launch("all_reduce", _nbytes(tensors), tensors, lambda b: b.allreduce_coalesced(tensors, opts),
                            post=post, opts=opts, answer=lambda: local.reduce_(tensors, opts.reduceOp, self.size()))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> GradwireWork:  # type: ignore[override]
        opts = opts or c10d.BroadcastOptions()
        return self._launch("broadcast", _nbytes(tensors), tensors, lambda b: b.broadcast(tensors, opts), opts=opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> GradwireWork:  # type: ignore[override]
        opts = opts or c10d.ReduceOptions()
        # only the root holds the result; every rank checks (a root-only error would leave the others waiting)
        root = self.rank() == opts.rootRank
        opts, post = self._reduction(opts, tensors, divided=tensors if root else [])

        def answer() -> Any:  # the root's result; the others' buffers stay as they are
            local.reduce_(tensors if root else [], opts.reduceOp, self.size())
            return tensors

        return self._launch("reduce", _nbytes(tensors), tensors, lambda b: b.reduce(tensors, opts), post=post, opts=opts,
                            answer=answer)

    def allgather(  # type: ignore[override]
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None,
    ) -> GradwireWork:
        opts = opts or c10d.AllgatherOptions()
        return self._launch("all_gather", _nbytes(inputs) * self.size(), inputs,
                            lambda b: b.allgather(output_lists, inputs, opts), opts=opts)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> GradwireWork:
        opts = opts or c10d.AllgatherOptions()
        return self._launch("all_gather", _nbytes(inputs) * self.size(), inputs,
                            lambda b: b.allgather_coalesced(output_lists, inputs, opts), opts=opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> GradwireWork:  # noqa: A002
        opts = opts or c10d.AllgatherOptions()
        return self._launch("all_gather", _nbytes([output]), [input],
                            lambda b: b._allgather_base(output, input, opts), opts=opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> GradwireWork:
        """``all_gather_into_tensor`` of several tensors in one launch (``_coalescing_manager``, FSDP).

        Priced as one all_gather of the outputs' total bytes: a coalesced launch
        pays the latency steps once and moves all the bytes.
        """
        opts = opts or c10d.AllgatherOptions()
        return self._launch("all_gather", _nbytes(outputs), inputs,
                            lambda b: b.allgather_into_tensor_coalesced(outputs, inputs, opts), opts=opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]

    def reduce_scatter(  # type: ignore[override]
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None,
    ) -> GradwireWork:
        opts, post = self._reduction(opts or c10d.ReduceScatterOptions(), outputs)

        def answer() -> Any:
            for out, ins in zip(outputs, input_lists):
                out.copy_(ins[self.rank()])
            return local.reduce_(outputs, opts.reduceOp, self.size())

        return self._launch("reduce_scatter", _nbytes(outputs) * self.size(), outputs,
                            lambda b: b.reduce_scatter(outputs, input_lists, opts), post=post, opts=opts, answer=answer)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> GradwireWork:  # noqa: A002
        opts, post = self._reduction(opts or c10d.ReduceScatterOptions(), [output])
        return self._launch("reduce_scatter", _nbytes([input]), [input],
                            lambda b: b._reduce_scatter_base(output, input, opts), post=post, opts=opts,
                            answer=lambda: self._scatter_own([output], [input], opts.reduceOp))

    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> GradwireWork:
        """``reduce_scatter_tensor`` of several tensors in one launch; priced as one op of the inputs' total bytes."""
        opts, post = self._reduction(opts or c10d.ReduceScatterOptions(), outputs)
        return self._launch("reduce_scatter", _nbytes(inputs), inputs,
                            lambda b: b.reduce_scatter_tensor_coalesced(outputs, inputs, opts), post=post, opts=opts,
                            answer=lambda: self._scatter_own(outputs, inputs, opts.reduceOp))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def all_to_all_single(
        self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
        output_split_sizes: list[int], input_split_sizes: list[int], opts: Any = None,
    ) -> GradwireWork:
        opts = opts or c10d.AllToAllOptions()
        return self._launch("all_to_all", _nbytes([input]), [input],
                            lambda b: b.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts),
                            opts=opts)

    alltoall_base = all_to_all_single  # type: ignore[assignment]

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> GradwireWork:
        opts = opts or c10d.AllToAllOptions()
        return self._launch("all_to_all", _nbytes(inputs), inputs, lambda b: b.alltoall(outputs, inputs, opts), opts=opts)

    def gather(  # type: ignore[override]
        self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None,
    ) -> GradwireWork:
        opts = opts or c10d.GatherOptions()
        return self._launch("gather", _nbytes(inputs) * self.size(), inputs,
                            lambda b: b.gather(output_lists, inputs, opts), opts=opts)

    def scatter(  # type: ignore[override]
        self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None,
    ) -> GradwireWork:
        opts = opts or c10d.ScatterOptions()
        return self._launch("scatter", _nbytes(outputs) * self.size(), outputs,
                            lambda b: b.scatter(outputs, input_lists, opts), opts=opts)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> GradwireWork:
        staged = self._host_staged(tensors)
        return self._launch("send", _nbytes(tensors), tensors, lambda b: b.send(staged, dst, tag),
                            src=self._ranks[self.rank()], dst=self._ranks[dst])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> GradwireWork:
        staged = self._host_staged(tensors, copy=False)
        return self._launch("send", _nbytes(tensors), tensors, lambda b: b.recv(staged, src, tag),
                            post=_copy_back(staged, tensors), src=self._ranks[src], dst=self._ranks[self.rank()],
                            source_of=lambda: src, label="recv")

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> GradwireWork:
        """A receive from whichever rank sends first; its Work tells the sender (``_source_rank``).

        The sender is unknown at issue, so the op is priced on the slowest link of the group.
        """
        me = self._ranks[self.rank()]
        staged = self._host_staged(tensors, copy=False)
        inner_work: list[Any] = []

        def start(b: Any) -> Any:
            inner_work.append(b.recv_anysource(staged, tag))
            return inner_work[0]

        return self._launch("send", _nbytes(tensors), tensors, start, post=_copy_back(staged, tensors), src=None,
                            dst=me, source_of=lambda: inner_work[0]._source_rank(), label="recv")

    def _host_staged(self, tensors: list[torch.Tensor], copy: bool = True) -> list[torch.Tensor]:
        """CUDA tensors of point-to-point ops on gloo, staged in host memory.

        gloo's send/recv take CPU tensors only; given CUDA memory they abort the
        process ("writev: Bad address") instead of raising, so they never see it.
        """
        if not (tensors and tensors[0].is_cuda and self._inner(tensors, collective=False) is self._gloo):
            return tensors
        return [t.cpu() if copy else torch.empty(t.shape, dtype=t.dtype) for t in tensors]

    def barrier(self, opts: Any = None) -> GradwireWork:
        opts = opts or c10d.BarrierOptions()
        return self._launch("barrier", 0, [], lambda b: b.barrier(opts), opts=opts)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier on the inner group, priced as a barrier.

        Rank 0 collects every other rank within ``timeout`` (default: the
        group's; zero means no time at all, as in gloo) and raises naming the
        first rank (or, with ``wait_all_ranks``, every rank) that did not
        arrive; the others raise when rank 0 gives up.
        """
        limit = self._timeout if timeout is None else timeout

        def start(b: Any) -> Any:
            b.monitored_barrier(limit, wait_all_ranks)
            done: Future = Future()
            done.set_result([])
            return c10d._create_work_from_future(done)  # type: ignore[attr-defined]  # missing from torch's stub

        opts = c10d.BarrierOptions()
        opts.asyncOp = False
        self._launch("barrier", 0, [], start, opts=opts).wait()

    # ---- the local network's answers (local.py) ------------------------
    def _scatter_own(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], op: Any) -> list[torch.Tensor]:
        """reduce_scatter_tensor: the own chunk of each input, reduced as if every rank held it."""
        for out, inp in zip(outputs, inputs):
            out.copy_(local.chunk_of(inp, self.rank(), self.size()).view_as(out))
        return local.reduce_(outputs, op, self.size())

    # ---- coalescing -------------------------------------------------------
    def start_coalescing(self, device: torch.device) -> None:
        """Begin collecting ops into one Work (``_coalescing_manager(group, device)``).

        The ops still start at once, each priced with its own pattern on the
        link (point-to-point sends and receives overlap on the full-duplex NIC);
        ``end_coalescing`` hands back one Work for all of them.
        """
        if self._coalesced is not None:
            raise RuntimeError("gradwire: start_coalescing called while this group is already coalescing; "
                               "call end_coalescing first")
        self._coalesced = []

    def end_coalescing(self, device: torch.device) -> dist._Work:
        """The Work of every op since ``start_coalescing``; it completes when they all have."""
        if self._coalesced is None:
            raise RuntimeError("gradwire: end_coalescing called without start_coalescing")
        works, self._coalesced = self._coalesced, None
        return CoalescedWork(works)

    # what ``_coalescing_manager`` calls from Python (C++ callers reach the two above)
    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing


def _copy_back(staged: list[torch.Tensor], tensors: list[torch.Tensor]) -> Callable[[], Any] | None:
    """After a staged recv: copy the host buffers into the caller's CUDA tensors."""
    if staged is tensors:
        return None

    def copy() -> list[torch.Tensor]:
        for dst, src in zip(tensors, staged):
            dst.copy_(src)
        return list(tensors)

    return copy


def cuda_inner_for(device_ids: Sequence[str], nccl_available: bool) -> tuple[str, str]:
    """The inner backend for CUDA tensors, from every rank's GPU identity; and why.

    >>> cuda_inner_for(["h/GPU-a", "h/GPU-b"], True)
    ('nccl', 'one GPU per rank')
    >>> cuda_inner_for(["h/GPU-a", "h/GPU-a"], True)[0]
    'gloo'
    """
    shared = sorted({i for i in device_ids if list(device_ids).count(i) > 1})
    if shared:
        ranks = [r for r, i in enumerate(device_ids) if i == shared[0]]
        return "gloo", f"ranks {ranks} share GPU {shared[0]}; NCCL needs one GPU per rank"
    if not nccl_available:
        return "gloo", "this torch build has no nccl"
    return "nccl", "one GPU per rank"


def _device_identity(device: torch.device) -> str:
    """host and GPU UUID (its index where torch does not expose the UUID)"""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
    if not uuid or " at 0x" in uuid:  # no UUID, or an object without a string form
        uuid = f"cuda:{index}"
    return f"{socket.gethostname()}/{uuid}"


def _backend_name(inner: Any) -> str:
    try:
        return inner.name()
    except Exception:  # noqa: BLE001
        return type(inner).__name__


def _has_randomness(spec: NetSpec) -> bool:
    return bool(getattr(spec, "jitter", 0.0))


def _check_avg(tensors: Sequence[torch.Tensor]) -> None:
    for t in tensors:
        if t.dtype == torch.bool:
            raise TypeError("gradwire: cannot use ReduceOp.AVG with boolean inputs (NCCL refuses them too); "
                            "use ReduceOp.MAX for any, ReduceOp.MIN for all, or convert to an integer dtype first")


def _inner_group(backend: Any, device: str, store: dist.Store, rank: int, size: int,
                 timeout: timedelta) -> dist.ProcessGroup:
    """A plain c10d ProcessGroup around one inner backend, as torch builds one for ``gloo`` / ``nccl``.

    Through it the inner backend's C++ ops that its Python binding lacks
    (``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``)
    are reachable. With ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` the backend is
    wrapped in torch's ProcessGroupWrapper, which checks before every
    collective that all ranks call the same op with the same shapes
    ("Detected mismatch between collectives"). torch would wrap a built-in
    backend itself, but it hands a Python process group through unwrapped.
    """
    from torch.distributed.distributed_c10d import (DebugLevel, ProcessGroupGloo, _create_process_group_wrapper,
                                                    get_debug_level)

    kind = dist.ProcessGroup.BackendType.GLOO if isinstance(backend, ProcessGroupGloo) else dist.ProcessGroup.BackendType.NCCL
    if hasattr(backend, "_set_sequence_number_for_group"):
        backend._set_sequence_number_for_group()
    if get_debug_level() == DebugLevel.DETAIL:
        backend = _create_process_group_wrapper(backend, f"gradwire/{device}", store, rank, size, timeout)
    group = dist.ProcessGroup(store, rank, size)
    group._set_default_backend(kind)
    # gloo also takes the CUDA tensors of ranks that share a GPU (module doc); a plain
    # ProcessGroup routes tensors by device type, so it must know gloo for both
    for dev in ("cpu", "cuda") if kind == dist.ProcessGroup.BackendType.GLOO else (device,):
        group._register_backend(torch.device(dev), kind, backend)
    return group


#: what a reducing op's options carry besides the op (torch 2.13), copied onto the SUM that stands in for AVG
_OPTION_FIELDS = ("timeout", "asyncOp", "rootRank", "rootTensor")


def _sum_then_divide(opts: Any, outputs: Sequence[torch.Tensor], divided: Sequence[torch.Tensor],
                     size: int) -> tuple[Any, Callable[[], Any]]:
    """ReduceOp.AVG on a backend without it (gloo): reduce with SUM, then divide (see ``_reduction``)."""
    _check_avg(outputs)
    summed = type(opts)()
    for name in _OPTION_FIELDS:
        if hasattr(opts, name):
            setattr(summed, name, getattr(opts, name))
    summed.reduceOp = dist.ReduceOp.SUM

    def divide() -> list[torch.Tensor]:
        for t in divided:
            if t.is_floating_point() or t.is_complex():
                t.div_(size)
            else:
                t.div_(size, rounding_mode="trunc")
        return list(outputs)

    return summed, divide
