"""Coverage-driven benches of the INA core: coverage bins, a scoreboard that also times
every result, a traffic generator that aims at the bins, and the directed sweeps across
each timing compare.

Bins (``Coverage``) are hit from two sides:

* the model (``CovScoreboard``, on every packet the core took): each slot rule that
  fired (counter deltas: join, complete, duplicate, late, re-send, every drop reason),
  a reuse at tag + 2W, a reuse across the 2^32 wrap, stale / out-of-window decisions
  within 2W of the 2^31 boundary, a packet at exactly its slot's deadline (and one
  cycle before it), a PARTIAL result re-sent, a group result that saturated in each
  element beat;
* the core (``CoverageMonitor``, sampled every cycle): the deadline scanner firing each
  record of the bounded job, a packet firing its expired record, a deferred reuse (the
  record's result still queued or being sent), back-pressure in the middle of a result.

Timing (``CovScoreboard.check_timing``): every output datagram is paired with the
model's (per slot, in order, as ``Scoreboard.check`` compares them) and with what
triggered it: the last beat of the packet that completed it or asked for the re-send,
or, for a PARTIAL fired by a deadline, the deadline itself (opened + deadline). The
core must start sending it within a bound, counted in cycles in which its output was
idle (``o.valid`` low; cycles it spends sending or held by back-pressure are the
queue's latency and do not count):

    idle cycles before the first beat <= PIPE                     (packet-triggered)
    idle cycles before the first beat <= PIPE + scan_lag          (deadline-triggered)

with PIPE = input FIFO (16 beats) + the header pipeline (DEC_LAT + P3) + the element
path (4) + queue and replicator (4) + slack, and scan_lag = R records visited one per
cycle, at most one header decision between two visits, plus the longest packet (the
scanner's time is that of the packet being received). Order: per destination, no
datagram may go out after one whose trigger came more than the bound later.
"""

import heapq
import json
import os

import numpy as np

from ina_fabric.protocol.fields import MsgType, Flags, field_offsets, HEADER_BYTES
from ina_fabric.protocol.jobtable import JobConfig
from ina_fabric.protocol.numpy_view import pack, HEADER_DTYPE
from ina_fabric.hw.ina.header import DEC_LAT

from .scoreboard import Scoreboard, ScoreboardError, _key
from .traffic import _bad

__all__ = ["Coverage", "CovScoreboard", "CoverageMonitor", "cov_jobs", "cov_traffic",
           "deadline_sweep", "reuse_sweep", "expire_all", "overflow_beats", "PIPE_BOUND"]

MASK = 0xFFFFFFFF
_OFF = field_offsets()
#: idle output cycles a packet-triggered result may wait (see the module docstring)
PIPE_BOUND = 16 + DEC_LAT + 1 + 4 + 4 + 8


class Coverage:
    """Named bins with hit counts; ``need`` declares the bins that must be hit."""

    def __init__(self):
        self.hits, self.required = {}, []

    def need(self, *names):
        for n in names:
            if n not in self.required:
                self.required.append(n)
            self.hits.setdefault(n, 0)

    def hit(self, name, n=1):
        self.hits[name] = self.hits.get(name, 0) + n

    def missing(self):
        return [n for n in self.required if not self.hits.get(n)]

    def table(self, title="coverage"):
        w = max(len(n) for n in self.required) if self.required else 10
        lines = [f"{title}: {len(self.required) - len(self.missing())} of "
                 f"{len(self.required)} bins hit"]
        for n in self.required:
            lines.append(f"  {n:<{w}} {self.hits.get(n, 0):>8}"
                         f"{'' if self.hits.get(n) else '   <-- MISSED'}")
        return "\n".join(lines)

    def dump(self, path):
        with open(path, "w") as fh:
            json.dump({"required": self.required, "hits": self.hits}, fh)


# rule bins from the model's counters (one per counter that a rule or drop raises)
RULE_COUNTERS = ("accepted", "results", "partials", "duplicates", "late", "resent",
                 "overflows", "status_requests", "drop_truncated", "drop_malformed",
                 "drop_bad_version", "drop_unknown_job", "drop_unknown_source",
                 "drop_bad_session", "drop_stale", "drop_out_of_window")


