"""Fixed-point quantization: exponents, the stated error bound, and clipping."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ina_fabric.host.transport import quantize as Q
from ina_fabric.protocol import HEADER_BYTES


def roundtrip(workers_values, elements=256):
    n = len(workers_values)
    S = Q.scale_bits(n)
    agreed = np.max([Q.local_exponents(v, elements) for v in workers_values], axis=0)
    total = np.zeros(workers_values[0].size, np.int64)
    for v in workers_values:
        for j, e in enumerate(agreed):
            cnt = min(elements, v.size - j * elements)
            buf = np.zeros(HEADER_BYTES + 4 * cnt, np.uint8)
            assert Q.pack_chunk(v, j * elements, cnt, int(e), S, buf) == 0
            total[j * elements: j * elements + cnt] += np.frombuffer(
                buf, ">i4", offset=HEADER_BYTES)
    assert np.abs(total).max() < 2 ** 31  # never overflows int32 with agreed exponents
    out = np.concatenate([Q.dequantize(total[j * elements:(j + 1) * elements], int(e), S)
                          for j, e in enumerate(agreed)])
    return out, agreed


@given(st.integers(1, 32), st.integers(1, 2000), st.floats(1e-30, 1e30), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_error_within_stated_bound(n, size, scale, seed):
    rng = np.random.default_rng(seed)
    vals = [(rng.standard_normal(size) * scale).astype(np.float32) for _ in range(n)]
    out, agreed = roundtrip(vals)
    exact = np.sum(np.array(vals, np.float64), axis=0)
    bound = np.repeat([Q.error_bound(int(e), n) for e in agreed], 256)[:size]
    bound = bound + np.abs(exact) * 2.0 ** -24   # float32 rounding of the output
    assert np.all(np.abs(out - exact) <= bound)


def test_exponent_is_frexp_of_chunk_max():
    v = np.array([0.0, 0.75, -3.0, 1.0, 2.0, 0.0, 0.0, 0.0], np.float32)
    e = Q.local_exponents(v, 2)
    assert e.tolist() == [math.frexp(0.75)[1], math.frexp(3.0)[1], math.frexp(2.0)[1],
                          Q.NO_EXPONENT]


def test_disagreeing_exponent_clips_and_counts():
    v = np.array([100.0, -100.0, 1.0], np.float32)
    buf = np.zeros(HEADER_BYTES + 12, np.uint8)
    clipped = Q.pack_chunk(v, 0, 3, 2, Q.scale_bits(4), buf)
    assert clipped == 2
    q = np.frombuffer(buf, ">i4", offset=HEADER_BYTES)
    assert q[0] == 2 ** 31 - 1 and q[1] == -(2 ** 31 - 1)


@pytest.mark.parametrize("n,s", [(1, 30), (2, 29), (4, 28), (5, 27), (32, 25)])
def test_scale_bits(n, s):
    assert Q.scale_bits(n) == s
