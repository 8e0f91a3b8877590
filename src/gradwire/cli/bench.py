"""``gradwire bench``: nccl-tests style collective benchmark on gloo, nccl or a simulated network.

    gradwire bench -b 8 -e 16M -f 2                          # all_reduce on gloo, 2 ranks
    gradwire bench --backend gradwire --net 1gbe -b 1M -e 64M -n 5
    gradwire bench --op all_gather --op reduce_scatter --world-size 4 --json out.json
    gradwire bench --backend gradwire --net bandwidth=1gbit,latency=2ms,clock=virtual --fit -b 1K -e 16M
    torchrun --nproc-per-node 2 -m gradwire.cli.main bench -b 1M -e 64M   # ranks from torchrun

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
    p.add_argument("--backend", default="gloo", help=f"{', '.join(BACKENDS)} (default gloo)")
    p.add_argument("--net", metavar="SPEC", type=net_spec,
                   help="network spec: simulated with --backend gradwire; with gloo/nccl only priced in model(us)")
    p.add_argument("--world-size", type=positive_int(1), default=2, metavar="N", help="ranks to spawn (default 2)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
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


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build the checked :class:`BenchConfig` of a parsed command line."""
    ops = args.op or ["all_reduce"]
    if "all" in ops:
        ops = list(COLLECTIVE_NAMES)
    return BenchConfig(
        ops=tuple(dict.fromkeys(ops)), backend=args.backend, net=args.net, world_size=args.world_size,
        min_bytes=args.minbytes, max_bytes=args.maxbytes, factor=args.stepfactor, iters=args.iters,
        warmup=args.warmup_iters, check=bool(args.check), dtype=args.datatype, redop=args.redop,
        root=args.root, timeout=args.timeout, device=args.device, progress=not args.no_progress and sys.stderr.isatty(),
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
