"""Real packets vs the model: `gradwire bench` (gloo) on emulated links next to the gradwire model of the same spec.

For each link rate (100 Mbit/s, 1 Gbit/s) and layout (2 nodes x 1 rank, 2 nodes
x 2 ranks) it runs, as root::

    gradwire emulate --net bandwidth=RATE --nodes 2 --nproc-per-node M -- \\
        gradwire bench -b 1M -e 64M -f 2 -n N -w 1 --fit --net MODEL_SPEC --json ...

where MODEL_SPEC is the spec `gradwire emulate` prints for that network, with
gloo's algorithm: ``bandwidth=RATE,algorithm=ring`` (plus ``topology=2x2`` and
a free loopback inside a node for 2 x 2). The model column is the model's
price; the fit column prices each row with the alpha and beta that
``bench --fit`` calibrated on the same sweep, and the cross-fit column with
those calibrated on the other layout at the same rate (a prediction, not a
fit). An unshaped sweep over the same namespaces (``--net custom``) measures
what gloo and the host cost without a link limit: a row counts as
link-dominated when that cost is at most a quarter of the modelled link time
(gloo reduces one chunk while the next is on the wire, so host work of that
size hides under the transfer; every row is reported either way).

At 1 Gbit/s a sweep is repeated (``--repeats-fast``, default 3) and each row's
time is the median of the sweeps' times (each a mean over ``-n`` calls, as
nccl-tests reports): on 2 cores the kernel's packet work for both nodes, the
bridge and the shapers shares the cores with gloo, and a sweep's row now and
then runs a few percent slow (a different row each time; no packet lost:
``gradwire emulate`` prints what the packets met). The fit is then made again
on the median rows, as ``bench --fit`` makes it (ring, TCP framing, the faster
placement per size); every sweep's own rows and fit stay in the raw files.

Checks, over the link-dominated in-place rows: model within 5 % of measured,
fit within 3 %. The in-place row is the all_reduce as torch.distributed runs
it; the out-of-place row adds the copy of the input into the output buffer
that user code writes (gradwire bench times it, as it says), which the model
of the network does not price and which ``bench --fit`` leaves out for the
same reason (it fits the faster placement). Both are in the table and the
JSON; the out-of-place errors are reported beside the check. ``--rescore``
analyses the raw sweeps of the last run again without running anything.

Writes benchmarks/results/emulate_bench.json in the shared shape of
``_results.write_results``: one row per rate, layout, size and placement
(``case`` is ``RATE_LAYOUT``), each case's fit, worst errors, commands and
load under ``cases``, and the raw sweeps under benchmarks/results/emulate_bench/
(``gradwire bench --json``'s own files, with the run beside them). Exits 1 if a
check fails.

    sudo python benchmarks/emulate_bench.py [--iters-slow 3] [--iters-fast 10] [--repeats-fast 3]   # ~20 min
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
RATES = {"100mbit": 100e6, "1gbit": 1e9}
LAYOUTS = {"2x1": (2, 1), "2x2": (2, 2)}
#: a row is link-dominated when the unshaped time is at most this share of the modelled time
DOMINANCE = 0.25
GRADWIRE = [sys.executable, "-m", "gradwire.cli.main"]


def load() -> dict:
    """The machine's load averages and the uptime line, to judge how quiet the timings were."""
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return {"loadavg": list(os.getloadavg()), "uptime": uptime, "time": time.strftime("%Y-%m-%d %H:%M:%S")}


#: set by --rescore: read the raw sweeps of the last run instead of running them
RESCORE = False


def sweep(net: str, layout: str, iters: int, model_net: str | None, out: Path) -> dict:
    """One emulated `gradwire bench` sweep; returns its JSON (rank 0 writes it before teardown)."""
    if RESCORE:
        return json.loads(out.read_text())
    nodes, per_node = LAYOUTS[layout]
    out.unlink(missing_ok=True)
    bench = [*GRADWIRE, "bench", "-b", "1M", "-e", "64M", "-f", "2", "-n", str(iters), "-w", "1",
             "--json", str(out), "--no-progress"]
    if model_net:
        bench += ["--net", model_net, "--fit"]
    cmd = [*GRADWIRE, "emulate", "--net", net, "--nodes", str(nodes), "--nproc-per-node", str(per_node),
           "--timeout", "1800", "--", *bench]
    before = load()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if not out.exists():
        raise RuntimeError(f"{' '.join(cmd)} wrote no result (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    data = json.loads(out.read_text())
    data["run"] = {"command": " ".join(cmd).replace(" ".join(GRADWIRE), "gradwire"),
                   "exit_code": proc.returncode, "seconds": time.monotonic() - t0, "load_before": before,
                   "load_after": load(), "emulate_lines": [ln for ln in proc.stderr.splitlines()
                                                           if ln.startswith("gradwire emulate:")]}
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"  {net} {layout}: {time.monotonic() - t0:.0f} s, exit {proc.returncode}", flush=True)
    return data


