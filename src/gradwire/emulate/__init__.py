"""Real packets: emulate a multi-node cluster on one Linux host with network namespaces, veth pairs and tc.

``gradwire emulate --net SPEC --nodes K --nproc-per-node M -- CMD`` gives every
node a network namespace with one veth link into a switch (a bridge in a
namespace of its own), shapes each link with the kernel's qdiscs, and runs
one torchrun agent per node inside its namespace with a real multi-node
rendezvous. The script's own backend (gloo) carries the traffic: nothing is
simulated, and the network model can be held against what the packets do.

Modules, pure first:

- :mod:`~gradwire.emulate.layout`: names, addresses, run ids;
- :mod:`~gradwire.emulate.plan`: which qdisc goes where for a spec, checked
  against the kernel's :class:`Capabilities` (a spec asking for more is
  refused with the reason), and the model spec of the emulated network;
- :mod:`~gradwire.emulate.timeline`: a network that changes (the spec's events)
  as changes of the built links at given times, and what cannot change, refused;
- :mod:`~gradwire.emulate.host`: privileges, processes, ``/proc``;
- :mod:`~gradwire.emulate.netlink`: pyroute2: probe, build, change in place, teardown, stale sets;
- :mod:`~gradwire.emulate.agents`: the torchrun command line of each node and its start;
- :mod:`~gradwire.emulate.controller`: the thread that applies the timeline while the job runs;
- :mod:`~gradwire.emulate.runner`: the lifecycle and its guaranteed teardown.

Example::

    from gradwire.emulate import Emulation, prepare, run
    from gradwire.net import parse_spec

    plan, stale = prepare(parse_spec("bandwidth=1gbit"), nodes=2, per_node=2)
    code = run(plan, ["python", "train.py"])
"""
from __future__ import annotations

from gradwire.emulate.host import EmulationUnavailable
from gradwire.emulate.layout import PREFIX, Layout, RunId
from gradwire.emulate.plan import Capabilities, EmulationPlan, Unsupported, plan_network
from gradwire.emulate.runner import Emulation, clean, prepare, run

__all__ = [
    "Capabilities", "Emulation", "EmulationPlan", "EmulationUnavailable", "Layout", "PREFIX", "RunId",
    "Unsupported", "clean", "plan_network", "prepare", "run",
]