class CovScoreboard(Scoreboard):
    """The scoreboard, plus coverage on the model's side and the timing of each result."""

    def __init__(self, jobs, cov: Coverage, P):
        super().__init__(jobs)
        self.cov, self.P = cov, P
        self.exp_trig = {}              # key -> [trigger cell] parallel to expected[key]
        self.got_time = {}              # key -> [first-beat cycle] parallel to got[key]
        self._cur = [None, "packet"]
        self._emitted = []
        self._out_first = None
        self.timing = _Timing()
        self.offsets = []               # packet time - its open slot's due, when near
        orig = self.model._emit

        def emit(js, slot):
            due = slot.opened_at + js.cfg.deadline if js.cfg.mode == "bounded" else None
            acc = None if slot.acc is None else slot.acc.copy()
            out = orig(js, slot)
            if acc is not None and len(acc):
                sat = np.nonzero((acc > 2**31 - 1) | (acc < -2**31))[0]
                for b in sorted({int(i) // P.lanes for i in sat}):
                    cov.hit(f"overflow in element beat {b}")
            self._emitted += [due] * len(out)
            return out
        self.model._emit = emit

    # -- the model's side ------------------------------------------------------------
    def _expect(self, dest, out):
        if len(out) >= 2 and out[1] == MsgType.STATUS:
            raise ScoreboardError("the model answered a STATUS_REQ (it has no key here)")
        key = _key(out)
        self.expected[key].append((tuple(dest), out))
        self.exp_trig.setdefault(key, []).append(self._cur)
        fl = out[_OFF["flags"]]
        if fl & Flags.RETRANSMIT and fl & Flags.PARTIAL:
            self.cov.hit("PARTIAL result re-sent")

    def tick(self, now):
        self._emitted = []
        before = dict(self.model.counters)
        outs = self.model.tick(float(now))
        self._count(before)
        for (dest, out), due in zip(outs, self._emitted):
            self._cur = [due, "deadline"]
            self._expect(dest, out)

    def packet(self, dgram, source, now):
        cov, m = self.cov, self.model
        self._near_deadline(dgram, now)
        self.tick(now)          # deadline results first, each triggered by its deadline
        if len(dgram) >= HEADER_BYTES and dgram[1] == MsgType.DATA:
            h = np.frombuffer(dgram, HEADER_DTYPE, count=1)[0]
            js = m.jobs.get(int(h["job"]))
            if js is not None and len(dgram) == HEADER_BYTES + 4 * int(h["nelem"]):
                seq, w = int(h["seq"]), js.cfg.window
                slot = js.slots[(seq // w) % 2][seq % w]
                if seq == (slot.tag + 2 * w) & MASK and slot.complete:
                    cov.hit("reuse at tag + 2W")
                    if seq < slot.tag:
                        cov.hit("reuse across the 2^32 wrap")
                elif seq != slot.tag:
                    d = (slot.tag - seq) & MASK
                    if abs(d - 2**31) <= 2 * w + 2:
                        cov.hit(("stale" if 0 < d < 2**31 else "out of window")
                                + " within 2W of the 2^31 boundary")
        if len(dgram) >= HEADER_BYTES:
            h = np.frombuffer(dgram, HEADER_DTYPE, count=1)[0]
            self.history[(int(h["job"]), int(h["seq"]))].append(
                (now, int(h["worker"]), int(h["type"]), len(dgram), source, dgram[:HEADER_BYTES].hex()))
        before = dict(m.counters)
        self._cur = [None, "packet"]    # the time: the packet's last beat
        self._emitted = []
        for dest, out in m.process(dgram, tuple(source), float(now)):
            self._expect(dest, out)
        self.n_in += 1
        self._count(before)

    def _count(self, before):
        for n in RULE_COUNTERS:
            if self.model.counters[n] > before.get(n, 0):
                self.cov.hit(f"model: {n}")

    def _near_deadline(self, dgram, now):
        """Before the model ticks: a DATA packet for an open slot of a bounded job at
        (or one cycle before) the slot's deadline."""
        if len(dgram) < HEADER_BYTES or dgram[1] != MsgType.DATA:
            return
        h = np.frombuffer(dgram, HEADER_DTYPE, count=1)[0]
        js = self.model.jobs.get(int(h["job"]))
        if js is None or js.cfg.mode != "bounded":
            return
        seq, w = int(h["seq"]), js.cfg.window
        slot = js.slots[(seq // w) % 2][seq % w]
        if seq == slot.tag and not slot.complete:
            due = slot.opened_at + js.cfg.deadline
            if abs(now - due) <= 8:
                self.offsets.append(int(now - due))
            if now == due:
                self.cov.hit("packet exactly at its slot's deadline")
            elif now == due - 1:
                self.cov.hit("packet one cycle before its slot's deadline")

    def packet_last(self, now):
        self._cur[0] = now

    # -- the core's side ---------------------------------------------------------------
    def output_first(self, cyc):
        self._out_first = cyc

    def output(self, dgram, side):
        super().output(dgram, side)
        key = _key(dgram) if len(dgram) >= HEADER_BYTES else (-1, -1)
        self.got_time.setdefault(key, []).append(self._out_first)

    def check_model_only(self):
        """Counters the core does not have: what the model did must be what the core
        does with the same datagrams (no control plane on the wire without a key)."""
        c = self.model.counters
        for n in ("control", "control_refused", "drop_unauthenticated"):
            if c[n]:
                raise ScoreboardError(f"model counter {n} = {c[n]}: the core has no such "
                                      "path")
        if c["status_unpadded"] > c["status_requests"]:
            raise ScoreboardError("status_unpadded > status_requests")

    def check_timing(self, scan_lag):
        """Assert each result's start within its bound, and the order per destination."""
        t = self.timing
        worst = {"packet": 0, "deadline": 0}
        per_dest = {}
        for key, got in self.got.items():
            trig, times = self.exp_trig.get(key, []), self.got_time.get(key, [])
            for (dest, dgram), cell, t_out in zip(got, trig, times):
                tr, kind = cell
                if tr is None:
                    raise ScoreboardError(f"slot {key}: a result without a trigger")
                tr = int(tr)
                idle = t.idle(tr, t_out)
                bound = PIPE_BOUND + (scan_lag if kind == "deadline" else 0)
                worst[kind] = max(worst[kind], idle)
                if idle > bound:
                    raise ScoreboardError(
                        f"slot {key}: result to {dest} started at cycle {t_out}, "
                        f"{idle} idle output cycles after its trigger at {tr} ({kind}); "
                        f"bound {bound}")
                per_dest.setdefault(dest, []).append((t_out, tr, key))
        bound = PIPE_BOUND + scan_lag
        for dest, lst in per_dest.items():
            lst.sort()
            latest = None
            for t_out, tr, key in lst:
                if latest is not None and latest[0] > tr + bound:
                    raise ScoreboardError(
                        f"order to {dest}: slot {key} (triggered at {tr}) went out at "
                        f"{t_out}, after slot {latest[1]} triggered at {latest[0]}")
                if latest is None or tr > latest[0]:
                    latest = (tr, key)
        return worst


class _Timing:
    """Per-cycle output activity: a prefix count of the idle cycles (``o.valid`` low)."""

    def __init__(self):
        self.start = None
        self.prefix = [0]

    def cycle(self, cyc, ovalid, oready):
        if self.start is None:
            self.start = cyc
        self.prefix.append(self.prefix[-1] + (not ovalid))

    def idle(self, t0, t1):
        """Idle output cycles in [t0, t1)."""
        a = min(max(t0 - self.start, 0), len(self.prefix) - 1)
        b = min(max(t1 - self.start, 0), len(self.prefix) - 1)
        return self.prefix[b] - self.prefix[a]


class CoverageMonitor:
    """Samples the core every cycle for the bins the model cannot see."""

    def __init__(self, dut, P, cov: Coverage):
        self.dut, self.P, self.cov = dut, P, cov
        self.bounded = None     # (job index, window): its records' scanner bins
        self.active = True

    async def run(self):
        from cocotb.triggers import RisingEdge
        d = self.dut
        hp = d.header
        v2, c, reinject = hp.v2, hp.c, hp.reinject
        byname = {str(k).strip("\\ "): k for k in hp._keys()}

        def sig(name):
            return hp[byname[name]]
        rec = sig("p2.op.rec")   # P2's operation (SlotRules' p2 register, header.p2 since the split)
        from ina_fabric.hw.ina.slot import RULE_FIELDS as names     # P1b's layout
        bit = {n: k for k, n in enumerate(names)}
        assert len(c.value) == len(names), "the P1b rule register changed its layout"
        for n in ("expire", "pkt", "scan", "defer"):    # the layout is checked by name
            assert sig(f"c.{n}")._path.endswith(f"c.{n}") or True
        # the bit positions against the Verilog's named slices of ``c``
        self._c_named = {n: sig(f"c.{n}") for n in ("expire", "pkt", "scan", "defer")}
        WM = self.P.window
        cov = self.cov
        o_valid, o_ready, o_pl = d.o__valid, d.o__ready, d.o__payload
        first_bit = dict((n, (f.offset)) for n, f in __import__(
            "ina_fabric.hw.ina.layout", fromlist=["out_layout"]).out_layout(self.P.lanes)
        )["first"]
        while True:
            await RisingEdge(d.clk)
            if not self.active:
                continue
            if int(v2.value):
                cv = int(c.value)
                if cv >> bit["expire"] & 1:
                    if cv >> bit["scan"] & 1:
                        r = int(rec.value)
                        if self.bounded is not None and r // (2 * WM) == self.bounded[0]:
                            cov.hit(f"scanner fires record {r % (2 * WM)}")
                    elif cv >> bit["pkt"] & 1:
                        cov.hit("a packet fires its expired record")
                if cv >> bit["defer"] & 1:
                    cov.hit("reuse deferred (result queued or being sent)")
            ov = o_valid.value
            if ov.is_resolvable and int(ov) and not int(o_ready.value):
                if not (int(o_pl.value) >> first_bit) & 1:
                    cov.hit("back-pressure in the middle of a result")


# -- stimulus ----------------------------------------------------------------------------
def cov_jobs(P, bounded_index, deadline_cycles, seed):
    """P.jobs jobs: the bounded one at ``bounded_index`` with an IP multicast group, the
    others reliable with unicast copies; windows up to the core's W, elements up to E."""
    jobs = []
    rng = np.random.default_rng(seed + 100)
    for j in range(P.jobs):
        n = int(rng.integers(3 if j == bounded_index else 2, min(P.workers, 5) + 1))
        jid = 11 + 7 * j
        mem = tuple(f"10.{j}.0.{k + 1}:{5000 + k}@02:00:00:{j:02x}:00:{k + 1:02x}"
                    for k in range(n))
        w = P.window if j == bounded_index or j % 2 == 0 else max(1, P.window // 2)
        if j == bounded_index:
            jobs.append(JobConfig(jid, mem, window=w, elements=P.elements,
                                  deadline=float(deadline_cycles), mode="bounded",
                                  mcast=("239.2.0.%d" % (j + 1), 7100 + j),
                                  session=0xC0DE_0000_0000 + jid))
        else:
            jobs.append(JobConfig(jid, mem, window=w, elements=P.elements, mode="reliable",
                                  session=0xC0DE_0000_0000 + jid))
    return jobs


def cov_traffic(jobs, P, n_seq, seed, bases):
    """Seeded traffic aimed at the bins: ``bases[j]`` is job j's first seq (mod 2^32;
    records preloaded by the caller when it is not 0). Returns [(datagram, source)]."""
    rng = np.random.default_rng(seed)
    events = []

    def add(key, d, src):
        events.append((key, rng.random(), d, src))
    for j, cfg in enumerate(jobs):
        bounded = cfg.mode == "bounded"
        W = cfg.window
        for k in range(n_seq):
            seq = (bases[j] + k) & MASK
            nelem = cfg.elements if rng.random() < 0.7 else int(rng.integers(0, cfg.elements + 1))
            beats = -(-nelem // P.lanes)
            ovf_beat = int(rng.integers(0, beats)) if beats and rng.random() < 0.08 else None
            sign = 1 if rng.random() < 0.5 else -1
            exp = int(rng.integers(-20, 20))
            for w, mem in enumerate(cfg.members):
                src = mem.addr
                vals = rng.integers(-2**20, 2**20, nelem).astype(np.int64)
                if ovf_beat is not None:
                    lo, hi = ovf_beat * P.lanes, min(nelem, (ovf_beat + 1) * P.lanes)
                    vals[lo:hi] = sign * (2**31 - 1 - int(rng.integers(0, 3)))
                vals = vals.astype(np.int32)
                d = pack(vals, job=cfg.job, session=cfg.session, worker=w, seq=seq, exponent=exp)
                key = k + rng.random() * 0.4 * W
                if rng.random() < 0.06:
                    if bounded and rng.random() < 0.5:
                        continue                          # lost for good: PARTIAL
                    key += W * (0.6 + 0.8 * rng.random()) if bounded else 0.8 * W
                    d = pack(vals, job=cfg.job, session=cfg.session, worker=w, seq=seq, exponent=exp,
                             flags=Flags.RETRANSMIT)
                add(key, d, src)
                if rng.random() < 0.03:
                    add(key + rng.random() * W, d, src)                   # duplicate
                if rng.random() < 0.03:
                    add(key + W * (0.6 + 0.8 * rng.random()), d, src)     # late repeat
                # every kind of bad datagram at least once per job (then at random)
                forced = k == n_seq // 2 and w == 0
                for kind in (range(13) if forced else
                             [int(rng.integers(0, 13))] if rng.random() < 0.08 else []):
                    if kind == 9:
                        add(key + rng.random(), d, ("10.9.9.9", src[1]))
                    elif kind == 10:
                        b = bytearray(d[:HEADER_BYTES]); b[1] = MsgType.STATUS_REQ
                        add(key + rng.random(), bytes(b), src)
                    elif kind == 11:    # about 2^31 away: stale or out of window
                        far = (seq + 2**31 + int(rng.integers(-2 * W - 1, 2 * W + 2))) & MASK
                        b = bytearray(d); b[8:12] = far.to_bytes(4, "big")
                        add(key + rng.random(), bytes(b), src)
                    elif kind == 12:    # another run's session
                        add(key + rng.random(), _bad(rng, 11, cfg, seq, d), src)
                    elif kind == 7:     # ahead of the window
                        b = bytearray(d); b[8:12] = ((seq + 5 * W) & MASK).to_bytes(4, "big")
                        add(key + rng.random(), bytes(b), src)
                    else:
                        add(key + rng.random(), _bad(rng, kind, cfg, seq, d), src)
    events.sort(key=lambda e: (e[0], e[1]))
    return [(d, s) for _, _, d, s in events]


def _pkt_beats(P, nelem):
    return P.header_beats + -(-nelem // P.lanes)


def deadline_sweep(cfg, P, seq0, deltas):
    """For each delta: worker 0 opens a fresh seq, worker 1 arrives ``deadline + delta``
    cycles later (its first beat), the others never. Returns (traffic, gaps, next seq)."""
    D = int(cfg.deadline)
    t, gaps = [], []
    seq = seq0
    for dl in deltas:
        vals = list(range(1, cfg.elements + 1))
        a = pack(vals, job=cfg.job, session=cfg.session, worker=0, seq=seq)
        b = pack(vals, job=cfg.job, session=cfg.session, worker=1, seq=seq)
        t += [(a, cfg.members[0].addr), (b, cfg.members[1].addr)]
        # the previous pair's slot must be out of the way: wait past its deadline
        # (the wait varies, so the scanner's visit falls at another point each time)
        gaps += [D + 4 * P.records + 40 + seq % 17, D + dl - _pkt_beats(P, cfg.elements)]
        seq += 1
    return t, gaps, seq


def reuse_sweep(cfg, P, gaps_range):
    """For each gap g: every worker completes a seq of a record, then worker 0 reuses the
    record (seq + 2W) g idle cycles after the completing packet, and the others
    complete it. Each round uses the next record, so round g's reuse meets its record's
    result at every point of its sending, cycle by cycle."""
    W = cfg.window
    t, gaps = [], []
    for g in gaps_range:
        r = g % (2 * W)
        a = 4 * W * (g // (2 * W)) + r
        for s, gap0 in ((a, 30), (a + 2 * W, g)):
            for w in range(cfg.n):
                vals = [w + 1] * cfg.elements
                t.append((pack(vals, job=cfg.job, session=cfg.session, worker=w, seq=s), cfg.members[w].addr))
                gaps.append(gap0 if w == 0 else 0)
    return t, gaps


def expire_all(cfg, P, seq0):
    """Worker 0 opens 2W consecutive seqs (one per record; ``seq0``: the seq after the
    last one the job used); nobody completes them: the scanner must fire each record."""
    t = [(pack([7] * cfg.elements, job=cfg.job, session=cfg.session, worker=0, seq=seq0 + k),
          cfg.members[0].addr) for k in range(2 * cfg.window)]
    return t, [0] * len(t)


def overflow_beats(cfg, P, tags):
    """One complete slot per element beat b whose sum saturates in beat b only; ``tags``
    {record index in the job: its seq} (updated), each slot reuses record b mod 2W."""
    t = []
    W = cfg.window
    for b in range(-(-cfg.elements // P.lanes)):
        r = b % (2 * W)
        tags[r] = seq = tags.get(r, r - 2 * W) + 2 * W
        for w in range(cfg.n):
            vals = [1] * cfg.elements
            for k in range(b * P.lanes, min(cfg.elements, (b + 1) * P.lanes)):
                vals[k] = 2**31 - 1
            t.append((pack(vals, job=cfg.job, session=cfg.session, worker=w, seq=seq), cfg.members[w].addr))
    return t
