"""Every process of one training, whatever session it is in: found, stopped within seconds, reaped.

Traps this module exists for:

- torchrun starts each worker in a session of its own, so killing the
  launcher's process group leaves the workers running; a launcher killed
  with SIGKILL cannot forward the signal, and its workers become orphans;
- an orphan is reparented to init, where no walk of the tree from the
  launcher finds it again (a DataLoader worker of a killed rank, too).

So:

1. The comparing process becomes a *child subreaper* for the comparison
   (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): an orphan anywhere below it is
   reparented to it instead of init, and stays in its tree.
2. The tree is walked by parent pid (``psutil``), never by process group or
   session. Every process seen below a training while it runs is remembered;
   a remembered ``psutil.Process`` keeps its start time, so a pid reused by
   an unrelated process is never signalled.
3. :meth:`ProcessTree.stop` sends SIGTERM to every process of the tree at
   once (a launcher that forwards it to its workers then finds them already
   told), waits a short grace, sends SIGKILL to what is left, and waits for
   each: a direct child or an orphan reparented here is reaped, no zombie
   stays.

Without a subreaper (not Linux) step 2 still covers every process seen
while its parent was alive; :func:`become_subreaper` says what is missing.
Signals the comparing process gets (SIGTERM, SIGHUP) become
:class:`ComparisonStopped`, a ``KeyboardInterrupt``, so one path stops a training on
Ctrl-C, on ``kill`` and on a closed terminal.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any, Iterator

import psutil

__all__ = ["GRACE", "ProcessTree", "ComparisonStopped", "become_subreaper", "deferred_signals", "signals_stop", "subreaper"]

#: seconds between SIGTERM and SIGKILL
GRACE = 3.0

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


class ComparisonStopped(KeyboardInterrupt):
    """The comparing process got a signal that asks it to stop (SIGTERM, SIGHUP; SIGINT stays KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _prctl(option: int, value: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, value, 0, 0, 0))


def become_subreaper(on: bool = True) -> str:
    """Make this process the child subreaper of its descendants (or stop being one); '' or why it is not.

    Linux only: elsewhere the answer says that orphans of a killed launcher
    are found only if they were seen while their parent lived.
    """
    if not sys.platform.startswith("linux"):
        return (f"no child subreaper on {sys.platform} (Linux only): a process whose parent died before "
                "gradwire saw it cannot be stopped by gradwire")
    if _prctl(_PR_SET_CHILD_SUBREAPER, int(on)) != 0:
        return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    return ""


def _is_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    flag = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value)


@contextlib.contextmanager
def subreaper() -> Iterator[str]:
    """This process is a child subreaper inside the block (as it was after); yields '' or why it is not."""
    was = _is_subreaper()
    why = "" if was else become_subreaper(True)
    try:
        yield why
    finally:
        if not was and not why:
            become_subreaper(False)


@contextlib.contextmanager
def _handling(handlers: dict[int, Any]) -> Iterator[None]:
    """Signal handlers set inside the block, the previous ones after. Only the main thread can set them:
    elsewhere the block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def signals_stop(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Inside the block, each of ``signums`` raises :class:`ComparisonStopped`.

    Once: the next is ignored while stopping.
    """

    def stop(signum: int, frame: FrameType | None) -> None:
        for s in signums:  # stopping takes seconds: a second kill must not cut it short
            signal.signal(s, signal.SIG_IGN)
        raise ComparisonStopped(signum)

    with _handling({s: stop for s in signums}):
        yield


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Ignore SIGINT, SIGTERM and SIGHUP inside the block (a cleanup a second Ctrl-C must not interrupt).

    Trap: an ignored signal stays ignored across ``exec``; nothing may be
    started inside the block.
    """
    with _handling({s: signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}):
        yield


def _key(p: psutil.Process) -> tuple[int, float]:
    try:
        return p.pid, p.create_time()
    except psutil.Error:
        return p.pid, 0.0


class ProcessTree:
    """The processes of one training: the ones started (``roots``) and all below them, seen or reparented here.

    Create it *before* starting the roots (it notes this process's children
    that are not the training's), :meth:`add` each root, :meth:`watch` while
    it runs, :meth:`stop` when it ends, however it ends.
    """

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._before = {_key(p) for p in self._children(recursive=False)}
        self.roots: list[subprocess.Popen[bytes]] = []
        self._seen: dict[tuple[int, float], psutil.Process] = {}

    def _children(self, recursive: bool) -> list[psutil.Process]:
        try:
            return list(self._me.children(recursive=recursive))
        except psutil.Error:
            return []

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        self.roots.append(proc)
        self.watch()

    def watch(self) -> list[psutil.Process]:
        """Remember every process of the training alive now; return them (roots excluded)."""
        root_pids = {p.pid for p in self.roots}
        # a root's descendants, and children of this process that were not there before: orphans reparented here
        found = [c for c in self._children(recursive=False) if _key(c) not in self._before]
        for top in list(found):
            try:
                found += top.children(recursive=True)
            except psutil.Error:
                continue
        for p in found:
            if p.pid not in root_pids:
                self._seen.setdefault(_key(p), p)
        return [p for p in self._seen.values() if p.is_running()]

    def alive(self) -> list[int]:
        """Pids of the training's processes still running (zombies not counted)."""
        pids = [p.pid for p in self.roots if p.poll() is None]
        for p in self.watch():
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    pids.append(p.pid)
            except psutil.Error:
                continue
        return pids

    def stop(self, grace: float = GRACE) -> int:
        """SIGTERM to every process, SIGKILL after ``grace`` s to what is left, reap; how many were running."""
        others = self.watch()
        running = [p for p in self.roots if p.poll() is None]
        count = len(running) + len(others)
        if not count:
            self._reap(others)
            return 0
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for root in running:
                with contextlib.suppress(OSError):
                    root.send_signal(sig)  # Popen knows whether its pid is still its own child
            for p in others:
                with contextlib.suppress(psutil.Error):
                    p.send_signal(sig)  # psutil checks the start time: a reused pid is left alone
            deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 10.0)
            while time.monotonic() < deadline:
                others = self.watch()  # a launcher may still start a worker as it dies: catch it too
                running = [p for p in self.roots if p.poll() is None]
                if not running and not self._reap(others, timeout=0.0):
                    break
                time.sleep(0.05)
        for root in self.roots:
            with contextlib.suppress(subprocess.TimeoutExpired):
                root.wait(timeout=1.0)
        self._reap(self.watch())
        return count

    @staticmethod
    def _reap(procs: list[psutil.Process], timeout: float = 0.0) -> list[psutil.Process]:
        """Wait for (and so reap, when it is a child of this process) each; those still alive."""
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        return list(alive)
