"""The core as a leaf of a two-level tree of switches (docs/fabric.md; hw/ina/leaf.py).

The core holds two leaf jobs (7 reliable with unicast copies, 9 bounded with an IP
multicast group), each with a parent: a reference model spine (``SwitchModel``) whose
job has two children, a sibling leaf (member 0, whose upward DATA the bench makes: one
per seq, random values and a count of 3 workers) and the core (member 1). The loop is
closed while the core runs (:class:`LeafLoop`, the scoreboard the harness drives):

* the workers' traffic (``traffic.generate``: loss, duplicates, late and re-sent DATA,
  overflow values, every kind of bad DATA) goes into the core as windowed senders' would:
  a datagram of seq ``s`` once every worker of its job has the RESULT of ``s - W`` (the
  generated order is kept; what is not a well-formed DATA goes with its neighbours);
  a straggler's DATA of the bounded job comes 1.2 to 4 leaf deadlines late (after the
  leaf sent its sum up: ``late``, answered from the relayed RESULT once it is there);
* what the core sends its parent reaches the spine model (or is lost), the spine's
  RESULTs for the core come back into the core's input a few datagrams later (or are
  lost, or doubled), with bad RESULTs beside them (from another source, another
  session, a count above 1,024, another element count, an unknown job);
* a worker re-sends, on its timeout, each DATA of its own whose RESULT has not reached
  it (its leaf, the core, relays or re-sends it, or sends its upward DATA again: the
  recovery at the lowest level that can answer);
* the spine's bounded deadline is longer than the leaf's; the sibling's DATA of the
  bounded job is sometimes lost, so the spine closes without it (PARTIAL), or without
  the core (its bitmap then lacks the core's bit: the relay's bitmap is 0).

The scoreboard is a model leaf with the same jobs and parent: every datagram the core
sends (to the parent, the members, the group, ERRORs) and every gateware counter must be
the model's, byte for byte.
"""

import numpy as np

from ina_fabric.host.switch.model import SwitchModel
from ina_fabric.protocol.fields import MsgType, Flags, HEADER_BYTES, field_offsets
from ina_fabric.protocol.jobtable import JobConfig, GATEWARE_MODES
from ina_fabric.protocol.numpy_view import HEADER_DTYPE, pack

from .scoreboard import Scoreboard
from .traffic import Mix, generate

__all__ = ["PARENT", "PARENT_MAC", "CORE", "leaf_jobs", "LeafLoop"]

#: the parent switch (a model spine), its MAC, and the core's address at the parent
PARENT = ("10.0.0.200", 4791)
PARENT_MAC = "02:00:00:00:00:c8"
CORE = ("10.0.0.254", 4791)
SIBLING = ("10.0.0.201", 4791)
#: the workers the sibling leaf covers
SIBLING_WORKERS = 3
_OFF = field_offsets()


def leaf_jobs(*, window=4, elements=4, deadline_cycles=300, workers=(4, 3)):
    """(the core's leaf jobs, the spine's jobs): 7 reliable (``workers[0]`` workers,
    unicast copies), 9 bounded (``workers[1]``, a multicast group), each a child of the
    spine as member 1."""
    leaves, spines = [], []
    for k, (job, mode, n, session) in enumerate(((7, "reliable", workers[0],
                                                  0x7A3F_19C2_0000_0107),
                                                 (9, "bounded", workers[1],
                                                  0xFFFF_FFFF_0000_0109))):
        members = tuple(f"10.1.{k}.{w + 1}:{5000 + w}@02:00:00:01:{k:02x}:{w + 1:02x}"
                        for w in range(n))
        bounded = mode == "bounded"
        leaves.append(JobConfig(
            job, members, window=window, elements=elements, mode=mode,
            deadline=float(deadline_cycles) if bounded else 1.0,
            mcast=("239.1.2.9", 7009) if bounded else None, session=session,
            parent=PARENT, index=1))
        spines.append(JobConfig(
            job, (f"{SIBLING[0]}:{SIBLING[1]}@02:00:00:00:00:c9",
                  f"{CORE[0]}:{CORE[1]}@02:00:00:00:00:fe"),
            window=window, elements=elements, mode=mode,
            deadline=float(3 * deadline_cycles) if bounded else 1.0, session=session,
            children=True, workers=SIBLING_WORKERS + n))
    return leaves, spines


def _set(d: bytes, field: str, value: int, size: int) -> bytes:
    b = bytearray(d)
    b[_OFF[field]:_OFF[field] + size] = value.to_bytes(size, "big")
    return bytes(b)


