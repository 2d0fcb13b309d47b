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

Narrow widths (issue 40, docs/precision.md): the same rule at ``bits`` = 16 or 8,
``S = bits - 2 - ceil(log2 N)`` (``scale_bits(N, bits)``), elements of ``bits // 8``
bytes; rounding to nearest (even), or stochastic and unbiased, ``floor(x + u)`` with ``u``
drawn by a counter-based generator (splitmix64) from the call's seed, the packet's seq,
the worker and the element's index, so a rerun draws the same. Bounds: nearest
``N * 2**(e - S - 1)``, stochastic ``N * 2**(e - S)`` (``error_bound``).
"""

import math

import numpy as np
from numba import njit

from ina_fabric.protocol.fields import NO_EXPONENT, HEADER_BYTES, NONFINITE_EXPONENT

__all__ = ["scale_bits", "local_exponents", "pack_chunk", "dequantize", "dequantize_into",
           "error_bound", "warm_up", "NO_EXPONENT", "NONFINITE", "pack_width",
           "dequantize_width_into", "chunk_key", "shared_exponents", "error_bounds"]

#: local exponent of a chunk that holds inf or NaN (its proposal; the wire's
#: NONFINITE_EXPONENT): a chunk agreed at it travels as zeros and reads back as NaN
NONFINITE = NONFINITE_EXPONENT


def scale_bits(nworkers: int, bits: int = 32) -> int:
    """S: fractional bits of a ``bits``-wide element, leaving headroom for the sum of
    ``nworkers`` values (``bits - 2 - ceil(log2 N)``: int32's rule at every width)."""
    s = bits - 2 - math.ceil(math.log2(max(nworkers, 1)))
    if s < 1:
        raise ValueError(f"{nworkers} workers leave no fractional bits at int{bits} (the "
                         f"sum needs {bits - 2 - s + 1} bits of headroom): use a wider "
                         f"precision")
    return s


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


def error_bound(exponent: int, nworkers: int, bits: int = 32,
                stochastic: bool = False) -> float:
    """Bound on |dequantized sum - exact sum| per element of a chunk (before float32):
    ``N * 2**(e - S - 1)`` rounding to nearest, ``N * 2**(e - S)`` stochastic."""
    if exponent == NO_EXPONENT:
        return 0.0
    return nworkers * math.ldexp(1.0, int(exponent) - scale_bits(nworkers, bits)
                                 - (0 if stochastic else 1))


def shared_exponents(inputs, elements: int) -> np.ndarray:
    """The exponents the workers agree on for each chunk of a call whose inputs (one
    float32 vector per worker) are ``inputs``: the max of their proposals (as the switch
    takes it). For tests and benches that check results against ``error_bounds``."""
    return np.max([local_exponents(x, elements) for x in inputs], axis=0)


def error_bounds(inputs, elements: int, bits: int = 32, stochastic: bool = False,
                 rotate=None, step: int = 0) -> np.ndarray:
    """Per element: the bound on |result - exact sum| of a call over ``inputs`` (one
    vector per worker) at ``bits``, before float32 rounding. ``rotate``: the call's
    ``RandomizedHadamard`` (or None), ``step`` its step: the bound holds in the rotated
    coordinates, so each element of a transform block is bounded by the Euclidean norm
    of the rotated bounds over that block."""
    n = len(inputs)
    x = [np.asarray(v, np.float32).reshape(-1) for v in inputs]
    size = x[0].size
    if rotate is not None:
        x = [rotate.forward(v, step) for v in x]
    e = shared_exponents(x, elements)
    per_chunk = np.array([error_bound(int(k), n, bits, stochastic) for k in e])
    b = np.repeat(per_chunk, elements)[:x[0].size]
    if rotate is None:
        return b
    out = np.empty(x[0].size)
    for a, k in rotate._parts(x[0].size):
        blk = k if rotate.block is None or k < rotate.block else rotate.block
        sq = (b[a:a + k] ** 2).reshape(-1, blk).sum(axis=1)
        out[a:a + k] = np.repeat(np.sqrt(sq), blk)
    return out[:size]


@njit(cache=True, nogil=True)
def _mix(z):
    """splitmix64's finalizer (uint64 in, uint64 out): the counter-based generator of
    stochastic rounding, bit for bit the same in _client.c."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def chunk_key(seed: int, seq: int, worker: int) -> int:
    """The generator key of one DATA packet's elements: its seq (shared by every rank
    of the call), the worker (its own draws: rounding errors independent across
    workers) and the call's seed (shared)."""
    return int(_mix(np.uint64((int(seed) + _mix(np.uint64(((seq & 0xFFFFFFFF) << 8)
                                                           | (worker & 0xFF))))
                              & 0xFFFFFFFFFFFFFFFF)))


