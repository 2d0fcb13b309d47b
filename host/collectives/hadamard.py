"""Randomized Hadamard transform: spread the loss of a few entries thinly over all entries.

``RandomizedHadamard(seed).forward(x, step)`` returns ``y = H D x / sqrt(m)``: ``x`` padded
with zeros to ``m`` entries (the next power of two, or a multiple of ``block`` with one
transform per block), ``D`` a diagonal of random signs drawn from ``(seed, step)`` (the same
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

__all__ = ["fwht", "RandomizedHadamard", "next_pow2"]


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
        return -(-n // self.block) * self.block

    def _signs(self, m: int, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(step) & 0xFFFFFFFF])
        bits = rng.integers(0, 2, m, dtype=np.int8)
        return (1 - 2 * bits).astype(np.float32)

    def _shape(self, m):
        return (1, m) if self.block is None else (m // self.block, self.block)

    def forward(self, x: np.ndarray, step: int) -> np.ndarray:
        """float32 vector of n entries -> float32 vector of padded_size(n) entries."""
        x = np.asarray(x, np.float32).reshape(-1)
        m = self.padded_size(x.size)
        y = np.zeros(m, np.float32)
        y[:x.size] = x
        y *= self._signs(m, step)
        shape = self._shape(m)
        y = fwht(y.reshape(shape)).reshape(-1)
        y *= np.float32(1.0 / np.sqrt(shape[1]))
        return y

    def inverse(self, y: np.ndarray, step: int, n: int) -> np.ndarray:
        """Undo :meth:`forward`: padded vector -> the first ``n`` entries, float32."""
        y = np.asarray(y, np.float32).reshape(-1)
        m = y.size
        if m != self.padded_size(n):
            raise ValueError(f"hadamard inverse: {m} entries, expected {self.padded_size(n)}")
        shape = self._shape(m)
        x = fwht(y.reshape(shape)).reshape(-1)
        x *= np.float32(1.0 / np.sqrt(shape[1]))
        x *= self._signs(m, step)
        return x[:n].copy()
