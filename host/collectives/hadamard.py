"""Randomized Hadamard transform: spread the loss of a few entries thinly over all entries.

``RandomizedHadamard(seed).forward(x, step)`` returns ``y = H D x / sqrt(m)``: ``x`` padded
with zeros to ``m`` entries (without ``block``: the next power of two; with ``block``: one
transform per whole block of ``block`` entries and one over the rest, padded only to the
next power of two of the rest, so a 38,282-entry bucket in blocks of 16,384 travels as
32,768 + 8,192 = 40,960 entries, not 65,536), ``D`` a diagonal of random signs drawn from ``(seed, step)`` (the same
on every rank, fresh every step) and ``H`` the Sylvester-Hadamard matrix, applied by a fast
Walsh-Hadamard transform (``log2 m`` vectorized butterfly passes, O(m log m), never a dense
matrix). The transform is orthonormal and linear, so the sum over ranks of the transforms is
the transform of the sum, and ``inverse(forward(x))`` is ``x`` to float32 rounding.

When a reduction loses a set of transformed entries (zeros in their place), the inverse
turns that into a small error spread over every entry of the bucket (about
``sqrt(lost fraction)`` of the norm, in random directions) instead of whole missing
entries: what OptiReduce relies on to keep training accurate at a few percent of loss.
"""

import numpy as np

__all__ = ["fwht", "RandomizedHadamard", "next_pow2", "DEFAULT_BLOCK"]

DEFAULT_BLOCK = 16384     # entries per transform (64 KiB): the loss of one datagram of
                          # 2,048 entries spreads over 8 datagrams' worth, and a bucket
                          # pads by at most its last block's power of two


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def fwht(a: np.ndarray) -> np.ndarray:
    """Unnormalized Walsh-Hadamard transform along the last axis (length a power of two).

    Returns a new array (float64 work is avoided: the dtype of ``a`` is kept)."""
    a = np.array(a, copy=True)
    m = a.shape[-1]
    if m & (m - 1):
        raise ValueError(f"fwht: length {m} is not a power of two")
    lead = a.shape[:-1]
    h = 1
    while h < m:
        v = a.reshape(*lead, m // (2 * h), 2, h)
        x, y = v[..., 0, :], v[..., 1, :]
        s = x + y
        np.subtract(x, y, out=y)
        x[...] = s
        h *= 2
    return a


class RandomizedHadamard:
    """Seeded randomized Hadamard transform; identical on all ranks for the same step."""

    def __init__(self, seed: int = 0, block: int | None = None):
        if block is not None and (block < 1 or block & (block - 1)):
            raise ValueError(f"hadamard block {block}: must be a power of two")
        self.seed = int(seed)
        self.block = block

    def padded_size(self, n: int) -> int:
        if self.block is None:
            return next_pow2(n)
        whole, rest = divmod(int(n), self.block)
        return whole * self.block + (next_pow2(rest) if rest else 0)

    def _parts(self, m):
        """(start, length) of each transform over a padded vector of ``m`` entries."""
        if self.block is None:
            return [(0, m)]
        whole, rest = divmod(m, self.block)
        parts = [(0, whole * self.block)] if whole else []
        if rest:
            parts.append((whole * self.block, rest))
        return parts

    def _transform(self, y):
        """The orthonormal blockwise transform of the padded vector ``y`` (new array)."""
        out = np.empty_like(y)
        for a, k in self._parts(y.size):
            b = k if self.block is None or k < self.block else self.block
            out[a:a + k] = fwht(y[a:a + k].reshape(-1, b)).reshape(-1)
            out[a:a + k] *= np.float32(1.0 / np.sqrt(b))
        return out

    def _signs(self, m: int, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(step) & 0xFFFFFFFF])
        bits = rng.integers(0, 2, m, dtype=np.int8)
        return (1 - 2 * bits).astype(np.float32)

    def forward(self, x: np.ndarray, step: int) -> np.ndarray:
        """float32 vector of n entries -> float32 vector of padded_size(n) entries."""
        x = np.asarray(x, np.float32).reshape(-1)
        m = self.padded_size(x.size)
        y = np.zeros(m, np.float32)
        y[:x.size] = x
        y *= self._signs(m, step)
        return self._transform(y)

    def inverse(self, y: np.ndarray, step: int, n: int) -> np.ndarray:
        """Undo :meth:`forward`: padded vector -> the first ``n`` entries, float32."""
        y = np.asarray(y, np.float32).reshape(-1)
        m = y.size
        if m != self.padded_size(n):
            raise ValueError(f"hadamard inverse: {m} entries, expected {self.padded_size(n)}")
        x = self._transform(y)
        x *= self._signs(m, step)
        return x[:n].copy()
