"""Run PyTorch's own distributed test suite on gloo and on gradwire, test by test, in one run.

The suite is ``torch/testing/_internal/distributed/distributed_test.py`` from
the installed torch; it is run as PyTorch's test/distributed/test_distributed_spawn.py
runs it: ``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR`` with a ``barrier/`` folder,
``INIT_METHOD=file://...``, one fresh set of spawned ranks per test. The suite
decides which tests apply by ``BACKEND == "gloo"``, so ``BACKEND`` stays
``gloo`` and only the backend handed to ``init_process_group`` changes: in the
ranks of a gradwire run, ``init_process_group(backend="gloo")`` becomes
``init_process_group(backend="gradwire")``, and the group reports the name
``gloo`` the test asked for, as under ``gradwire profile``
(:mod:`gradwire.backend.names`): new groups without a backend, or that ask
for ``gloo`` by name, are gradwire groups reporting ``gloo`` too.

Each test runs on gloo, then on gradwire, before the next test starts, so a
loaded machine affects both alike.

Ranks start with ``spawn`` as in PyTorch's runner, which re-imports torch in
every rank of every test (seconds each, 285 tests twice); ``--start fork``
runs the same tests in a few minutes.

Usage:
    python benchmarks/torch_suite.py --start fork         # whole suite, 2 ranks
    python benchmarks/torch_suite.py --ran-in benchmarks/results/torch_suite.json \
        --out benchmarks/results/torch_suite_spawn.json    # spawn, only the tests that ran
    python benchmarks/torch_suite.py -k any_source -k batch_isend --out /tmp/x.json
    python benchmarks/torch_suite.py --net 1gbe           # gradwire simulates 1 Gbit/s

Writes benchmarks/results/torch_suite.json by default, in the shared shape of
``_results.write_results``: passed / failed / skipped per backend (``counts``),
and one row per test, ``{"test": NAME, "gloo": {...}, "gradwire": {...}}``,
with its status, detail and seconds on each backend.
"""
from __future__ import annotations

import os
import sys
import tempfile

#: the backend the ranks of the current test use ("gloo" or "gradwire"); read when they init
_SWAP_VAR = "GRADWIRE_SUITE_BACKEND"
#: how the ranks start: "spawn" (as test_distributed_spawn.py) or "fork" (no re-import per rank: faster)
_START_VAR = "GRADWIRE_SUITE_START"

