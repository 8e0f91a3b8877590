"""predict stays fast: 6 strategies x 3 networks x 2 ... 1024 ranks for a 100-bucket model, ratio column included."""
import time

from gradwire.predict import Bucket, StepProfile, default_worlds, sweep
from gradwire.predict.codec import CodecCost, Line

STRATEGIES = ["sync", "fp16", "onebit", "delayed", "onebit+delayed", "powersgd:4"]
NETS = ["10gbe", "25gbe,topology=1x8,intra=nvlink", "100gbe,topology=1x8,intra=nvlink,algorithm=hierarchical"]


def test_a_1024_rank_sweep_takes_seconds():
    # a 655 M-parameter model under DDP's defaults: 99 buckets of one 25 MiB layer each and a last small one
    buckets = tuple(Bucket(26_224_640, 0.003 * (i + 1)) for i in range(99)) + (Bucket(1_000_000, 0.3),)
    prof = StepProfile("gpt-like", 0.15, 0.3, 0.01, buckets)
    cost = CodecCost(Line(1e-5, 1e-10), Line(1e-5, 1e-10), Line(1e-5, 1e-10))
    start = time.perf_counter()
    preds, ratios = sweep(lambda s: prof, STRATEGIES, NETS, default_worlds, lambda s: cost)
    elapsed = time.perf_counter() - start
    assert len(preds) == 6 * (10 + 8 + 8) and len(ratios) == 26
    assert elapsed < 5.0, f"the sweep took {elapsed:.1f} s"  # about 0.5 s on a quiet core: generous headroom
