"""Typed keys and per-element state that follows named segments across layouts.

An exchanged flat tensor is made of *segments*: a DDP bucket holds several
parameters, a flat gradient one parameter, a model average all of them.
State that exists per element (a momentum buffer, an error-feedback
residual) belongs to the segments, not to the flat tensor that carried
them this step:

1. :class:`StateKey` names a flat tensor by its segments, in order:
   ``(("p0", 4096), ("p1", 64))``. Two tensors with the same key hold the
   same elements in the same places; a tensor whose size differs from its
   key's is an error (never a silently fresh state).
2. :class:`SegmentStore` keeps one flat buffer per key. When a key it has
   never seen arrives with segments it knows (DDP rebuilt its buckets in a
   new order), the new buffer is assembled from the old pieces, zeros for
   the segments never seen, and the old buffers are dropped once none of
   their segments lives there any more.

A key with a ``chunk`` names the part ``[start, start + count)`` of a tensor
that this rank serves in a two-phase exchange (its server residual); such
state is not made of whole segments and does not follow them.

Trap: a segment's name must mean the same elements every time it is used.
The hooks name DDP's parameters in the order they first see them, which is
the same in every process that builds the same model (see
:mod:`gradwire.exchange.state`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import Tensor

__all__ = ["SegmentStore", "StateKey", "rearrange"]


@dataclass(frozen=True)
class StateKey:
    """The name of one exchanged flat tensor: its segments ``(name, numel)`` in order.

    ``chunk``, when set, is the ``(start, count)`` part of that tensor this
    rank serves in a two-phase exchange (see :meth:`serving`).
    """

    segments: tuple[tuple[str, int], ...]
    chunk: tuple[int, int] | None = None
    _offsets: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)
    _label: list[str] = field(default_factory=list, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a StateKey needs at least one segment")
        offset = 0
        for name, numel in self.segments:
            if not isinstance(name, str) or numel < 0:
                raise ValueError(f"segments are (name: str, numel >= 0), got {(name, numel)!r}")
            if name in self._offsets:
                raise ValueError(f"segment {name!r} appears twice in one key")
            self._offsets[name] = offset
            offset += numel
        if self.chunk is not None:
            start, count = self.chunk
            if start < 0 or count < 0 or start + count > offset:
                raise ValueError(f"chunk {self.chunk} does not fit a tensor of {offset} elements")
        chunk = "" if self.chunk is None else f"[{self.chunk[0]}:{self.chunk[0] + self.chunk[1]}]"
        self._label.append("StateKey(" + "+".join(f"{n}:{c}" for n, c in self.segments) + chunk + ")")

    def __repr__(self) -> str:
        """Every segment and the chunk: unique, and the same in every process (compressors key RNG state by it)."""
        return self._label[0]

    @classmethod
    def of(cls, name: str, numel: int) -> StateKey:
        """A key of one segment."""
        return cls(((str(name), int(numel)),))

    @property
    def total(self) -> int:
        """Elements of the whole tensor."""
        return sum(n for _, n in self.segments)

    @property
    def numel(self) -> int:
        """Elements of the state under this key: the chunk's when set, else the whole tensor's."""
        return self.chunk[1] if self.chunk is not None else self.total

    def serving(self, start: int, count: int) -> StateKey:
        """The key of the chunk ``[start, start + count)`` this rank serves."""
        return StateKey(self.segments, (start, count))

    def offset(self, name: str) -> int | None:
        """Where segment ``name`` starts in this key's tensor (None when it is not here)."""
        return self._offsets.get(name)

    def names(self) -> frozenset[str]:
        """The segment names."""
        return frozenset(self._offsets)

    def check(self, tensor: Tensor) -> None:
        """Raise ValueError unless ``tensor`` has this key's size."""
        if tensor.numel() != self.numel:
            raise ValueError(f"state key {self} names {self.numel} elements, the tensor has {tensor.numel()}: "
                             "a tensor must keep its key's segments (a changed model, or two tensors under one key)")

    def as_plain(self) -> dict[str, Any]:
        """This key in plain types (for checkpoints)."""
        return {"segments": [list(s) for s in self.segments], "chunk": None if self.chunk is None else list(self.chunk)}

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> StateKey:
        """The key :meth:`as_plain` described."""
        chunk = plain.get("chunk")
        return cls(tuple((str(n), int(c)) for n, c in plain["segments"]), None if chunk is None else (int(chunk[0]), int(chunk[1])))

    def __str__(self) -> str:
        names = "+".join(name for name, _ in self.segments[:4]) + ("+..." if len(self.segments) > 4 else "")
        chunk = f"[{self.chunk[0]}:{self.chunk[0] + self.chunk[1]}]" if self.chunk is not None else ""
        return f"{names}({self.total}){chunk}"