if __name__ in ("__main__", "__mp_main__") and "TEMP_DIR" not in os.environ:
    # the suite reads its environment at import: set it up before torch's test modules load
    _tmp = tempfile.mkdtemp(prefix="gradwire_torch_suite_")
    os.makedirs(os.path.join(_tmp, "barrier"), exist_ok=True)
    os.environ.update(TEMP_DIR=_tmp, BACKEND="gloo", INIT_METHOD=f"file://{_tmp}/init")
    os.environ.setdefault("WORLD_SIZE", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
import unittest  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

import gradwire  # noqa: E402 - registers the backend in every rank

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import write_results  # noqa: E402

_init_process_group = dist.init_process_group


def _init_swapped(*args, **kwargs):  # type: ignore[no-untyped-def]
    """``init_process_group`` with the suite's ``gloo`` swapped for the backend of this run."""
    target = os.environ.get(_SWAP_VAR, "gloo")
    asked = kwargs.get("backend", args[0] if args else None)
    if asked != "gloo" or target == "gloo":
        return _init_process_group(*args, **kwargs)
    if "backend" in kwargs:
        kwargs["backend"] = target
    else:
        args = (target, *args[1:])
    _init_process_group(*args, **kwargs)
    gradwire.backend.report_as(dist.distributed_c10d._get_default_group(), asked)  # as the profile's bootstrap does


dist.init_process_group = _init_swapped
dist.distributed_c10d.init_process_group = _init_swapped


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """The suite's test class, as test_distributed_spawn.py builds it for ``BACKEND=gloo``."""

    def setUp(self) -> None:
        super().setUp()
        if os.environ.get(_START_VAR, "spawn") == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


def _outcome(result: unittest.TestResult, test: unittest.TestCase) -> tuple[str, str]:
    for kind, items in (("failed", result.failures), ("failed", result.errors)):
        for t, tb in items:
            if t is test:
                last = [line for line in tb.strip().splitlines() if line.strip()][-1]
                return kind, last[:300]
    for t, reason in result.skipped:
        if t is test:
            return "skipped", str(reason)[:200]
    if result.expectedFailures:
        return "passed", "expected failure"
    return "passed", ""


def _run_one(test: unittest.TestCase, backend: str) -> tuple[str, str, float]:
    os.environ[_SWAP_VAR] = backend
    result = unittest.TestResult()
    t0 = time.perf_counter()
    test(result)
    return (*_outcome(result, test), time.perf_counter() - t0)


def tests_of(report: dict) -> dict[str, dict[str, dict]]:
    """Each test's outcome per backend in a report this script wrote: its ``rows`` or, in files
    written before the shared shape, its ``tests``."""
    if "rows" in report:
        return {r["test"]: {b: v for b, v in r.items() if b != "test"} for r in report["rows"]}
    return report["tests"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", action="append", default=[], help="run only tests whose name contains this (repeatable)")
    parser.add_argument("--backends", default="gloo,gradwire", help="comma-separated, in run order (default %(default)s)")
    parser.add_argument("--net", default=None, help="network gradwire simulates (default: $GRADWIRE_NET or loopback)")
    parser.add_argument("--ran-in", type=Path, default=None,
                        help="run only the tests that some backend did not skip in this earlier report")
    parser.add_argument("--start", choices=("spawn", "fork"), default="spawn",
                        help="how ranks start: spawn, as PyTorch runs the suite (default), or fork (faster)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "torch_suite.json"))
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in backends if b not in ("gloo", "gradwire")]
    if bad:
        parser.error(f"--backends takes gloo and gradwire, got {bad}")
    if args.net:
        gradwire.configure(args.net)  # raises on a bad spec, before any test runs
        os.environ[gradwire.backend.ENV_VAR] = args.net
    os.environ[_START_VAR] = args.start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    names = sorted(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn))
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    if args.ran_in is not None:
        earlier = tests_of(json.loads(args.ran_in.read_text()))
        names = [n for n in names if any(r["status"] != "skipped" for r in earlier.get(n, {}).values())]
    tests: dict[str, dict[str, dict]] = {}
    t_start = time.time()
    for i, name in enumerate(names):
        row: dict[str, dict] = {}
        for backend in backends:
            status, detail, seconds = _run_one(TestDistBackendWithSpawn(name), backend)
            row[backend] = {"status": status, "detail": detail, "seconds": round(seconds, 2)}
        tests[name] = row
        summary = " ".join(f"{b}={row[b]['status']}" for b in backends)
        print(f"[{i + 1}/{len(names)}] {name}: {summary}", flush=True)

    counts = {b: {s: sum(1 for r in tests.values() if r[b]["status"] == s) for s in ("passed", "failed", "skipped")}
              for b in backends}
    report: dict = {
        "torch": torch.__version__,
        "world_size": int(os.environ["WORLD_SIZE"]),
        "net": os.environ.get(gradwire.backend.ENV_VAR) or "loopback",
        "start": args.start,
        "seconds": round(time.time() - t_start, 1),
        "counts": counts,
    }
    if set(backends) == {"gloo", "gradwire"}:
        report["passed_on_gloo_only"] = sorted(n for n, r in tests.items()
                                               if r["gloo"]["status"] == "passed" and r["gradwire"]["status"] != "passed")
        report["passed_on_gradwire_only"] = sorted(n for n, r in tests.items()
                                                   if r["gradwire"]["status"] == "passed" and r["gloo"]["status"] != "passed")
    command = " ".join([f"WORLD_SIZE={os.environ['WORLD_SIZE']}", "python", "benchmarks/torch_suite.py",
                        *(argv if argv is not None else sys.argv[1:])])
    rows = [{"test": name, **row} for name, row in tests.items()]
    written = write_results(out, rows, command=command, **report)
    print(json.dumps({k: v for k, v in written.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
