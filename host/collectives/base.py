"""The interface every collective implements, and the small shared pieces."""

from abc import ABC, abstractmethod
import os
import pathlib
import time

import numpy as np

__all__ = ["Collective", "DirStore", "HadamardCollective"]


class Collective(ABC):
    """One rank of an allreduce among ``world`` ranks.

    ``allreduce(x)`` takes a float32 vector (any shape) and returns ``(sum, stats)``: the
    elementwise sum over ranks (same shape, float32) and a dict with at least ``seconds``,
    ``entries`` (bucket size), ``entries_lost`` (entries of the result that are not the
    exact sum: a contribution or the whole entry was missing) and ``lost_fraction``.
    All ranks must make the same sequence of calls with the same sizes (as DDP does).
    """
    name = "collective"
    rank: int
    world: int

    @abstractmethod
    def allreduce(self, x: np.ndarray):
        ...

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DirStore:
    """A tiny rendezvous store in a directory shared by the ranks (duck-types the
    ``set``/``get`` of ``torch.distributed.Store``); ``get`` waits for the key."""

    def __init__(self, path, timeout: float = 30.0):
        self.path = pathlib.Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.timeout = timeout

    @staticmethod
    def _name(key):
        return key.replace("/", "%2F")

    def set(self, key: str, value):
        key = self._name(key)
        data = value.encode() if isinstance(value, str) else bytes(value)
        tmp = self.path / f".{key}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        tmp.rename(self.path / key)

    def get(self, key: str) -> bytes:
        p = self.path / self._name(key)
        t_end = time.monotonic() + self.timeout
        while not p.exists():
            if time.monotonic() > t_end:
                raise TimeoutError(f"rendezvous: key {key!r} not set within {self.timeout}s")
            time.sleep(0.002)
        return p.read_bytes()


class HadamardCollective(Collective):
    """Wrap a collective with the randomized Hadamard transform (forward before, inverse
    after; fresh signs every call, identical on every rank), per block of ``block``
    entries (``None``: the whole vector padded to a power of two). Its stats add
    ``transformed_entries`` and ``hadamard_bytes_ratio`` (transformed / original entries:
    what the padding costs on the wire)."""

    def __init__(self, inner: Collective, seed: int = 0, block: int | None = None):
        from .hadamard import RandomizedHadamard
        self.inner = inner
        self.rank, self.world = inner.rank, inner.world
        self.h = RandomizedHadamard(seed, block)
        self.name = f"{inner.name}+hadamard"
        self.step = 0

    def allreduce(self, x):
        x = np.asarray(x, np.float32)
        t0 = time.perf_counter()
        y = self.h.forward(x.reshape(-1), self.step)
        z, st = self.inner.allreduce(y)
        out = self.h.inverse(z, self.step, x.size).reshape(x.shape)
        self.step += 1
        st = dict(st)
        st["transformed_entries"] = y.size
        st["hadamard_bytes_ratio"] = y.size / max(x.size, 1)
        st["seconds"] = time.perf_counter() - t0
        return out, st

    def close(self):
        self.inner.close()

    def __getattr__(self, name):
        return getattr(self.__dict__["inner"], name)
