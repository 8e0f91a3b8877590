"""gloo and NCCL on long links: the transport model of gradwire.net.transport beside measurements.

Two parts, written to benchmarks/results/long_links.json:

1. ``measured``: every measurement of a collective library on a delayed link
   that gradwire could cite, each priced three ways: the transport model
   (``transport=gloo`` or ``nccl``), the TCP model before it (one connection,
   no segment credit: what ``gradwire.net.tcp`` priced alone) or the kernel's
   share, and the plain alpha-beta model:

   - published (``published_rows``): gloo and NCCL point-to-point (64 and 128
     MiB, 2 nodes) and all_reduce (128 and 256 MiB, 4, 8 and 16 nodes) on AWS
     with tc netem, from https://github.com/BinhangYuan/tc_cluster_setting
     (ETH DS3Lab; ``results/p2p.md``, ``results/allreduce.md`` at commit
     75581a5), the setup of Yuan et al., "Decentralized Training of Foundation
     Models in Heterogeneous Environments" (NeurIPS 2022). What the spec takes
     from the setup (:func:`published_spec`): netem on every node's egress, so
     ``latency`` is the netem delay (the repository's earlier ping, half a
     ping-pong on the receiver, read 10.2 ms under ``delay 10ms``: two delayed
     one-way trips); ``bandwidth`` the netem rate, else the instance's ("up to
     10 Gbps"; one TCP flow at most 5 Gbit/s outside a placement group, AWS's
     per-flow limit, what gloo's one connection measured: 4.5-5.0 Gbit/s);
     ``mtu=9001`` (a VPC's default: the 1 Gbit/s rows' 541 ms for 64 MiB is
     9001's framing, 1500's would be 561 ms); Linux's default buffers
     (``tcp_rmem=6MiB``, ``tcp_wmem`` 4 MiB); NCCL's sockets on ENA (2 x 8,
     autodetected; the scripts set no NCCL variable); the ring (what both
     libraries run for a large all_reduce). A gloo send is timed on the
     receiver from its barrier, so it includes the receiver's ready notice
     (one latency) before the first byte leaves. gloo's sends are priced with
     the default ``tcp_share`` and with the share gloo's connections carried on
     this kernel (``--measure``'s 40 ms rows, where the window binds).
   - measured here: this kernel's gloo all_reduce over a 50 ms link built by
     ``sudo python benchmarks/tcp_model.py --measure`` (kept in
     results/tcp_model.json); with ``--measure`` (root, ~5 min) also gloo
     send/recv here: 64 and 128 MiB over one gloo connection through
     tcp_model.py's delayer at 1 Gbit/s and 10, 20 and 40 ms of RTT, mainline
     Linux's buffers in the namespaces, CUBIC and BBR (kept in the results as
     ``p2p_runs``; a run without ``--measure`` prices the kept ones again),
     priced with the default ``tcp_share`` and with the share tcp_model.py's
     bulk probe measured on this kernel.
2. ``grid``: the model's prices on the grid the published claims cover (gloo
   send of 64 and 128 MB on 2 nodes; NCCL all_reduce of 128 and 256 MB on 4,
   8 and 16 nodes; 1, 2 and 5 Gbit/s; 1, 5 and 10 ms RTT), with the TCP model
   before and alpha-beta beside.

    python benchmarks/long_links.py     # arithmetic, a few seconds
    sudo python benchmarks/long_links.py --measure
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
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


# ------------------------------------------------------------------ gloo send/recv measured here (--measure, root)
P2P_SIZES = (64 * MiB, 128 * MiB)
P2P_RTTS = (0.010, 0.020, 0.040)  # at 1 Gbit/s: the bandwidth-delay products of 1.25-5 Gbit/s at 8-10 ms
P2P_RATE, P2P_MTU, P2P_REPEATS = 1e9, 9000, 3
#: mainline Linux's buffers (the host here raises tcp_rmem[2] to 32 MiB; a namespace takes the kernel's own)
LINUX_BUFFERS = {"net.ipv4.tcp_rmem": "4096 131072 6291456", "net.ipv4.tcp_wmem": "4096 16384 4194304"}


def _p2p(rank: int) -> None:
    """One rank of a 2-rank gloo job across the link: rank 0 sends, rank 1 answers 4 bytes (rank 0 prints)."""
    import torch
    import torch.distributed as dist
    from tcp_model import ADDRS, TUNS

    os.environ.update(MASTER_ADDR=ADDRS[0], MASTER_PORT="29534", GLOO_SOCKET_IFNAME=TUNS[rank])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ack = torch.zeros(1)

    def one(buf: torch.Tensor) -> float:
        start = time.monotonic()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(ack, 1)
        else:
            dist.recv(buf, 0)
            dist.send(ack, 0)
        return time.monotonic() - start

    out: dict = {"ping_s": [one(torch.zeros(1)) for _ in range(5)], "rows": []}
    for n in P2P_SIZES:
        buf = torch.zeros(n // 4)
        first = one(buf)  # the connection has carried only pings: slow start, small buffers
        out["rows"].append({"bytes": n, "first_s": first, "warm_s": [one(buf) for _ in range(P2P_REPEATS)]})
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def measure_p2p() -> list[dict]:
    """gloo send/recv over the delayer at each RTT, per congestion control, with mainline Linux's buffers."""
    from tcp_model import NAMESPACES, delayed_link

    me = [sys.executable, str(Path(__file__).resolve())]
    runs = []
    for cc in ("cubic", "bbr"):
        for rtt in P2P_RTTS:
            with delayed_link(P2P_MTU, delay=rtt / 2, rate=P2P_RATE, congestion=cc, sysctls=LINUX_BUFFERS):
                peer = subprocess.Popen(["ip", "netns", "exec", NAMESPACES[1], *me, "--role", "p2p", "1"],
                                        stdout=subprocess.DEVNULL)
                try:
                    done = subprocess.run(["ip", "netns", "exec", NAMESPACES[0], *me, "--role", "p2p", "0"],
                                          check=True, capture_output=True, text=True, timeout=600)
                    peer.wait(timeout=60)
                finally:
                    peer.kill()
            run = {"cc": cc, "rtt_set_s": rtt, "rate_bits": P2P_RATE, "mtu": P2P_MTU, "buffers": LINUX_BUFFERS,
                   **json.loads(done.stdout.strip().splitlines()[-1])}
            print(f"  {cc} RTT {rtt * 1e3:g} ms: " + ", ".join(
                f"{r['bytes'] >> 20} MiB {statistics.median(r['warm_s']):.3f} s (first {r['first_s']:.3f})"
                for r in run["rows"]), flush=True)
            runs.append(run)
    return runs


