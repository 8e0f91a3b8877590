"""predict replays ``auto`` as the fastest of its candidates at each network and world size."""
from gradwire.predict import Bucket, StepProfile, sweep
from gradwire.predict.codec import CodecCost, Line

NETS = ["bandwidth=100mbit", "bandwidth=100gbit"]


def test_auto_is_the_fastest_of_its_candidates_everywhere():
    buckets = tuple(Bucket(4_000_000, 0.01 * (i + 1)) for i in range(4))
    prof = StepProfile("cnn-like", 0.05, 0.1, 0.005, buckets)
    cost = CodecCost(Line(1e-4, 2e-9), Line(1e-4, 2e-9), Line(1e-4, 2e-9))
    fixed = ["sync", "fp16", "int8", "onebit"]
    preds, _ = sweep(lambda s: prof, fixed + ["auto", "auto:onebit+delayed", "delayed", "onebit+delayed"], NETS,
                     lambda net: [2, 8], lambda s: cost, target=None)
    for net in NETS:
        for world in (2, 8):
            best = min(preds[(net, world, s)].step_seconds for s in fixed)
            assert preds[(net, world, "auto")].step_seconds == best
            assert preds[(net, world, "auto:onebit+delayed")].step_seconds == min(
                preds[(net, world, s)].step_seconds for s in ("delayed", "onebit+delayed"))
    # the slow link compresses, the fast one does not pay for it
    assert preds[(NETS[0], 2, "auto")].strategy != "sync"
    assert preds[(NETS[1], 2, "auto")].strategy == "sync"
