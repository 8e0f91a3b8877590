"""Run a command on an emulated cluster: clean up stale sets, probe, plan, build, launch, wait, tear down.

Teardown is guaranteed on every way out this process can see:

- normal exit and errors: :class:`Emulation` removes the network in ``__exit__``
  (and in ``__enter__`` when building fails half way);
- Ctrl-C, SIGTERM and SIGHUP: :func:`run` turns each into an exception in the
  main thread, forwards the signal to the agents, gives them :data:`GRACE_SECONDS`
  to stop their workers, kills what is left inside the namespaces and removes
  the network; during the removal further signals are ignored, so a second
  Ctrl-C cannot cut it short;
- ``kill -9``, which no process can catch: the agents get SIGTERM from the
  kernel (``PR_SET_PDEATHSIG``) and the next run removes the namespaces
  it finds with a dead owner (:func:`prepare`), or ``gradwire emulate --clean`` does.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from ipaddress import IPv4Network
from types import FrameType
from typing import Callable, Iterator, Sequence

from pyroute2.netlink.exceptions import NetlinkError

from gradwire.emulate import netlink
from gradwire.emulate.agents import agent_env, start_agent, torchrun_argv
from gradwire.emulate.controller import T0_ENV, Applied, Controller
from gradwire.emulate.host import EmulationUnavailable, check_host, this_run
from gradwire.emulate.layout import DEFAULT_PORT, DEFAULT_SUBNET, Layout
from gradwire.emulate.plan import EmulationPlan, plan_network
from gradwire.net.spec import NetSpec

__all__ = ["Emulation", "GRACE_SECONDS", "EmulationStopped", "clean", "prepare", "run"]

#: seconds the agents get to stop their workers after a signal, before everything inside is killed
GRACE_SECONDS = 15.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class EmulationStopped(BaseException):
    """A signal asked this process to stop (BaseException, like KeyboardInterrupt: nothing should swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals(then: str) -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP raise :class:`EmulationStopped` (``then="raise"``) or are ignored.

    Trap: pyroute2 forks helper children (to open a socket inside a
    namespace) and stops them with SIGTERM. A forked child inherits this
    handler; were it to raise there, the exception would unwind the child
    out of its helper and into a copy of this program, building the network a
    second time from inside a namespace (and were it to ignore the signal, the
    helper's parent could wait on it forever). In any process but this one
    the handler dies of the signal, as the child would have without it.
    """
    owner = os.getpid()

    def handler(signum: int, _frame: FrameType | None) -> None:
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if then == "raise":
            raise EmulationStopped(signum)

    old = {s: signal.signal(s, handler) for s in _FORWARDED}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def clean() -> list[str]:
    """Remove the namespaces of runs that died without cleaning up; return their names."""
    check_host()
    found = netlink.stale()
    left = netlink.remove(found)
    if left:
        raise EmulationUnavailable(f"could not remove stale namespaces: {', '.join(left)}")
    return found


def prepare(
    spec: NetSpec,
    nodes: int,
    per_node: int,
    *,
    subnet: IPv4Network | str = DEFAULT_SUBNET,
    port: int = DEFAULT_PORT,
    shaper: str = "auto",
    burst: int | None = None,
) -> tuple[EmulationPlan, list[str]]:
    """Check the host, remove stale sets, probe the kernel and plan; returns ``(plan, stale names removed)``.

    Raises:
        EmulationUnavailable: not root, no namespaces, no veth or bridge.
        gradwire.emulate.plan.Unsupported: the spec asks for what the kernel cannot do.
    """
    removed = clean()
    run_id = this_run()
    caps = netlink.probe(run_id)
    layout = Layout(nodes, per_node, run_id, IPv4Network(subnet), port)
    return plan_network(spec, layout, caps, shaper, burst), removed


class Emulation:
    """The network of a plan, present inside the ``with`` block and gone after it.

    Example::

        plan, _ = prepare(parse_spec("bandwidth=1gbit"), nodes=2, per_node=1)
        with Emulation(plan):
            ...  # processes entered into plan.layout.node_ns(i) see a shaped network
    """

    def __init__(self, plan: EmulationPlan) -> None:
        self.plan = plan

    def __enter__(self) -> "Emulation":
        try:
            netlink.build(self.plan)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove every namespace, link and qdisc of the plan (idempotent); raise if something stays."""
        with _signals("ignore"):  # a second Ctrl-C must not cut the removal short
            left = netlink.teardown(self.plan.layout)
        if left:
            raise EmulationUnavailable(f"could not remove {', '.join(left)}; `gradwire emulate --clean` retries")


def run(
    plan: EmulationPlan,
    cmd: Sequence[str],
    *,
    timeout: float | None = None,
    grace: float = GRACE_SECONDS,
    report: Callable[[netlink.Traffic], None] | None = None,
    on_change: Callable[[Applied], None] | None = None,
) -> int:
    """Build the network, run ``cmd`` under one torchrun agent per node, tear down; return the exit code.

    Exit code: 0 when every agent succeeded; the first failing agent's code
    (the others are stopped then); ``128 + signal`` after SIGINT/SIGTERM/SIGHUP;
    124 when ``timeout`` seconds passed. ``report`` receives what the packets
    met (:func:`~gradwire.emulate.netlink.traffic`) once the agents are gone,
    before teardown.

    A spec with events (a network that changes) is followed from ``t = 0``,
    the moment the first agent starts, by a :class:`~gradwire.emulate.controller.Controller`
    (``on_change`` receives each change as it is made); the agents get that
    moment as ``time.monotonic()`` in :data:`~gradwire.emulate.controller.T0_ENV`.
    When a change cannot be made the agents are stopped and
    :class:`EmulationUnavailable` says which change and why. On every way out
    the schedule stops and the built links are restored before the agents are
    stopped and the network is removed.
    """
    lay = plan.layout
    argvs = [torchrun_argv(lay, node, cmd) for node in range(lay.nodes)]  # a bad command fails before building
    env = agent_env(os.environ, plan.model_spec.to_string(), lay.world_size, os.cpu_count() or 1)
    agents: list[subprocess.Popen] = []
    controller: Controller | None = None
    with _signals("raise"):
        try:
            with Emulation(plan):
                try:
                    if plan.spec.events:  # sockets open before the agents start: no thread may exist then
                        controller = _controller(plan, on_change)
                    t0 = time.monotonic()
                    env[T0_ENV] = repr(t0)
                    for node, argv in enumerate(argvs):
                        agents.append(start_agent(lay.node_ns(node), argv, env))
                    if controller is not None:
                        controller.start(t0)
                    return _wait(agents, timeout, grace, controller)
                except EmulationStopped as stop:
                    _close(controller)  # the network as built: the workers' shutdown must get through
                    _stop(agents, stop.signum, grace)
                    return 128 + stop.signum
                finally:
                    _close(controller)
                    _stop(agents, signal.SIGTERM, grace)
                    if report is not None:
                        try:
                            counts = netlink.traffic(plan)
                        except (OSError, RuntimeError, NetlinkError):
                            pass  # the counters are a diagnosis; reading them never fails the run
                        else:
                            report(counts)
        except EmulationStopped as stop:  # a signal while building or tearing down: the network is gone already
            return 128 + stop.signum


def _controller(plan: EmulationPlan, on_change: Callable[[Applied], None] | None) -> Controller:
    """The schedule's controller, its sockets open and one change made already (nothing runs yet)."""
    links = netlink.Links(plan)
    controller = Controller(plan, links, on_change)
    try:
        controller.prime()
    except (OSError, NetlinkError) as exc:
        links.close()
        raise EmulationUnavailable(f"this kernel refused to change a shaper in place ({exc}); a network that "
                                   "changes (drop=, slow=, outage=, trace=) needs it: run the spec without its "
                                   "events") from None
    return controller


def _close(controller: Controller | None) -> None:
    """Stop following the schedule and restore the built links; a failure here is left to the teardown."""
    if controller is not None:
        with contextlib.suppress(OSError, RuntimeError, NetlinkError):
            controller.close()


def _wait(agents: list[subprocess.Popen], timeout: float | None, grace: float,
          controller: Controller | None = None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if controller is not None and controller.error is not None:
            _stop(agents, signal.SIGTERM, grace)
            raise EmulationUnavailable(f"the network's schedule could not be followed ({controller.error}); "
                                       "the run was stopped")
        codes = [a.poll() for a in agents]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            _stop(agents, signal.SIGTERM, grace)
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            _stop(agents, signal.SIGTERM, grace)
            return 124
        time.sleep(0.1)


def _stop(agents: list[subprocess.Popen], signum: int, grace: float) -> None:
    """Send ``signum`` to the live agents, wait up to ``grace`` s, then kill the rest."""
    live = [a for a in agents if a.poll() is None]
    for a in live:
        with contextlib.suppress(ProcessLookupError):
            a.send_signal(signum)
    deadline = time.monotonic() + grace
    for a in live:
        try:
            a.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            a.kill()
            a.wait()
