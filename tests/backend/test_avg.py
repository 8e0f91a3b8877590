"""ReduceOp.AVG on integer tensors has NCCL's semantics: sum, then division truncating toward zero."""
import pytest

from gradwire.launch import spawn
from tests.backend import reduce_workers


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_integer_avg_is_the_truncated_sum_over_the_world(dtype):
    world = 2
    res = spawn(reduce_workers.integer_avg, world, (dtype,), timeout=90)
    sums = [sum(col) for col in zip(*(reduce_workers.rows(r) for r in range(world)))]
    expected = [int(s / world) for s in sums]  # C's integer division: toward zero
    assert expected == [-1, 2, 3, -3]  # the floor would give -2 and -4
    for rank, r in enumerate(res):
        for op in ("all_reduce", "all_reduce_async", "reduce_scatter_tensor", "reduce_scatter"):
            assert r[op] == expected, (rank, op, r[op])
        if rank == 0:  # the root holds the average (gloo leaves the others' buffers undefined)
            assert r["reduce"] == expected
        assert r["caller_options_untouched"]
        for msg in r["bool"]:
            assert msg is not None and "AVG" in msg and "bool" in msg, r["bool"]