def rearrange(src: Tensor, src_key: StateKey, dst_key: StateKey, out: Tensor | None = None) -> Tensor:
    """``src`` (laid out as ``src_key``) in the layout of ``dst_key``: the segments both hold are copied.

    Segments of ``dst_key`` that ``src_key`` lacks are left as they are in
    ``out`` (zeros in a new tensor).

    Raises:
        ValueError: a segment has different sizes in the two keys.
    """
    src_key.check(src)
    if out is None:
        out = torch.zeros(dst_key.numel, dtype=src.dtype, device=src.device)
    dst_key.check(out)
    flat_src, flat_out = src.reshape(-1), out.view(-1)
    sizes = dict(src_key.segments)
    start = 0
    for name, numel in dst_key.segments:
        at = src_key.offset(name)
        if at is not None:
            if sizes[name] != numel:
                raise ValueError(f"segment {name!r} held {sizes[name]} elements, now {numel}: "
                                 "the same name must mean the same elements (did the model change?)")
            flat_out[start:start + numel].copy_(flat_src[at:at + numel])
        start += numel
    return out


class SegmentStore:
    """Per-element state by :class:`StateKey`: one flat buffer per key, assembled from segments.

    Keys with a ``chunk`` are kept as they are (no segment follows them).

    Thread-safe: the server step of a two-phase exchange runs in a completion
    callback while the training thread starts the next bucket's exchange, and
    both reach the same store.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._buffers: dict[StateKey, Tensor] = {}
        #: segment name -> the key whose buffer holds its latest state
        self._home: dict[str, StateKey] = {}

    def get(self, key: StateKey) -> Tensor | None:
        """The buffer of ``key``, if it has one."""
        with self._lock:
            return self._buffers.get(key)

    def knows(self, key: StateKey) -> bool:
        """Whether any state exists for ``key`` (itself, or one of its segments elsewhere)."""
        with self._lock:
            return key in self._buffers or (key.chunk is None and any(n in self._home for n in key.names()))

    def buffer(self, key: StateKey, like: Tensor) -> Tensor:
        """The buffer of ``key`` (dtype and device of ``like``), assembled or zero-filled when new.

        Raises:
            ValueError: ``like`` does not have the key's size, or a segment's
                stored size differs from the key's.
        """
        key.check(like)
        with self._lock:
            buf = self._buffers.get(key)
            if buf is not None and buf.dtype == like.dtype and buf.device == like.device:
                return buf
            buf = torch.zeros(key.numel, dtype=like.dtype, device=like.device)
            if key.chunk is None:
                self._assemble(key, buf)
            self._buffers[key] = buf
            return buf

    def set(self, key: StateKey, value: Tensor) -> None:
        """Install ``value`` (flat, the key's size) as the state of ``key``."""
        key.check(value)
        with self._lock:
            if key.chunk is None:
                self._claim(key)
            self._buffers[key] = value.reshape(-1)

    def drop(self, key: StateKey) -> None:
        """Forget the state of ``key`` (its segments' latest state with it)."""
        with self._lock:
            self._buffers.pop(key, None)
            for name in key.names() if key.chunk is None else ():
                if self._home.get(name) == key:
                    del self._home[name]

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()
            self._home.clear()

    def keys(self) -> Iterator[StateKey]:
        with self._lock:
            return iter(list(self._buffers))

    def __len__(self) -> int:
        with self._lock:
            return len(self._buffers)

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"_buffers": dict(self._buffers), "_home": dict(self._home)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._lock = threading.RLock()
        self._buffers, self._home = state["_buffers"], state["_home"]

    def _assemble(self, key: StateKey, buf: Tensor) -> None:
        homes: dict[StateKey, None] = {}
        for name, _ in key.segments:
            home = self._home.get(name)
            if home is not None:
                homes[home] = None
        for home in homes:
            rearrange(self._buffers[home], home, key, out=buf)
        self._claim(key)

    def _claim(self, key: StateKey) -> None:
        """Make ``key`` the home of its segments; drop buffers that hold no segment's latest state (lock held)."""
        for name in key.names():
            self._home[name] = key
        live = set(self._home.values())
        for old in [k for k in self._buffers if k.chunk is None and k != key and k not in live]:
            del self._buffers[old]
            # a served chunk of a layout that is gone goes with it
        for old in [k for k in self._buffers if k.chunk is not None and StateKey(k.segments) not in live
                    and StateKey(k.segments) != key]:
            del self._buffers[old]

    def state_dict(self) -> dict[str, Any]:
        """Copies of every buffer with its key, in plain types (``torch.load(weights_only=True)`` reads them).

        Whole keys come in the order they were made (the training thread's),
        then the served chunks by their layout's place and start: those are
        made in completion callbacks, in whatever order threads interleave,
        and two identical runs must give identical checkpoints.
        """
        with self._lock:
            whole = [k for k in self._buffers if k.chunk is None]
            place = {k: i for i, k in enumerate(whole)}

            def order(k: StateKey) -> tuple[int, int]:
                assert k.chunk is not None
                return place.get(StateKey(k.segments), len(place)), k.chunk[0]

            chunks = sorted((k for k in self._buffers if k.chunk is not None), key=order)
            return {"buffers": [{**key.as_plain(), "value": self._buffers[key].clone()} for key in whole + chunks]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        entries = [(StateKey.from_plain(e), e["value"]) for e in state["buffers"]]
        with self._lock:
            self.clear()
            for key, value in sorted(entries, key=lambda kv: kv[0].chunk is not None):
                key.check(value)
                if key.chunk is None:
                    for name in key.names():
                        self._home[name] = key
                self._buffers[key] = value.clone()
