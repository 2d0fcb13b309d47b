"""A two-level tree of switches and its workers on a simulated network (tests only).

``TreeNet(shape)`` builds a spine and ``len(shape)`` leaves, leaf ``i`` with ``shape[i]``
workers, each switch a ``cls`` (``SwitchModel`` or ``FastSwitchModel``) holding its own
entry of one job, as ``ina job install --tree`` installs it (docs/fabric.md). Datagrams
travel with a fixed latency per hop and may be lost or duplicated (a seeded generator);
each switch's deadlines fire at their times (``next_deadline``/``tick``), interleaved with
deliveries in time order, so the run is deterministic for a seed.
"""

import heapq
import random

import numpy as np

from ina_fabric.host.switch import SwitchModel
from ina_fabric.protocol import pack, unpack, MsgType, Flags
from ina_fabric.protocol.jobtable import JobConfig
from ina_fabric.protocol.fields import width_byte

SESSION = 0x7EE5_0038
JOB = 38
SPINE = ("198.18.0.1", 19900)


def leaf_addr(i):
    return ("198.18.1.%d" % (i + 1), 19900)


def worker_addr(i, w):
    return ("198.18.%d.%d" % (10 + i, w + 1), 20000 + w)


def tree_configs(shape, *, mode="reliable", window=8, elements=4, leaf_deadline=0.010,
                 spine_deadline=0.030, session=SESSION, job=JOB):
    """(spine entry, [leaf entries]) of one job on a two-level tree."""
    spine = JobConfig(job, tuple(f"{a}:{p}" for a, p in map(leaf_addr, range(len(shape)))),
                      window, elements, spine_deadline, mode, None, session,
                      children=True, workers=sum(shape))
    leaves = [JobConfig(job, tuple(f"{a}:{p}" for a, p in (worker_addr(i, w)
                                                          for w in range(k))),
                        window, elements, leaf_deadline, mode, None, session,
                        parent=SPINE, index=i)
              for i, k in enumerate(shape)]
    return spine, leaves


class TreeNet:
    def __init__(self, shape, *, cls=SwitchModel, loss=0.0, dup=0.0, seed=0, latency=1e-4,
                 spine=None, leaf0=None, **job):
        """``spine``: a callable making the spine from its entry (default ``cls``);
        ``leaf0``: one making leaf 0 from its entry (default ``cls``)."""
        self.shape = list(shape)
        spine_cfg, leaves = tree_configs(shape, **job)
        self.cfg = spine_cfg
        self.switches = {SPINE: (spine or cls)([spine_cfg])}
        for i, cfg in enumerate(leaves):
            self.switches[leaf_addr(i)] = (leaf0 if i == 0 and leaf0 else cls)([cfg])
        self.workers = [worker_addr(i, w) for i, k in enumerate(shape) for w in range(k)]
        self.leaf_of = {worker_addr(i, w): (i, w) for i, k in enumerate(shape)
                        for w in range(k)}
        self.rng = random.Random(seed)
        self.loss, self.dup, self.latency = loss, dup, latency
        self.now = 0.0
        self._q, self._order = [], 0
        #: every datagram a worker received: worker address -> [(time, bytes)]
        self.received = {a: [] for a in self.workers}
        #: every datagram that crossed a switch-to-switch link, in order
        self.trunk = []

    @property
    def n(self):
        return len(self.workers)

    def _put(self, t, dest, src, data, lossy=True):
        copies = 1
        if lossy and self.rng.random() < self.loss:
            copies = 0
        elif lossy and self.rng.random() < self.dup:
            copies = 2
        for _ in range(copies):
            self._order += 1
            heapq.heappush(self._q, (t, self._order, dest, src, data))

    def _emit(self, t, src, outs):
        for dest, data in outs:
            dest = tuple(dest)
            if dest in self.switches:
                self.trunk.append((t, src, dest, data))
            self._put(t + self.latency, dest, src, data)

    def send(self, worker, seq, values, exponent=0, retransmit=False, t=None, lossy=True,
             width=32):
        """Worker ``worker`` (an address) sends its DATA for ``seq`` at ``t`` (now), its
        elements ``width`` bits wide."""
        i, w = self.leaf_of[worker]
        d = pack(np.asarray(values), job=self.cfg.job, worker=w, seq=seq,
                 exponent=exponent, session=self.cfg.session,
                 flags=Flags.RETRANSMIT if retransmit else 0, width=width_byte(width))
        self._put((self.now if t is None else t) + self.latency, leaf_addr(i), worker, d,
                  lossy)

    def _next_tick(self):
        best = None
        for addr, sw in self.switches.items():
            d = sw.next_deadline()
            if d is not None and (best is None or d < best[0]):
                best = (d, addr)
        return best

    def run(self, until=float("inf")):
        """Deliver datagrams and fire deadlines in time order until nothing is left
        before ``until``."""
        while True:
            tick = self._next_tick()
            t_pkt = self._q[0][0] if self._q else None
            if tick is not None and tick[0] <= until and (t_pkt is None or tick[0] <= t_pkt):
                self.now = max(self.now, tick[0])
                self._emit(self.now, tick[1], self.switches[tick[1]].tick(tick[0]))
                continue
            if t_pkt is None or t_pkt > until:
                break
            t, _, dest, src, data = heapq.heappop(self._q)
            self.now = max(self.now, t)
            if dest in self.switches:
                self._emit(t, dest, self.switches[dest].process(data, src, t))
            elif dest in self.received:
                self.received[dest].append((t, data))
        if until != float("inf"):
            self.now = max(self.now, until)

    def results(self, worker):
        """seq -> (time, header, elements) of the first RESULT of each seq a worker got."""
        out = {}
        for t, d in self.received[worker]:
            h, body = unpack(d)
            if int(h["type"]) == MsgType.RESULT and int(h["seq"]) not in out:
                out[int(h["seq"])] = (t, h, body)
        return out

    def counters(self, addr):
        return self.switches[addr].counters
