"""P1b of the header pipeline: the slot rules, from P1a's registered compares (see
:mod:`.header`): expire, reuse, defer, join, stale, out of window; the worker's bitmap
bit; whether the operation goes back to P1a (``reinject``, registered twice: once for
the operation pipeline, once inverted, ``n_flush``, for the flush of the input side).

With one-beat headers (L >= 5) a packet may follow a packet to its record two cycles
later (two-beat packets), so P1b may need P3's write, which P1a could not see: the
compares run on it too, and a registered select picks one.

Ports::

    q1, q1c, q1_md, q1_bit, q1_due, q1_init_tag, q1_job
                In: from :class:`~.slot_compare.SlotCompare`
    jobs, nwm1  In: the job table, per job N - 1
    w3_data, p3_push, p3_a_rec
                In: P3's write register, its pushes and its first request's record
    p1_rec      In: the record of the operation in P1a
    p0_valid, near2
                In: a packet in P0 to this operation's record (a scan here is dropped)
    p2, c, p2_md, p2_bit, p2_cnt1, p2_due, p2_init_tag, p2_job
                Out: the operation in P2, its rules (:data:`~.slot.RULE_FIELDS`) and
                what P2 composes the write from
    p2_wc1      Out: a spine (``CoreParams.tree``): the record's workers plus this DATA's
                (a child switch's DATA covers its ``count``, a worker's one; the op's
                ``covers`` and ``ovf`` in P2 are those of the job's kind of members)
    reinject, n_flush
                Out: P2's operation goes back to P1a; low: the input side flushes

``duplicate_check=False`` plants a bug for the tests: a worker's repeated contribution
to an open slot is added again. ``child_counts=False`` plants another (a spine): a child
switch's DATA counts one worker, whatever its ``count``.
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

from .layout import Reason, OpKind
from .params import CoreParams, TREE_COUNT_BITS
from .regfile import job_layout, jobs_at
from .slot import CMP_FIELDS, RULE_FIELDS, meta_layout, stage_layout, md_compares
from .leaf import LEAF_RULES, leaf_rules

__all__ = ["SlotRules"]


class SlotRules(wiring.Component):
    """See the module docstring."""

    def __init__(self, params: CoreParams, *, duplicate_check: bool = True,
                 child_counts: bool = True):
        self.params = P = params
        self.duplicate_check = duplicate_check
        self.child_counts = child_counts
        NJ, R = P.jobs, P.records
        MetaL = meta_layout(P)
        super().__init__({
            "q1": In(stage_layout(P)), "q1c": In(data.StructLayout({k: 1 for k in CMP_FIELDS})),
            "q1_md": In(MetaL), "q1_bit": In(P.workers), "q1_due": In(32),
            "q1_init_tag": In(signed(34)), "q1_job": In(range(max(2, NJ))),
            "jobs": In(data.ArrayLayout(job_layout(), NJ)), "nwm1": In(data.ArrayLayout(6, NJ)),
            "w3_data": In(MetaL), "p3_push": In(2), "p3_a_rec": In(range(R)),
            "p1_rec": In(range(R)), "p0_valid": In(1), "near2": In(1),
            "p2": Out(stage_layout(P)), "c": Out(data.StructLayout({k: 1 for k in RULE_FIELDS})),
            "p2_md": Out(MetaL), "p2_bit": Out(P.workers), "p2_cnt1": Out(range(P.workers + 2)),
            "p2_due": Out(32), "p2_init_tag": Out(signed(34)), "p2_job": Out(range(max(2, NJ))),
            "reinject": Out(1), "n_flush": Out(1, init=1),
            **({"p2_wc1": Out(TREE_COUNT_BITS + 1)} if P.tree else {}),
        })

    def elaborate(self, platform):
        P = self.params
        BYP2 = P.header_beats == 1
        m = Module()
        q1, q1c = self.q1, self.q1c
        q1_op, q1_valid, q1_job = q1.op, q1.valid, self.q1_job
        p2, c, reinject = self.p2, self.c, self.reinject
        w3_data = self.w3_data
        # a scan visit followed by a packet to its record within two cycles is dropped
        scan_cancel2 = self.p0_valid & (q1_op.kind == OpKind.SCAN) & self.near2
        q1m = q1c      # the compares in use in P1b
        if BYP2:
            q1_sel = Signal()
            m.d.sync += q1_sel.eq(p2.valid & ~p2.adj & (p2.op.rec == self.p1_rec))
            cw = md_compares(w3_data, q1_op, jobs_at(self.jobs, "nworkers", q1_job),
                             Array(self.nwm1)[q1_job], self.q1_bit, P.narrow)
            q1m = Signal.like(q1c)
            m.d.comb += q1m.eq(q1c)
            for k, v in cw.items():
                m.d.comb += getattr(q1m, k).eq(Mux(q1_sel, v, getattr(q1c, k)))
            m.d.comb += q1m.pend.eq(q1c.pend | ((self.p3_push[0] | self.p3_push[1])
                                                & (self.p3_a_rec == q1_op.rec)))
            q1_mdx = Signal(meta_layout(P))
            m.d.comb += q1_mdx.eq(Mux(q1_sel, w3_data, self.q1_md))
        else:
            q1_mdx = self.q1_md

        # Validity is applied in P2 (an invalid or flushed operation writes nothing and
        # requests nothing), so these assume it.
        k_pkt1 = q1_op.kind == OpKind.PKT
        k_scan1 = (q1_op.kind == OpKind.SCAN) & q1m.enable
        k_pkt_ok1 = q1m.pkt & q1m.src_ok
        # any operation at time ts may fire its record when it is due (the model's
        # ``process`` ticks before it even parses the packet)
        k_expire1 = q1m.may_expire & ~q1m.complete & q1m.late
        if P.leaf:
            # a leaf (hw/ina/leaf.py): an up record neither expires nor is reused; a job
            # with a parent closes a record upward (up), not complete; a parent's RESULT
            # is none of a DATA's rules
            lf = leaf_rules(m, P, q1_op, q1m, q1_mdx, self.jobs, q1_job, k_pkt1, k_expire1)
            k_expire1 = lf.expire
            k_pkt_ok1 = k_pkt_ok1 & ~lf.res
            closes1 = q1m.complete | (k_expire1 & ~lf.haspar)
        else:
            closes1 = q1m.complete | k_expire1
        k_reuse1 = k_pkt_ok1 & closes1 & q1m.eq_seqm
        # reuse waits while the record's last result is queued or being sent, or expires now
        k_defer1 = k_reuse1 & q1m.nelem_nz & (k_expire1 | q1m.pend)
        if P.leaf:      # (a relay waits while the upward DATA is queued or being sent)
            k_defer1 = k_defer1 | lf.defer
        reuse1 = k_reuse1 & ~k_defer1
        join1 = k_pkt_ok1 & ~k_defer1 & (k_reuse1 | q1m.eq_seq)
        cur_complete1 = closes1 & ~reuse1
        # the worker's bit, selected here from the registered bitmap (off P1a's path)
        dup1 = (C(0) if not self.duplicate_check
                else q1_mdx.bitmap.bit_select(q1_op.worker[:5], 1))
        # (join, completeness, duplicate and element count combine in P2)
        early_ok1 = (q1_op.reason == Reason.OK) | (q1_op.reason == Reason.BIG_NELEM)
        if P.narrow and not P.tree:     # (BAD_COUNT: a width byte whose nibbles differ)
            early_ok1 |= q1_op.reason == Reason.BAD_COUNT
        if P.tree:
            early_ok1 |= q1_op.reason == Reason.BAD_COUNT
            # a spine: the workers this DATA covers, against the job's total
            kids = jobs_at(self.jobs, "children", q1_job)
            total = Mux(kids, jobs_at(self.jobs, "total_workers", q1_job),
                        jobs_at(self.jobs, "nworkers", q1_job))
            # (a parent's RESULT: its count, 1024 at most when it is relayed: leaf_rules)
            covers = Signal(TREE_COUNT_BITS)
            kc = kids & self.child_counts
            if P.leaf:
                kc = kc | lf.res
            m.d.comb += covers.eq(Mux(kc, q1_op.covers, 1))
            wc1 = Signal(TREE_COUNT_BITS + 1)
            m.d.comb += wc1.eq(q1_mdx.wcount + covers)
            tree_sync = [
                self.p2_wc1.eq(wc1), p2.op.covers.eq(covers), p2.op.ovf.eq(kids & q1_op.ovf),
                c.badcount.eq(k_pkt1 & (q1_op.reason == Reason.BAD_COUNT) & q1m.src_ok),
                c.wc_lt_t.eq(q1_mdx.wcount < total), c.wc1_lt_t.eq(wc1 < total),
                c.cov_lt_t.eq(covers < total),
            ]
        else:
            tree_sync = [c.badcount.eq(k_pkt1 & (q1_op.reason == Reason.BAD_COUNT) & q1m.src_ok
                                        if P.narrow else 0),
                         c.wc_lt_t.eq(0), c.wc1_lt_t.eq(0), c.cov_lt_t.eq(0)]
        m.d.sync += [
            p2.valid.eq(q1_valid & ~reinject & ~scan_cancel2), p2.op.eq(q1_op),
            # (a scan is never re-run, so a cancelled scan need not be looked at here)
            reinject.eq(q1_valid & ~reinject & (q1.adj | k_defer1)),
            self.n_flush.eq(~(q1_valid & ~reinject & (q1.adj | k_defer1))),
            p2.reinj.eq(q1.reinj), p2.adj.eq(q1.adj), self.p2_md.eq(q1_mdx),
            self.p2_job.eq(q1_job),
            self.p2_bit.eq(self.q1_bit), self.p2_cnt1.eq(q1_mdx.count + 1),
            self.p2_due.eq(self.q1_due), self.p2_init_tag.eq(self.q1_init_tag),
            c.defer.eq(k_defer1), c.expire.eq(k_expire1), c.reuse.eq(reuse1), c.join.eq(join1),
            c.cur_complete.eq(cur_complete1), c.dup.eq(dup1), c.nelem_ne.eq(q1m.nelem_ne), c.width_ne.eq(q1m.width_ne),
            c.one_n.eq(q1m.one_n), c.cnt1_n.eq(q1m.cnt1_n),
            c.opens.eq(reuse1 | q1m.cnt0),
            # the larger exponent (compared here from registers, off P1a's path)
            c.new_exp.eq(reuse1 | (q1_op.exp > q1_mdx.exponent)),
            c.stale.eq(k_pkt_ok1 & ~join1 & q1m.lt),
            c.oow.eq(k_pkt_ok1 & ~join1 & ~q1m.lt & ~k_defer1),
            c.unksrc.eq(k_pkt1 & ((q1_op.reason == Reason.UNKNOWN_SOURCE)
                                  | (early_ok1 & ~q1m.src_ok)) & (~lf.res if P.leaf else 1)),
            c.bignelem.eq(k_pkt1 & (q1_op.reason == Reason.BIG_NELEM) & q1m.src_ok),
            c.pkt.eq(k_pkt1), c.scan.eq(k_scan1), c.init.eq(q1_op.kind == OpKind.INIT),
            c.pkt_ok.eq(k_pkt_ok1), c.cnt_lt_n.eq(q1m.cnt_lt_n),
        ]
        m.d.sync += tree_sync       # (after ``p2.op``: a spine's covers and ovf replace it)
        if P.leaf:
            m.d.sync += [c.haspar.eq(lf.haspar), c.up.eq(lf.up), c.relay.eq(lf.relay & ~lf.defer),
                         c.res_unksrc.eq(lf.res_unksrc), c.res_badsess.eq(lf.res_badsess),
                         c.res_drop.eq(lf.res_drop), c.res_malf.eq(lf.res_malf)]
        else:
            m.d.sync += [getattr(c, k).eq(0) for k in LEAF_RULES]
        return m
