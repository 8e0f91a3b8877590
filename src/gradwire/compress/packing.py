"""Bit packing: 8 signs or 4 two-bit codes per byte, decoded by table lookup.

Layout follows ``numpy.packbits`` (big-endian within a byte): element ``i`` of
a group lands in bit ``7 - i`` (signs) or bits ``6 - 2i .. 7 - 2i`` (codes).

Why these kernels (on CPU; ``benchmarks/compress_timing.py`` times them):
1. Signs: ``numpy.less(x, 0)`` and ``numpy.packbits`` on the bool array;
   ``torch.lt`` makes the same bool array several times slower on CPU, and
   torch-only packing is slower still (it is the path for CUDA tensors).
2. Decoding: ``numpy.take`` of a 256-row table, one row of 8 (or 4) output
   values per packed byte, writes the scaled floats in one pass;
   ``unpackbits`` followed by ``torch.where`` makes three.

Traps:
- Odd lengths: the last byte is padded with zero bits (positive sign / code 0);
  decoders cut the output back to ``n`` elements.
- ``-0.0`` and NaN pack as positive (``x < 0`` is False); a NaN stays visible
  through the scale, which callers compute from the same data.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "SIGN_TABLE", "TERNARY_TABLE", "decode_table", "decode_table_torch", "pack_bits_torch", "pack_codes2", "pack_signs",
    "unpack_signs",
]


def _sign_table() -> np.ndarray:
    bits = (np.arange(256)[:, None] >> np.arange(7, -1, -1)) & 1
    return np.where(bits == 1, -1.0, 1.0).astype(np.float32)


def _ternary_table() -> np.ndarray:
    codes = (np.arange(256)[:, None] >> np.array([6, 4, 2, 0])) & 3
    return np.select([codes == 1, codes == 2], [1.0, -1.0], 0.0).astype(np.float32)


#: row ``b`` holds the 8 signs (+1 for a 0 bit, -1 for a 1 bit) packed in byte ``b``.
SIGN_TABLE: np.ndarray = _sign_table()
#: row ``b`` holds the 4 ternary values (code 0 -> 0, 1 -> +1, 2 -> -1) in byte ``b``.
TERNARY_TABLE: np.ndarray = _ternary_table()


#: bit weights of one byte, first element in the most significant bit (numpy.packbits' order)
_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)


def pack_signs(x: Tensor) -> Tensor:
    """Pack ``x < 0`` of a 1-D or 2-D tensor into uint8 along the last dim (ceil(n/8) bytes).

    CPU tensors go through numpy; other devices (CUDA) through :func:`pack_bits_torch`.
    """
    x = x.detach()
    if x.device.type != "cpu":
        return pack_bits_torch(torch.lt(x, 0))
    if x.dtype not in (torch.float32, torch.float64, torch.float16):
        x = x.float()  # numpy has no bfloat16
    return torch.from_numpy(np.packbits(np.less(x.numpy(), 0), axis=-1))


def pack_bits_torch(bits: Tensor) -> Tensor:
    """``numpy.packbits`` along the last dim in torch ops (any device): bool -> uint8, zero-padded."""
    pad = (-bits.shape[-1]) % 8
    if pad:
        bits = torch.nn.functional.pad(bits.to(torch.uint8), (0, pad))
    groups = bits.to(torch.uint8).reshape(*bits.shape[:-1], -1, 8)
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=bits.device)
    return (groups * weights).sum(-1, dtype=torch.uint8)


def decode_table(packed: Tensor, table: np.ndarray, n: int, scale: float = 1.0, out: Tensor | None = None) -> Tensor:
    """Expand each byte of 1-D ``packed`` into a row of ``table`` times ``scale``; first ``n`` values.

    Returns a float32 tensor of ``n`` elements (contiguous): ``out`` (float32,
    ``n`` elements, contiguous) when given. Writing into a buffer the caller
    keeps avoids a fresh multi-MB allocation per call, which glibc serves from
    new pages: their first-touch faults cost more than the lookup itself.
    """
    with np.errstate(invalid="ignore"):  # 0 * inf -> NaN is the wanted, visible result
        tab = table if scale == 1.0 else table * np.float32(scale)
    if packed.device.type != "cpu":
        rows = decode_table_torch(packed, torch.from_numpy(tab), n)
        return rows if out is None else out.view(-1).copy_(rows)
    idx = packed.numpy().reshape(-1)
    if out is None:
        # a byte always indexes one of the 256 rows: mode='clip' skips numpy's bounds-checking pass
        return torch.from_numpy(np.take(tab, idx, axis=0, mode="clip").reshape(-1)[:n])
    width = tab.shape[1]
    whole = min(idx.size, n // width)  # bytes whose every value lands in out
    dst = out.view(-1).numpy()
    np.take(tab, idx[:whole], axis=0, mode="clip", out=dst[: whole * width].reshape(whole, width))
    if whole * width < n:  # the last byte's values, cut at n
        dst[whole * width :] = tab[idx[whole]][: n - whole * width]
    return out


def decode_table_torch(packed: Tensor, table: Tensor, n: int) -> Tensor:
    """:func:`decode_table` in torch ops on ``packed``'s device (CUDA): first ``n`` values."""
    rows = table.to(packed.device)
    return rows.index_select(0, packed.reshape(-1).long()).reshape(-1)[:n].contiguous()


def unpack_signs(packed: Tensor, n: int, scale: float = 1.0, out: Tensor | None = None) -> Tensor:
    """Inverse of :func:`pack_signs` for 1-D data: ``scale * (+1 | -1)``, ``n`` float32 values (into ``out``)."""
    return decode_table(packed, SIGN_TABLE, n, scale, out)


def pack_codes2(codes: Tensor) -> Tensor:
    """Pack 1-D uint8 codes in [0, 3] four per byte (ceil(n/4) bytes)."""
    n = codes.numel()
    pad = (-n) % 4
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad)])
    c = codes.view(-1, 4)
    return (c[:, 0] << 6) | (c[:, 1] << 4) | (c[:, 2] << 2) | c[:, 3]
