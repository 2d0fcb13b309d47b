"""Replica consistency under bounded-time reductions: measure drift, repair it cheaply.

Why replicas drift: in bounded TAR a rank that misses a broadcast chunk fills it with its
own estimate (``N`` times its local value, OptiReduce's choice) while the other ranks
apply the owner's reduced value. Scatter-side loss does not cause drift (the owner
rescales, and every rank receives that same value). Optimizers used here (SGD, momentum,
Adam, weight decay) are elementwise, so a rank's parameters (and optimizer state) can
differ from the others' only on the entries it missed: its *dirty* ranges, reported by
``TarUdp`` in ``stats["missing"]``.

``ReplicaGuard`` keeps each rank's dirty ranges and, every ``period`` steps (the same steps
on every rank), repairs them over the reliable TCP mesh:

* ``mode="chunks"``: each rank asks each shard owner for the current values of only its
  dirty ranges in that owner's shard, for every vector it is given (parameters, momentum,
  ...). The owner never misses its own shard, so its values are the reference: after the
  repair all replicas are bitwise equal. Traffic is proportional to what was lost.
* ``mode="broadcast"``: every owner broadcasts its whole shard of every vector (a periodic
  parameter broadcast: half an allreduce). Needed when the dirty set is dense, e.g. after
  the Hadamard transform (a missing transformed chunk touches every entry).

``drift(mesh, vec)`` measures the max absolute difference of a vector across ranks (one
TCP scatter of shards to their owners, then the per-shard maxima exchanged).

Stated bound (plain SGD, learning rate ``lr``): between repairs an entry of two replicas
differs by at most ``lr * sum_over_steps |g_fill - g_true|`` on steps where one of them
missed it, so with ``G`` the largest reduced-gradient magnitude (and fills bounded by it),
drift <= ``2 * lr * G * period``; right after a repair it is exactly 0.
"""

import struct

import numpy as np

from .tar import Mesh, shard_bounds

__all__ = ["ReplicaGuard", "drift", "sgd_drift_bound"]


def sgd_drift_bound(lr, gmax, period):
    return 2.0 * lr * gmax * period


def drift(mesh: Mesh, vec: np.ndarray) -> float:
    """Max over entries of (max over ranks - min over ranks); the same value on all ranks."""
    v = np.ascontiguousarray(vec, np.float32).reshape(-1)
    N, r = mesh.world, mesh.rank
    lo, hi = shard_bounds(v.size, N)
    tag = mesh.next_tag()
    for o in range(N):
        if o != r:
            mesh.peers[o].send(tag, v[lo[o]:hi[o]])
    mx = v[lo[r]:hi[r]].copy()
    mn = mx.copy()
    for s in range(N):
        if s != r:
            w = np.frombuffer(mesh.peers[s].recv(tag), np.float32)
            np.maximum(mx, w, out=mx)
            np.minimum(mn, w, out=mn)
    local = float((mx - mn).max()) if mx.size else 0.0
    tag = mesh.next_tag()
    for o in range(N):
        if o != r:
            mesh.peers[o].send(tag, struct.pack("<d", local))
    for s in range(N):
        if s != r:
            local = max(local, struct.unpack("<d", mesh.peers[s].recv(tag))[0])
    return local


class ReplicaGuard:
    """Track dirty ranges of one rank and repair them every ``period`` steps."""

    def __init__(self, mesh: Mesh, size: int, period: int = 10, mode: str = "chunks"):
        if mode not in ("chunks", "broadcast", "none"):
            raise ValueError(f"consistency mode {mode!r}: chunks, broadcast or none")
        if period < 1:
            raise ValueError("consistency period must be >= 1")
        self.mesh, self.size, self.period, self.mode = mesh, int(size), period, mode
        self.dirty = np.zeros(self.size, bool)
        self.steps = 0
        self.totals = {"repairs": 0, "entries_repaired": 0, "entries_sent": 0,
                       "dirty_marked": 0}

    def note(self, stats, offset: int = 0):
        """Record the ranges this rank missed in one allreduce (bucket at ``offset``)."""
        for a, ln in stats.get("missing", ()):
            self.dirty[offset + a: offset + a + ln] = True
            self.totals["dirty_marked"] += ln

    def step(self, vectors):
        """Call once per training step after the optimizer; repairs on period steps.
        ``vectors``: flat float32 arrays laid out like the bucket (params, momentum...),
        modified in place. Returns the number of entries this rank received."""
        self.steps += 1
        if self.mode == "none" or self.steps % self.period:
            return 0
        got = self._chunks(vectors) if self.mode == "chunks" else self._broadcast(vectors)
        self.dirty[:] = False
        self.totals["repairs"] += 1
        self.totals["entries_repaired"] += got
        return got

    def _chunks(self, vectors):
        mesh, N, r = self.mesh, self.mesh.world, self.mesh.rank
        lo, hi = shard_bounds(self.size, N)
        tag = mesh.next_tag()
        want = {}
        for o in range(N):
            if o == r:
                continue
            idx = np.flatnonzero(self.dirty[lo[o]:hi[o]]).astype(np.int64) + lo[o]
            want[o] = idx
            mesh.peers[o].send(tag, idx)
        reqs = {s: np.frombuffer(mesh.peers[s].recv(tag), np.int64)
                for s in range(N) if s != r}
        tag = mesh.next_tag()
        for s, idx in reqs.items():
            payload = np.concatenate([np.asarray(v, np.float32).reshape(-1)[idx]
                                      for v in vectors]) if idx.size else np.zeros(0, np.float32)
            mesh.peers[s].send(tag, payload)
            self.totals["entries_sent"] += payload.size
        got = 0
        for o, idx in want.items():
            data = np.frombuffer(mesh.peers[o].recv(tag), np.float32)
            if idx.size:
                parts = data.reshape(len(vectors), idx.size)
                for v, p in zip(vectors, parts):
                    v.reshape(-1)[idx] = p
                got += data.size
        return got

    def _broadcast(self, vectors):
        mesh, N, r = self.mesh, self.mesh.world, self.mesh.rank
        lo, hi = shard_bounds(self.size, N)
        tag = mesh.next_tag()
        mine = np.concatenate([np.asarray(v, np.float32).reshape(-1)[lo[r]:hi[r]]
                               for v in vectors])
        for o in range(N):
            if o != r:
                mesh.peers[o].send(tag, mine)
                self.totals["entries_sent"] += mine.size
        got = 0
        for o in range(N):
            if o == r:
                continue
            data = np.frombuffer(mesh.peers[o].recv(tag), np.float32)
            parts = data.reshape(len(vectors), hi[o] - lo[o])
            for v, p in zip(vectors, parts):
                v.reshape(-1)[lo[o]:hi[o]] = p
            got += data.size
        return got
