"""Bad input fails early with a message naming what is wrong and what is valid."""
from __future__ import annotations

import pytest
import torch

from gradwire.bench.collectives import check_world
from gradwire.bench.config import BenchConfig, parse_bench_size, sweep_sizes
from gradwire.cli.main import main


@pytest.mark.parametrize("text,value", [
    ("8", 8), ("64K", 64 << 10), ("16M", 16 << 20), ("1G", 1 << 30), ("16m", 16 << 20),
    ("16MiB", 16 << 20), ("16MB", 16_000_000),
])
def test_sizes_read_like_nccl_tests(text: str, value: int) -> None:
    assert parse_bench_size(text) == value


def test_sweep_multiplies_by_the_factor() -> None:
    assert sweep_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert sweep_sizes(1 << 20, 1 << 20, 2) == [1 << 20]
    assert sweep_sizes(2, 3, 1.1) == [2, 3]  # always advances


@pytest.mark.parametrize("kwargs,message", [
    ({"min_bytes": 1024, "max_bytes": 8}, "must not exceed -e"),
    ({"factor": 1.0}, "-f (size factor) must be > 1"),
    ({"factor": 0.5}, "-f (size factor) must be > 1"),
    ({"ops": ("allreduce",)}, "unknown collective 'allreduce'; valid: all_reduce"),
    ({"dtype": "float8"}, "unknown dtype 'float8'; valid: float"),
    ({"redop": "mean"}, "unknown reduce op 'mean'; valid: sum"),
    ({"redop": "avg", "dtype": "int32"}, "avg needs a floating point dtype"),
    ({"backend": "mpi"}, "unknown backend 'mpi'; valid: gloo, nccl, gradwire"),
    ({"iters": 0}, "-n (iterations) must be >= 1"),
    ({"net": "2gbe"}, "unknown preset"),
    ({"device": "gpu"}, "unknown device 'gpu'; valid: auto, cpu, cuda"),
    ({"backend": "nccl", "device": "cpu"}, "backend nccl runs CUDA tensors only"),
])
def test_bad_config_names_the_problem(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BenchConfig(**kwargs)


def test_world_too_small_for_the_op() -> None:
    with pytest.raises(ValueError, match=r"sendrecv needs a world size >= 2, got 1"):
        check_world(BenchConfig(ops=("sendrecv",)), 1)
    with pytest.raises(ValueError, match=r"root 2\) must be a rank of the world \(0..1\)"):
        check_world(BenchConfig(root=2), 2)


@pytest.mark.parametrize("argv,message", [
    (["-b", "1M", "-e", "1K"], "must not exceed -e"),
    (["-f", "1"], "size factor) must be > 1"),
    (["--op", "all_reduse"], "unknown collective 'all_reduse'"),
    (["-d", "complex"], "unknown dtype 'complex'"),
    (["--op", "sendrecv", "--world-size", "1"], "sendrecv needs a world size >= 2"),
] + ([] if torch.cuda.is_available() else [(["--tensors", "cuda"], "--tensors cuda needs CUDA GPUs")]))
def test_cli_bad_input_exits_2_with_a_clear_message(argv: list, message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_doctor_needs_two_ranks(capsys: pytest.CaptureFixture) -> None:
    assert main(["doctor", "--world-size", "1"]) == 2
    assert "world size >= 2" in capsys.readouterr().err


def test_device_resolves_per_backend() -> None:
    assert BenchConfig(backend="nccl").device_type == "cuda"
    assert BenchConfig(backend="gradwire").device_type == "cpu"
    assert BenchConfig(backend="gradwire", device="cuda").device_type == "cuda"
