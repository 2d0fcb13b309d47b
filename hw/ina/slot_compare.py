"""P1a of the header pipeline: every compare of the operation against its record's
metadata, into registers (see :mod:`.header`).

The compares (tags, expiry, counts, element count: carry chains) run on every
candidate at once: each job's read, ``w4_data`` (the write that landed while the read
happened) and P3's write register (the write that lands now); the registered selects
(``byp1``, ``byp0``, the operation's job) pick one with an AND-OR kept apart from the
chains. Also the source check, the reason, the record's pending-request count.

Ports::

    p1, p1_md, w4_data, byp1, byp0
                In: the operation and its candidates (:class:`~.slot_issue.SlotIssue`)
    w3_data     In: P3's write register
    src_eq      In: per job, the source against the member table (P0)
    pending     In: per record, requests not yet sent; ``p3_push``: P3 pushes a, b
    jobs, wbit, nwm1
                In: the job table, per job W and N - 1
    reinject    In: P2 sends its operation back (this one is flushed)
    p0_valid, near1
                In: a packet in P0 to this operation's record (a scan here is dropped)
    q1, q1c, q1_md, q1_bit, q1_due, q1_init_tag, q1_job
                Out: the operation in P1b, its compares (:data:`~.slot.CMP_FIELDS`), the
                metadata picked, the worker's bit, the due time a reuse sets, the tag an
                initialization writes, the operation's job
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

from .layout import Reason, OpKind
from .params import CoreParams
from .regfile import job_layout, jobs_at
from .slot import (CHECK_REASONS, CMP_FIELDS, meta_layout, stage_layout, md_compares,
                   log2)

__all__ = ["SlotCompare"]


class SlotCompare(wiring.Component):
    """See the module docstring."""

    def __init__(self, params: CoreParams):
        self.params = P = params
        NJ = P.jobs
        MetaL = meta_layout(P)
        super().__init__({
            "p1": In(stage_layout(P)), "p1_md": In(data.ArrayLayout(MetaL, NJ)),
            "w4_data": In(MetaL), "byp1": In(1), "byp0": In(1), "w3_data": In(MetaL),
            "src_eq": In(data.ArrayLayout(3, NJ)),
            "pending": In(P.records), "p3_push": In(2),
            "jobs": In(data.ArrayLayout(job_layout(), NJ)),
            "wbit": In(data.ArrayLayout(33, NJ)), "nwm1": In(data.ArrayLayout(6, NJ)),
            "reinject": In(1), "p0_valid": In(1), "near1": In(1),
            "q1": Out(stage_layout(P)), "q1c": Out(data.StructLayout({k: 1 for k in CMP_FIELDS})),
            "q1_md": Out(MetaL), "q1_bit": Out(P.workers), "q1_due": Out(32),
            "q1_init_tag": Out(signed(34)), "q1_job": Out(range(max(2, NJ))),
            # a leaf: a RESULT's source against the parent's address (P0, registered)
            **({"par_eq": In(3)} if P.leaf else {}),
        })

    def elaborate(self, platform):
        P = self.params
        NJ = P.jobs
        LWM = log2(P.window)
        m = Module()
        p1_op, p1_reinj = self.p1.op, self.p1.reinj
        byp1, byp0 = self.byp1, self.byp0
        w3_data, w4_data, p1_md = self.w3_data, self.w4_data, self.p1_md
        wbit, nwm1 = self.wbit, self.nwm1

        def jf(name, idx):
            return jobs_at(self.jobs, name, idx)

        def first_reason(bits):
            out = Signal(Reason)
            sel = Reason.OK
            for k in reversed(range(len(CHECK_REASONS))):
                sel = Mux(bits[k], CHECK_REASONS[k], sel)
            m.d.comb += out.eq(sel)
            return out

        # a scan visit to the record that the packet in P0 needs next is dropped (the
        # scanner comes back to it)
        scan_cancel1 = self.p0_valid & (p1_op.kind == OpKind.SCAN) & self.near1
        p1_job = Signal(range(max(2, NJ)))
        m.d.comb += p1_job.eq(p1_op.rec >> (LWM + 1))
        md1 = Signal(meta_layout(P))
        m.d.comb += md1.eq(Mux(byp1, w3_data, Mux(byp0, w4_data, Array(p1_md)[p1_job])))
        n1 = jf("nworkers", p1_job)
        bit1 = Signal(P.workers)
        m.d.comb += bit1.eq(1 << p1_op.worker[:5])
        # (the compares, in three parts, are only those of the packet from P0; a re-run
        # packet keeps the result of its own check, ``src_ok`` in the op: it
        # may be re-run because it followed a packet to its record, whatever its source)
        p1_src_eq = self.src_eq
        src_now = Array(p1_src_eq)[p1_job].all()
        if P.leaf:      # a parent's RESULT: from the parent (hw/ina/leaf.py)
            src_now = Mux(p1_op.res, self.par_eq.all(), src_now)
        src_ok1 = Mux(p1_reinj, p1_op.src_ok, src_now)
        pend1 = self.pending.bit_select(p1_op.rec, 1) | (byp1 & (self.p3_push[0] | self.p3_push[1]))
        w1 = Signal(signed(35))
        w2 = Signal(signed(35))
        m.d.comb += [w1.eq(Array(wbit)[p1_job]), w2.eq(Cat(C(0, 1), Array(wbit)[p1_job]))]
        init_idx = p1_op.rec[:LWM] if LWM else C(0, 1)
        init_set = p1_op.rec[LWM]
        q1, q1c = self.q1, self.q1c
        reason1 = first_reason(p1_op.checks)
        m.d.sync += [
            q1.valid.eq(self.p1.valid & ~self.reinject & ~scan_cancel1), q1.op.eq(p1_op),
            q1.op.reason.eq(reason1), q1.op.src_ok.eq(src_ok1), q1.reinj.eq(p1_reinj),
            q1.adj.eq(self.p1.adj),
            self.q1_md.eq(md1), self.q1_bit.eq(bit1), self.q1_job.eq(p1_job),
            self.q1_due.eq(p1_op.ts + jf("deadline", p1_job)),
            self.q1_init_tag.eq(init_idx + Mux(init_set, w1, 0) - w2),
            q1c.one_n.eq(n1 == 1), q1c.nelem_nz.eq(p1_op.nelem != 0), q1c.src_ok.eq(src_ok1),
            q1c.pend.eq(pend1), q1c.enable.eq(jf("enable", p1_job)),
            q1c.bounded.eq(jf("bounded", p1_job)), q1c.ok.eq(reason1 == Reason.OK),
            q1c.pkt.eq((p1_op.kind == OpKind.PKT) & (reason1 == Reason.OK)),
            # a packet or a scan of an enabled bounded job may fire its record
            q1c.may_expire.eq(((p1_op.kind == OpKind.PKT) | (p1_op.kind == OpKind.SCAN))
                              & jf("enable", p1_job) & jf("bounded", p1_job)),
        ]
        # the compares run on every candidate (each job's read, w4, P3's write register),
        # and the registered selects pick one at the end (off the compare chains)
        nm1 = Array(nwm1)[p1_job]
        # (a candidate's select: byp1 first, then byp0, then the record's job)
        nw = P.narrow
        cands = [(byp1, md_compares(w3_data, p1_op, n1, nm1, bit1, nw)),
                 (~byp1 & byp0, md_compares(w4_data, p1_op, n1, nm1, bit1, nw))]
        cands += [(~byp1 & ~byp0 & (p1_job == j),
                   md_compares(p1_md[j], p1_op, n1, nm1, bit1, nw))
                  for j in range(NJ)]
        # every compare, by name:
        for k in cands[0][1]:
            # one LUT per candidate (its select and its compare), then their OR (kept
            # apart: synthesis would chain them)
            terms = [Signal(name=f"q1c_{k}_t{n}", attrs={"keep": 1}) for n in range(len(cands))]
            m.d.comb += [t.eq(sel & c[k]) for t, (sel, c) in zip(terms, cands)]
            m.d.sync += getattr(q1c, k).eq(Cat(terms).any())
        return m
