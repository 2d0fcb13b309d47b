"""Reference aggregator + replicator (DESIGN.md, "Aggregator semantics").

Pure and deterministic: no sockets, no clock. ``process(datagram, source, now)`` returns
the datagrams to send as ``[(destination, bytes)]``; ``tick(now)`` fires deadlines.
``process`` calls ``tick(now)`` first, so a packet that arrives after its slot's deadline
is late, whatever the caller's tick rate. Counters are in ``self.counters``.

Slots. A job with window W has 2W slots: seq ``s`` maps to index ``s % W`` in set
``(s // W) % 2``. Each (set, index) record holds one seq at a time (its *tag*). Before
any traffic, record (set, i) holds the virtual, complete seq ``i + set*W - 2W``. For a
DATA packet with seq ``s`` and the record's tag ``t``:

* ``s == t``: join the slot (add, duplicate, late or re-send; see below);
* ``s == t + 2W`` and the record is complete: the record is reused and opens for ``s``;
* ``s < t``: *stale* drop (the slot has moved on; its result is gone);
* otherwise: *out-of-window* drop (the worker is ahead of the window).

Accumulation is exact (int64; 32 int32 values cannot overflow it) and the result is
saturated to int32 when it is emitted, with OVERFLOW set if any element saturated.
Saturating at each add would make the result depend on arrival order; this way every
order gives the same bytes, which the gateware matches with 37-bit accumulators.
"""

from collections import Counter
import json

import numpy as np

from ina_fabric.protocol.fields import (HEADER_BYTES, VERSION, MsgType, Flags, NO_EXPONENT,
                               field_offsets)
from ina_fabric.protocol.numpy_view import HEADER_DTYPE, ELEM_DTYPE

__all__ = ["SwitchModel", "COUNTERS", "INT32_MIN", "INT32_MAX", "GROUP_WORKER"]

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
GROUP_WORKER = 255  # worker field of a RESULT sent to the whole group

COUNTERS = (
    "rx", "rx_data", "accepted", "duplicates", "late", "results", "partials", "overflows",
    "resent", "status_requests", "control",
    "drop_truncated", "drop_malformed", "drop_bad_version", "drop_unknown_job",
    "drop_unknown_source", "drop_stale", "drop_out_of_window",
)

_OFF = field_offsets()


class _Slot:
    __slots__ = ("tag", "complete", "acc", "nelem", "bitmap", "count", "exponent",
                 "opened_at", "result")

    def __init__(self, tag):
        self.tag = tag
        self.complete = True
        self.acc = None
        self.nelem = 0
        self.bitmap = 0
        self.count = 0
        self.exponent = NO_EXPONENT
        self.opened_at = 0.0
        self.result = None  # header+payload bytes of the emitted RESULT


class _JobState:
    def __init__(self, cfg):
        self.cfg = cfg
        w = cfg.window
        self.slots = [[_Slot(i + s * w - 2 * w) for i in range(w)] for s in range(2)]
        self.open = {}  # seq -> slot, in opening order (deadline order within a job)
        self.group = [cfg.mcast] if cfg.mcast else [m.addr for m in cfg.members]


