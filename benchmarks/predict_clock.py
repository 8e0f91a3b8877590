"""predict on the simulated cluster clock: its step against the step compare measures, and on a busy host.

    python benchmarks/predict_clock.py agree [--worlds 2,4] [--devices cpu-core,a100,t4]
    python benchmarks/predict_clock.py hosts [--worlds 2,4] [--devices cpu-core,a100,t4]
    python benchmarks/predict_clock.py reprice --name agree_8 --worlds 8 --work DIR
    python benchmarks/predict_clock.py steps --worlds 8 --devices a100 --strategies onebit+delayed --work DIR

agree: for each device and world size, one ``gradwire compare`` of the bundled CNN (``cnn-wide``, batch 64, one
seed, 3 epochs so that PyTorch's PowerSGD is past its 10 warm-up steps) on three networks, a comm-bound one
(200 Mbit/s), a compute-bound one (10 Gbit/s) and a changing one (10 Gbit/s dropping to 200 Mbit/s half the time:
for 250 ms every 500 ms on cpu-core, 10 ms every 20 ms on an a100 or a t4, whose steps are 20 times shorter; that
one trained for 10 epochs on cpu-core and 30 on a GPU, so that compare's mean step covers the change ten times or
more), under sync, onebit, delayed, onebit+delayed and torch-powersgd:4; and ``gradwire predict --device
D --measure-world N --worlds N`` of the same model, batch, networks and strategies. Compare's step: the mean of
its steady steps (past the strategy's warm-up and DDP's rebuild; an epoch's first step, after its evaluation, and
its partial last batch left out); predict's:
its steady step (on the changing network, its replay of compare's whole run, ``predict(..., horizon=SPAN,
epochs=...)``, by compare's rule (:func:`over_span`), and beside it its mean over 600 s). Both on the simulated
cluster clock, so neither depends on this host.

hosts: the same ``gradwire predict`` runs quiet and beside two ``python -c 'while True: pass'`` loops: each step
against the quiet run's.

reprice: predict again (or read its answers kept in ``--work``) for the static networks' rows of a results file,
beside compare's steps as the file holds them: after a change to predict, without training again. The rows'
replay of compare's run (``predict_run_ms``) needs the run itself and is dropped; the changing network's rows
are left as they are (their figure is that replay: rerun ``agree --only-changing --work DIR`` on the kept runs).

steps: compare's steps on the changing network beside predict's replay of them, step by step, with the replay's
drift from the run (the kept runs of an ``agree --work DIR``); it writes nothing.

Results: ``benchmarks/results/predict_clock/{agree,hosts}.json`` (``--name`` another file). ``--strategies`` reruns
some of them; with ``--merge`` their rows replace theirs in the results file and the other rows stay (each row
says when it was measured).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "predict_clock"
BUSY = [sys.executable, "-c", "while True: pass"]
STATIC = {"comm-bound": "bandwidth=200mbit,latency=100us", "compute-bound": "bandwidth=10gbit,latency=20us"}
#: the changing network of each device: 10 Gbit/s dropping to 200 Mbit/s half the time, a period of about eight of
#: sync's steps there, so that compare's short run meets the change several times
CHANGING = {"cpu-core": "bandwidth=10gbit,latency=20us,drop=200mbit:for=250ms:every=500ms",
            "a100": "bandwidth=10gbit,latency=20us,drop=200mbit:for=10ms:every=20ms",
            "t4": "bandwidth=10gbit,latency=20us,drop=200mbit:for=10ms:every=20ms"}


def nets_of(device: str) -> dict[str, str]:
    return {**STATIC, "changing": CHANGING.get(device, CHANGING["cpu-core"])}
STRATEGIES = ("sync", "onebit", "delayed", "onebit+delayed", "torch-powersgd:4")
MODEL, BATCH, EPOCHS = "cnn-wide", 64, 3
#: epochs of compare's run on the changing network: enough that it covers ten periods of the change or more (a GPU's
#: steps are 20 times shorter than a cpu-core's: 10 epochs of 4 ranks on an a100 covered 0.12-0.43 s, 6 to 21
#: periods of 20 ms, and where its 70 steps fell in the period moved the mean by up to 6%)
CHANGING_EPOCHS = {"cpu-core": 10}
GPU_CHANGING_EPOCHS = 30
NAME: str | None = None
MERGE = False
#: agree on the changing network alone (``--only-changing``)
ONLY_CHANGING = False


def _run(cmd: list[str]) -> None:
    env = dict(os.environ)
    subprocess.run([sys.executable, "-m", "gradwire", *cmd], check=True, stdout=subprocess.DEVNULL, env=env)


def _left_out(strategy: str) -> int:
    """The run's first steps compare's rule leaves out: the strategy's warm-up and DDP's rebuild."""
    from gradwire.strategies import parse_strategy

    return parse_strategy(strategy).exchange.warmup_steps + 2


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How many rows are within 5% and the largest error, printed and as the results file's fields."""
    worst = max(rows, key=lambda r: abs(r["error"]))
    within = sum(abs(r["error"]) <= 0.05 for r in rows)
    print(f"{within} of {len(rows)} within 5%; the largest error {worst['error']:+.1%} ({worst['device']}, "
          f"{worst['world']} ranks, {worst['net']}, {worst['strategy']})")
    return {"within_5pct": within, "points": len(rows), "largest_error": worst["error"]}