class LeafLoop(Scoreboard):
    """The scoreboard (a model leaf) and the rest of the tree around the core: the
    harness hands it every datagram the core took (``packet``) and sent (``output``),
    and calls ``cycle_hook`` every cycle; it inserts the spine's RESULTs and the workers'
    re-sends into ``traffic``, the list the harness is sending (the module docstring)."""

    def __init__(self, leaves, spines, pending, traffic, seed, *, loss=0.05, dup=0.05,
                 bad=0.12, timeout=600, resends=6, sibling_loss=0.15, straggle=0.06,
                 error_interval=None):
        super().__init__(leaves, parent=PARENT, parent_mac=PARENT_MAC,
                         error_interval=error_interval)
        self.rng = np.random.default_rng(seed + 77)
        self.cfg = {c.job: c for c in leaves}
        self.traffic, self.pos = traffic, 0
        #: the workers' datagrams not yet sent (each with its (job, seq) or None)
        self.pending = [(d, s, self._job_seq(d)) for d, s in pending]
        self.have = {}          # (job, seq) -> workers that have its RESULT
        self.straggle, self.delayed = straggle, []     # [(time, datagram, source)]
        self.spine = SwitchModel(spines, modes=GATEWARE_MODES, answers=False)
        self.cfg = {c.job: c for c in leaves}
        self.loss, self.dup, self.bad = loss, dup, bad
        self.timeout, self.resends = timeout, resends
        self.sibling_loss = sibling_loss
        self.sibling_sent = set()
        self.waiting = {}       # (job, worker, seq) -> [datagram, last send, sends]
        self.n_up = self.n_down = self.n_resent = 0
        #: relayed RESULTs whose spine closed without this leaf (bitmap 0)
        self.n_not_mine = 0
        self.now = 0

    # -- what the harness calls ------------------------------------------------------
    def taken(self, k):
        """The harness took ``traffic[k]`` to send: insertions go after it."""
        self.pos = k + 1

    def packet(self, dgram, source, now):
        super().packet(dgram, source, now)
        self.now = now
        own = self._own_data(dgram, source)
        if own is not None:
            job, w, seq = own
            self.waiting.setdefault((job, w, seq), [dgram, now, 1])
            if (job, seq) not in self.sibling_sent:
                self.sibling_sent.add((job, seq))
                self._sibling(job, seq, now)

    def output(self, dgram, side):
        super().output(dgram, side)
        import ipaddress
        dst = (str(ipaddress.IPv4Address(side["dst_ip"])), side["dst_port"])
        if len(dgram) < HEADER_BYTES:
            return
        h = np.frombuffer(dgram, HEADER_DTYPE, count=1)[0]
        job, seq = int(h["job"]), int(h["seq"])
        if dst == PARENT and dgram[1] == MsgType.DATA:
            self.n_up += 1
            if self.rng.random() >= self.loss:
                self._to_spine(dgram, CORE, self.now)
        elif dgram[1] == MsgType.RESULT and job in self.cfg:
            cfg = self.cfg[job]
            if int(h["bitmap"]) == 0 and not h["flags"] & Flags.RETRANSMIT:
                self.n_not_mine += 1
            for w, mem in enumerate(cfg.members):
                if side["mcast"] or mem.addr == dst:
                    self.waiting.pop((job, w, seq), None)
                    self.have.setdefault((job, seq), set()).add(w)

    # -- the workers' window ---------------------------------------------------------
    def _job_seq(self, d):
        if len(d) < HEADER_BYTES:
            return None
        h = np.frombuffer(d, HEADER_DTYPE, count=1)[0]
        job = int(h["job"])
        return (job, int(h["seq"])) if job in self.cfg else None

    def _allowed(self, job, seq):
        """Every worker of ``job`` has the RESULT of ``seq - W`` (or it is before the
        job's first window); seqs far ahead of the window (bad DATA) go at once."""
        cfg = self.cfg[job]
        prev = seq - cfg.window
        if prev < 0 or prev > 1 << 20:
            return True
        return len(self.have.get((job, prev), ())) == cfg.n

    def _release(self):
        """Move what the window allows from ``pending`` to the end of ``traffic``, in
        the generated order."""
        if not self.pending and not self.delayed:
            return
        keep, out = [], []
        for d, s, js in self.pending:
            if js is not None and not self._allowed(*js):
                keep.append((d, s, js))
            elif (js is not None and self.cfg[js[0]].mode == "bounded"
                  and self.rng.random() < self.straggle):
                dl = self.cfg[js[0]].deadline
                self.delayed.append((self.now + dl * (1.2 + 2.8 * self.rng.random()), d, s))
            else:
                out.append((d, s))
        due = [e for e in self.delayed if e[0] <= self.now]
        self.delayed = [e for e in self.delayed if e[0] > self.now]
        out += [(d, s) for _, d, s in due]
        self.pending = keep
        self.traffic += out

    def cycle_hook(self, cyc):
        if cyc % 16:
            return
        self.now = max(self.now, cyc)
        self._release()
        for dest, out in self.spine.tick(cyc):
            self._down(dest, out)
        for key, entry in sorted(self.waiting.items()):
            d, last, sends = entry
            if cyc - last >= self.timeout and sends <= self.resends:
                entry[1], entry[2] = cyc, sends + 1
                b = bytearray(d)
                b[_OFF["flags"]] |= Flags.RETRANSMIT
                self.n_resent += 1
                self._insert(bytes(b), self.cfg[key[0]].members[key[1]].addr, 0)

    # -- the tree around the core ----------------------------------------------------
    def _insert(self, dgram, source, later):
        self.traffic.insert(min(self.pos + later, len(self.traffic)), (dgram, source))

    def _own_data(self, d, s):
        """(job, worker, seq) of a worker's well-formed DATA of a core job, else None."""
        if len(d) < HEADER_BYTES:
            return None
        h = np.frombuffer(d, HEADER_DTYPE, count=1)[0]
        cfg = self.cfg.get(int(h["job"]))
        if (cfg is None or int(h["type"]) != MsgType.DATA or int(h["session"]) != cfg.session
                or int(h["worker"]) >= cfg.n or int(h["width"]) != 0
                or cfg.members[int(h["worker"])].addr != tuple(s)
                or len(d) != HEADER_BYTES + 4 * int(h["nelem"])
                or int(h["nelem"]) > cfg.elements):
            return None
        return cfg.job, int(h["worker"]), int(h["seq"])

    def _sibling(self, job, seq, now):
        """The sibling leaf's DATA up for ``seq`` (lost now and then in bounded mode)."""
        cfg = self.cfg[job]
        if cfg.mode == "bounded" and self.rng.random() < self.sibling_loss:
            return
        vals = self.rng.integers(-2**22, 2**22, cfg.elements, dtype=np.int32)
        d = pack(vals, job=job, session=cfg.session, worker=0, seq=seq,
                 count=SIBLING_WORKERS, bitmap=0b111,
                 exponent=int(self.rng.integers(-20, 20)))
        self._to_spine(d, SIBLING, now)

    def _to_spine(self, d, src, now):
        for dest, out in self.spine.process(d, src, now):
            self._down(dest, out)

    def _down(self, dest, res):
        """A spine datagram: those for the core go into its input (maybe lost, doubled,
        with a bad RESULT beside them)."""
        if tuple(dest) != CORE or res[1] != MsgType.RESULT:
            return
        self.n_down += 1
        rng = self.rng
        if rng.random() < self.bad:
            self._insert(*self._bad_result(res), int(rng.integers(0, 3)))
        if rng.random() < self.loss:
            return
        later = int(rng.integers(1, 4))
        self._insert(res, PARENT, later)
        if rng.random() < self.dup:
            self._insert(res, PARENT, later + int(rng.integers(1, 6)))

    def _bad_result(self, res):
        """A RESULT the core must drop, beside a good one."""
        kind = int(self.rng.integers(0, 6))
        if kind == 0:
            return res, ("10.9.9.9", PARENT[1])                  # not from the parent
        if kind == 1:
            return res, (PARENT[0], PARENT[1] + 1)               # another port
        if kind == 2:                                            # another session
            at = _OFF["session"] + int(self.rng.integers(0, 8))
            b = bytearray(res)
            b[at] ^= 1 << int(self.rng.integers(0, 8))
            return bytes(b), PARENT
        if kind == 3:                                            # count above 1,024
            return _set(res, "count", 1025 + int(self.rng.integers(0, 100)), 2), PARENT
        if kind == 4:                                            # another element count
            n = int.from_bytes(res[_OFF["nelem"]:_OFF["nelem"] + 2], "big")
            b = _set(res, "nelem", n + 1, 2) + bytes(4)
            return b, PARENT
        return _set(res, "job", 1234, 2), PARENT                 # a job not here


def generate_leaf(n_seq, seed, *, window=4, elements=4, deadline_cycles=300, workers=(4, 3)):
    """(leaf jobs, spine jobs, the workers' traffic) for ``n_seq`` seqs per job."""
    leaves, spines = leaf_jobs(window=window, elements=elements,
                               deadline_cycles=deadline_cycles, workers=workers)
    mix = Mix(loss=0.04, dup=0.03, late=0.02, overflow=0.03, short_nelem=0.0, bad=0.02)
    return leaves, spines, generate(leaves, n_seq, seed, mix)
