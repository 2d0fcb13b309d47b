"""The in-band control scenario: CONTROL datagrams (accepted, refused, unauthenticated,
replayed, malformed), live update vs install, mixed with DATA that shows what each did
to the slots. The same datagrams go to the core and the model (sim/ina/scoreboard.py)."""

import dataclasses

from ina_fabric.protocol.auth import seal, STATUS_MIN_REQUEST, STATUS_MAX_REQUEST
from ina_fabric.protocol.fields import MsgType, HEADER_BYTES
from ina_fabric.protocol.jobtable import JobConfig, ENTRY_DTYPE, MEMBER_DTYPE, removal_entry
from ina_fabric.protocol.numpy_view import pack

__all__ = ["KEY", "scenario", "busy_pair", "CONTROL_GAP"]

KEY = bytes(range(32))
#: idle cycles after a CONTROL, so the core has applied it before the next datagram
#: (the model applies it at once): about 270 cycles per 64 bytes hashed, plus the rest
CONTROL_GAP = 7000
#: ... and after a STATUS_REQ (1,200 bytes hashed, a page of about 900 bytes written in
#: decimal and hashed)
STATUS_GAP = 20000
ADMIN = ("10.0.0.1", 4000)


#: the sessions of the scenario's runs (fixed, so that a run is repeatable)
S1, S2, S3 = 0x1122334455667788, 0xFEDCBA9876543210, 0x00000000000000A5


def _job(job, n, mode="reliable", deadline=0.001, window=2, mcast=None, session=S1):
    mem = tuple(f"10.0.{job}.{k + 1}:{5000 + k}@02:00:00:00:{job:02x}:{k + 1:02x}"
                for k in range(n))
    return JobConfig(job, mem, window=window, elements=4, deadline=deadline, mode=mode,
                     mcast=mcast, session=session)


def _ctl(cfg_bytes, nonce, key=KEY):
    return seal(pack(None, type=MsgType.CONTROL) + cfg_bytes, key, nonce)


def _d(cfg, w, seq):
    vals = [w + 1, -(w + 1), 1000 * w + seq, seq]
    return pack(vals, job=cfg.job, worker=w, seq=seq, session=cfg.session), cfg.members[w].addr


