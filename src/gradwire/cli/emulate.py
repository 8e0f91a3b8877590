"""``gradwire emulate``: run a command on a multi-node cluster emulated with real packets (namespaces + tc).

    gradwire emulate --net bandwidth=1gbit --nodes 2 --nproc-per-node 2 -- python train.py
    gradwire emulate --net bandwidth=100mbit,topology=2x2 -- gradwire bench -b 1M -e 64M
    gradwire emulate --net bandwidth=1gbit --nodes 4 --plan      # what would be built, and its model spec
    gradwire emulate --net bandwidth=1gbit,drop=100mbit:for=5s:every=30s,outage=2s:at=45s --nodes 2 -- ...
    gradwire emulate --clean                                      # remove sets left by killed runs

A network that changes (drop=, slow=, outage=, trace= bandwidth rows) is
followed from the moment the first node starts: rates change in place on the
shapers, an outage takes every switch port down (``--plan`` lists the changes;
see gradwire.emulate.timeline). cross= and latency or loss changes are refused
with the reason.

Needs root. The exit code is the command's (the first failing node's), 2 when
the spec or the host is refused before anything starts, 128 + N after signal N.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

from gradwire.cli._args import command_after_dashes, net_spec


def add_parser(subparsers: Any) -> None:
    """Register ``gradwire emulate``."""
    p = subparsers.add_parser(
        "emulate", help="run a command on an emulated multi-node cluster: real packets, shaped by tc (root)",
        description="Give every node a network namespace and a tc-shaped link into a switch, and run the command "
        "under one torchrun agent per node (multi-node rendezvous). Nothing is simulated: the command's own "
        "backend carries the packets.",
    )
    p.add_argument("--net", type=net_spec, default="custom",
                   help="network spec: bandwidth (tbf/htb); latency, jitter, loss only where the kernel has netem; "
                        "events drop=, slow=, outage=, trace= (bandwidth) are applied as the run goes (default: unshaped)")
    p.add_argument("--nodes", type=int, metavar="K", help="nodes (default: the spec's topology, else 1)")
    p.add_argument("--nproc-per-node", type=int, metavar="M", help="ranks per node (default: the spec's topology, else 1)")
    p.add_argument("--subnet", default="10.250.0.0/24", help="private IPv4 subnet inside the namespaces (default: %(default)s)")
    p.add_argument("--port", type=int, default=29400, help="rendezvous port on node 0 (default: %(default)s)")
    p.add_argument("--shaper", default="auto", choices=("auto", "htb", "tbf"),
                   help="rate limiter: htb (pure ACKs first, needs u32) or tbf (one FIFO) (default: htb if present)")
    p.add_argument("--burst", metavar="SIZE", help="token bucket size, e.g. 256KiB (default: 2 ms of line time, >= 32 KiB)")
    p.add_argument("--timeout", type=float, metavar="S", help="stop the command after S seconds (exit code 124)")
    p.add_argument("--plan", action="store_true",
                   help="print what would be built, its model spec and the schedule's first changes, then exit")
    p.add_argument("--clean", action="store_true", help="remove namespaces left by killed runs, then exit")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command each node's torchrun runs, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Refuse what cannot run (one line, exit 2), else build, run the command, tear down."""
    from gradwire.emulate import EmulationUnavailable, clean, prepare
    from gradwire.emulate import run as run_emulation
    from gradwire.net.units import parse_size

    def say(line: str) -> None:
        print(f"gradwire emulate: {line}", file=sys.stderr)

    try:
        if args.clean:
            removed = clean()
            say(f"removed {len(removed)} stale namespace(s){': ' + ', '.join(removed) if removed else ''}")
            return 0
        cmd = command_after_dashes(args.cmd, "gradwire emulate --net SPEC --nodes K -- python train.py ...",
                                   required=not args.plan, scripts=True)
        spec = args.net
        topo = spec.topology if isinstance(spec.topology, tuple) else (None, None)
        nodes = args.nodes or topo[0] or 1
        per_node = args.nproc_per_node or topo[1] or 1
        burst = None if args.burst is None else parse_size(args.burst)
        if args.timeout is not None and not (args.timeout > 0 and math.isfinite(args.timeout)):
            raise ValueError(f"--timeout must be a number of seconds > 0, got {args.timeout}")
        plan, removed = prepare(spec, nodes, per_node, subnet=args.subnet, port=args.port, shaper=args.shaper,
                                burst=burst)
    except (EmulationUnavailable, ValueError) as exc:
        say(f"error: {exc}")
        return 2
    if removed:
        say(f"removed stale namespace(s) of killed runs: {', '.join(removed)}")
    from gradwire.emulate.timeline import describe as describe_schedule

    for line in [*plan.describe(), *describe_schedule(plan)]:
        say(line)
    if os.environ.get("GRADWIRE_NET"):
        say(f"note: GRADWIRE_NET={os.environ['GRADWIRE_NET']} is set: a script on the gradwire backend adds that "
            "model's time to the real network's")
    if args.plan:
        return 0
    try:
        return run_emulation(plan, cmd, timeout=args.timeout, report=lambda traffic: say(traffic.describe()),
                             on_change=lambda done: say(done.describe(plan)))
    except EmulationUnavailable as exc:  # teardown could not remove something: say what and how to retry
        say(f"error: {exc}")
        return 1
