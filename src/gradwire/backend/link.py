"""The simulated NIC of a set of ranks: when its transmit and receive sides are free.

Every op of a group queues on its link (process_group.py, point 1): it
starts at ``max(now, busy_until)`` of the sides it uses (full duplex: a send
holds the transmit side, a receive the receive side, a collective both) and
holds them for its modelled seconds.

Groups whose rank sets are equal share one :class:`NicQueue`: the NIC is one.
A strategy that gives its collectives a group of their own
(``dist.new_group(ranks)``, so that gloo can never pair them with DDP's) puts
them on the same wire as DDP's all_reduces, and an op of one group waits for
the other group's op ahead of it.

Traps:
- Only equal rank sets share. A group of ranks {0, 1} beside the world
  group of {0, 1, 2, 3} keeps its own link, as before: its ops are priced
  for its own ranks, and which part of the world's traffic crosses the same
  NICs depends on the topology. Contention between overlapping but unequal
  rank sets is not modelled.
- Each rank orders the ops of two groups on the shared link as its threads
  issue them; ranks that issue them in different orders price different
  start times. Every op still completes at ``max(modelled, real end)``, so
  the ranks agree on the data, not always on the instant.
- The registry is keyed by the network model as well: a new default group
  (``destroy_process_group`` then ``init_process_group``) starts on idle links.
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable, Iterable

__all__ = ["NicQueue", "link_for"]


class NicQueue:
    """One NIC: the instants until which its transmit and receive sides are busy."""

    __slots__ = ("_lock", "_tx_busy", "_rx_busy", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tx_busy = 0.0
        self._rx_busy = 0.0

    def reserve(self, now: float, seconds: float | Callable[[float], float], sends: bool,
                receives: bool) -> tuple[float, float]:
        """Queue an op issued at ``now`` on the sides it uses; return its (start, done).

        ``seconds`` is its modelled time, or (a network that changes) a function
        of the instant it starts at, which only the queue knows.
        """
        with self._lock:
            start = max(now, self._tx_busy if sends else now, self._rx_busy if receives else now)
            done = start + (seconds(start) if callable(seconds) else seconds)
            if sends:
                self._tx_busy = done
            if receives:
                self._rx_busy = done
        return start, done


_lock = threading.Lock()
#: live links by (network model, rank set); a link lives as long as a group holds it
_links: "weakref.WeakValueDictionary[tuple[int, frozenset[int]], NicQueue]" = weakref.WeakValueDictionary()


def link_for(model: object, ranks: Iterable[int]) -> NicQueue:
    """The link of the global ``ranks`` on ``model``'s network: one per rank set (module doc).

    The model's id is safe as a key: every group that holds the link holds the model too.
    """
    key = (id(model), frozenset(ranks))
    with _lock:
        link = _links.get(key)
        if link is None:
            link = _links[key] = NicQueue()
        return link
