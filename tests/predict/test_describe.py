"""Described models: the meta device, DDP's bucket rule, the compute spread, and bad factories."""
import textwrap

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gradwire.predict.describe import bucket_layout, describe_model, is_factory, load_factory

def _write(tmp_path, body):
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(body))
    return path


def _mlp():
    # sizes: 64*256+256 = 16,640, then 256*256+256 = 65,792 four times, 256*10+10 = 2,570 elements
    layers = [nn.Linear(64, 256)] + [nn.Linear(256, 256) for _ in range(4)] + [nn.Linear(256, 10)]
    return nn.Sequential(*layers)


def test_buckets_follow_ddp_rule_by_hand():
    params = list(_mlp().parameters())
    # reverse order, a bucket closes once it reaches the cap (0.3 MiB = 314,572 bytes):
    # [10.b, 10.w, 5.b, 5.w] = 10,280 + 263,168 > cap? 273,448 < cap, + 4.b 4.w = 536,616 >= cap: close
    # then [3.b 3.w 2.b 2.w] = 526,336, then [1.b 1.w 0.b 0.w] = 263,168 + 66,560
    buckets = bucket_layout(params, 0.3)
    assert buckets == [[11, 10, 9, 8, 7, 6], [5, 4, 3, 2], [1, 0]]
    # DDP's default: a 1 MiB first bucket (1,048,576 bytes), 25 MiB after it: the last layer and three of
    # 263,168 bytes make 799,784, the fourth 1,062,952 and closes it; the first layer alone after it
    assert bucket_layout(params, None) == [list(range(11, 1, -1)), [1, 0]]


def test_buckets_are_those_ddp_rebuilds(tmp_path):
    """A real DDP (one rank, gloo): the buckets its comm hook sees from the second iteration on."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = _mlp()
        names = {id(p): i for i, p in enumerate(model.parameters())}
        seen = []

        def hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            seen.append([names[id(p)] for p in bucket.parameters()])
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        for cap in (0.3, 0.1):
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
            ddp.register_comm_hook(None, hook)
            for _ in range(2):
                seen.clear()
                ddp(torch.randn(4, 64)).sum().backward()
            with torch.device("meta"):
                meta = list(_mlp().parameters())
            assert seen == bucket_layout(meta, cap), cap
    finally:
        dist.destroy_process_group()


def test_ready_times_by_parameter_share():
    prof = describe_model("tests.predict.test_describe:_two_layers", 10.0, bucket_cap_mb=0.001)
    # parameters (reverse order): 2.b (10), 2.w (1000), 1.b (100), 1.w (1000): 2,110 in all, backward 10 ms
    # one bucket per layer (each over the 1 KB cap): ready after 1,010 and after all 2,110 elements
    assert [b.nbytes for b in prof.buckets] == [4040, 4400]
    assert [b.ready for b in prof.buckets] == pytest.approx([0.010 * 1010 / 2110, 0.010])
    assert (prof.forward, prof.backward, prof.optimizer) == pytest.approx((0.005, 0.010, 0.0))
    assert "parameter count" in prof.notes[1]


def _two_layers():
    return nn.Sequential(nn.Linear(10, 100), nn.ReLU(), nn.Linear(100, 10))


def test_ready_times_by_flops():
    prof = describe_model("tests.predict.test_describe:_conv_then_linear", 10.0, bucket_cap_mb=0.001,
                          input_shape=(1, 8, 8), batch_size=2)
    # forward FLOPs (2 per multiply-add): conv 3x3, 1 -> 4 channels on 8x8 (padding 1): 2 * 2 * 64 * 4 * 9 = 9,216;
    # linear 256 -> 2: 2 * 2 * 256 * 2 = 2,048. The linear's gradients come first: ready at 2,048 / 11,264
    assert [b.ready for b in prof.buckets] == pytest.approx([0.010 * 2048 / 11264, 0.010])


def _conv_then_linear():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Flatten(), nn.Linear(256, 2))


def test_a_factory_from_a_file_builds_on_meta_without_memory(tmp_path):
    path = _write(tmp_path, """
        import torch
        from torch import nn
        def huge():  # 4 x 16384^2 fp32 parameters: 4 GiB if it were allocated
            return nn.Sequential(*[nn.Linear(16384, 16384, bias=False) for _ in range(4)])
    """)
    assert is_factory(f"{path}:huge") and not is_factory("cnn-wide")
    prof = describe_model(f"{path}:huge", 100.0)
    assert [b.nbytes for b in prof.buckets] == [16384 * 16384 * 4] * 4
    assert all(p.device.type == "meta" for p in _meta(load_factory(f"{path}:huge")).parameters())


def _meta(factory):
    with torch.device("meta"):
        return factory()


@pytest.mark.parametrize("name, message", [
    ("no_such_package_gw.models:net", "cannot import 'no_such_package_gw.models'"),
    ("torch.nn:NoSuchThing", "has no attribute 'NoSuchThing'"),
    ("torch.nn:Linear", "building the model on the meta device failed"),
    ("math:pi", "not a function or class"),
    ("tests.predict.test_describe:_no_parameters", "has no trainable parameters"),
    ("tests.predict.test_describe:_not_a_module", "not a torch.nn.Module"),
    ("/nonexistent/model.py:f", "no such file"),
    ("torchvision.models:", "write PKG.MODULE:FACTORY"),
])
def test_bad_factories_say_what_is_wrong(name, message):
    with pytest.raises(ValueError, match=message):
        describe_model(name, 10.0)


def _no_parameters():
    return nn.Sequential(nn.ReLU())


def _not_a_module():
    return 42


def test_a_file_that_fails_to_import(tmp_path):
    path = _write(tmp_path, "raise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match="failed: RuntimeError: boom"):
        describe_model(f"{path}:f", 10.0)


@pytest.mark.parametrize("compute", [0, -5.0, float("nan"), float("inf")])
def test_compute_time_must_be_positive(compute):
    with pytest.raises(ValueError, match="--compute-ms must be"):
        describe_model("tiny", compute)


def test_bundled_names_can_be_described():
    prof = describe_model("tiny", 2.0)
    assert prof.gradient_bytes == 650 * 4 and prof.source == "described"
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        describe_model("resnet", 2.0)
