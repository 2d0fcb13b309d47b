"""float32 <-> int32 fixed point with a block exponent shared by all workers of a chunk.

How the workers agree on the exponent (SwitchML's scheme, one window early): every DATA
packet ``p`` carries, in its ``exponent`` field, the sender's local exponent for chunk
``p`` (``frexp`` of the chunk's max |value|); the switch keeps the max over contributors
and returns it in the RESULT of ``p``. The data of chunk ``p`` travels in packet ``p+W``,
which a worker sends only after the RESULT of ``p`` arrived (the window is self-clocked),
so every worker quantizes chunk ``p`` with the same exponent ``e``. The first W packets
of a call carry proposals only (no elements).

Quantization: ``q = rint(v * 2**(S-e))`` with ``S = 30 - ceil(log2 N)``. Since
``|v| < 2**e``, ``|q| <= 2**S`` and the sum of N workers stays below ``2**30``: it cannot
overflow when the exponent was agreed. Error bound of the reduced value, per element:

    |dequantized_sum - exact_sum| <= N * 2**(e - S - 1)   (+ float32 rounding of the output)

i.e. at most ``N * 2**-S`` of the chunk's largest |value| (1.5e-8 for N=4).
"""

import math

import numpy as np
from numba import njit

from ina_fabric.protocol.fields import NO_EXPONENT, HEADER_BYTES

__all__ = ["scale_bits", "local_exponents", "pack_chunk", "dequantize", "error_bound",
           "NO_EXPONENT", "NONFINITE"]

#: local exponent of a chunk that holds inf or NaN
NONFINITE = 127


def scale_bits(nworkers: int) -> int:
    """S: fractional bits, leaving headroom for the sum of ``nworkers`` values."""
    return 30 - math.ceil(math.log2(max(nworkers, 1)))


def local_exponents(values: np.ndarray, elements: int) -> np.ndarray:
    """Per-chunk exponent e with max|chunk| < 2**e, i.e. ``frexp(max|chunk|)[1]``
    (NO_EXPONENT for an all-zero chunk, NONFINITE for one holding inf or NaN)."""
    v = np.asarray(values, np.float32).reshape(-1)
    k = -(-v.size // elements)
    full = v.size // elements
    m = np.empty(k, np.float32)
    if full:
        blocks = v[:full * elements].reshape(full, elements)
        np.maximum(blocks.max(axis=1), -blocks.min(axis=1), out=m[:full])
    if k > full:
        tail = v[full * elements:]
        m[full] = max(tail.max(), -tail.min())
    with np.errstate(invalid="ignore"):
        e = np.frexp(m)[1]
    out = np.clip(e, -127, 126).astype(np.int8)
    out[m == 0] = NO_EXPONENT
    out[~np.isfinite(m)] = NONFINITE
    return out


@njit(cache=True, nogil=True, fastmath=True)
def _pack(values, start, count, exponent, sbits, out, offset):
    """Quantize values[start:start+count] and write big-endian int32 at out[offset:]
    (offset a multiple of 4; ``out`` a 4-aligned uint8 array). Branch-free so LLVM
    vectorizes it: scale, clamp, round, byte-swap, store in one pass. Values must be
    finite (``local_exponents`` flags a chunk with inf/NaN as exponent 127)."""
    scale = 0.0 if exponent == NO_EXPONENT else 2.0 ** (sbits - exponent)
    lim = 2147483647.0
    o32 = out[offset:offset + 4 * count].view(np.uint32)
    v = values[start:start + count]
    clipped = 0
    for i in range(count):
        x = np.float64(v[i]) * scale
        clipped += abs(x) > lim
        x = min(max(x, -lim), lim)
        q = np.uint32(np.int64(np.rint(x)))
        o32[i] = (((q & np.uint32(0xFF)) << np.uint32(24))
                  | ((q & np.uint32(0xFF00)) << np.uint32(8))
                  | ((q >> np.uint32(8)) & np.uint32(0xFF00))
                  | (q >> np.uint32(24)))
    return clipped


def pack_chunk(values, start, count, exponent, sbits, out, offset=HEADER_BYTES) -> int:
    """Fused quantize + big-endian pack into ``out`` (a uint8 array). Returns the number of
    elements that had to be clipped (only possible if the exponent was not agreed)."""
    return _pack(values, start, count, np.int64(exponent), sbits, out, offset)


def dequantize(elements_be: np.ndarray, exponent: int, sbits: int, rescale: float = 1.0):
    """Big-endian int32 elements to float32 values (times ``rescale``)."""
    if exponent == NO_EXPONENT:
        return np.zeros(elements_be.shape, np.float32)
    factor = math.ldexp(rescale, int(exponent) - sbits)
    return (elements_be.astype(np.float64) * factor).astype(np.float32)


def error_bound(exponent: int, nworkers: int) -> float:
    """Bound on |dequantized sum - exact sum| per element of a chunk (before float32)."""
    if exponent == NO_EXPONENT:
        return 0.0
    return nworkers * math.ldexp(1.0, int(exponent) - scale_bits(nworkers) - 1)


@njit(cache=True, nogil=True)
def _pack_many(values, elements, exponents, sbits, out, stride):
    """Bulk form of pack_chunk: chunk j goes to out[j*stride + HEADER_BYTES:]."""
    clipped = 0
    for j in range(exponents.size):
        start = j * elements
        count = min(elements, values.size - start)
        clipped += _pack(values, start, count, np.int64(exponents[j]), sbits, out,
                         j * stride + HEADER_BYTES)
    return clipped