# ------------------------------------------------------------------ published: AWS, tc netem (module doc, 1)
SOURCE = "https://github.com/BinhangYuan/tc_cluster_setting/blob/75581a5bab58872fe9a613665717ca6837b75f2d/results/"
#: results/p2p.md, 2 x p3.2xlarge: (netem delay ms, netem rate Gbit/s or None) -> ms for gloo 64 MiB, NCCL 64 MiB,
#: gloo 128 MiB, NCCL 128 MiB (its first row, "AWS default", about 0.1 ms of RTT: delay 0.05)
PUBLISHED_P2P = {
    (0.05, None): (107, 55, 216, 112), (1, None): (110, 59, 222, 115), (5, None): (274, 80, 512, 134),
    (10, None): (532, 113, 972, 171), (0.05, 5): (110, 109, 218, 217), (0.05, 2): (271, 270, 542, 541),
    (0.05, 1): (541, 541, 1082, 1082), (1, 5): (115, 110, 224, 220), (5, 2): (311, 275, 581, 542),
    (10, 1): (620, 543, 1160, 1083),
}
#: results/allreduce.md: nodes -> (delay ms, rate Gbit/s) -> ms for gloo 128 MiB, NCCL 128 MiB, gloo 256, NCCL 256
PUBLISHED_ALL_REDUCE = {
    4: {(1, 5): (485, 329, 959, 655), (5, 2): (1517, 835, 2989, 1650), (10, 1): (2993, 1669, 5909, 3298)},
    8: {(1, 5): (537, 383, 1111, 763), (5, 2): (1814, 970, 3562, 1921), (10, 1): (3582, 1940, 6999, 3841)},
    16: {(1, 5): (612, 410, 1239, 817), (5, 2): (1950, 1038, 3861, 2057), (10, 1): (3873, 2076, 7636, 4114)},
}
#: the instance's line rate ("up to 10 Gbps") and AWS's limit on one flow outside a placement group, Gbit/s
AWS_INSTANCE_GBIT, AWS_FLOW_GBIT = 10, 5


def published_spec(transport: str, delay_ms: float, rate_gbit: float | None) -> str:
    """The spec of the published setup (module doc, 1): its link, MTU, buffers, sockets and the ring."""
    one_flow = transport == "gloo"  # one connection per pair: AWS's per-flow limit
    bandwidth = rate_gbit or (AWS_FLOW_GBIT if one_flow else AWS_INSTANCE_GBIT)
    spec = f"bandwidth={bandwidth}gbit,latency={delay_ms:g}ms,mtu=9001,tcp_rmem=6MiB,algorithm=ring,transport={transport}"
    return spec if one_flow else spec + ",streams=16"


