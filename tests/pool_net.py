"""Jobs sharing one switch's slot pool, its parent taking the overflow, and their
workers, on a simulated network (tests only; docs/pool.md).

``PoolNet(jobs, pool_slots)`` builds a leaf switch with a pool of ``pool_slots`` slots
and ``parent=PARENT``, and the parent (a switch without a pool), each a ``cls``
(``SwitchModel`` or ``FastSwitchModel``) holding the same entry of every job. Each worker
behaves as the client's window does: it sends seq ``s + W`` once it has the RESULT of
``s``, and re-sends what has no RESULT after ``rto``; with ``acks``, its DATA carry its
ack in ``count`` as the client's do (the distance to the lowest seq it has no RESULT
of, plus one). Datagrams travel with a fixed latency
and may be lost or duplicated on every link (a seeded generator); deadlines fire at their
times, interleaved with deliveries in time order, so a run is deterministic for a seed.
"""

import heapq
import random

import numpy as np

from ina_fabric.host.switch import SwitchModel
from ina_fabric.protocol import pack, unpack, MsgType, Flags, Refusal
from ina_fabric.protocol.jobtable import JobConfig
from ina_fabric.protocol.fields import width_byte

LEAF = ("198.18.2.1", 19900)
PARENT = ("198.18.2.2", 19900)


def worker_addr(k, w):
    return ("198.18.%d.%d" % (20 + k, w + 1), 21000 + w)


