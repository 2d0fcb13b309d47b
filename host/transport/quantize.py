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

from ina_fabric.protocol.fields import NO_EXPONENT, HEADER_BYTES, NONFINITE_EXPONENT

__all__ = ["scale_bits", "local_exponents", "pack_chunk", "dequantize", "dequantize_into",
           "error_bound", "warm_up", "NO_EXPONENT", "NONFINITE"]

#: local exponent of a chunk that holds inf or NaN (its proposal; the wire's
#: NONFINITE_EXPONENT): a chunk agreed at it travels as zeros and reads back as NaN
NONFINITE = NONFINITE_EXPONENT


def scale_bits(nworkers: int) -> int:
    """S: fractional bits, leaving headroom for the sum of ``nworkers`` values."""
    return 30 - math.ceil(math.log2(max(nworkers, 1)))


def local_exponents(values: np.ndarray, elements: int) -> np.ndarray:
    """Per-chunk exponent e with max|chunk| < 2**e, i.e. ``frexp(max|chunk|)[1]``
    (NO_EXPONENT for an all-zero chunk, NONFINITE for one holding inf or NaN)."""
    v = np.ascontiguousarray(values, np.float32).reshape(-1)
    out = np.empty(-(-v.size // elements), np.int8)
    _exponents(v.view(np.uint32), elements, out)
    return out


@njit(cache=True, nogil=True)
def _exponents(bits, elements, out):
    """One pass over the float32 bit patterns: per chunk the largest ``bits & 0x7fffffff``
    (an integer max, which LLVM vectorizes; it orders finite magnitudes like the floats
    do, and inf/NaN above all of them), then frexp's exponent read off the bits. Returns
    the first chunk holding inf or NaN, or -1."""
    n, bad = bits.size, -1
    for j in range(out.size):
        a = j * elements
        b = min(a + elements, n)
        m = np.uint32(0)
        for i in range(a, b):
            m = max(m, bits[i] & np.uint32(0x7FFFFFFF))
        if m == 0:
            out[j] = NO_EXPONENT
        elif m >= np.uint32(0x7F800000):
            out[j] = NONFINITE
            if bad < 0:
                bad = j
        else:
            biased = np.int64(m >> np.uint32(23))
            if biased:                  # normal: 1.f * 2**(b-127) = 0.1f * 2**(b-126)
                e = biased - 126
            else:                       # subnormal: frexp's exponent from the top bit
                e = -149
                while m:
                    m >>= np.uint32(1)
                    e += 1
            out[j] = min(max(e, -127), 126)
    return bad


@njit(cache=True, nogil=True, fastmath=True)
def _pack(values, start, count, exponent, sbits, out, offset):
    """Quantize values[start:start+count] and write big-endian int32 at out[offset:]
    (offset a multiple of 4; ``out`` a 4-aligned uint8 array). Branch-free so LLVM
    vectorizes it: scale, clamp, round, byte-swap, store in one pass. An exponent of
    NO_EXPONENT or NONFINITE writes zeros (the chunk carries nothing, or its sum is NaN
    anyway); otherwise the values must be finite."""
    o32 = out[offset:offset + 4 * count].view(np.uint32)
    if exponent == NO_EXPONENT or exponent == NONFINITE:
        o32[:] = 0
        return 0
    scale = 2.0 ** (sbits - exponent)
    lim = 2147483647.0
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
    if exponent == NONFINITE:
        return np.full(elements_be.shape, np.nan, np.float32)
    factor = math.ldexp(rescale, int(exponent) - sbits)
    return (elements_be.astype(np.float64) * factor).astype(np.float32)


@njit(cache=True, nogil=True)
def _dequant(buf, offset, count, factor, out, start):
    """out[start:start+count] = float32(int32_be(buf[offset:]) * factor), one pass (the
    same float64 product and rounding as ``dequantize``)."""
    u = buf[offset:offset + 4 * count].view(np.uint32)
    for i in range(count):
        q = u[i]
        q = (((q & np.uint32(0xFF)) << np.uint32(24)) | ((q & np.uint32(0xFF00)) << np.uint32(8))
             | ((q >> np.uint32(8)) & np.uint32(0xFF00)) | (q >> np.uint32(24)))
        s = (np.int64(q) ^ np.int64(0x80000000)) - np.int64(0x80000000)
        out[start + i] = np.float32(np.float64(s) * factor)


def dequantize_into(buf, offset, count, exponent, sbits, out, start, rescale=1.0):
    """Fused dequantize of ``count`` big-endian int32 at ``buf[offset:]`` (a uint8 array,
    ``offset`` a multiple of 4) straight into ``out[start:]`` (float32): no temporaries.
    NO_EXPONENT writes zeros, NONFINITE (some worker's chunk held inf or NaN) NaN."""
    if exponent == NO_EXPONENT:
        out[start:start + count] = 0.0
    elif exponent == NONFINITE:
        out[start:start + count] = np.nan
    else:
        _dequant(buf, offset, count, math.ldexp(rescale, int(exponent) - sbits), out, start)


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


def warm_up():
    """Compile (or load from numba's on-disk cache) every kernel the data path uses, with
    the argument types it uses them with, so no timer ever includes JIT time. Call it
    before the first timed call, and before forking workers (they inherit the code).
    Returns the seconds it took."""
    import time
    t = time.perf_counter()
    x = np.ones(8, np.float32)
    buf = np.zeros(HEADER_BYTES + 64, np.uint8)
    out = np.empty(8, np.float32)
    local_exponents(x, 4)
    _pack(x, 0, 8, np.int64(1), 28, buf, HEADER_BYTES)
    _pack(x, 0, 8, 1, 28, buf, HEADER_BYTES)
    _dequant(buf, HEADER_BYTES, 8, 1.0, out, 0)
    return time.perf_counter() - t