def gloo_share_here(runs: list[dict]) -> float | None:
    """What gloo's connections carried per round trip on this kernel where the window binds (the longest RTT of
    ``--measure``'s sends), as a share of the send buffer: the ``tcp_share`` of a kernel like this one."""
    if not runs:
        return None
    longest = max(r["rtt_set_s"] for r in runs)
    shares = [row["carried_per_rtt_bytes"] / int(r["buffers"]["net.ipv4.tcp_wmem"].split()[2])
              for r in runs if r["rtt_set_s"] == longest for row in p2p_rows([r]) if "warm" in row["what"]]
    return statistics.median(shares)


def published_rows(share: float | None) -> list[dict]:
    """The published sends and all_reduces beside the model of their setup (module doc, 1)."""
    rows = []

    def row(what: str, file: str, op: str, transport: str, nodes: int, size: int, delay: float,
            rate: float | None, measured_ms: float) -> None:
        spec = published_spec(transport, delay, rate)
        notice = delay / 1e3 if transport == "gloo" and op == "send" else 0.0  # the receiver's ready notice

        def price(text: str) -> float:
            extra = {"src": 0, "dst": 1} if op == "send" else {}
            return notice + NetworkModel(text, nodes).cost(op, size * MiB, **extra).seconds

        measured, model, plain = measured_ms / 1e3, price(spec), price(spec + ",tcp=off")
        gbit = rate or (AWS_FLOW_GBIT if transport == "gloo" else AWS_INSTANCE_GBIT)
        out = {"source": SOURCE + file, "what": what, "transport": transport, "op": op, "nodes": nodes, "MiB": size,
               "delay_ms": delay, "bandwidth_gbit": gbit, "in_range": 1 <= delay <= 10 and 1 <= gbit <= 5,
               "spec": spec, "measured_s": measured, "model_s": model,
               "model_error_pct": 100 * (model / measured - 1), "alpha_beta_s": plain,
               "alpha_beta_error_pct": 100 * (plain / measured - 1)}
        if transport == "gloo" and share is not None:
            on_kernel = price(f"{spec},tcp_share={share:.3f}")
            out.update(kernel_share=share, model_kernel_share_s=on_kernel,
                       model_kernel_share_error_pct=100 * (on_kernel / measured - 1))
        rows.append(out)

    for (delay, rate), times in PUBLISHED_P2P.items():
        link = f"delay {delay:g} ms" + (f", {rate} Gbit/s" if rate else "")
        for (transport, size), ms in zip((("gloo", 64), ("nccl", 64), ("gloo", 128), ("nccl", 128)), times):
            row(f"published: {transport} send {size} MiB, 2 nodes, {link}", "p2p.md", "send", transport, 2, size,
                delay, rate, ms)
    for nodes, cases in PUBLISHED_ALL_REDUCE.items():
        for (delay, rate), times in cases.items():
            for (transport, size), ms in zip((("gloo", 128), ("nccl", 128), ("gloo", 256), ("nccl", 256)), times):
                row(f"published: {transport} all_reduce {size} MiB, {nodes} nodes, delay {delay} ms, {rate} Gbit/s",
                    "allreduce.md", "all_reduce", transport, nodes, size, delay, rate, ms)
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


def kernel_shares() -> dict[str, float]:
    """The payload share of the send buffer this kernel's connections carried in tcp_model.py's bulk probe, per cc."""
    kept = json.loads((HERE / "tcp_model.json").read_text()).get("measured_here") or {}
    return {r["cc"]: r["measured"] for r in kept.get("rows", []) if "bytes in flight" in r["what"]}