def scenario(jobs_max: int):
    """(traffic [(datagram, source)], gaps, expected model counters)."""
    a = _job(7, 3)
    b = _job(9, 2, mode="bounded", deadline=300e-6, mcast=("239.0.0.9", 7009))
    t, gaps = [], []

    def ctl(dgram, gap=CONTROL_GAP):
        t.append((dgram, ADMIN))
        gaps.append(0)
        gaps_after[len(t)] = gap

    gaps_after = {}

    def data(*pkts):
        for p in pkts:
            t.append(p)
            gaps.append(0)

    nonce = iter(range(1000, 2000))
    ctl(_ctl(a.to_bytes(), next(nonce)))                           # install: control
    data(_d(a, 0, 0), _d(a, 1, 0), _d(a, 2, 0))                     # a RESULT
    data(_d(a, 0, 1), _d(a, 1, 1))                                  # seq 1 open
    upd = _ctl(dataclasses.replace(a, deadline=0.002).to_bytes(update=True), next(nonce))
    ctl(upd)                                                        # live update: kept
    data(_d(a, 2, 1))                                               # completes seq 1
    ctl(upd)                                                        # replayed
    ctl(_ctl(a.to_bytes(), next(nonce), key=b"\x01" * 32))          # another key
    bad = bytearray(_ctl(a.to_bytes(), next(nonce)))
    bad[24] ^= 0x40
    ctl(bytes(bad))                                                 # altered
    ctl(_ctl(dataclasses.replace(a, window=4).to_bytes(update=True), next(nonce)))
    ctl(_ctl(_job(9, 2).to_bytes(update=True), next(nonce)))        # update, not installed
    data(_d(a, 0, 2), _d(a, 1, 2))                                  # seq 2 open
    ctl(_ctl(a.to_bytes(), next(nonce)))                            # re-install: afresh
    data(_d(a, 2, 2), _d(a, 0, 0), _d(a, 1, 0), _d(a, 2, 0))        # a new run
    # malformed entries, sealed
    e = bytearray(a.to_bytes())
    e[18:20] = b"\x00\x02"                                          # unknown flag
    ctl(_ctl(bytes(e), next(nonce)))
    e = bytearray(a.to_bytes())
    e[3] = 2                                                        # unknown mode
    ctl(_ctl(bytes(e), next(nonce)))
    e = bytearray(a.to_bytes())
    e[4:6] = (3).to_bytes(2, "big")                                 # window 3
    ctl(_ctl(bytes(e), next(nonce)))
    e = bytearray(a.to_bytes())
    E, M = ENTRY_DTYPE.itemsize, MEMBER_DTYPE.itemsize
    e[E + 2 * M:E + 2 * M + 6] = e[E + M:E + M + 6]                 # duplicate member
    ctl(_ctl(bytes(e), next(nonce)))
    e = bytearray(a.to_bytes())
    e[2] = 2                                                        # 2 members, 3 sent
    ctl(_ctl(bytes(e), next(nonce)))
    ctl(_ctl(a.to_bytes() + b"\0", next(nonce)))                    # impossible length
    # a second job fills the table; a third is refused; removal
    ctl(_ctl(b.to_bytes(), next(nonce)))
    # STATUS: answered (both jobs), another key, too long
    req = pack(None, type=MsgType.STATUS_REQ) + bytes(STATUS_MIN_REQUEST - HEADER_BYTES - 24)
    ctl(seal(req, KEY, next(nonce)), STATUS_GAP)
    ctl(seal(req, b"\x02" * 32, next(nonce)), STATUS_GAP)
    ctl(seal(req + bytes(STATUS_MAX_REQUEST), KEY, next(nonce)))
    data(_d(b, 0, 0))                                               # PARTIAL later
    if jobs_max == 2:
        ctl(_ctl(_job(11, 2).to_bytes(), next(nonce)))              # table full: refused
    # sessions: job 7 is held by S1 (active): another run's install, update and removal
    # are refused, its DATA dropped; S1's own install of 4 workers replaces it
    a2 = _job(7, 4, session=S2)
    ctl(_ctl(a2.to_bytes(), next(nonce)))                           # taken: refused
    ctl(_ctl(dataclasses.replace(a, session=S2, deadline=0.003).to_bytes(update=True),
             next(nonce)))                                          # update: refused
    ctl(_ctl(removal_entry(7, S2), next(nonce)))                    # removal: refused
    data(_d(a2, 0, 3))                                              # drop_bad_session
    a4 = _job(7, 4)
    ctl(_ctl(a4.to_bytes(), next(nonce)))                           # job 7 replaced
    data(_d(a4, 3, 0), _d(a4, 0, 0))
    ctl(_ctl(removal_entry(9, S1), next(nonce)))                    # remove job 9 (its own)
    data(_d(b, 1, 1))                                               # unknown job
    b3 = _job(9, 2, session=S3)
    ctl(_ctl(b3.to_bytes(), next(nonce)))                           # id 9 free: S3 takes it
    ctl(seal(req, KEY, next(nonce)), STATUS_GAP)                    # STATUS: sessions
    ctl(_ctl(removal_entry(9), next(nonce)))                        # session 0: any
    # a STATUS_REQ too short to be answered
    data((pack(None, type=MsgType.STATUS_REQ), ADMIN))
    gaps = [g + gaps_after.get(k, 0) for k, g in enumerate(gaps)]
    # the PARTIAL of job 9's first seq 0 fires in the gap after the CONTROL behind it
    expect = {"control": 8, "control_refused": 5 + (jobs_max == 2),
              "drop_unauthenticated": 4, "drop_malformed": 6, "status_requests": 5,
              "status_unpadded": 2, "drop_unknown_job": 1, "partials": 1,
              "drop_bad_session": 1}
    return t, gaps, expect


def busy_pair():
    """Two installs back to back: the core takes the first and drops the second
    (``drop_control_busy``); the model, which has no such limit, is not asked."""
    b = _job(9, 2)
    return [(_ctl(b.to_bytes(), 5000), ADMIN), (_ctl(b.to_bytes(), 5001), ADMIN)]
