"""``gradwire bench``: nccl-tests style collective benchmark on gloo, nccl or a simulated network.

    gradwire bench -b 8 -e 16M -f 2                          # all_reduce on gloo, 2 ranks
    gradwire bench --backend gradwire --net 1gbe -b 1M -e 64M -n 5
    gradwire bench --op all_gather --op reduce_scatter --world-size 4 --json out.json
    gradwire bench --backend gradwire --net bandwidth=1gbit,latency=2ms,clock=virtual --fit -b 1K -e 16M
    gradwire bench --clock sim --net 10gbe --device a100 -b 1M -e 256M -f 4   # the simulated cluster clock
    torchrun --nproc-per-node 2 -m gradwire.cli.main bench -b 1M -e 64M   # ranks from torchrun

``--clock sim`` times each collective on the simulated cluster clock (the
gradwire backend: the network model's time, nothing waited out), ``--clock
realtime`` on this host's wall clock with real packets (to check the model);
``--device NAME`` is the device of the simulated cluster, whose compute a
collective needs (a reduction's arithmetic) is priced on it
(:func:`gradwire.bench.driver.reduction_seconds`). Tensors' placement is
``--tensors cpu|cuda|auto``; ``--device cpu|cuda|auto`` still means that, with
a note that it moved.

The command exits 1 when any collective returned wrong data (the ``#wrong``
column), 2 on bad input.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from gradwire.bench.config import BACKENDS, COLLECTIVE_NAMES, DTYPES, REDOPS, BenchConfig
from gradwire.cli._args import byte_size, check_net_fits, net_spec, output_file, positive_int, seconds


def add_parser(subparsers: Any) -> None:
    """Register ``gradwire bench``."""
    p = subparsers.add_parser(
        "bench", help="benchmark collectives (nccl-tests table) on gloo, nccl or a simulated network",
        description="Benchmark torch.distributed collectives with nccl-tests' flags and table. "
        "Spawns --world-size ranks, or runs as one rank under torchrun.",
    )
    p.add_argument("--op", action="append", metavar="OP",
                   help=f"collective, repeatable: {', '.join(COLLECTIVE_NAMES)} or all (default all_reduce)")
    p.add_argument("--backend", default=None,
                   help=f"{', '.join(BACKENDS)} (default gloo; gradwire with --clock or --device)")
    p.add_argument("--net", metavar="SPEC", type=net_spec,
                   help="network spec: simulated with --backend gradwire; with gloo/nccl only priced in model(us)")
    p.add_argument("--world-size", type=positive_int(1), default=2, metavar="N", help="ranks to spawn (default 2)")
    p.add_argument("--clock", choices=("sim", "realtime"), default=None,
                   help="sim: the simulated cluster clock (the network model's time); realtime: this host's wall "
                        "clock with real packets (default: the --net spec's clock)")
    p.add_argument("--device", metavar="NAME", default=None,
                   help="device of the simulated cluster (a100, cpu-core, 19.5/1555, host:x0.1...): a collective's "
                        "compute (reduction) priced on it; implies --clock sim")
    p.add_argument("--tensors", default=None, choices=("auto", "cpu", "cuda"),
                   help="tensors on cpu or cuda (default auto: cuda for nccl, else cpu)")
    p.add_argument("-b", "--minbytes", type=byte_size, default=32 << 20, metavar="SIZE",
                   help="smallest size, K/M/G = powers of 1024 (default 32M)")
    p.add_argument("-e", "--maxbytes", type=byte_size, default=32 << 20, metavar="SIZE", help="largest size (default 32M)")
    p.add_argument("-f", "--stepfactor", type=float, default=2.0, metavar="F", help="size factor per row, > 1 (default 2)")
    p.add_argument("-n", "--iters", type=int, default=20, metavar="N", help="timed iterations (default 20)")
    p.add_argument("-w", "--warmup-iters", type=int, default=5, metavar="N", help="warm-up iterations (default 5)")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="check results (default 1)")
    p.add_argument("-d", "--datatype", default="float", metavar="TYPE", help=f"{', '.join(DTYPES)} (default float)")
    p.add_argument("-o", "--redop", default="sum", metavar="OP", help=f"{', '.join(REDOPS)} (default sum)")
    p.add_argument("-r", "--root", type=int, default=0, help="root of broadcast and reduce (default 0)")
    p.add_argument("--json", type=output_file, metavar="FILE", help="write every row (and the fit) as JSON")
    p.add_argument("--csv", type=output_file, metavar="FILE", help="write every row as CSV")
    p.add_argument("--plot", type=output_file, metavar="FILE.png",
                   help="plot time and busbw against size, measured and model")
    p.add_argument("--fit", action="store_true", help="fit alpha and beta to the sweep and print a --net spec")
    p.add_argument("--fit-algorithm", metavar="NAME",
                   help="algorithm assumed by --fit (default: the simulated network's, else ring)")
    p.add_argument("--fit-protocol", metavar="NAME", help="framing of the fitted spec: tcp, rdma, none")
    p.add_argument("--timeout", type=seconds, default=3600.0, metavar="S",
                   help="seconds before ranks are killed, > 0 (default 3600)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run_bench)


#: what ``--device`` meant before it named the simulated cluster's device: the tensors' placement
_PLACEMENTS = ("auto", "cpu", "cuda")


def _clock_and_device(args: argparse.Namespace) -> tuple[str, str, Any]:
    """(backend, tensors, net) of ``--backend``, ``--clock``, ``--device``, ``--tensors`` and ``--net``.

    ``--device cpu|cuda|auto`` is the old spelling of ``--tensors`` (a note on
    stderr says so); any other ``--device`` is a device of the simulated
    cluster and implies ``--clock sim``. ``--clock`` and ``--device`` time on the
    gradwire backend (its network model), the default backend then.
    """
    from dataclasses import replace

    from gradwire.device import parse_device

    device, tensors = args.device, args.tensors
    if device is not None and device.strip().lower() in _PLACEMENTS:
        if tensors is not None:
            raise ValueError(f"--device {device} and --tensors {tensors}: --device {device} is the old spelling of "
                             "--tensors; give --tensors alone")
        placement = device.strip().lower()
        print(f"gradwire bench: note: --device {device} places the tensors: it is --tensors {placement} "
              "now; --device names the simulated cluster's device (e.g. a100)", file=sys.stderr)
        device, tensors = None, placement
    clock = args.clock
    if device is not None:
        device = parse_device(device).text  # one line naming the devices there are
        if clock == "realtime":
            raise ValueError(f"--device {device} prices compute on the simulated clock, and --clock realtime takes "
                             "it as this host runs it: use --clock sim, or leave --device out")
        clock = "sim"
    backend, net = args.backend, args.net
    if clock is not None:
        if backend is not None and backend != "gradwire":
            raise ValueError(f"--clock {clock} times collectives on the gradwire backend's network model, and "
                             f"--backend {backend} has none: use --backend gradwire (or leave --backend out)")
        backend = "gradwire"
        base = net if net is not None else net_spec("loopback")
        net = replace(base, clock=clock, device=device if device else base.device)
    return backend or "gloo", tensors or "auto", net


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build the checked :class:`BenchConfig` of a parsed command line."""
    ops = args.op or ["all_reduce"]
    if "all" in ops:
        ops = list(COLLECTIVE_NAMES)
    backend, tensors, net = _clock_and_device(args)
    return BenchConfig(
        ops=tuple(dict.fromkeys(ops)), backend=backend, net=net, world_size=args.world_size,
        min_bytes=args.minbytes, max_bytes=args.maxbytes, factor=args.stepfactor, iters=args.iters,
        warmup=args.warmup_iters, check=bool(args.check), dtype=args.datatype, redop=args.redop,
        root=args.root, timeout=args.timeout, device=tensors, progress=not args.no_progress and sys.stderr.isatty(),
    )


def run_bench(args: argparse.Namespace) -> int:
    """Run the sweep, print the table (rank 0), write the requested files; 1 if data was wrong."""
    import os

    from gradwire.bench import fit_result, format_table, plot, run, write_csv, write_json

    config = config_from_args(args)
    if config.net is not None:  # a topology of another size fails here, not in every rank
        torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        check_net_fits(config.net, int(os.environ["WORLD_SIZE"]) if torchrun else config.world_size)
    result = run(config)
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun only rank 0 reports
        return 1 if result.wrong else 0
    fit = fit_result(result, args.fit_algorithm, args.fit_protocol) if args.fit else None
    sys.stdout.write(format_table(result))
    if fit is not None:
        sys.stdout.write(fit.format())
    if args.json:
        write_json(result, args.json, fit)
    if args.csv:
        write_csv(result, args.csv)
    if args.plot:
        plot(result, args.plot)
    if result.wrong:
        print(f"gradwire bench: {result.wrong} wrong values", file=sys.stderr)
        return 1
    return 0
