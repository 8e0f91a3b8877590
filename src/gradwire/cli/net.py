"""``gradwire net``: inspect simulated networks without running anything.

    gradwire net describe 10gbe,latency=200us
    gradwire net describe 100gbe,topology=2x4,intra=nvlink --sizes 1MiB 64MiB
    gradwire net presets

Only :mod:`gradwire.net` (pure numpy) is imported, never torch.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import fields
from typing import Any

from rich.console import Console
from rich.table import Table

from gradwire.cli._args import byte_size, check_net_fits, net_spec, positive_int
from gradwire.net import OPS, PRESETS, Link, NetSpec, describe
from gradwire.net.model import DESCRIBE_SIZES
from gradwire.net.spec import CHANGING, spec_keys
from gradwire.net.schedule import Condition
from gradwire.net.units import human_bandwidth, human_size, human_time

#: largest buffer ``net describe`` prices: 1 PiB
#: most ranks ``net describe`` prices
MAX_WORLD = 1 << 20


def add_parser(subparsers: Any) -> None:
    """Register ``gradwire net`` and its actions on the top-level sub-parsers."""
    parser = subparsers.add_parser(
        "net", help="inspect a simulated network: its spec and modelled collective times",
        description="Inspect a simulated network. SPEC is comma-separated tokens: a preset "
        f"({', '.join(PRESETS)}) and/or key=value with keys {', '.join(spec_keys())}.",
    )
    actions = parser.add_subparsers(dest="net_action", metavar="ACTION")
    parser.set_defaults(func=lambda args: _usage(parser))

    desc = actions.add_parser("describe", help="print a spec's fields and modelled times per collective")
    desc.add_argument("spec", metavar="SPEC", type=net_spec,
                      help="e.g. '10gbe,latency=200us' or 'bandwidth=1gbit,loss=0.01%%'")
    desc.add_argument("--world-size", "-n", type=positive_int(1, MAX_WORLD), nargs="+", metavar="N", default=None,
                      help="world sizes to model (default: 2 4 8, or the one a topology holds)")
    desc.add_argument("--sizes", "-s", type=byte_size, nargs="+", metavar="SIZE",
                      default=list(DESCRIBE_SIZES), help="buffer sizes, e.g. 4KiB 1MiB 16MiB (default: 4KiB 1MiB 16MiB 256MiB)")
    desc.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), metavar="OP",
                      help=f"collectives to model (default: all of {', '.join(OPS)})")
    desc.set_defaults(func=run_describe)

    presets = actions.add_parser("presets", help="list the network presets")
    presets.set_defaults(func=run_presets)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _link_text(link: Link) -> str:
    payload = link.payload_rate
    rate = "unlimited" if math.isinf(payload) else f"{payload / 1e9:.4g} GB/s"
    return f"{human_bandwidth(link.bandwidth)}, {human_time(link.latency)}, {link.protocol} -> payload {rate}"


def spec_table(spec: NetSpec) -> Table:
    """Every field of ``spec`` in spec syntax, plus the links it implies."""
    table = Table(title=f"network spec: {spec.to_string()}", title_justify="left")
    table.add_column("field")
    table.add_column("value")
    for f in fields(spec):
        value = getattr(spec, f.name)
        if f.name == "stragglers":
            text = ", ".join(s.to_string() for s in value) or "none"
        elif f.name == "events":
            text = ", ".join(e.to_string() for e in value) or "none (a constant network)"
        elif f.name == "topology":
            text = ("flat (one rank per node)" if value is None else "auto (torchrun's layout)"
                    if value == "auto" else f"{value[0]} nodes x {value[1]} ranks")
        elif value is None:
            text = "same as inter-node link"
        elif f.name in ("bandwidth", "intra_bandwidth"):
            text = human_bandwidth(value)
        elif f.name in ("latency", "intra_latency", "jitter"):
            text = human_time(value)
        elif f.name == "loss":
            text = f"{value * 100:g}%"
        else:
            text = str(value)
        table.add_row(f.name, text)
    table.add_row("[dim]inter-node link[/dim]", _link_text(spec.inter_link()))
    table.add_row("[dim]intra-node link[/dim]", _link_text(spec.intra_link()))
    return table


#: how far ``net describe`` lists a changing network's conditions
TIMELINE_SECONDS = 300.0
TIMELINE_ROWS = 12


def timeline_table(spec: NetSpec) -> Table:
    """The conditions a changing network goes through from t = 0, stretch by stretch."""
    from gradwire.net.schedule import Schedule

    schedule = Schedule(spec.events)
    table = Table(title="how the network changes (t = 0: the job's process group is created)", title_justify="left")
    for name in ("from", "to", "inter-node link"):
        table.add_column(name)
    t = 0.0
    for end, cond in schedule.segments(0.0, spec.bandwidth):
        table.add_row(human_time(t), "for ever" if math.isinf(end) else human_time(end), _condition_text(spec, cond))
        t = end
        if t >= TIMELINE_SECONDS or len(table.rows) >= TIMELINE_ROWS:
            break
    return table


def _condition_text(spec: NetSpec, cond: "Condition") -> str:
    if cond.down:
        return "down: nothing moves"
    parts = [human_bandwidth(spec.bandwidth if cond.bandwidth is None else cond.bandwidth),
             human_time(spec.latency if cond.latency is None else cond.latency)]
    if cond.loss is not None:
        parts.append(f"loss {cond.loss * 100:g}%")
    parts += [f"rank {r} at {f:g}x" for r, f in cond.links]
    return ", ".join(parts)


def _gbps(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value / 1e9:.3f}"


def run_describe(args: argparse.Namespace) -> int:
    """Print the spec and, per world size, the modelled time of every op and size."""
    spec = args.spec
    for world in args.world_size or ():  # a topology holds one world size: say so rather than price another
        check_net_fits(spec, world)
    console = Console(emoji=False)
    console.print(spec_table(spec))
    if spec.events:
        console.print(timeline_table(spec))
    rows = describe(spec, world_sizes=args.world_size or (2, 4, 8), sizes=args.sizes, ops=args.ops)
    for world in dict.fromkeys(r.world_size for r in rows):
        table = Table(title=f"world size {world}: modelled time, algbw/busbw in GB/s (nccl-tests conventions)",
                      title_justify="left")
        table.add_column("op", no_wrap=True, min_width=14)
        table.add_column("size", justify="right", no_wrap=True)
        table.add_column("time", justify="right", no_wrap=True)
        table.add_column("algorithm", no_wrap=True, min_width=18)
        table.add_column("algbw", justify="right")
        table.add_column("busbw", justify="right")
        for r in (r for r in rows if r.world_size == world):
            busbw = "-" if r.op == "barrier" else _gbps(r.busbw)
            algbw = "-" if r.op == "barrier" else _gbps(r.algbw)
            table.add_row(r.op, human_size(r.nbytes), human_time(r.seconds), r.algorithm, algbw, busbw)
        console.print(table)
    return 0


def run_presets(args: argparse.Namespace) -> int:
    """Print the preset registry."""
    table = Table(title="network presets (use as the first token of a spec)", title_justify="left")
    for name in ("preset", "bandwidth", "latency", "protocol", "description"):
        table.add_column(name)
    for p in PRESETS.values():
        table.add_row(p.name, human_bandwidth(p.bandwidth), human_time(p.latency), p.protocol, p.description)
    for name in CHANGING:
        spec = net_spec(name)
        table.add_row(name, human_bandwidth(spec.bandwidth), human_time(spec.latency), spec.protocol,
                      "changes: " + ", ".join(e.to_string() for e in spec.events))
    Console(emoji=False).print(table)
    return 0
