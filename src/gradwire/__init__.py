"""gradwire: make the network a variable in PyTorch distributed training."""
from __future__ import annotations

__version__ = "0.1.0"
