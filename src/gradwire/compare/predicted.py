"""The prediction beside a comparison's measured speedups: ``gradwire predict``'s model of the same trainings.

It prices every strategy of the comparison at each of its networks (the "predicted" column) and against
bandwidth (``bandwidth.png``, each strategy's crossover), on the comparison's clock:

- the simulated cluster clock (the bundled models' default): each strategy's step priced on the networks'
  device as the clock prices it (:mod:`gradwire.predict.priced`: a short training per strategy on free
  ``loopback`` on that clock, replayed on each network by the clock's overlap rules). Nothing of this host
  enters, so the prediction is the same on any host;
- this host's wall clock (``--clock realtime``): the model replayed on the compute-only run's measured step,
  with this host calibrated first (:mod:`gradwire.compare.crossover`).
"""
from __future__ import annotations

from typing import Any, Callable

from gradwire.compare.config import CompareConfig
from gradwire.compare.report import Row
from gradwire.compare.results import Run

__all__ = ["predict_beside"]


def _pace(runs: list[Run], per_epoch: int) -> float | None:
    """The compute-only run's step compute (s), each seed's as the calibration takes its reference
    (:func:`gradwire.predict.calibrate.reference_step`: a moment of another job's load left out)."""
    from gradwire.compare.config import COMPUTE_ONLY
    from gradwire.predict.calibrate import reference_step

    seeds = [s.step_compute for r in runs if r.strategy == COMPUTE_ONLY and r.ok for s in r.seeds if s.step_compute]
    return sum(reference_step(c, per_epoch)[0] for c in seeds) / len(seeds) if seeds else None


def predict_beside(cfg: CompareConfig, rows: list[Row], runs: list[Run], say: Callable[[str], None] = print) -> Any:
    """The predicted speedups at each network and against bandwidth, on the measured step (None without a
    compute-only run to measure it by), each row's beside its measured one. The host is calibrated first
    (:mod:`gradwire.compare.crossover`); a calibration that fails leaves the prediction to the network and the
    exchanges timed here, and says so."""
    from gradwire.compare.config import COMPUTE_ONLY
    from gradwire.compare.crossover import hook_buckets, replay_for, replayed, speedup_curves
    from gradwire.strategies import Timing, parse_strategy
    from gradwire.predict.calibrate import calibrate
    from gradwire.train.data import TRAIN_SIZE, steps_per_epoch

    ideal = next((r for r in rows if r.strategy == COMPUTE_ONLY and r.ok), None)
    if ideal is None or not ideal.compute_ms > 0 or len(cfg.strategies) < 2:
        return None
    if cfg.nets[0].clock == "sim":
        return _priced(cfg, rows, ideal.compute_ms, say)
    names = cfg.strategy_names
    fixed = list(dict.fromkeys(c for s in names for c in replayed(s)))  # auto: replayed as its candidates
    codecs = [c for s in fixed if isinstance(c := parse_strategy(s).exchange.codec, str)]
    steps = cfg.epochs * steps_per_epoch(TRAIN_SIZE, cfg.workers, cfg.batch_size)
    say(f"predicting: measuring this host with {cfg.workers} ranks (its real collectives, each exchange's CPU work)")
    try:
        buckets = [s for s in fixed if parse_strategy(s).timing in (Timing.BLOCKING, Timing.NEXT_STEP)]
        measured = calibrate(cfg.model, cfg.batch_size, cfg.workers, codecs,
                             hook_buckets(cfg.model, names, cfg.workers), buckets)
    except (RuntimeError, TimeoutError, OSError) as exc:
        say(f"predicting without the host: its calibration failed ({str(exc).splitlines()[0][:160]})")
        replay = replay_for(cfg.model, ideal.compute_ms, names, cfg.workers, cfg.batch_size, steps=steps)
        calibration = None
    else:
        pace = _pace(runs, steps // cfg.epochs)
        scale = (pace if pace is not None else ideal.compute_ms / 1e3) / measured.compute
        replay = replay_for(cfg.model, ideal.compute_ms, names, cfg.workers, cfg.batch_size, measured.scaled(scale),
                            steps)
        calibration = {**measured.as_dict(), "scale": scale}
    curves = speedup_curves(replay, ideal.compute_ms, names, cfg.nets[0], cfg.workers)
    for net, spec in zip(cfg.net_names, cfg.nets):
        steps_ms = {s: t * 1e3 for s, t in replay.steps_on(names, spec).items()}
        curves.step_ms_at_nets[net] = steps_ms
        curves.at_nets[net] = {s: steps_ms[names[0]] / steps_ms[s] for s in names[1:]}
    curves.calibration = calibration
    _with_predictions(rows, curves.at_nets)
    return curves


def _priced(cfg: CompareConfig, rows: list[Row], compute_ms: float, say: Callable[[str], None]) -> Any:
    """The prediction on the simulated cluster clock: every strategy priced on the first network's device."""
    from gradwire.compare.crossover import Replay, replayed, speedup_curves
    from gradwire.predict import calibrated
    from gradwire.predict.priced import device_of, priced_cost, priced_profiles
    from gradwire.train.data import TRAIN_SIZE, steps_per_epoch

    device = cfg.nets[0].device or "cpu-core"
    try:
        device_of(device)
    except ValueError as exc:  # host or step:TIME: a clock of this host's, or one a training scales
        say(f"not predicting: {str(exc).splitlines()[0][:160]}")
        return None
    names = cfg.strategy_names
    fixed = list(dict.fromkeys(c for s in names for c in replayed(s)))
    say(f"predicting: pricing each strategy's step on {device} with {cfg.workers} ranks (simulated cluster clock)")
    try:
        found = priced_profiles(fixed, cfg.model, cfg.workers, device, cfg.batch_size)
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        say(f"not predicting: pricing the steps failed ({str(exc).splitlines()[0][:160]})")
        return None
    costs = {s: priced_cost(s, device) for s in fixed}
    profiles = {s: calibrated(p, costs[s]) for s, p in found.items()}
    steps = cfg.epochs * steps_per_epoch(TRAIN_SIZE, cfg.workers, cfg.batch_size)
    replay = Replay(profiles, costs, cfg.workers, compute_ms, None, steps)
    curves = speedup_curves(replay, compute_ms, names, cfg.nets[0], cfg.workers)
    for net, spec in zip(cfg.net_names, cfg.nets):
        steps_ms = {s: t * 1e3 for s, t in replay.steps_on(names, spec).items()}
        curves.step_ms_at_nets[net] = steps_ms
        curves.at_nets[net] = {s: steps_ms[names[0]] / steps_ms[s] for s in names[1:]}
    _with_predictions(rows, curves.at_nets)
    return curves


def _with_predictions(rows: list[Row], at_nets: dict[str, dict[str, float]]) -> None:
    """Each row's predicted speedup, beside its measured one."""
    for r in rows:
        r.predicted_speedup = at_nets.get(r.net, {}).get(r.strategy, float("nan"))
