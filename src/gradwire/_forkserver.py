"""Imported only by the fork server of :mod:`gradwire.launch` (its ``PRELOAD``, last).

Every process forked from the server would otherwise start with the server's
random state: the same torch (and numpy) draws on every rank and in every
group, where processes started fresh each draw from their own seed. Python's
``random`` reseeds itself after a fork; torch and numpy do not, so a fork
handler registered here reseeds them from the OS's entropy in each child.
"""
from __future__ import annotations

import os
import sys


def _reseed() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


os.register_at_fork(after_in_child=_reseed)
