"""The one result shape every benchmark writes: what ran, where, on what, and its rows.

Every ``benchmarks/*.py`` ends with :func:`write_results`, so each JSON file
under ``benchmarks/results/`` answers the same questions first::

    {"command": "python benchmarks/compress_wire.py --steps 4",
     "commit": "67ada1f", "dirty": false,
     "host": {"cpu": "AMD EPYC ...", "cores": 2, "load": [1.2, 0.9, 0.8], "torch": "2.13.0+cpu", ...},
     "date": "2026-12-01T15:55:00+00:00",
     "rows": [...],
     ...the benchmark's own summary fields}

A timing is only as good as the host beside it: ``load`` is the 1, 5 and 15
minute load average when the benchmark ended (compare it with ``cores``).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["host", "write_results"]

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host() -> dict[str, Any]:
    """The machine a figure came from: CPU, the cores this process may use, load, Python and torch."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    info: dict[str, Any] = {"cpu": _cpu(), "cores": cores, "load": [round(x, 2) for x in os.getloadavg()],
                            "python": platform.python_version(), "system": platform.platform()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info["torch"] = None
    return info


def write_results(path: str | Path, rows: Any, *, command: str | None = None, indent: int | None = 1,
                  **summary: Any) -> dict[str, Any]:
    """Write ``rows`` (and ``summary``'s fields) to ``path`` in the shared shape (module doc); return it.

    ``command`` defaults to how this process was started (``python benchmarks/NAME.py ARGS``).
    """
    if command is None:
        script = Path(sys.argv[0])
        try:
            script = script.resolve().relative_to(ROOT)
        except ValueError:
            pass
        command = " ".join(["python", shlex.quote(str(script)), *map(shlex.quote, sys.argv[1:])])
    result: dict[str, Any] = {
        "command": command,
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "host": host(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **summary,
        "rows": rows,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=indent) + "\n")
    return result
