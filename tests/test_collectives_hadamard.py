"""Randomized Hadamard transform: exact butterfly, round trip, linearity, loss spreading."""

import numpy as np
import pytest
import scipy.linalg

from ina_fabric.host.collectives.hadamard import RandomizedHadamard, fwht, next_pow2


@pytest.mark.parametrize("m", [1, 2, 8, 64, 1024])
def test_fwht_matches_dense_hadamard(m):
    x = np.random.default_rng(m).standard_normal((3, m)).astype(np.float64)
    assert np.allclose(fwht(x), x @ scipy.linalg.hadamard(m).T)


def test_fwht_rejects_non_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        fwht(np.zeros(12))


@pytest.mark.parametrize("n,block", [(1, None), (5, None), (1000, None), (4096, None),
                                     (100003, None), (100003, 4096), (7, 8)])
def test_round_trip_relative_error_below_1e5(n, block):
    h = RandomizedHadamard(seed=11, block=block)
    x = (np.random.default_rng(n).standard_normal(n) * 10).astype(np.float32)
    y = h.forward(x, step=3)
    assert y.size == h.padded_size(n) and y.size >= n
    if block is None:
        assert y.size == next_pow2(n)
    z = h.inverse(y, step=3, n=n)
    assert z.dtype == np.float32 and z.shape == (n,)
    assert np.linalg.norm(z - x) / np.linalg.norm(x) < 1e-5


def test_same_seed_and_step_same_transform_and_linear():
    a, b = RandomizedHadamard(5), RandomizedHadamard(5)
    xs = [np.random.default_rng(i).standard_normal(3000).astype(np.float32) for i in range(4)]
    ys = [a.forward(x, 9) for x in xs]
    assert np.array_equal(ys[0], b.forward(xs[0], 9))
    assert not np.allclose(ys[0], a.forward(xs[0], 10))   # fresh signs every step
    total = a.inverse(np.sum(ys, axis=0), 9, 3000)          # sum of transforms
    assert np.allclose(total, np.sum(xs, axis=0), atol=1e-4)


def test_bad_inverse_size_is_an_error():
    with pytest.raises(ValueError, match="expected"):
        RandomizedHadamard(0).inverse(np.zeros(100, np.float32), 0, 100)
    with pytest.raises(ValueError, match="power of two"):
        RandomizedHadamard(0, block=12)


def test_loss_spreads_thinly():
    """Dropping 5% of transformed entries: a small error on every entry, no entry lost."""
    n = 1 << 14
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    lost = rng.random(n) < 0.05
    raw = x.copy()
    raw[lost] = 0
    h = RandomizedHadamard(1)
    y = h.forward(x, 0)
    y[lost] = 0
    spread = h.inverse(y, 0, n)
    err_raw, err_h = np.abs(raw - x), np.abs(spread - x)
    # same total error energy (orthonormal), but no entry is wiped out
    assert np.isclose(np.linalg.norm(err_h), np.linalg.norm(err_raw), rtol=0.1)
    assert err_h.max() < 0.5 * err_raw.max()
    assert (err_h > 0).mean() > 0.99 and (err_raw > 0).mean() < 0.06


def test_per_block_padding_pads_only_the_last_block():
    """Issue 18: padding the digits CNN's 38,282 gradient entries to 2^16 sent 1.7x the
    bytes. Per block of 16,384 with the rest padded to its own power of two: 40,960
    entries (1.07x), and the round trip is still exact to float32 rounding."""
    n = 38282
    h = RandomizedHadamard(seed=1, block=16384)
    assert h.padded_size(n) == 2 * 16384 + 8192
    assert h.padded_size(n) / n < 1.1 and RandomizedHadamard(1).padded_size(n) / n > 1.7
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = h.forward(x, 4)
    assert np.linalg.norm(h.inverse(y, 4, n) - x) / np.linalg.norm(x) < 1e-5
    # blocks are independent: a datagram lost in the first block leaves the rest exact
    y[100:2148] = 0
    z = h.inverse(y, 4, n)
    assert np.allclose(z[16384:], x[16384:], atol=1e-5)
    assert np.abs(z[:16384] - x[:16384]).max() < 0.5 * np.abs(x[100:2148]).max()


def test_hadamard_collective_reports_bytes_ratio():
    from ina_fabric.host.collectives.base import HadamardCollective

    class Sum:
        rank, world, name = 0, 1, "id"

        def allreduce(self, y):
            return y, {"seconds": 0.0}

    c = HadamardCollective(Sum(), seed=2, block=16384)
    x = np.arange(38282, dtype=np.float32)
    out, st = c.allreduce(x)
    assert st["transformed_entries"] == 40960
    assert st["hadamard_bytes_ratio"] == pytest.approx(40960 / 38282)
    assert np.allclose(out, x, atol=1e-2)