class PoolNet:
    """``jobs``: [(workers, window, elements, mode, packets)], job ids 1, 2, ..."""

    def __init__(self, jobs, pool_slots, *, cls=SwitchModel, loss=0.0, dup=0.0, seed=0,
                 latency=1e-4, rto=0.004, deadline=0.003, values_seed=None, widths=None,
                 acks=False):
        """``widths``: job id -> the element width (bits) its workers send (default 32;
        docs/precision.md)."""
        self.widths = dict(widths or {})
        self.cfgs, self.packets = [], {}
        for k, (n, window, elements, mode, packets) in enumerate(jobs):
            cfg = JobConfig(k + 1, tuple("%s:%d" % worker_addr(k, w) for w in range(n)),
                            window, elements, deadline, mode, None, 0x5EED_0039 + k)
            self.cfgs.append(cfg)
            self.packets[cfg.job] = packets
        self.leaf = cls(self.cfgs, pool_slots=pool_slots, parent=PARENT)
        self.parent = cls(self.cfgs)
        self.switches = {LEAF: self.leaf, PARENT: self.parent}
        vr = np.random.default_rng(seed if values_seed is None else values_seed)
        #: job -> [worker][seq] -> int64 values
        self.values = {}
        self.workers = {}      # address -> (cfg, member index)
        for cfg in self.cfgs:
            bits = self.widths.get(cfg.job, 32)
            lim = min(2**24, 1 << bits - 3)
            v = vr.integers(-lim, lim, (cfg.n, self.packets[cfg.job], cfg.elements))
            if vr.random() < 0.3:
                v[:, ::3, 0] = (1 << bits - 1) - 1  # some sums saturate (OVERFLOW)
            self.values[cfg.job] = v
            for w, m in enumerate(cfg.members):
                self.workers[m.addr] = (cfg, w)
        self.rng = random.Random(seed)
        self.loss, self.dup, self.latency, self.rto = loss, dup, latency, rto
        self.acks = acks
        self.low = {a: 0 for a in self.workers}    # the lowest seq without a RESULT
        self.now = 0.0
        self._q, self._order = [], 0
        #: every datagram a worker received: address -> [(time, bytes)]
        self.received = {a: [] for a in self.workers}
        #: every datagram between the two switches, in order: (time, src, dest, bytes)
        self.trunk = []
        #: datagrams delivered to each switch, by type
        self.delivered = {a: {} for a in self.switches}
        self.got = {a: {} for a in self.workers}         # seq -> first RESULT's bytes
        self.sent = {a: {} for a in self.workers}        # seq -> last send time
        self.pool_peak = 0

    def _put(self, t, dest, src, data):
        r = self.rng.random()
        copies = 0 if r < self.loss else 2 if r < self.loss + self.dup else 1
        for _ in range(copies):
            self._order += 1
            heapq.heappush(self._q, (t, self._order, dest, src, data))

    def _emit(self, t, src, outs):
        for dest, data in outs:
            dest = tuple(dest)
            if dest in self.switches:
                self.trunk.append((t, src, dest, data))
            self._put(t + self.latency, dest, src, data)

    def _send(self, addr, seq, retransmit):
        cfg, w = self.workers[addr]
        if self.acks:
            got, low = self.got[addr], self.low[addr]
            while low in got:
                low += 1
            self.low[addr] = low
            ack = seq - low + 1
        d = pack(self.values[cfg.job][w, seq], job=cfg.job, worker=w, seq=seq,
                 session=cfg.session, flags=Flags.RETRANSMIT if retransmit else 0,
                 width=width_byte(self.widths.get(cfg.job, 32)),
                 count=ack if self.acks else 0)
        self.sent[addr][seq] = self.now
        self._put(self.now + self.latency, LEAF, addr, d)

    def _on_result(self, addr, data):
        h, _ = unpack(data[:28] if data[1] == MsgType.ERROR else data)
        cfg, w = self.workers[addr]
        seq = int(h["seq"])
        if int(h["session"]) != cfg.session or seq in self.got[addr] or \
                seq >= self.packets[cfg.job]:
            return
        if int(h["type"]) == MsgType.ERROR and int(h["count"]) == Refusal.STALE:
            data = None        # bounded mode: its result is gone (the client abandons it)
        elif int(h["type"]) != MsgType.RESULT:
            return
        self.got[addr][seq] = data
        self.sent[addr].pop(seq, None)
        nxt = seq + cfg.window
        if nxt < self.packets[cfg.job] and nxt not in self.got[addr]:
            self._send(addr, nxt, False)

    def _timers(self):
        for addr, sent in self.sent.items():
            for seq, t in list(sent.items()):
                if self.now - t >= self.rto:
                    self._send(addr, seq, True)

    def done(self):
        return all(len(self.got[a]) == self.packets[cfg.job]
                   for a, (cfg, _) in self.workers.items())

    def run(self, limit=30.0):
        """Start every worker's first window, then deliver, fire deadlines and re-send
        until every worker has every RESULT or ``limit`` simulated seconds passed."""
        for addr, (cfg, w) in self.workers.items():
            for seq in range(min(cfg.window, self.packets[cfg.job])):
                self._send(addr, seq, False)
        next_timer = self.rto
        while not self.done() and self.now < limit:
            cands = [(next_timer, 0, None)]
            for a, sw in self.switches.items():
                d = sw.next_deadline()
                if d is not None:
                    cands.append((d, 1, a))
            if self._q:
                cands.append((self._q[0][0], 2, None))
            t, kind, a = min(cands)
            self.now = max(self.now, t)
            if kind == 0:
                self._timers()
                next_timer = self.now + self.rto / 2
            elif kind == 1:
                self._emit(self.now, a, self.switches[a].tick(t))
            else:
                t, _, dest, src, data = heapq.heappop(self._q)
                if dest in self.switches:
                    typ = data[1] if len(data) > 1 else -1
                    dl = self.delivered[dest]
                    dl[typ] = dl.get(typ, 0) + 1
                    self._emit(t, dest, self.switches[dest].process(data, src, t))
                    self.pool_peak = max(self.pool_peak, self.leaf.pool_used)
                elif dest in self.received:
                    self.received[dest].append((t, data))
                    self._on_result(dest, data)
        return self

    def expected(self, job, seq, bitmap=None):
        """The exact sum of ``seq`` over the workers in ``bitmap`` (all: None), clipped
        to the job's width (int32 unless ``widths`` says), and whether it saturated."""
        v = self.values[job][:, seq]
        if bitmap is not None:
            v = v[[w for w in range(v.shape[0]) if bitmap >> w & 1]]
        s = v.sum(axis=0)
        bits = self.widths.get(job, 32)
        c = np.clip(s, -(1 << bits - 1), (1 << bits - 1) - 1)
        return c, bool((c != s).any())
