"""DiLoCo (outer Nesterov on the averaged parameter change), streamed in fragments, compressed, overlapped;
PyTorch's post-local SGD as a peer. Pure checks of the arithmetic, and 2-rank trainings."""
from __future__ import annotations

import pytest
import torch

from gradwire.launch import spawn
from gradwire.strategies import parse_strategy
from gradwire.strategies.diloco import fragment_bounds
from gradwire.train import TrainConfig

from . import workers


def test_fragments_split_the_model_into_runs_of_about_equal_size() -> None:
    assert fragment_bounds([10, 10, 10, 10], 2) == [(0, 2), (2, 4)]
    assert fragment_bounds([100, 1, 1, 1], 2) == [(0, 1), (1, 4)]
    assert fragment_bounds([1, 1, 1], 3) == [(0, 1), (1, 2), (2, 3)]
    assert fragment_bounds([5], 1) == [(0, 1)]
    with pytest.raises(ValueError, match="fragments must be from 1"):
        fragment_bounds([1, 1], 3)


def test_names_options_and_bad_values() -> None:
    choice = parse_strategy("int8+diloco:100:lr=0.5:mu=0.8:overlap=2")
    assert str(choice) == "int8+diloco:100:lr=0.5:mu=0.8:overlap=2"
    assert choice.average_schedule() == (100, 1, True)
    assert parse_strategy("streaming-diloco:100:fragments=4").average_schedule() == (25, 4, False)
    assert parse_strategy("torch-postlocalsgd:8:warmup=2").average_schedule() == (8, 1, False)
    for bad, words in [("diloco:10:overlap=10", "overlap must be from 0 to H - 1"),
                       ("diloco:10:lr=x", "lr must be a number"), ("diloco:10:mu=1", "in \\[0, 1\\)"),
                       ("streaming-diloco:4:fragments=5", "fragments must be from 1 to H"),
                       ("signum+diloco:4", "vote"), ("fp16+torch-postlocalsgd:4", "its own compression"),
                       ("onebit+diloco:100", "error feedback carries that miss.*use int8"),
                       ("onebit:block=64+streaming-diloco:4", "grows every round.*valid compressors.*int8")]:
        with pytest.raises(ValueError, match=words):
            parse_strategy(bad).build()


def test_the_outer_exchange_compresses_from_its_first_round() -> None:
    # no DDP buckets to rebuild: an uncompressed first round would be a fifth of the bytes of five rounds
    assert parse_strategy("int8+diloco:100").build()._exchange.compressing(10**6)
    assert parse_strategy("int8+streaming-diloco:100").build()._exchange.compressing(10**6)
    late = parse_strategy("int8:warmup=2+diloco:100").build()._exchange
    assert not late.compressing(10**6) and late.warmup_iters == 2


def test_one_outer_step_is_sgd_nesterov_on_the_mean_delta() -> None:
    s = parse_strategy("diloco:2:lr=0.5:mu=0.9").build()
    model = torch.nn.Linear(3, 1, bias=False)
    s.params = list(model.parameters())
    from gradwire.strategies.diloco import _Fragment

    anchor = torch.tensor([1.0, 2.0, 3.0])
    part = _Fragment(0, s.params, anchor.clone(), torch.zeros(3), 0)
    mean = torch.tensor([0.1, -0.2, 0.3])
    s._outer(part, mean)
    ref = torch.nn.Parameter(anchor.clone())
    opt = torch.optim.SGD([ref], lr=0.5, momentum=0.9, nesterov=True)
    ref.grad = mean.clone()
    opt.step()
    assert torch.allclose(part.anchor, ref.detach())
    s._outer(part, mean)
    ref.grad = mean.clone()
    opt.step()
    assert torch.allclose(part.anchor, ref.detach())


@pytest.mark.slow
def test_diloco_family_trains_and_every_rank_ends_on_one_model() -> None:
    names = ["sync", "diloco:4", "diloco:4:overlap=1", "streaming-diloco:4:fragments=2", "int8+diloco:4",
             "int8+streaming-diloco:4:fragments=2:overlap=1", "torch-postlocalsgd:4", "localsgd:4"]
    configs = [TrainConfig(strategy=s, model="cnn", epochs=1, batch_size=16, max_steps=40) for s in names]
    results = spawn(workers.train_many, 2, ("loopback", configs), timeout=110)
    by_name = {name: (results[0][i], results[1][i]) for i, name in enumerate(names)}
    for name, (r0, r1) in by_name.items():
        assert r0.param_checksum == r1.param_checksum, name
        assert r0.test_accuracy > 0.25, (name, r0.test_accuracy)  # 10 classes: chance is 0.1
    sync_bytes = by_name["sync"][0].stats["total"]["payload_bytes"]
    diloco_bytes = by_name["diloco:4"][0].stats["total"]["payload_bytes"]
    # 40 steps: sync sends every step, diloco one round per 4 steps (plus the last in finish and DDP's own start)
    assert diloco_bytes < 0.45 * sync_bytes
    # streaming: the same bytes in all, but each round moves about half the model
    stream = by_name["streaming-diloco:4:fragments=2"][0]
    assert stream.stats["total"]["payload_bytes"] == pytest.approx(diloco_bytes, rel=0.25)
    # int8: a quarter of fp32's bytes from the second round on (the first is uncompressed)
    assert by_name["int8+diloco:4"][0].stats["total"]["wire_bytes"] < 0.4 * by_name["diloco:4"][0].stats["total"]["wire_bytes"]
