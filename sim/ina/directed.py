"""Directed scenarios: one per row of the semantics table (DESIGN.md). Each returns
(jobs, traffic [(datagram, source)], gaps [idle cycles before each packet], expected
model counters). The scoreboard checks the core against the model on each; the
expected counters check that the scenario really exercises its row."""

from ina_fabric.protocol.fields import MsgType, HEADER_BYTES
from ina_fabric.protocol.jobtable import JobConfig
from ina_fabric.protocol.numpy_view import pack

__all__ = ["SCENARIOS", "b2b_jobs", "b2b_traffic"]

E = 4


def _job(job=7, n=3, window=2, mode="reliable", deadline=1.0, mcast=None, elements=E):
    mem = tuple(f"10.0.{job}.{k + 1}:{5000 + k}@02:00:00:00:{job:02x}:{k + 1:02x}"
                for k in range(n))
    return JobConfig(job, mem, window=window, elements=elements, deadline=deadline,
                     mode=mode, mcast=mcast, session=0xD1EC_7ED0_0000 + job)


def _d(cfg, w, seq, vals=None, exp=0, **kw):
    vals = vals if vals is not None else [w + 1, -(w + 1), 1000 * w, seq & 0xFFFF]
    return pack(vals, job=cfg.job, session=cfg.session, worker=w, seq=seq, exponent=exp, **kw), cfg.members[w].addr


def _plain(traffic, expect, jobs, gaps=None):
    return jobs, traffic, gaps or [0] * len(traffic), expect


def complete():
    a = _job()
    t = [_d(a, 0, 0, exp=-3), _d(a, 1, 0, exp=5), _d(a, 2, 0, exp=1)]
    return _plain(t, {"accepted": 3, "results": 1, "partials": 0}, [a])


def overflow():
    a = _job(n=2)
    big = [2**31 - 1, -2**31, 2**31 - 1, 5]
    t = [_d(a, 0, 0, big), _d(a, 1, 0, [10, -10, -5, 5])]
    return _plain(t, {"results": 1, "overflows": 1}, [a])


def duplicate_open():
    a = _job(n=2)
    t = [_d(a, 0, 0), _d(a, 0, 0), _d(a, 1, 0)]
    return _plain(t, {"duplicates": 1, "accepted": 2, "results": 1, "resent": 0}, [a])


def resend_after_complete():
    a = _job(n=2)
    t = [_d(a, 0, 0), _d(a, 1, 0), _d(a, 1, 0), _d(a, 0, 0)]
    return _plain(t, {"results": 1, "duplicates": 2, "resent": 2}, [a])


def deadline_partial_and_late():
    b = _job(job=9, n=3, mode="bounded", deadline=120.0)
    t = [_d(b, 0, 0), _d(b, 1, 0), _d(b, 2, 0), _d(b, 0, 1), _d(b, 0, 0)]
    gaps = [0, 0, 300, 0, 5]
    return _plain(t, {"partials": 2, "late": 1, "duplicates": 1, "resent": 2,
                      "results": 2}, [b], gaps)


def deadline_unvisited():
    b = _job(job=9, n=3, mode="bounded", deadline=60.0, mcast=("239.0.0.9", 7009))
    t = [_d(b, 0, 0), _d(b, 1, 1), _d(b, 2, 1)]
    return _plain(t, {"partials": 2, "results": 2}, [b])


def reuse_and_window():
    a = _job(n=2, window=2)
    t = []
    for seq in range(6):
        t += [_d(a, 0, seq), _d(a, 1, seq)]
    t += [_d(a, 0, 1), _d(a, 0, 13), _d(a, 1, 6), _d(a, 0, 4)]
    return _plain(t, {"results": 6, "drop_stale": 1, "drop_out_of_window": 1,
                      "accepted": 13, "resent": 1}, [a])


def bad_inputs():
    a = _job(n=2)
    good, src = _d(a, 0, 0)
    t = [(good[:12], src), (good[:-4], src), (good + b"\0\0\0\0", src), (good + b"\0", src)]
    b = bytearray(good); b[0] = 3; t.append((bytes(b), src))
    b = bytearray(good); b[1] = MsgType.CONTROL; t.append((bytes(b), src))
    b = bytearray(good); b[1] = MsgType.STATUS_REQ; t.append((bytes(b[:HEADER_BYTES]), src))
    b = bytearray(good); b[4:6] = b"\x04\xd2"; t.append((bytes(b), src))
    b = bytearray(good); b[6] = 5; t.append((bytes(b), src))
    t.append((good, ("10.9.9.9", 5000)))
    t.append((good, (src[0], 4999)))
    t.append(_d(a, 0, 0, [1] * (E + 1)))
    t.append(_d(a, 1, 0, [1, 2]))           # opens seq 0 with 2 elements
    t.append(_d(a, 0, 0))                   # 4 elements: nelem mismatch
    t.append(_d(a, 0, 0, [3, 4]))
    return _plain(t, {"drop_truncated": 2, "drop_malformed": 5, "drop_bad_version": 1,
                      "status_requests": 1, "drop_unknown_job": 1,
                      "drop_unknown_source": 3, "results": 1}, [a])


def multicast_group():
    a = _job(n=3, mcast=("239.1.1.1", 7001))
    t = [_d(a, 2, 0), _d(a, 0, 0), _d(a, 1, 0), _d(a, 1, 1), _d(a, 0, 1), _d(a, 2, 1),
         _d(a, 2, 1)]
    return _plain(t, {"results": 2, "resent": 1}, [a])


