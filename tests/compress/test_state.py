"""StateKey, SegmentStore and rearrange: pure, one process."""
from __future__ import annotations

import pickle
import threading

import pytest
import torch

from gradwire.compress import SegmentStore, StateKey
from gradwire.compress.state import rearrange


def test_keys_name_segments_and_chunks() -> None:
    k = StateKey((("a", 2), ("b", 3)))
    assert (k.total, k.numel, k.offset("b"), k.offset("c")) == (5, 5, 2, None)
    served = k.serving(1, 3)
    assert (served.numel, served.total, served.chunk) == (3, 5, (1, 3)) and served != k
    assert repr(k) == "StateKey(a:2+b:3)" and repr(served) == "StateKey(a:2+b:3[1:4])"
    assert StateKey.from_plain(served.as_plain()) == served
    for bad in ((), (("a", 1), ("a", 2)), (("a", -1),)):
        with pytest.raises(ValueError):
            StateKey(bad)
    with pytest.raises(ValueError, match="does not fit"):
        k.serving(4, 2)


def test_rearrange_moves_named_segments() -> None:
    src_key, dst_key = StateKey((("a", 2), ("b", 3))), StateKey((("b", 3), ("c", 1), ("a", 2)))
    out = rearrange(torch.arange(5.0), src_key, dst_key)
    assert out.tolist() == [2.0, 3, 4, 0, 0, 1]
    with pytest.raises(ValueError, match="held 3 elements, now 4"):
        rearrange(torch.arange(5.0), src_key, StateKey((("b", 4),)))


def test_store_assembles_a_new_layout_and_drops_the_old_one() -> None:
    store = SegmentStore()
    old = StateKey((("a", 2), ("b", 3)))
    store.buffer(old, torch.zeros(5)).copy_(torch.arange(5.0))
    store.set(old.serving(0, 2), torch.ones(2))
    new = StateKey((("b", 3), ("c", 1), ("a", 2)))
    assert store.buffer(new, torch.zeros(6)).tolist() == [2.0, 3, 4, 0, 0, 1]
    assert store.get(old) is None and store.get(old.serving(0, 2)) is None and len(store) == 1
    clone = pickle.loads(pickle.dumps(store))
    assert torch.equal(clone.get(new), store.get(new))
    restored = SegmentStore()
    restored.load_state_dict(store.state_dict())
    assert torch.equal(restored.get(new), store.get(new)) and restored.knows(StateKey.of("a", 2))


def test_store_is_safe_under_a_concurrent_server_step() -> None:
    # a two-phase exchange's server step (a completion callback) touches served chunks while the training
    # thread assembles the next bucket's layout in the same store
    store, stop, errors = SegmentStore(), threading.Event(), []
    base = StateKey((("w", 64),))
    store.buffer(base, torch.zeros(64))

    def server() -> None:
        i = 0
        while not stop.is_set():
            try:
                key = base.serving(i % 32, 32)
                store.buffer(key, torch.zeros(32)).add_(1.0)
                store.keys()
                i += 1
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    thread = threading.Thread(target=server)
    thread.start()
    try:
        for i in range(3000):
            layout = StateKey((("w", 64), (f"x{i}", 8)))  # a new layout each time: assemble + claim + prune
            store.buffer(layout, torch.zeros(72))
    finally:
        stop.set()
        thread.join()
    assert errors == []