def model_spec(rate: str, layout: str) -> str:
    nodes, per_node = LAYOUTS[layout]
    spec = f"bandwidth={rate},algorithm=ring"
    return spec if per_node == 1 else f"{spec},topology={nodes}x{per_node},intra=loopback"


def median_sweep(runs: list[dict]) -> dict:
    """One sweep whose row times are the medians over ``runs`` (same sizes), refitted on them (module doc)."""
    import statistics

    from gradwire.bench.fit import Fit, fit_points, terms

    data = dict(runs[0])
    rows = []
    for i, row in enumerate(runs[0]["rows"]):
        times = [r["rows"][i]["time_us"] for r in runs]
        rows.append(dict(row, time_us=statistics.median(times), repeats_us=times,
                         wrong=sum(r["rows"][i]["wrong"] or 0 for r in runs)))
    data["rows"] = rows
    p = data["world_size"]
    best: dict[int, float] = {}
    for r in rows:
        best[r["size"]] = min(best.get(r["size"], float("inf")), r["time_us"] * 1e-6)
    points = [(*terms("all_reduce", "ring", p, size), seconds) for size, seconds in sorted(best.items())]
    data["fit"] = Fit((fit_points(points, "all_reduce"),), fit_points(points, "all"), "ring", "tcp", p).to_dict()
    data["repeats"] = [r["run"] for r in runs]
    return data


def fitted_us(fit: dict, p: int, size: int) -> float:
    from gradwire.bench.fit import terms

    steps, volume = terms("all_reduce", "ring", p, size)
    return (fit["overall"]["alpha"] * steps + fit["overall"]["beta"] * volume) * 1e6


