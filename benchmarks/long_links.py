"""gloo and NCCL on long links: the transport model of gradwire.net.transport beside measurements.

Two parts, written to benchmarks/results/long_links.json:

1. ``measured``: every measurement of a collective library on a delayed link
   that gradwire could cite, each priced three ways: the transport model
   (``transport=gloo`` or ``nccl``), the TCP model before it (one connection,
   no segment credit: what ``gradwire.net.tcp`` priced alone) and the plain
   alpha-beta model. The one set found is this kernel's gloo all_reduce over a
   50 ms link built here by ``sudo python benchmarks/tcp_model.py --measure``
   (kept in results/tcp_model.json). No published gloo point-to-point or NCCL
   all_reduce measurement on links of 1-10 ms and 1-5 Gbit/s was found in the
   sources searched (GitHub issues of NVIDIA/nccl, NVIDIA/nccl-tests,
   pytorch/gloo, pytorch/pytorch; stored web pages): the nearest,
   NVIDIA/nccl-tests#241, reports a ~50% busbw drop at "several hundreds of us"
   without a table.
2. ``grid``: the model's prices on the grid the published claims cover (gloo
   send of 64 and 128 MB on 2 nodes; NCCL all_reduce of 128 and 256 MB on 4,
   8 and 16 nodes; 1, 2 and 5 Gbit/s; 1, 5 and 10 ms RTT), with the TCP model
   before and alpha-beta beside, so any published point can be checked
   against it.

    python benchmarks/long_links.py     # arithmetic, a few seconds
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from _results import write_results

from gradwire.net import NetworkModel
from gradwire.net.tcp import TcpConfig, steps_seconds
from gradwire.net.transport import Transport, resolve

MiB = 1 << 20
HERE = Path(__file__).parent / "results"
#: the TCP model before the transports: one connection, steps of whole messages, no credit
TCP_ONLY = Transport("tcp", "one connection per peer, no segment credit", channels=False, pipelined=False, segment=0)


def measured_rows() -> list[dict]:
    """gloo's 2-rank ring all_reduce measured over 50 ms here, priced as tcp_model.py's score_gloo does."""
    kept = json.loads((HERE / "tcp_model.json").read_text()).get("measured_here") or {}
    runs = kept.get("gloo_runs") or []
    if not runs:
        return []
    rtt = statistics.median(t for r in runs for t in r["small_s"])  # 2 steps x one way = one RTT
    rate, mss = 1e9 / 8 * 8948 / 9000, 8948  # the delayer's 1 Gbit/s on 9000-byte IP packets
    config = TcpConfig(congestion=runs[0]["cc"])
    rows = []
    for i, row in enumerate(runs[0]["rows"]):
        n, gap = row["bytes"], row["gap_s"]
        value = statistics.median(statistics.median(r["rows"][i]["all_reduce_s"]) for r in runs)

        def price(transport: Transport) -> float:
            return steps_seconds(n / 2, 2, rate, rtt, rtt / 2, mss=mss, config=config, idle=gap, same_peer=True,
                                 transport=transport)

        model, before, plain = price(resolve("gloo")), price(TCP_ONLY), rtt + n / rate
        rows.append({"source": "measured here: sudo python benchmarks/tcp_model.py --measure (results/tcp_model.json, "
                               f"measured_here.gloo_runs), Linux {kept.get('kernel')}, {runs[0]['cc']}",
                     "what": f"gloo all_reduce {n >> 20} MiB, 2 ranks, 1 Gbit/s, RTT {rtt * 1e3:.1f} ms, after "
                             f"{gap:g} s of compute", "measured_s": value, "model_s": model,
                     "model_error_pct": 100 * (model / value - 1), "tcp_model_before_s": before,
                     "tcp_model_before_error_pct": 100 * (before / value - 1), "alpha_beta_s": plain,
                     "alpha_beta_error_pct": 100 * (plain / value - 1)})
    return rows


def grid_rows() -> list[dict]:
    """The model's prices where the published claims lie (module doc, 2)."""
    rows = []
    for bw in (1, 2, 5):
        for rtt_ms in (1, 5, 10):
            base = f"bandwidth={bw}gbit,latency={rtt_ms / 2:g}ms"
            for transport, op, sizes, worlds in (("gloo", "send", (64, 128), (2,)),
                                                 ("nccl", "all_reduce", (128, 256), (4, 8, 16))):
                for size in sizes:
                    for world in worlds:
                        def cost(spec: str) -> float:
                            model = NetworkModel(spec, world)
                            extra = {"src": 0, "dst": 1} if op == "send" else {}
                            return model.cost(op, size * MiB, **extra).seconds

                        rows.append({"transport": transport, "op": op, "MiB": size, "nodes": world,
                                     "bandwidth_gbit": bw, "rtt_ms": rtt_ms,
                                     "model_s": cost(f"{base},transport={transport}"),
                                     "tcp_model_before_s": cost(f"{base},transport=gloo"),
                                     "alpha_beta_s": cost(f"{base},tcp=off")})
    return rows


def main() -> int:
    measured, grid = measured_rows(), grid_rows()
    print(f"{'measured':70} {'meas s':>8} {'model':>8} {'err':>6} {'before':>8} {'err':>6} {'a-b':>7} {'err':>6}")
    for r in measured:
        print(f"{r['what']:70} {r['measured_s']:8.3f} {r['model_s']:8.3f} {r['model_error_pct']:+5.0f}% "
              f"{r['tcp_model_before_s']:8.3f} {r['tcp_model_before_error_pct']:+5.0f}% {r['alpha_beta_s']:7.3f} "
              f"{r['alpha_beta_error_pct']:+5.0f}%")
    print("\nmodel only (no published point in this range was found)")
    for r in grid:
        print(f"  {r['transport']:4} {r['op']:10} {r['MiB']:4d} MiB {r['nodes']:2d} nodes {r['bandwidth_gbit']} Gbit/s "
              f"RTT {r['rtt_ms']:2d} ms: {r['model_s']:7.3f} s (alpha-beta {r['alpha_beta_s']:7.3f}, x"
              f"{r['model_s'] / r['alpha_beta_s']:.2f})")
    path = HERE / "long_links.json"
    write_results(path, measured, indent=2, grid=grid,
                  published_found="none in 1-10 ms and 1-5 Gbit/s (see the module doc for where it was searched)")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