def p2p_rows(runs: list[dict]) -> list[dict]:
    """gloo send/recv measured here beside the model: a send on one warm connection plus the answer's latency.

    Priced twice: the model's default ``tcp_share`` (0.5) and the share this kernel's connections carried in
    ``tcp_model.py --measure``'s bulk probe (a different measurement: 64 MiB on one socket at 50 ms).
    """
    from gradwire.net.tcp import BUFFER_PAYLOAD_RATIO, tcp_transfer_seconds, window_cap

    shares = kernel_shares()
    rows = []
    for run in runs:
        rtt = run["rtt_set_s"]
        rate, mss = run["rate_bits"] / 8 * (run["mtu"] - 52) / run["mtu"], run["mtu"] - 52
        rmem, wmem = (int(run["buffers"][f"net.ipv4.tcp_{k}"].split()[2]) for k in ("rmem", "wmem"))
        kernel = shares.get(run["cc"], BUFFER_PAYLOAD_RATIO)
        for i, row in enumerate(run["rows"]):
            n = row["bytes"]
            cases = [("warm", statistics.median(row["warm_s"]), 0.0)]
            if i == 0:  # the first transfer after the pings: slow start from initcwnd (later sizes find it warm)
                cases.append(("first on the connection", row["first_s"], None))
            for label, measured, idle in cases:
                def model(share: float) -> float:
                    return tcp_transfer_seconds(n, rate, rtt, mss=mss, window_cap=window_cap(rmem, wmem, share),
                                                idle=idle, slow_start_after_idle=run["cc"] != "bbr") + rtt / 2

                plain, default, on_kernel = rtt + n / rate, model(BUFFER_PAYLOAD_RATIO), model(kernel)
                rows.append({"source": "measured here: sudo python benchmarks/long_links.py --measure",
                             "what": f"gloo send {n >> 20} MiB + 4-byte answer, {label}, 2 ranks, "
                                     f"{run['rate_bits'] / 1e9:g} Gbit/s, RTT {rtt * 1e3:g} ms, {run['cc']}",
                             "measured_s": measured, "model_s": default,
                             "model_error_pct": 100 * (default / measured - 1),
                             "kernel_share": kernel, "model_kernel_share_s": on_kernel,
                             "model_kernel_share_error_pct": 100 * (on_kernel / measured - 1),
                             "alpha_beta_s": plain, "alpha_beta_error_pct": 100 * (plain / measured - 1),
                             "carried_per_rtt_bytes": n / max(measured - rtt, 1e-9) * rtt})
    return rows


def published_summary(rows: list[dict]) -> dict:
    """How many published points in 1-10 ms and 1-5 Gbit/s each model prices within 10%, by library and op."""
    counts, lines = {}, ["", "published, 1-10 ms and 1-5 Gbit/s: within 10% of the measurement"]
    for transport in ("gloo", "nccl"):
        for op in ("send", "all_reduce"):
            cell = [r for r in rows if r["in_range"] and r["transport"] == transport and r["op"] == op]
            if not cell:
                continue
            entry = {}
            for key in ("model_error_pct", "model_kernel_share_error_pct", "alpha_beta_error_pct"):
                errors = [r[key] for r in cell if key in r]
                if errors:
                    entry[key] = {"within_10pct": sum(abs(e) <= 10 for e in errors), "points": len(errors),
                                  "range_pct": [min(errors), max(errors)]}
            counts[f"{transport} {op}"] = entry
            lines.append(f"  {transport} {op:10}: " + "; ".join(
                f"{k.removesuffix('_error_pct').replace('_', ' ')} {v['within_10pct']}/{v['points']} "
                f"({v['range_pct'][0]:+.1f}% to {v['range_pct'][1]:+.1f}%)" for k, v in entry.items()))
    return {"counts": counts, "lines": lines}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true",
                    help="also time gloo send/recv over delayed links built here (root, ~5 min)")
    ap.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        _p2p(int(args.role[1]))
        return 0
    if args.measure and os.geteuid() != 0:
        ap.error("--measure builds network namespaces and TUN devices: run it as root (sudo)")
    path = HERE / "long_links.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    p2p_runs = measure_p2p() if args.measure else previous.get("p2p_runs", [])
    share = gloo_share_here(p2p_runs)
    published = published_rows(share)
    measured, grid = published + measured_rows() + p2p_rows(p2p_runs), grid_rows()
    print(f"{'measured':70} {'meas s':>8} {'model':>8} {'err':>6} {'a-b':>7} {'err':>6} {'kernel':>8} {'err':>6}")
    for r in measured:
        kernel = (f" {r['model_kernel_share_s']:8.3f} {r['model_kernel_share_error_pct']:+5.0f}%"
                  if "kernel_share" in r else "")
        print(f"{r['what']:70} {r['measured_s']:8.3f} {r['model_s']:8.3f} {r['model_error_pct']:+5.0f}% "
              f"{r['alpha_beta_s']:7.3f} {r['alpha_beta_error_pct']:+5.0f}%" + kernel)
    print("\nmodel only, over the grid")
    for r in grid:
        print(f"  {r['transport']:4} {r['op']:10} {r['MiB']:4d} MiB {r['nodes']:2d} nodes {r['bandwidth_gbit']} Gbit/s "
              f"RTT {r['rtt_ms']:2d} ms: {r['model_s']:7.3f} s (alpha-beta {r['alpha_beta_s']:7.3f}, x"
              f"{r['model_s'] / r['alpha_beta_s']:.2f})")
    summary = published_summary(published)
    for line in summary["lines"]:
        print(line)
    write_results(path, measured, indent=2, grid=grid, p2p_runs=p2p_runs, gloo_share_here=share,
                  published=summary["counts"], published_source=SOURCE)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