def analyse(shaped: dict, baseline: dict, cross_fit: dict) -> dict:
    """Per row: model, fit and cross-fit errors against the measurement, and whether the link dominates."""
    base = {(r["size"], r["placement"]): r["time_us"] for r in baseline["rows"]}
    p = shaped["world_size"]
    rows = []
    for r in shaped["rows"]:
        measured, model = r["time_us"], r["model_us"]
        fit, cross = fitted_us(shaped["fit"], p, r["size"]), fitted_us(cross_fit, p, r["size"])
        unshaped = base[(r["size"], r["placement"])]
        rows.append({
            "size": r["size"], "placement": r["placement"], "measured_us": measured, "model_us": model,
            "fit_us": fit, "cross_fit_us": cross, "unshaped_us": unshaped,
            "link_dominated": unshaped <= DOMINANCE * model, "wrong": r["wrong"],
            "model_error_pct": 100 * (model / measured - 1), "fit_error_pct": 100 * (fit / measured - 1),
            "cross_fit_error_pct": 100 * (cross / measured - 1), "sweeps_us": r.get("repeats_us", [measured]),
        })
    dom = [r for r in rows if r["link_dominated"] and r["placement"] == "in-place"]
    dom_out = [r for r in rows if r["link_dominated"] and r["placement"] != "in-place"]

    def worst(key: str, among: list) -> float | None:
        return max((abs(r[key]) for r in among), default=None)

    return {
        "rows": rows, "fit_spec": shaped["fit"]["spec"], "fit_rms_error": shaped["fit"]["overall"]["rms_error"],
        "link_dominated_sizes": sorted({r["size"] for r in dom}),
        "max_model_error_pct_dominated": worst("model_error_pct", dom),
        "max_fit_error_pct_dominated": worst("fit_error_pct", dom),
        "max_cross_fit_error_pct_dominated": worst("cross_fit_error_pct", dom),
        "max_model_error_pct_dominated_out_of_place": worst("model_error_pct", dom_out),
        "max_fit_error_pct_dominated_out_of_place": worst("fit_error_pct", dom_out),
        "max_model_error_pct_all": worst("model_error_pct", rows),
        "wrong": sum(r["wrong"] or 0 for r in rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters-slow", type=int, default=3, help="timed iterations at 100 Mbit/s (default 3)")
    ap.add_argument("--iters-fast", type=int, default=10, help="timed iterations at 1 Gbit/s (default 10)")
    ap.add_argument("--iters-unshaped", type=int, default=10, help="timed iterations unshaped (default 10)")
    ap.add_argument("--repeats-fast", type=int, default=3, help="sweeps at 1 Gbit/s, median per row (default 3)")
    ap.add_argument("--rates", nargs="+", choices=list(RATES), default=list(RATES),
                    help="link rates to sweep (default: all)")
    ap.add_argument("--out", type=Path, default=RESULTS / "emulate_bench.json", help="results file")
    ap.add_argument("--rescore", action="store_true", help="analyse the raw sweeps of the last run again")
    args = ap.parse_args()
    global RESCORE
    RESCORE = args.rescore
    raw = args.out.with_suffix("")
    raw.mkdir(parents=True, exist_ok=True)
    previous = json.loads(args.out.read_text()) if RESCORE and args.out.exists() else {}
    started = previous.get("load_at_start") or load()
    print(f"load at start: {started['uptime']}", flush=True)
    baselines = {lay: sweep("custom", lay, args.iters_unshaped, None, raw / f"unshaped_{lay}.json") for lay in LAYOUTS}
    shaped = {}
    for rate in args.rates:
        for lay in LAYOUTS:
            slow = rate == "100mbit"
            repeats = 1 if slow else args.repeats_fast
            runs = [sweep(f"bandwidth={rate}", lay, args.iters_slow if slow else args.iters_fast,
                          model_spec(rate, lay), raw / (f"{rate}_{lay}.json" if repeats == 1 else f"{rate}_{lay}_r{i}.json"))
                    for i in range(repeats)]
            shaped[(rate, lay)] = median_sweep(runs)
    rows: list[dict] = []
    cases: dict[str, dict] = {}
    ok = True
    for (rate, lay), data in shaped.items():
        other = next(o for o in LAYOUTS if o != lay)
        a = analyse(data, baselines[lay], shaped[(rate, other)]["fit"])
        a["command"] = data["run"]["command"]
        a["sweeps"] = len(data["repeats"])
        a["exit_code"] = max(r["exit_code"] for r in data["repeats"])
        a["load_before"], a["load_after"] = data["repeats"][0]["load_before"], data["repeats"][-1]["load_after"]
        a["emulate_lines"] = [ln for r in data["repeats"] for ln in r["emulate_lines"] if "real packets" in ln]
        case = f"{rate}_{lay}"
        rows += [{"case": case, "rate": rate, "layout": lay, **r} for r in a["rows"]]
        cases[case] = {k: v for k, v in a.items() if k != "rows"}
        good = (a["max_model_error_pct_dominated"] is not None and a["max_model_error_pct_dominated"] <= 5
                and a["max_fit_error_pct_dominated"] <= 3 and a["wrong"] == 0)
        ok &= good
        print(f"\n{rate} {lay} (n={data['world_size']}): fitted {a['fit_spec']}; link-dominated sizes "
              f"{[s >> 20 for s in a['link_dominated_sizes']]} MiB")
        print(f"  {'size':>6} {'placement':>12} {'measured ms':>12} {'model':>8} {'err':>7} {'fit':>7} "
              f"{'cross':>7} {'unshaped ms':>12}")
        for r in a["rows"]:
            print(f"  {r['size'] >> 20:>4}MB {r['placement']:>12} {r['measured_us'] / 1e3:>12.1f} "
                  f"{r['model_us'] / 1e3:>8.1f} {r['model_error_pct']:>+6.1f}% {r['fit_error_pct']:>+6.1f}% "
                  f"{r['cross_fit_error_pct']:>+6.1f}% {r['unshaped_us'] / 1e3:>12.1f}"
                  f"{'' if r['link_dominated'] else '  (host-bound)'}"
                  f"{'  sweeps: ' + ' / '.join(f'{t / 1e3:.1f}' for t in r['sweeps_us']) if len(r['sweeps_us']) > 1 else ''}")
        if a["link_dominated_sizes"]:
            print(f"  {'PASS' if good else 'FAIL'}: link-dominated in-place rows: model within "
                  f"{a['max_model_error_pct_dominated']:.1f}% (<= 5), fit within "
                  f"{a['max_fit_error_pct_dominated']:.1f}% (<= 3); out-of-place (with the copy): model "
                  f"{a['max_model_error_pct_dominated_out_of_place']:.1f}%, fit "
                  f"{a['max_fit_error_pct_dominated_out_of_place']:.1f}%")
        else:
            print("  FAIL: no row is link-dominated on this machine")
    out = args.out
    # a rescore's own command, commit and date are the rescore's: those of the run that measured go beside them
    measured = {f"measured_{k}": previous.get(f"measured_{k}", previous.get(k))
                for k in ("command", "commit", "date")} if RESCORE else {}
    write_results(out, rows, indent=2, **measured,
                  description=__doc__.splitlines()[0], dominance_threshold=DOMINANCE, load_at_start=started,
                  load_at_end=previous.get("load_at_end") or load(), rescored=RESCORE,
                  unshaped={lay: b["run"]["command"] for lay, b in baselines.items()}, all_checks_pass=ok, cases=cases)
    print(f"\n{'PASS' if ok else 'FAIL'}; wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
