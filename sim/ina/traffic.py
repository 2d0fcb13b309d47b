"""Seeded traffic for the core benches: DATA packets of several jobs with loss,
duplicates, reordering across workers, late packets, overflow values, unknown jobs and
sources, another session, more elements than the job's or fewer than the slot's,
truncated and malformed datagrams, and garbage (every reason the switch answers with an
ERROR: issue 43). Plain Python + numpy.

Returns ``[(datagram, source)]`` in arrival order. Arrival order is built by giving each
event a sort key in "seq units" (seq + jitter + delays) so slots interleave the way a
windowed sender's would; the stream is open loop (it does not react to results).
"""

import numpy as np

from ina_fabric.protocol.fields import MsgType, Flags, HEADER_BYTES, field_offsets
from ina_fabric.protocol.numpy_view import pack
from ina_fabric.protocol.jobtable import JobConfig

__all__ = ["Mix", "make_jobs", "generate"]


class Mix:
    """Rates of impairments (probabilities per packet)."""
    def __init__(self, loss=0.02, dup=0.03, late=0.02, overflow=0.03, short_nelem=0.05,
                 bad=0.03, jitter=0.4, retransmit=True):
        self.loss, self.dup, self.late, self.overflow = loss, dup, late, overflow
        self.short_nelem, self.bad, self.jitter = short_nelem, bad, jitter
        self.retransmit = retransmit


def make_jobs(*, n_a=4, n_b=3, window=4, elements=8, deadline_cycles=400):
    """Two jobs: A reliable with unicast copies, B bounded with an IP multicast group."""
    mem_a = tuple(f"10.0.0.{k + 1}:{5000 + k}@02:00:00:00:00:{k + 1:02x}" for k in range(n_a))
    mem_b = tuple(f"10.0.1.{k + 1}:{6000 + k}@02:00:00:00:01:{k + 1:02x}" for k in range(n_b))
    a = JobConfig(7, mem_a, window=window, elements=elements, deadline=1.0, mode="reliable",
                  session=0x7A3F_19C2_0000_0007)     # fixed: the benches replay exactly
    b = JobConfig(9, mem_b, window=window, elements=elements,
                  deadline=float(deadline_cycles), mode="bounded",
                  mcast=("239.1.2.3", 7000), session=0xFFFF_FFFF_0000_0009)
    return [a, b]


def _values(rng, nelem, overflow):
    if overflow:
        return rng.choice(np.array([2**31 - 1, -2**31, 2**31 - 7, -2**31 + 3], np.int64),
                          nelem).astype(np.int32)
    return rng.integers(-2**20, 2**20, nelem, dtype=np.int32)


def generate(jobs, n_seq: int, seed: int, mix: Mix = Mix()):
    rng = np.random.default_rng(seed)
    events = []  # (key, tiebreak, datagram, source)

    def add(key, dgram, src):
        events.append((key, rng.random(), dgram, src))

    for cfg in jobs:
        bounded = cfg.mode == "bounded"
        for seq in range(n_seq):
            nelem = cfg.elements
            if rng.random() < mix.short_nelem:
                nelem = int(rng.integers(0, cfg.elements + 1))
            ovf = rng.random() < mix.overflow
            for w, mem in enumerate(cfg.members):
                src = mem.addr
                vals = _values(rng, nelem, ovf)
                exp = int(rng.integers(-20, 20))
                d = pack(vals, job=cfg.job, session=cfg.session, worker=w, seq=seq, exponent=exp)
                key = seq + rng.random() * mix.jitter * cfg.window
                if rng.random() < mix.loss:
                    if bounded:
                        if rng.random() < 0.5:
                            continue      # lost for good: the deadline emits PARTIAL
                        key += cfg.window * 1.5   # arrives after the deadline: late
                    key += cfg.window * 0.8   # host retransmits after a timeout
                    d = pack(vals, job=cfg.job, session=cfg.session, worker=w, seq=seq, exponent=exp,
                             flags=Flags.RETRANSMIT)
                add(key, d, src)
                if rng.random() < mix.dup:
                    add(key + rng.random() * cfg.window, d, src)
                if rng.random() < mix.late:
                    add(key + cfg.window * (1 + rng.random()), d, src)
                if rng.random() < mix.bad:
                    kind = int(rng.integers(0, 14))
                    if kind == 9:      # right header, wrong source address
                        add(key + rng.random(), d, ("10.9.9.9", src[1]))
                    elif kind == 10:   # a status request
                        b = bytearray(d[:HEADER_BYTES]); b[1] = MsgType.STATUS_REQ
                        add(key + rng.random(), bytes(b), src)
                    else:
                        add(key + rng.random(), _bad(rng, kind, cfg, seq, d), src)
    events.sort(key=lambda e: (e[0], e[1]))
    return [(d, s) for _, _, d, s in events]


def _bad(rng, kind, cfg, seq, d):
    if kind == 0:
        return d[:int(rng.integers(0, HEADER_BYTES))]            # truncated header
    if kind == 1:
        return d[:len(d) - 4 * int(rng.integers(1, 3))] if len(d) > 24 else d[:10]
    if kind == 2:
        return d + b"\x01\x02"                                    # body too long
    if kind == 3:
        b = bytearray(d); b[0] = 2; return bytes(b)              # bad version
    if kind == 4:
        # a CONTROL whose payload can never be a job-table entry (4k+2 bytes)
        b = bytearray(d) + b"\0\0"; b[1] = MsgType.CONTROL; return bytes(b)
    if kind == 5:
        b = bytearray(d); b[4:6] = (1234).to_bytes(2, "big"); return bytes(b)  # unknown job
    if kind == 6:
        b = bytearray(d); b[6] = 31; return bytes(b)             # unknown worker
    if kind == 7:
        b = bytearray(d); b[8:12] = (seq + 5 * cfg.window).to_bytes(4, "big")
        return bytes(b)                                          # ahead of the window
    if kind == 11:                                   # another run's session (or a forger's)
        at = field_offsets()["session"] + int(rng.integers(0, 8))
        b = bytearray(d); b[at] ^= 1 << int(rng.integers(0, 8)); return bytes(b)
    if kind in (12, 13):
        # more elements than the job's (12), or fewer than the slot's (13): BAD_LENGTH
        n = (len(d) - HEADER_BYTES) // 4
        n = cfg.elements + 1 + int(rng.integers(0, 3)) if kind == 12 else max(0, n - 1)
        b = bytearray(d[:HEADER_BYTES]) + bytes(4 * n)
        at = field_offsets()["nelem"]
        b[at:at + 2] = n.to_bytes(2, "big"); return bytes(b)
    return bytes(rng.integers(0, 256, int(rng.integers(1, 60)), dtype=np.uint8))  # garbage
