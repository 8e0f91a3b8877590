"""`gradwire predict`: step time, throughput and scaling efficiency for 2 … 1024 ranks, per strategy and network.

Where the step comes from (one of):

- ``--profile DIR``: what ``gradwire profile --out DIR`` recorded of a real
  job (forward, backward, each DDP bucket's size and ready time, optimizer);
- ``--model PKG.MODULE:FACTORY`` or ``--model path/to/file.py:FACTORY`` with
  ``--compute-ms``: a model built on the meta device (no weights, no memory)
  for its parameter layout and DDP's buckets, and the backward time given;
- ``--model NAME`` (a bundled digits model): a short loopback run per
  strategy, recorded the same way (``--compute-ms`` describes it instead).

A step is an optimizer step: with gradient accumulation its micro-steps'
compute comes first, then the synchronising one's forward, backward and
exchange. ``--accumulate N`` asks what N micro-steps per optimizer step
would give (the recorded micro-step, N times).

Each strategy's step is replayed bucket by bucket on the network model of
every ``--net`` at every world size (nothing runs). The last column is the
smallest compression ratio that reaches ``--target-efficiency``.

Which clock: ``--device NAME`` (default: compare's, ``cpu-core``) prices
compute on that device's roofline, as the simulated cluster clock does
(:mod:`gradwire.predict.priced`): the bundled model's short runs are on that
clock, compression is priced by the same rule, and the figures are the
cluster's, the same on any host. ``--device host`` is this host's wall clock:
the runs and the compression are timed here, as before.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradwire.cli._args import default_nets, input_file, net_spec, output_file, positive_int

if TYPE_CHECKING:
    from gradwire.net import NetSpec

DEFAULT_STRATEGIES = "sync,fp16,onebit,delayed,onebit+delayed"


def _float_in(name: str, low: float, high: float, low_open: bool = True) -> Any:
    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        ok = (value > low if low_open else value >= low) and value <= high
        if not ok or math.isnan(value):
            bound = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"{name} must be in {bound}{low:g}, {high:g}], got {text!r}")
        return value

    convert.__name__ = "number"
    return convert


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in re.split(r"[,x]", text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--input-shape must be integers like 3,224,224, got {text!r}") from None
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"--input-shape must be positive integers like 3,224,224, got {text!r}")
    return dims


def _accumulate(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.strip():
        raise argparse.ArgumentTypeError(f"--accumulate must be an integer >= 1 (micro-steps per optimizer step; "
                                         f"1: no accumulation), got {text!r}")
    return value


def _device(text: str) -> str:
    """A ``--device`` value: ``host`` (this host's wall clock) or a device model predict prices on."""
    if text.strip().lower() == "host":
        return "host"
    from gradwire.predict.priced import device_of

    try:
        return device_of(text).text
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(sub: Any) -> None:
    from gradwire.compare.config import DEFAULT_DEVICE, DEFAULT_NET

    p = sub.add_parser("predict", help="predict step time and scaling efficiency on larger clusters",
                       description=__doc__.splitlines()[0])
    p.add_argument("--net", action="append", type=net_spec, default=None,
                   help=f"network spec or preset; repeat for several (default: compare's first network, "
                        f"{DEFAULT_NET}). GPU clusters: e.g. 25gbe,topology=1x8,intra=nvlink")
    p.add_argument("--strategies", default=DEFAULT_STRATEGIES,
                   help="comma-separated composed names (default: %(default)s)")
    p.add_argument("--model", default="cnn-wide",
                   help="a bundled model name (measured), or PKG.MODULE:FACTORY / path/file.py:FACTORY "
                        "(described; needs --compute-ms) (default: %(default)s)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="predict from what `gradwire profile --out DIR` recorded")
    p.add_argument("--compute-ms", type=_float_in("--compute-ms", 0, 1e9), default=None,
                   help="backward time of one step in ms (e.g. measured on your GPU): describe --model instead "
                        "of measuring it")
    p.add_argument("--forward-ratio", type=_float_in("--forward-ratio", 0, 100, low_open=False), default=0.5,
                   help="forward time as a share of --compute-ms (default: %(default)s)")
    p.add_argument("--optimizer-ms", type=_float_in("--optimizer-ms", 0, 1e9, low_open=False), default=0.0,
                   help="optimizer time per step in ms for a described model (default: %(default)s)")
    p.add_argument("--input-shape", type=_shape, default=None,
                   help="one sample's shape (e.g. 3,224,224): spread backward by FLOPs instead of parameters")
    p.add_argument("--bucket-cap-mb", type=_float_in("--bucket-cap-mb", 0, 1e6), default=None,
                   help="DDP's bucket_cap_mb (default: DDP's default, 25 with a 1 MiB first bucket)")
    p.add_argument("--batch-size", type=positive_int(1), default=None,
                   help="samples per rank per forward (per micro-step with --accumulate), for throughput in "
                        "samples/s (default with --profile: the batch its DDP forwards saw)")
    p.add_argument("--accumulate", type=_accumulate, default=None, metavar="N",
                   help="what-if: N micro-steps (backward passes) per optimizer step, the gradients exchanged "
                        "once, after the last (default: as recorded; 1 without accumulation)")
    p.add_argument("--target-efficiency", type=_float_in("--target-efficiency", 0, 1), default=0.9,
                   help="scaling efficiency the 'ratio needed' column aims at (default: %(default)s)")
    p.add_argument("--device", type=_device, default=DEFAULT_DEVICE,
                   help="what the cluster computes on, priced as the simulated cluster clock prices it: cpu-core, "
                        "t4, v100, a100, h100 (datasheet rooflines), TFLOPS/GBps (e.g. 19.5/1555), NAME:xF; or host: "
                        "this host's wall clock, runs and compression timed here (default: %(default)s, compare's)")
    p.add_argument("--codec", choices=("measure", "free"), default="measure",
                   help="compression time: measure prices it on --device (times it here with --device host), free "
                        "costs nothing (default: %(default)s)")
    p.add_argument("--codec-device", default=None,
                   help="with --device host: where the compression time is timed (default: cuda if available, "
                        "else cpu)")
    p.add_argument("--measure-world", type=positive_int(2), default=4,
                   help="ranks of the measured run of a bundled model, >= 2 (default: %(default)s)")
    p.add_argument("--steps", type=positive_int(5), default=None,
                   help="steps of each measured run (default: 60 with --device host, shorter runs are noisier; on a "
                        "device model the warm-up + 8, every steady step priced alike)")
    p.add_argument("--worlds", default=None,
                   help="world sizes to predict (default: 2, 4, ... 1024; multiples of the ranks per node)")
    p.add_argument("--profiles", type=input_file, default=None,
                   help="read the profiles of an earlier --json instead of measuring")
    p.add_argument("--json", type=output_file, default=None, help="write profiles and predictions here")
    p.add_argument("--plot", type=output_file, default=None,
                   help="write a PNG of scaling efficiency against world size, one panel per network")
    p.set_defaults(func=run)


def _worlds(text: str) -> list[int]:
    try:
        worlds = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise ValueError(f"--worlds must be comma-separated integers, got {text!r}") from None
    if not worlds or min(worlds) < 2:
        raise ValueError(f"--worlds must list world sizes >= 2, got {text!r}")
    return worlds


def _check_inputs(args: argparse.Namespace, specs: list[NetSpec], strategies: list[str]) -> dict[str, list[int]]:
    """Refuse bad input before any work; the world sizes of each network (by its spec string)."""
    from gradwire.strategies import parse_strategy
    from gradwire.predict import check_fits, default_worlds
    from gradwire.predict.describe import is_factory
    from gradwire.predict.plans import check_planned

    for s in strategies:
        check_planned(parse_strategy(s))
    sources = [bool(args.profile), bool(args.profiles)]
    if sum(sources) > 1:
        raise ValueError("give one of --profile DIR and --profiles FILE")
    if is_factory(args.model) and args.compute_ms is None and not any(sources):
        raise ValueError(f"--model {args.model!r} is described, not run: give --compute-ms, the backward time of "
                         "one step in ms (e.g. measured on your GPU)")
    if args.codec_device is not None and args.device != "host":
        raise ValueError(f"--codec-device times compression on this host; it goes with --device host (--device "
                         f"{args.device} prices compression on that device itself)")
    if args.profile and not Path(args.profile).is_dir():
        raise ValueError(f"--profile {args.profile!r} is not a folder; give the --out folder of gradwire profile")
    explicit = _worlds(args.worlds) if args.worlds else None
    worlds = {}
    for spec in specs:
        sizes = worlds[spec.to_string()] = explicit or default_worlds(spec)
        check_fits(spec, sizes)
    return worlds


def _codec_device(args: argparse.Namespace) -> str:
    import torch

    device = args.codec_device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--codec-device {device!r}: no CUDA device here; use cpu")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"--codec-device must be cpu or cuda[:N], got {device!r}")
    return device


def _profiles(args: argparse.Namespace, strategies: list[str]) -> dict[str, Any]:
    """Profiles by strategy name; "*" is the one every strategy without its own uses."""
    from gradwire.predict.describe import describe_model, is_factory

    if args.profiles:
        from gradwire.predict.report import read_profiles

        return read_profiles(args.profiles)
    if args.profile:
        from gradwire.predict.recorded import load_profile_dir

        return {"*": load_profile_dir(args.profile, batch_size=args.batch_size)}
    if args.compute_ms is not None:
        return {"*": describe_model(args.model, args.compute_ms, args.bucket_cap_mb, args.forward_ratio,
                                    args.optimizer_ms, args.input_shape, args.batch_size)}
    from gradwire.strategies import parse_strategy
    from gradwire.predict.measure import measure_profiles
    from gradwire.train.models import MODELS

    if args.model not in MODELS and not is_factory(args.model):
        raise ValueError(f"unknown model {args.model!r}; valid models: {', '.join(sorted(MODELS))}, or "
                         "PKG.MODULE:FACTORY / path/file.py:FACTORY with --compute-ms")
    from gradwire.strategies import Timing

    averaging = (Timing.AVERAGE, Timing.AVERAGE_OVERLAPPED)
    ddp = [s for s in strategies if parse_strategy(s).timing not in averaging]
    measured = list(dict.fromkeys(ddp + ["sync"]))  # the averaging strategies and the ratio column use sync's
    if args.device != "host":  # on the device model: the simulated cluster clock's prices (gradwire.predict.priced)
        from gradwire.predict.priced import priced_profiles

        profiles = priced_profiles(measured, args.model, args.measure_world, args.device, args.batch_size or 32,
                                   args.bucket_cap_mb, args.steps)
        profiles["*"] = profiles["sync"]
        return profiles
    profiles = measure_profiles(measured, args.model, args.measure_world, args.steps or 60,
                                args.batch_size or 32, args.bucket_cap_mb)
    profiles["*"] = profiles["sync"]
    return profiles


def _clock(device: str) -> str:
    """What predict's times are, in words."""
    if device == "host":
        return "this host's wall clock (its runs and compression timed here)"
    from gradwire.device import parse_device

    return f"simulated cluster clock; device {parse_device(device).describe()}"


def run(args: argparse.Namespace) -> int:
    from gradwire.compare.config import DEFAULT_NET
    from gradwire.predict import calibrated, sweep
    from gradwire.predict.codec import FREE
    from gradwire.predict.plans import codec_of, exchange_cost
    from gradwire.strategies import parse_strategy

    specs = default_nets(args.net, [DEFAULT_NET])
    nets = [spec.to_string() for spec in specs]  # the names the report and results.json show
    strategies = [str(parse_strategy(s.strip())) for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise ValueError("--strategies is empty; e.g. sync,fp16,onebit,delayed")
    worlds = _check_inputs(args, specs, strategies)
    priced = args.device != "host"
    device = _codec_device(args) if args.codec == "measure" and not priced else "cpu"

    def cost_for(s: str) -> Any:
        if args.codec == "free":
            return FREE
        if priced:
            from gradwire.predict.priced import priced_cost

            return priced_cost(s, args.device)
        return exchange_cost(s, device)

    # auto is replayed as its candidates (sweep): measure and price those
    replayed = list(dict.fromkeys(str(c) for s in strategies
                                  for c in parse_strategy(s).auto_candidates() or [parse_strategy(s)]))
    profiles = {}
    for key, prof in _profiles(args, replayed).items():  # a measured job: its own run calibrates its compute
        known = prof.strategy is not None and prof.stretch == 1.0 and not prof.strategy.startswith("hook:")
        profiles[key] = calibrated(prof, cost_for(prof.strategy)) if known else prof
        if args.accumulate is not None:  # the what-if after the calibration, which fits the run as it ran
            profiles[key] = profiles[key].accumulating(args.accumulate)

    def profile_for(s: str) -> Any:
        return profiles.get(s) or profiles.get("sync") or profiles["*"]

    preds, ratios = sweep(profile_for, strategies, specs, worlds.__getitem__, cost_for, args.target_efficiency)
    from gradwire.predict.report import plot, report

    report(preds, ratios, strategies, nets, worlds, args.target_efficiency, profile_for("sync"))
    print(f"times on the {_clock(args.device)}")
    if args.codec == "measure" and any(codec_of(parse_strategy(s)) is not None for s in strategies):
        where = f"priced on {args.device}" if priced else (
            f"measured on {device}" + (" (one thread)" if device == "cpu" else ""))
        print(f"compression time {where}; --codec free for the best case")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "nets": nets, "target_efficiency": args.target_efficiency, "clock": "realtime" if not priced else "sim",
            "device": args.device,
            "profiles": {k: v.as_dict() for k, v in profiles.items()},
            "predictions": [dict(p.as_dict(), net=net) for (net, _, _), p in preds.items()],
            "ratio_needed": [{"net": n, "world": w, "ratio": r} for (n, w), r in ratios.items()]}, indent=1))
    if args.plot:
        plot(preds, strategies, nets, args.target_efficiency, Path(args.plot))
    return 0
