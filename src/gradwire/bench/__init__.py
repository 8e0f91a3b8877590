"""Benchmarks: collectives by nccl-tests conventions, and model fitting.

    from gradwire.bench import BenchConfig, run, format_table
    result = run(BenchConfig(ops=("all_reduce",), backend="gradwire", net="1gbe",
                             min_bytes=1 << 20, max_bytes=16 << 20))
    print(format_table(result))

Modules: :mod:`~gradwire.bench.collectives` (one definition per collective),
:mod:`~gradwire.bench.driver` (the shared sweep), :mod:`~gradwire.bench.report`
(table, JSON, CSV, plot), :mod:`~gradwire.bench.fit` (alpha-beta fit),
:mod:`~gradwire.bench.doctor` (cross-rank environment checks).
"""
from __future__ import annotations

from gradwire.bench.config import BenchConfig, parse_bench_size
from gradwire.bench.driver import BenchResult, Row, run
from gradwire.bench.fit import Fit, fit_result
from gradwire.bench.report import format_table, plot, write_csv, write_json

__all__ = [
    "BenchConfig", "BenchResult", "Fit", "Row", "fit_result", "format_table", "parse_bench_size",
    "plot", "run", "write_csv", "write_json",
]