def _steady(steps: list[float], strategy: str, world: int, changing: bool) -> float:
    """Compare's steady step (module doc): the median of its steady steps on a static network, their mean on a
    changing one (each step meets another condition). On a static network an epoch's first step is left out:
    it follows the epoch's evaluation, whose compute moved the clock while a ``delayed`` exchange was in
    flight (on a changing one every step of the span counts, as in predict's mean over the same span)."""
    from gradwire.train.data import TRAIN_SIZE, steps_per_epoch

    per_epoch = steps_per_epoch(TRAIN_SIZE, world, BATCH)
    partial = (TRAIN_SIZE // world) % BATCH != 0
    skip = _left_out(strategy)
    # an epoch's first step follows its evaluation, whose compute moved the clock while a ``delayed`` exchange
    # was in flight (it finds the exchange done); its last one may be a partial batch
    kept = [t for i, t in enumerate(steps) if i >= skip and (changing or i % per_epoch != 0)
            and not (partial and i % per_epoch == per_epoch - 1)]
    return statistics.fmean(kept) if changing else statistics.median(kept)


def compare_steps(device: str, world: int, tmp: Path, skip: tuple[str, ...] = ()) -> dict[tuple[str, str], float]:
    """(net name, strategy) -> compare's steady step in seconds (a results.json already in ``tmp`` is reused).

    The static networks in one comparison of :data:`EPOCHS`; the changing one in a longer one
    (:data:`CHANGING_EPOCHS`): its mean step is over every condition it meets, so the run covers ten or more
    periods of the change (predict's mean is over 600 s of it). ``skip``: ``DEVICE:WORLD`` whose changing
    network is left out.
    """
    steps = {}
    for suffix, nets, epochs in (("", list(STATIC.values()), EPOCHS),
                                 ("-changing", [nets_of(device)["changing"]],
                                  CHANGING_EPOCHS.get(device, GPU_CHANGING_EPOCHS))):
        if (suffix and f"{device}:{world}" in skip) or (ONLY_CHANGING and not suffix):
            continue
        out = tmp / f"compare-{device}-{world}{suffix}"
        cmd = ["compare", "--workers", str(world), "--epochs", str(epochs), "--seeds", "1", "--batch-size",
               str(BATCH), "--model", MODEL, "--device", device, "--strategies", ",".join(STRATEGIES), "--out",
               str(out)]
        for net in nets:
            cmd += ["--net", net]
        if not (out / "results.json").exists():
            _run(cmd)
        res = json.loads((out / "results.json").read_text())
        for run in res["runs"]:
            name = _name(run["net"], device)
            if run["strategy"] in STRATEGIES and name is not None and (name == "changing") == bool(suffix):
                seconds = run["seeds"][0]["step_seconds"]
                steps[(name, run["strategy"])] = _steady(seconds, run["strategy"], world, name == "changing")
                SPANS[(device, world, name, run["strategy"])] = sum(seconds)
                RUN_SECONDS[(device, world, name, run["strategy"])] = list(seconds)
                # where the run's first step fell on the schedule (runs before it was recorded: t = 0)
                STARTS[(device, world, name, run["strategy"])] = \
                    run["seeds"][0].get("detail", {}).get("first_step_at") or 0.0
    return steps


#: (device, world, net name, strategy) -> the simulated seconds of compare's run, and of each of its steps
SPANS: dict[tuple[str, int, str, str], float] = {}
RUN_SECONDS: dict[tuple[str, int, str, str], list[float]] = {}
STARTS: dict[tuple[str, int, str, str], float] = {}
#: the day this run measured its rows
MEASURED = time.strftime("%Y-%m-%d")
#: predict's short run at this many ranks for every compared world size (None: at each world size itself)
FROM_WORLD: int | None = None


def run_shape(device: str, world: int, compute: float) -> Any:
    """compare's run around its steps, priced on ``device`` as the clock prices it (``gradwire.predict.Epochs``),
    for a profile whose forward and backward take ``compute`` seconds.

    Steps an epoch (the data's arithmetic), the partial last batch's forward and backward as the compute a full
    one's leaves out (the clock's step is shorter by that difference, not by its ratio: the profile's compute
    also holds work no batch size moves, DDP's, ``zero_grad``'s; cpu-core at 16 ranks, batch 32: 5.94 ms
    less, where the ratio of the two, 0.754, took 7.0 ms off the profile's 28.5), the evaluation of the test
    set and the next epoch's shuffle between epochs, and the fetch of the next batch between two steps, each
    priced op by op on the device's roofline. predict's measured step holds its batch's
    gather (its loop indexes the data inside the step), where compare's loop fetches the batch before it: the
    gather is taken out of what lies between the replayed steps."""
    import torch

    from gradwire.device.catalog import parse_device
    from gradwire.device.roofline import RooflineMode
    from gradwire.predict import Epochs
    from gradwire.train.data import TRAIN_SIZE, load_digits, shard_batches, steps_per_epoch
    from gradwire.train.loop import evaluate
    from gradwire.train.models import build_model

    chip = parse_device(device).device
    data, model, loss = load_digits(), build_model(MODEL, seed=0), torch.nn.CrossEntropyLoss()

    def priced(work: Any) -> float:
        total = [0.0]
        with RooflineMode(chip, lambda seconds: total.__setitem__(0, total[0] + seconds), lambda: False):
            work()
        return total[0]

    def step(n: int) -> float:  # as compare's loop runs it: its gradients set to None first, not accumulated
        model.zero_grad(set_to_none=True)
        return priced(lambda: loss(model(data.x_train[:n]), data.y_train[:n]).backward())

    last = (TRAIN_SIZE // world) % BATCH or BATCH
    batches = shard_batches(data, 0, world, BATCH, 0, 1)
    first, fetch = priced(lambda: next(batches)), priced(lambda: next(batches))  # the shuffle and a slice, a slice
    idx = torch.arange(BATCH)
    gather = min(fetch, priced(lambda: (data.x_train[idx], data.y_train[idx])))
    return Epochs(steps_per_epoch(TRAIN_SIZE, world, BATCH), gap=fetch - gather,
                  last=max(0.01, 1 - (step(BATCH) - step(last)) / compute),
                  pause=priced(lambda: evaluate(model, data.x_test, data.y_test)) + first - gather)


def over_span(res: dict[str, Any], strategy: str, device: str, world: int, net: str = "changing") -> float:
    """predict's step over the run compare made (its own profiles, as the CLI fitted them): the whole run
    replayed from the instant on the schedule where its first step began, its warm-up first (``predict(...,
    epochs=...)`` takes a strategy's warm-up steps on the plain all_reduce), its epochs around its steps
    (:func:`run_shape`), and compare's rule applied to the replayed steps (:func:`_steady`): like with like.

    Why the whole run and not from its first kept step: each step of a ``delayed`` run waits for the exchange
    the step before launched, back to the first; a replay that starts later starts with nothing in flight
    (a100, 8 ranks, delayed: its first kept step 3.64 ms in the run, 0.78 in such a replay, every later step
    2.9 ms early on the schedule, -4.7% over the run). The price: the run's first two steps (its first
    exchange, DDP's rebuild of its buckets) are in neither figure and predict prices them a fraction of a
    millisecond off, and on a schedule whose period is close to a few steps that fraction moves which steps
    meet the change for the rest of the run (benchmarks/README.md)."""
    return _steady(replayed(res, strategy, device, world, net), strategy, world, net == "changing")


def replayed(res: dict[str, Any], strategy: str, device: str, world: int, net: str = "changing") -> list[float]:
    """Each step's seconds in predict's replay of compare's whole run (:func:`over_span`), the run's first one
    first."""
    from gradwire.predict import StepProfile, predict
    from gradwire.predict.priced import priced_cost

    profiles = res["profiles"]
    prof = StepProfile.from_dict(profiles.get(strategy) or profiles.get("sync") or profiles["*"])
    key = (device, world, net, strategy)
    seconds, shape = RUN_SECONDS[key], run_shape(device, world, prof.forward + prof.backward)
    steps, start = len(seconds), STARTS[key]
    horizon = start + sum(seconds) + shape.pause * -(-steps // shape.steps) + shape.gap * steps
    replay = predict(prof, strategy, nets_of(device)[net], world, priced_cost(strategy, device),
                     horizon=horizon, epochs=dataclasses.replace(shape, start=start))
    return list(replay.durations[:steps])


def side_by_side(devices: list[str], worlds: list[int], work: str, net: str = "changing") -> None:
    """compare's steps beside predict's replay of them, and how far ahead (-) or behind (+) of the run the
    replay is at each step's end: where a cell's two figures part, step by step (compare's kept runs in
    ``work``). The replay's step holds the batch's gather, which compare's loop does before its step
    (:func:`run_shape`): a drift of that much a step (10 us on an a100) is the run's."""
    for device in devices:
        for world in worlds:
            compare_steps(device, world, Path(work))
            res = predict_answers(device, world, Path(work), reuse=True)
            for strategy in STRATEGIES:
                if (device, world, net, strategy) not in RUN_SECONDS:
                    continue
                run, replay = RUN_SECONDS[(device, world, net, strategy)], replayed(res, strategy, device, world, net)
                print(f"{device}, {world} ranks, {net}, {strategy}: step, compare's ms, the replay's ms, drift ms")
                drift = 0.0
                for k, (a, b) in enumerate(zip(run, replay)):
                    drift += b - a
                    mark = "  <<" if abs(b - a) > 0.05 * a else ""
                    print(f"{k:5d} {a * 1e3:10.3f} {b * 1e3:10.3f} {drift * 1e3:+9.3f}{mark}")


def _name(spec: str, device: str) -> str | None:
    """Which of the device's networks a spec string is (its clock and device left out)."""
    import re

    bare = re.sub(r",(clock|device)=[^,]*", "", spec)
    return next((k for k, n in nets_of(device).items() if n == bare), None)


def predict_answers(device: str, world: int, tmp: Path, reuse: bool = False) -> dict[str, Any]:
    """``gradwire predict``'s answers (its ``--json``) for the device and world size, run into ``tmp`` (with
    ``reuse``, read from there when present)."""
    measure = FROM_WORLD or world
    out = tmp / (f"predict-{device}-{world}.json" if FROM_WORLD is None else f"predict-{device}-{world}-from{measure}.json")
    cmd = ["predict", "--device", device, "--model", MODEL, "--batch-size", str(BATCH), "--measure-world", str(measure),
           "--worlds", str(world), "--strategies", ",".join(STRATEGIES), "--json", str(out)]
    for net in nets_of(device).values():
        cmd += ["--net", net]
    if not out.exists() or not reuse:
        _run(cmd)
    return json.loads(out.read_text())


def predict_steps(device: str, world: int, tmp: Path, reuse: bool = False) -> dict[tuple[str, ...], float]:
    """(net name, strategy) -> predict's step in seconds (``("run", net name, strategy)``: over compare's run)."""
    res = predict_answers(device, world, tmp, reuse)
    steps: dict[tuple[str, ...], float] = {(str(_name(p["net"], device)), p["strategy"]): p["step_seconds"]
                                          for p in res["predictions"]}
    for strategy in STRATEGIES:
        for net in nets_of(device):
            if (device, world, net, strategy) in SPANS:
                steps[("run", net, strategy)] = over_span(res, strategy, device, world, net)
    return steps


def agree(devices: list[str], worlds: list[int], work: str | None, skip: tuple[str, ...] = ()) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = work or scratch
        for device in devices:
            for world in worlds:
                measured = compare_steps(device, world, Path(tmp), skip)
                predicted = predict_steps(device, world, Path(tmp), reuse=work is not None)
                for (net, strategy), step in sorted(measured.items()):
                    p = predicted[(net, strategy)]
                    row = {"device": device, "world": world, "net": net, "spec": nets_of(device)[net],
                           "strategy": strategy, "measured": MEASURED, "compare_ms": step * 1e3, "predict_ms": p * 1e3,
                           "error": p / step - 1, "predict_measured_at": FROM_WORLD or world}
                    run = predicted[("run", net, strategy)]
                    if net == "changing":  # like with like: the same stretch of the schedule, the run's shape
                        row.update(predict_600s_ms=p * 1e3, error_600s=p / step - 1, predict_ms=run * 1e3,
                                   error=run / step - 1, span_s=SPANS[(device, world, net, strategy)])
                    else:  # beside predict's steady step: its replay of compare's run, by compare's rule
                        row.update(predict_run_ms=run * 1e3, error_run=run / step - 1)
                    rows.append(row)
                    print(f"{device:9} {world:2} {net:14} {strategy:17} compare {step * 1e3:8.2f} ms  predict "
                          f"{row['predict_ms']:8.2f} ms  {row['error']:+.1%}", flush=True)
    path = RESULTS / f"{NAME or 'agree'}.json"
    epochs = EPOCHS
    if MERGE and path.exists():  # the other cells' rows, as measured before
        before = json.loads(path.read_text())
        rerun = {(r["device"], r["world"], r["net"], r["strategy"]) for r in rows}
        rows = [r for r in before["rows"] if (r["device"], r["world"], r["net"], r["strategy"]) not in rerun] + rows
        if ONLY_CHANGING:  # the static networks' runs are the file's
            epochs = before.get("epochs", EPOCHS)
    write_results(path, rows, clock="simulated cluster clock (both sides)", **_summary(rows), model=MODEL,
                  batch_size=BATCH, epochs=epochs, changing_epochs=CHANGING_EPOCHS)


def hosts(devices: list[str], worlds: list[int]) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for device in devices:
            for world in worlds:
                quiet = predict_steps(device, world, Path(tmp))
                loops = [subprocess.Popen(BUSY) for _ in range(2)]
                try:
                    busy = predict_steps(device, world, Path(tmp))
                finally:
                    for p in loops:
                        p.kill()
                        p.wait()
                for key, step in sorted(quiet.items()):
                    rows.append({"device": device, "world": world, "net": key[0], "strategy": key[1],
                                 "quiet_ms": step * 1e3, "busy_ms": busy[key] * 1e3, "difference": busy[key] / step - 1})
    worst = max(abs(r["difference"]) for r in rows)
    print(f"{len(rows)} predictions, the largest difference beside two busy loops: {worst:.3%}")
    write_results(RESULTS / f"{NAME or 'hosts'}.json", rows, clock="simulated cluster clock", largest_difference=worst)


def reprice(devices: list[str], worlds: list[int], work: str | None) -> None:
    path = RESULTS / f"{NAME or 'agree'}.json"
    before = json.loads(path.read_text())
    rows, cache = before.pop("rows"), {}
    with tempfile.TemporaryDirectory() as scratch:
        for row in rows:
            if row["net"] == "changing" or row["device"] not in devices or row["world"] not in worlds:
                continue
            key = (row["device"], row["world"])
            if key not in cache:
                cache[key] = predict_steps(*key, Path(work or scratch), reuse=work is not None)
            p = cache[key][(row["net"], row["strategy"])]
            was = row["error"]
            row.update(predict_ms=p * 1e3, error=p / (row["compare_ms"] / 1e3) - 1, predicted=MEASURED,
                       predict_measured_at=FROM_WORLD or row["world"])
            for field in ("predict_run_ms", "error_run"):
                row.pop(field, None)
            print(f"{row['device']:9} {row['world']:2} {row['net']:14} {row['strategy']:17} compare "
                  f"{row['compare_ms']:8.2f} ms  predict {row['predict_ms']:8.2f} ms  {row['error']:+.1%} "
                  f"(was {was:+.1%})", flush=True)
    before.setdefault("runs_command", before.get("command"))  # the command behind compare's steps
    for field in ("command", "commit", "dirty", "host", "date"):
        before.pop(field, None)
    write_results(path, rows, **{**before, **_summary(rows)})


def main() -> None:
    global EPOCHS, NAME, BATCH, STRATEGIES, MERGE, ONLY_CHANGING, FROM_WORLD
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("agree", "hosts", "reprice", "steps"))
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--devices", default="cpu-core,a100,t4")
    ap.add_argument("--work", default=None, help="keep compare's results here (reused when present)")
    ap.add_argument("--skip-changing", default="", help="DEVICE:WORLD,...: leave out the changing network there")
    ap.add_argument("--only-changing", action="store_true", help="agree: the changing network alone")
    ap.add_argument("--epochs", type=int, default=3, help="of compare's runs on the static networks")
    ap.add_argument("--changing-epochs", type=int, default=None,
                    help="of compare's runs on the changing network, on every device (default: 10 on cpu-core, "
                         f"{GPU_CHANGING_EPOCHS} on a GPU; at 8 ranks an epoch holds 4 times fewer steps than at 2)")
    ap.add_argument("--name", default=None, help="results file name (default: the mode's)")
    ap.add_argument("--batch-size", type=int, default=BATCH,
                    help="per rank, for compare and predict alike (at 16 ranks 64 leaves one full batch an epoch)")
    ap.add_argument("--strategies", default=",".join(STRATEGIES), help="a subset of " + ",".join(STRATEGIES))
    ap.add_argument("--merge", action="store_true",
                    help="agree: keep the other cells' rows of the results file (device, ranks, network, strategy), "
                         "replace these ones'")
    ap.add_argument("--from-world", type=int, default=None,
                    help="agree: predict from its short run at this many ranks (default: at each compared world "
                         "size), as a user predicts a larger cluster from a small run")
    args = ap.parse_args()
    if args.from_world is not None and args.from_world < 2:
        ap.error(f"--from-world: a short run needs 2 ranks or more, got {args.from_world}")
    EPOCHS, NAME, BATCH, MERGE, FROM_WORLD = args.epochs, args.name, args.batch_size, args.merge, args.from_world
    ONLY_CHANGING = args.only_changing
    unknown = set(args.strategies.split(",")) - set(STRATEGIES)
    if unknown:
        ap.error(f"--strategies: {','.join(sorted(unknown))} not among {','.join(STRATEGIES)}")
    STRATEGIES = tuple(s for s in STRATEGIES if s in args.strategies.split(","))
    if args.changing_epochs is not None:
        CHANGING_EPOCHS.update({d: args.changing_epochs for d in args.devices.split(",")})
    worlds = [int(w) for w in args.worlds.split(",")]
    devices = args.devices.split(",")
    if args.mode == "agree":
        agree(devices, worlds, args.work, tuple(x for x in args.skip_changing.split(",") if x))
    elif args.mode == "steps":
        ONLY_CHANGING = True
        if args.work is None:
            ap.error("steps: name the folder that holds compare's kept runs and predict's answers with --work DIR "
                     "(the one an agree --work DIR run filled)")
        side_by_side(devices, worlds, args.work)
    elif args.mode == "reprice":
        if not (RESULTS / f"{NAME or 'agree'}.json").exists():
            ap.error(f"reprice: no results file {NAME or 'agree'}.json in {RESULTS} to predict again beside; name "
                     "one of its files with --name, or run agree first")
        reprice(devices, worlds, args.work)
    else:
        hosts(devices, worlds)


if __name__ == "__main__":
    main()