class SwitchModel:
    """The aggregator for a set of jobs (``JobConfig``)."""

    def __init__(self, jobs=()):
        self.jobs: dict[int, _JobState] = {}
        self.counters = Counter({name: 0 for name in COUNTERS})
        for cfg in jobs:
            self.add_job(cfg)

    def add_job(self, cfg):
        """Install or replace a job. A replacement with the same members, window and
        elements per packet keeps the slots (so a live deadline or mode change loses
        nothing in flight); any other replacement resets them."""
        old = self.jobs.get(cfg.job)
        if old is not None and (old.cfg.members, old.cfg.window, old.cfg.elements) == (
                cfg.members, cfg.window, cfg.elements):
            old.cfg = cfg
            old.group = [cfg.mcast] if cfg.mcast else [m.addr for m in cfg.members]
            return
        self.jobs[cfg.job] = _JobState(cfg)

    def remove_job(self, job: int):
        self.jobs.pop(job, None)

    # -- deadlines -------------------------------------------------------------------
    def tick(self, now: float):
        out = []
        for js in self.jobs.values():
            if js.cfg.mode != "bounded" or not js.open:
                continue
            deadline = js.cfg.deadline
            expired = []
            for seq, slot in js.open.items():
                if slot.opened_at + deadline > now:
                    break
                expired.append(seq)
            for seq in expired:
                out += self._emit(js, js.open.pop(seq))
        return out

    def next_deadline(self):
        """Earliest time at which ``tick`` has work, or None."""
        times = [next(iter(js.open.values())).opened_at + js.cfg.deadline
                 for js in self.jobs.values() if js.cfg.mode == "bounded" and js.open]
        return min(times, default=None)

    # -- packets ---------------------------------------------------------------------
    def process(self, datagram: bytes, source, now: float):
        out = self.tick(now)
        c = self.counters
        c["rx"] += 1
        n = len(datagram)
        if n < HEADER_BYTES:
            c["drop_truncated"] += 1
            return out
        h = np.frombuffer(datagram, HEADER_DTYPE, count=1)[0]
        if h["version"] != VERSION:
            c["drop_bad_version"] += 1
            return out
        mtype = int(h["type"])
        if mtype == MsgType.STATUS_REQ:
            c["status_requests"] += 1
            return out + [(source, self.status_datagram())]
        if mtype == MsgType.CONTROL:
            return out + self._control(datagram, source)
        if mtype != MsgType.DATA:
            c["drop_malformed"] += 1
            return out
        nelem = int(h["nelem"])
        body = n - HEADER_BYTES
        if body < 4 * nelem:
            c["drop_truncated"] += 1
            return out
        if body != 4 * nelem:
            c["drop_malformed"] += 1
            return out
        js = self.jobs.get(int(h["job"]))
        if js is None:
            c["drop_unknown_job"] += 1
            return out
        cfg = js.cfg
        worker = int(h["worker"])
        if worker >= cfg.n or cfg.members[worker].addr != tuple(source):
            c["drop_unknown_source"] += 1
            return out
        if nelem > cfg.elements:
            c["drop_malformed"] += 1
            return out
        c["rx_data"] += 1
        seq = int(h["seq"])
        w = cfg.window
        slot = js.slots[(seq // w) % 2][seq % w]
        bit = 1 << worker
        if seq == slot.tag + 2 * w and slot.complete:
            slot.tag, slot.complete, slot.result = seq, False, None
            slot.acc = np.zeros(nelem, np.int64)
            slot.nelem, slot.bitmap, slot.count = nelem, 0, 0
            slot.exponent, slot.opened_at = NO_EXPONENT, now
            js.open[seq] = slot
        elif seq != slot.tag:
            c["drop_stale" if seq < slot.tag else "drop_out_of_window"] += 1
            return out
        if slot.complete:
            if slot.bitmap & bit:
                c["duplicates"] += 1
            else:
                c["late"] += 1
            c["resent"] += 1
            return out + [(cfg.members[worker].addr, self._unicast(slot.result, worker))]
        if slot.bitmap & bit:
            c["duplicates"] += 1
            return out
        if nelem != slot.nelem:
            c["drop_malformed"] += 1
            return out
        c["accepted"] += 1
        if nelem:
            slot.acc += np.frombuffer(datagram, ELEM_DTYPE, count=nelem, offset=HEADER_BYTES)
        slot.bitmap |= bit
        slot.count += 1
        slot.exponent = max(slot.exponent, int(h["exponent"]))
        if slot.count == cfg.n:
            del js.open[seq]
            out += self._emit(js, slot)
        return out

    def _control(self, datagram, source):
        """CONTROL: the payload is one job-table entry (``JobConfig.to_bytes``); a zero
        ``nworkers`` removes the job. The reply is a STATUS datagram."""
        from ina_fabric.protocol.jobtable import JobConfig, ConfigError, ENTRY_DTYPE
        payload = datagram[HEADER_BYTES:]
        try:
            if len(payload) == ENTRY_DTYPE.itemsize and payload[2] == 0:
                self.remove_job(int.from_bytes(payload[:2], "big"))
            else:
                self.add_job(JobConfig.from_bytes(payload))
        except ConfigError:
            self.counters["drop_malformed"] += 1
            return []
        self.counters["control"] += 1
        return [(source, self.status_datagram())]

    # -- results ---------------------------------------------------------------------
    def _emit(self, js, slot):
        c = self.counters
        flags = 0
        if slot.count < js.cfg.n:
            flags |= Flags.PARTIAL
            c["partials"] += 1
        clipped = np.clip(slot.acc, INT32_MIN, INT32_MAX)
        if slot.nelem and not np.array_equal(clipped, slot.acc):
            flags |= Flags.OVERFLOW
            c["overflows"] += 1
        hdr = np.zeros((), HEADER_DTYPE)
        hdr["version"], hdr["type"], hdr["flags"] = VERSION, MsgType.RESULT, flags
        hdr["exponent"], hdr["job"], hdr["worker"] = slot.exponent, js.cfg.job, GROUP_WORKER
        hdr["count"], hdr["seq"], hdr["nelem"] = slot.count, slot.tag, slot.nelem
        hdr["bitmap"] = slot.bitmap
        slot.result = hdr.tobytes() + clipped.astype(ELEM_DTYPE).tobytes()
        slot.complete = True
        slot.acc = None
        c["results"] += 1
        return [(dest, slot.result) for dest in js.group]

    @staticmethod
    def _unicast(result: bytes, worker: int) -> bytes:
        b = bytearray(result)
        b[_OFF["worker"]] = worker
        b[_OFF["flags"]] |= Flags.RETRANSMIT
        return bytes(b)

    # -- status ----------------------------------------------------------------------
    def status(self) -> dict:
        return {
            "counters": dict(self.counters),
            "jobs": {j: {"workers": js.cfg.n, "window": js.cfg.window,
                         "elements": js.cfg.elements, "mode": js.cfg.mode,
                         "deadline_ms": js.cfg.deadline * 1e3, "open_slots": len(js.open)}
                     for j, js in self.jobs.items()},
        }

    def status_datagram(self) -> bytes:
        payload = json.dumps(self.status(), sort_keys=True).encode()
        hdr = np.zeros((), HEADER_DTYPE)
        hdr["version"], hdr["type"] = VERSION, MsgType.STATUS
        return hdr.tobytes() + payload