@njit(cache=True, nogil=True)
def _packw(values, start, count, exponent, sbits, out, offset, code, stochastic, key):
    """Quantize values[start:start+count] at width code ``code`` (0 int32, 1 int16,
    2 int8) and write big-endian elements at out[offset:]; rounding to nearest even, or
    ``floor(x + u)`` with u from ``_mix(key + i * golden)`` (stochastic). Returns the
    clipped count. NO_EXPONENT/NONFINITE write zeros (as _pack)."""
    size = 4 >> code
    if exponent == NO_EXPONENT or exponent == NONFINITE:
        out[offset:offset + size * count] = 0
        return 0
    scale = 2.0 ** (sbits - exponent)
    lim = float((1 << ((32 >> code) - 1)) - 1)
    v = values[start:start + count]
    clipped = 0
    golden = np.uint64(0x9E3779B97F4A7C15)
    k = np.uint64(key)
    for i in range(count):
        x = np.float64(v[i]) * scale
        clipped += abs(x) > lim
        x = min(max(x, -lim), lim)
        if stochastic:
            u = np.float64(_mix(k + np.uint64(i) * golden) >> np.uint64(11)) * 2.0 ** -53
            q = np.int64(np.floor(x + u))
            q = min(max(q, -np.int64(lim)), np.int64(lim))
        else:
            q = np.int64(np.rint(x))
        o = offset + size * i
        if size == 4:
            out[o] = (q >> 24) & 0xFF
            out[o + 1] = (q >> 16) & 0xFF
            out[o + 2] = (q >> 8) & 0xFF
            out[o + 3] = q & 0xFF
        elif size == 2:
            out[o] = (q >> 8) & 0xFF
            out[o + 1] = q & 0xFF
        else:
            out[o] = q & 0xFF
    return clipped


def pack_width(values, start, count, exponent, sbits, out, offset, bits=32,
               stochastic=False, key=0) -> int:
    """``pack_chunk`` at any width (docs/precision.md); int32 rounding to nearest is
    ``pack_chunk`` itself (the same bytes). Returns the clipped count."""
    code = {32: 0, 16: 1, 8: 2}[bits]
    if code == 0 and not stochastic:
        return _pack(values, start, count, np.int64(exponent), sbits, out, offset)
    return _packw(values, start, count, np.int64(exponent), sbits, out, offset, code,
                  stochastic, np.uint64(key))


@njit(cache=True, nogil=True)
def _dequantw(buf, offset, count, factor, out, start, code):
    """out[start:start+count] = float32(element * factor) for big-endian elements of
    width code ``code`` at buf[offset:] (the same float64 product as ``_dequant``)."""
    size = 4 >> code
    for i in range(count):
        o = offset + size * i
        if size == 4:
            q = (np.int64(buf[o]) << 24) | (np.int64(buf[o + 1]) << 16) | \
                (np.int64(buf[o + 2]) << 8) | np.int64(buf[o + 3])
            q = (q ^ np.int64(0x80000000)) - np.int64(0x80000000)
        elif size == 2:
            q = (np.int64(buf[o]) << 8) | np.int64(buf[o + 1])
            q = (q ^ np.int64(0x8000)) - np.int64(0x8000)
        else:
            q = (np.int64(buf[o]) ^ np.int64(0x80)) - np.int64(0x80)
        out[start + i] = np.float32(np.float64(q) * factor)


def dequantize_width_into(buf, offset, count, exponent, sbits, out, start, rescale=1.0,
                          bits=32):
    """``dequantize_into`` for elements ``bits`` wide."""
    if bits == 32:
        return dequantize_into(buf, offset, count, exponent, sbits, out, start, rescale)
    if exponent == NO_EXPONENT:
        out[start:start + count] = 0.0
    elif exponent == NONFINITE:
        out[start:start + count] = np.nan
    else:
        _dequantw(buf, offset, count, math.ldexp(rescale, int(exponent) - sbits), out,
                  start, {16: 1, 8: 2}[bits])


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
    for code in (0, 1, 2):
        for sr in (False, True):
            _packw(x, 0, 8, np.int64(1), 4, buf, HEADER_BYTES, code, sr, np.uint64(1))
        _dequantw(buf, HEADER_BYTES, 8, 1.0, out, 0, code)
    return time.perf_counter() - t
