"""Spawn a few ranks on this machine, collect what each returns, fail loudly.

This is the one launcher every multi-process part of gradwire uses (tests,
benchmarks, the training harness). It is ``torch.multiprocessing`` underneath,
with these things added that distributed work on one machine needs:

1. Results travel to the parent over a queue *before* the rank tears its
   process group down. Torch's gloo occasionally aborts a process at teardown
   ("terminate called without an active exception", SIGABRT); a rank that
   already sent its result is therefore counted as successful whatever its exit
   code says.
2. A rank that raises sends its formatted traceback; the parent re-raises it as
   :class:`RankError` naming the rank and kills the others, so a failing rank
   never leaves the rest hanging in a collective.
3. A hard timeout for the whole group.
4. Progress on the way: a rank may :func:`report` values while it runs; the
   parent hands them to ``on_report`` as they arrive, so a long group (many
   training runs in one set of processes) keeps what it finished even when a
   later part fails.

5. Fast starts: ranks are forked from a ``forkserver`` that has imported
   torch, torch.distributed and gradwire once (importing torch costs seconds
   of CPU per process; forking costs milliseconds), and ``torch._dynamo``,
   which the first ``DistributedDataParallel`` of a rank imports (2.7 s of
   every rank on a quiet 2-core host, up to 7 s on a busy one; the test
   suite's spawning files ran in a third to a half of the time with it
   preloaded). Trap: what these modules read from the environment at import
   (``TORCHDYNAMO_*``, ``TORCHINDUCTOR_*``) is the server's, taken when it
   started; set such variables before the first :func:`spawn`. The server holds no
   threads and no CUDA context, so each rank starts as clean as a spawned
   one. Two things a spawned process would read afresh are applied in the
   rank instead: the parent's environment as it is at :func:`spawn` (the
   server's is the one it started with), and what torch took from it at
   import (the thread count, ``TORCH_DISTRIBUTED_DEBUG``). Each rank also
   draws from its own random seed, as a fresh process does
   (:mod:`gradwire._forkserver`).

The worker function must be importable (a module-level function) because the
start method pickles it by reference.
"""
from __future__ import annotations

import os
import pickle
import queue as queue_mod
import random
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

__all__ = ["PRELOAD", "RankError", "free_port", "rank_context", "report", "spawn"]


class RankError(RuntimeError):
    """A spawned rank failed; the message carries that rank's traceback."""

    def __init__(self, rank: int, detail: str) -> None:
        super().__init__(f"rank {rank} failed:\n{detail}")
        self.rank = rank
        self.detail = detail


#: where :func:`free_port` looks when the kernel's ephemeral range is unknown, and the lowest port it takes
_EPHEMERAL_LOW, _LOWEST_PORT = 32768, 10000


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's ``ip_local_port_range``; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW


def free_port() -> int:
    """Return a TCP port that was free on every address a moment ago, below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` comes from the ephemeral
    range, from which every process's outgoing connections also take their
    local ports: between this call and the rendezvous store binding it,
    any connection on the machine could take it (a test suite running in
    parallel did: ``EADDRINUSE`` at ``init_process_group``). Below that range
    only servers that pick a number take ports, so a random free one there
    stays free unless another caller picks the same number in that moment.
    Where the range starts too low to leave room, the kernel's choice is used.
    """
    low = _ephemeral_low()
    if low - _LOWEST_PORT >= 1000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(_LOWEST_PORT, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@dataclass
class _Outcome:
    rank: int
    ok: bool
    value: Any


@dataclass
class _Report:
    rank: int
    value: bytes


#: the queue to the parent, in a rank started by :func:`spawn`
_channel: Any = None


def report(value: Any) -> None:
    """Send ``value`` (picklable) to the parent's ``on_report`` now, from inside a rank of :func:`spawn`.

    Reports from one rank arrive in the order sent, and before that rank's result.
    """
    if _channel is None:
        raise RuntimeError("report() is for code running in a rank started by gradwire.launch.spawn")
    _channel.put(_Report(int(os.environ["RANK"]), pickle.dumps(value)))


#: imported once by the fork server that ranks start from (module doc, item 5)
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "gradwire", "gradwire._forkserver")


def rank_context() -> Any:
    """The multiprocessing context ranks start from: a fork server with :data:`PRELOAD` imported.

    For a launcher of one's own: processes it starts see the environment the
    server started with, and torch's import-time settings from it (module doc);
    each draws from its own random seed.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def _entry(
    rank: int,
    world_size: int,
    fn: Callable[..., Any],
    args: Sequence[Any],
    env: Mapping[str, str],
    results: Any,
) -> None:
    os.environ.clear()
    os.environ.update(env)
    if "torch" in sys.modules and env.get("OMP_NUM_THREADS"):
        # torch was imported by the fork server (or while unpickling ``fn``) and
        # sized its pool from that environment: apply the ranks' thread count now.
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    if "torch.distributed" in sys.modules:
        sys.modules["torch.distributed"].set_debug_level_from_env()
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    global _channel
    _channel = results
    try:
        value = fn(rank, world_size, *args)
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        results.put(_Outcome(rank, False, traceback.format_exc()))
        raise SystemExit(1)
    # Plain pickle copies tensors by value; torch's queue pickler would share
    # their storage through file descriptors that die with this process.
    results.put(_Outcome(rank, True, pickle.dumps(value)))
    # Leave without running teardown handlers that may abort (see module doc):
    # the result is already delivered.


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    *,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    master_port: int | None = None,
    on_report: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes.

    Args:
        fn: a module-level function; what it returns must pickle.
        world_size: number of ranks, >= 1.
        args: extra positional arguments passed to every rank.
        timeout: seconds for the whole group; past it every rank is killed.
        env: extra environment variables for the ranks (e.g. ``GRADWIRE_NET``).
        master_port: port for the rendezvous store; a free one by default.
        on_report: called in the parent as ``on_report(rank, value)`` for every
            :func:`report` of a rank, as it arrives (reports without it are dropped).

    Returns:
        The ranks' return values, indexed by rank.

    Raises:
        RankError: the first rank that raised, with its traceback; the other
            ranks are terminated.
        TimeoutError: the group did not finish within ``timeout``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = rank_context()
    results = ctx.Queue()
    full_env = dict(os.environ)
    full_env.update({
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port or free_port()),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    })
    full_env.update(env or {})
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, fn, tuple(args), full_env, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    outcomes: dict[int, _Outcome] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcomes) < world_size:
            try:
                out: _Outcome = results.get(timeout=0.2)
            except queue_mod.Empty:
                dead = [
                    r for r, p in enumerate(procs)
                    if r not in outcomes and not p.is_alive() and p.exitcode not in (0, None)
                ]
                if dead:
                    # Give its message a moment to arrive: it is sent before exit.
                    try:
                        out = results.get(timeout=1.0)
                    except queue_mod.Empty:
                        r = dead[0]
                        raise RankError(r, f"process exited with code {procs[r].exitcode} and sent no result") from None
                elif time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(outcomes))
                    raise TimeoutError(f"ranks {missing} did not finish within {timeout:.0f} s")
                else:
                    continue
            if isinstance(out, _Report):
                if on_report is not None:
                    on_report(out.rank, pickle.loads(out.value))
                continue
            if not out.ok:
                raise RankError(out.rank, out.value)
            out.value = pickle.loads(out.value)
            outcomes[out.rank] = out
    finally:
        for p in procs:
            p.join(timeout=5 if len(outcomes) == world_size else 0.1)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return [outcomes[r].value for r in range(world_size)]
