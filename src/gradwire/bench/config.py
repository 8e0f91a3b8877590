"""What one ``gradwire bench`` run measures: a checked, picklable config.

The flags and their meaning follow nccl-tests (``-b -e -f -n -w -c -d -o -r``),
so a table from this tool can be read next to one from ``all_reduce_perf``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from gradwire.net.spec import NetSpec
from gradwire.net.units import parse_buffer_size

__all__ = ["BACKENDS", "COLLECTIVE_NAMES", "DTYPES", "REDOPS", "BenchConfig", "parse_bench_size", "sweep_sizes"]

#: collectives by CLI name, in the order ``--op all`` runs them (definitions: gradwire.bench.collectives)
COLLECTIVE_NAMES: tuple[str, ...] = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv",
)

#: backends the benchmark can run on
BACKENDS: tuple[str, ...] = ("gloo", "nccl", "gradwire")

#: dtype names (nccl-tests spelling first) -> torch dtype attribute name
DTYPES: dict[str, str] = {
    "float": "float32", "float32": "float32", "half": "float16", "float16": "float16",
    "bfloat16": "bfloat16", "double": "float64", "float64": "float64",
    "int8": "int8", "uint8": "uint8", "int32": "int32", "int": "int32", "int64": "int64",
}

#: reduce operations (nccl-tests names) -> torch.distributed.ReduceOp attribute name
REDOPS: dict[str, str] = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN", "avg": "AVG"}

#: nccl-tests' sizes (``64K``, ``16M``: powers of 1024); anything else as :func:`gradwire.net.units.parse_size`
parse_bench_size = parse_buffer_size


def sweep_sizes(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """Sizes from ``min_bytes`` up to ``max_bytes``, each ``factor`` times the last."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size = max(int(size * factor), size + 1)
    return sizes


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run: which collectives, on what, at which sizes."""

    ops: tuple[str, ...] = ("all_reduce",)
    """collectives to measure, names from :data:`gradwire.bench.collectives.COLLECTIVES`"""
    backend: str = "gloo"
    """torch.distributed backend: gloo, nccl or gradwire"""
    net: NetSpec | None = None
    """network: simulated by the gradwire backend; with gloo/nccl only priced (model column); a spec string is parsed"""
    world_size: int = 2
    """ranks to spawn (ignored under torchrun, which fixes its own)"""
    min_bytes: int = 32 << 20
    """-b: smallest message in bytes"""
    max_bytes: int = 32 << 20
    """-e: largest message in bytes"""
    factor: float = 2.0
    """-f: multiply the size by this from one row to the next (> 1)"""
    iters: int = 20
    """-n: timed iterations per size and placement"""
    warmup: int = 5
    """-w: untimed iterations per size before timing"""
    check: bool = True
    """-c: check every result against the expected output and count wrong elements"""
    dtype: str = "float"
    """-d: element type"""
    redop: str = "sum"
    """-o: reduce operation for reducing collectives"""
    root: int = 0
    """-r: root rank of rooted collectives (broadcast, reduce)"""
    timeout: float = 3600.0
    """seconds for the whole run before the ranks are killed"""
    progress: bool = False
    """show a progress bar on rank 0's stderr"""
    device: str = "auto"
    """tensors on cpu or cuda; auto: cuda for nccl, cpu otherwise (gloo and gradwire take both)"""

    def __post_init__(self) -> None:
        if not self.ops:
            raise ValueError(f"no collective given; valid: {', '.join(COLLECTIVE_NAMES)} or all")
        for op in self.ops:
            if op not in COLLECTIVE_NAMES:
                raise ValueError(f"unknown collective {op!r}; valid: {', '.join(COLLECTIVE_NAMES)} or all")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"unknown device {self.device!r}; valid: auto, cpu, cuda")
        if self.backend == "nccl" and self.device == "cpu":
            raise ValueError("backend nccl runs CUDA tensors only; use --tensors cuda (or auto), or gloo for cpu")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; valid: {', '.join(DTYPES)}")
        if self.redop not in REDOPS:
            raise ValueError(f"unknown reduce op {self.redop!r}; valid: {', '.join(REDOPS)}")
        if self.redop == "avg" and not DTYPES[self.dtype].startswith(("float", "bfloat")):
            raise ValueError(f"reduce op avg needs a floating point dtype, got {self.dtype}; use sum")
        if self.min_bytes < 1:
            raise ValueError(f"-b (min bytes) must be >= 1, got {self.min_bytes}")
        if self.min_bytes > self.max_bytes:
            raise ValueError(f"-b (min bytes {self.min_bytes}) must not exceed -e (max bytes {self.max_bytes})")
        if not self.factor > 1:
            raise ValueError(f"-f (size factor) must be > 1, got {self.factor!r}")
        if self.iters < 1:
            raise ValueError(f"-n (iterations) must be >= 1, got {self.iters}")
        if self.warmup < 0:
            raise ValueError(f"-w (warm-up iterations) must be >= 0, got {self.warmup}")
        if self.root < 0:
            raise ValueError(f"-r (root) must be a rank >= 0, got {self.root}")
        if not 0 < self.timeout < math.inf:  # also rejects NaN
            raise ValueError(f"--timeout must be a finite number of seconds > 0, got {self.timeout!r}")
        if self.net is not None:  # a bad spec fails here, before any rank starts
            object.__setattr__(self, "net", NetSpec.of(self.net))
            if self.net.device is not None and self.net.device.startswith("step:"):
                raise ValueError(f"device={self.net.device} scales compute by a training step, and a benchmark of "
                                 "collectives has none; give the device itself (e.g. device=a100), or no device")
            if self.net.device is not None and self.net.device.startswith("profile:"):
                raise ValueError(f"device={self.net.device} prices a recorded model's ops, and a benchmark of "
                                 "collectives runs none of them; give a device (e.g. device=cpu-core or a100)")

    @property
    def device_type(self) -> str:
        """``cpu`` or ``cuda``: the resolved :attr:`device`"""
        if self.device != "auto":
            return self.device
        return "cuda" if self.backend == "nccl" else "cpu"

    @property
    def sizes(self) -> list[int]:
        """Requested message sizes, before each collective rounds them to its layout."""
        return sweep_sizes(self.min_bytes, self.max_bytes, self.factor)
