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

from .protocol.fields import NO_EXPONENT, HEADER_BYTES

__all__ = ["scale_bits", "local_exponents", "pack_chunk", "dequantize", "error_bound",
           "NO_EXPONENT"]


def scale_bits(nworkers: int) -> int:
    """S: fractional bits, leaving headroom for the sum of ``nworkers`` values."""
    return 30 - math.ceil(math.log2(max(nworkers, 1)))


def local_exponents(values: np.ndarray, elements: int) -> np.ndarray:
    """Per-chunk exponent e with max|chunk| < 2**e (NO_EXPONENT for an all-zero chunk)."""
    return _local_exponents(values, elements)


@njit(cache=True, nogil=True)
def _local_exponents(values, elements):
    k = (values.size + elements - 1) // elements
    out = np.empty(k, np.int8)
    for j in range(k):
        m = 0.0
        for i in range(j * elements, min(values.size, (j + 1) * elements)):
            a = abs(values[i])
            if a > m:
                m = a
        if m == 0.0 or not np.isfinite(m):
            out[j] = NO_EXPONENT if m == 0.0 else 127
        else:
            e = np.int64(np.floor(np.log2(m))) + 1
            while m >= 2.0 ** e:      # guard log2 rounding at powers of two
                e += 1
            while e > -126 and m < 2.0 ** (e - 1):
                e -= 1
            out[j] = max(min(e, 127), -127)
    return out


@njit(cache=True, nogil=True)
def _pack(values, start, count, exponent, sbits, out, offset):
    """Quantize values[start:start+count] and write big-endian int32 at out[offset:]."""
    if exponent == NO_EXPONENT:
        scale = 0.0
    else:
        scale = 2.0 ** (sbits - exponent)
    lim = 2.0 ** 31 - 1
    clipped = 0
    for i in range(count):
        x = values[start + i] * scale
        if x > lim:
            x = lim
            clipped += 1
        elif x < -lim:
            x = -lim
            clipped += 1
        elif x != x:  # NaN
            x = 0.0
            clipped += 1
        q = np.int64(np.rint(x)) & 0xFFFFFFFF
        o = offset + 4 * i
        out[o] = (q >> 24) & 0xFF
        out[o + 1] = (q >> 16) & 0xFF
        out[o + 2] = (q >> 8) & 0xFF
        out[o + 3] = q & 0xFF
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
