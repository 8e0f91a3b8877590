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

from importlib import import_module
from typing import Any

# Lazy exports: `gradwire --help` imports gradwire.bench.config, which must not pull in torch.
_EXPORTS = {
    "BenchConfig": "config", "parse_bench_size": "config",
    "BenchResult": "driver", "BenchRow": "driver", "run": "driver",
    "Fit": "fit", "fit_result": "fit",
    "format_table": "report", "plot": "report", "write_csv": "report", "write_json": "report",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"gradwire.bench.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'gradwire.bench' has no attribute {name!r}")