def empty_packets():
    a = _job(n=2)
    t = [_d(a, 0, 0, []), _d(a, 1, 0, []), _d(a, 0, 1, [7]), _d(a, 1, 1, [8])]
    return _plain(t, {"results": 2}, [a])


def expire_and_reuse():
    b = _job(job=9, n=3, window=2, mode="bounded", deadline=120.0)
    t = [_d(b, 0, 0), _d(b, 1, 0), _d(b, 0, 4), _d(b, 1, 4), _d(b, 2, 4), _d(b, 2, 0)]
    return _plain(t, {"partials": 1, "results": 2, "accepted": 5, "drop_stale": 1},
                  [b], [0, 0, 300, 0, 0, 0])


def reuse_while_sending():
    a = _job(n=2, window=2)
    t = [_d(a, 0, 0), _d(a, 1, 0), _d(a, 0, 4), _d(a, 1, 4), _d(a, 0, 8), _d(a, 1, 8)]
    return _plain(t, {"results": 3, "accepted": 6}, [a])


SCENARIOS = {f.__name__: f for f in (
    complete, overflow, duplicate_open, resend_after_complete, deadline_partial_and_late,
    deadline_unvisited, reuse_and_window, bad_inputs, multicast_group, empty_packets,
    expire_and_reuse, reuse_while_sending)}


def b2b_jobs(P, n=4, mcast=True):
    mem = tuple(f"10.1.0.{k + 1}:{5000 + k}@02:00:00:01:00:{k + 1:02x}" for k in range(n))
    return [JobConfig(3, mem, window=P.window, elements=P.elements, mode="reliable",
                      mcast=("239.3.3.3", 7003) if mcast else None,
                      session=0xB2B0_0000_0003)]


def b2b_traffic(jobs, n_seq):
    import numpy as np
    rng = np.random.default_rng(5)
    cfg = jobs[0]
    out = []
    for seq in range(n_seq):
        for w in range(cfg.n):
            vals = rng.integers(-2**31, 2**31, cfg.elements, dtype=np.int64).astype(np.int32)
            out.append(_d(cfg, w, seq, vals))
    return out


# -- sequence numbers are 32-bit serial numbers (the model's modular compares) ---------
def seq_far():
    """Packets whose seq is about 2^31 away from their record's tag: a modular compare
    says stale for ``(tag - seq) mod 2^32`` in 1 .. 2^31-1, else out of window (a plain
    integer compare says out of window for every seq above the tag)."""
    a = _job(n=2, window=2)
    t = [_d(a, 0, 0), _d(a, 1, 0)]          # record (0, 0) now holds 0, the others -4..-1
    for s in (2**31 - 4, 2**31 - 1, 2**31, 2**31 + 1, 2**31 + 2, 2**31 + 3, 2**31 + 4,
              2**31 + 5, 2**32 - 8, 2**32 - 7, 2**32 - 6, 2**32 - 5):
        t.append(_d(a, 0, s))
    return _plain(t, {"results": 1, "drop_stale": 9, "drop_out_of_window": 3}, [a])


def wrap_preload(a, base):
    """Tags of job ``a``'s records after it completed seqs ``base - 2W .. base - 1``."""
    w = a.window
    return {(((base + k) // w) % 2, (base + k) % w): (base - 2 * w + k) & 0xFFFFFFFF
            for k in range(2 * w)}


def seq_wrap():
    """A job that runs across the 2^32 wrap (its records preloaded as if it had run
    from 0 to 2^32 - 4): reuse at tag + 2W mod 2^32, stale and out of window across the
    wrap, and a re-send after it."""
    a = _job(n=2, window=2)
    base = 2**32 - 4
    t = []
    for s in range(base, base + 10):
        t += [_d(a, 0, s & 0xFFFFFFFF), _d(a, 1, s & 0xFFFFFFFF)]
    t += [_d(a, 0, 2**32 - 1),              # stale across the wrap (tag 3)
          _d(a, 0, 5),                      # a re-send after the wrap
          _d(a, 1, 13)]                     # out of window (tag 5)
    jobs, traffic, gaps, expect = _plain(
        t, {"results": 10, "drop_stale": 1, "drop_out_of_window": 1, "resent": 1}, [a])
    return jobs, traffic, gaps, expect, {0: wrap_preload(a, base)}


SCENARIOS.update({f.__name__: f for f in (seq_far, seq_wrap)})


def spoof_rerun():
    """A datagram from a wrong source right behind a member's packet to the same record
    (empty packets: their decisions are one or two cycles apart, so the second is re-run
    from P2): the re-run must not skip its source check (it did: the spoofed packet
    completed the slot)."""
    a = _job(n=2)
    good0, src0 = _d(a, 0, 0, [])
    spoof, src1 = _d(a, 1, 0, [])
    t = [(good0, src0), (spoof, ("10.9.9.9", src1[1])), (spoof, (src1[0], 4999)),
         _d(a, 1, 1, []), _d(a, 0, 1, []), (spoof, ("10.9.9.8", src1[1]))]
    return _plain(t, {"drop_unknown_source": 3, "results": 1, "accepted": 3}, [a])


SCENARIOS[spoof_rerun.__name__] = spoof_rerun
