"""P2 and P3 of the header pipeline (see :mod:`.header`): P2 combines join,
completeness, duplicate and element count into accept / complete / re-send, composes
the metadata write and up to two requests (an expired PARTIAL, then a completion or a
re-send) into registers; P3 is those registers: the write lands, the requests are
pushed. Also the counter events, the element path's packet and the re-run's wait.

Ports::

    p2, c, p2_md, p2_bit, p2_cnt1, p2_due, p2_init_tag, p2_job, p2_wc1
                In: from :class:`~.slot_rules.SlotRules` (``p2_wc1``: a spine's)
    reinject    In: P2's operation goes back to P1a
    v2          Out: P2's operation is valid (and not to be re-run)
    w3          Out: P3's metadata write
    push_a, a, push_b, b, push_hot
                Out: P3's requests and its record, one-hot
    elem_start, elem_packet
                Out: a packet is decided, for the element path
    retry       Out: a re-run packet is on its way (pops wait)
    rewind_to   Out: the FIFO position the input is rewound to
    events, accepted
                Out: counter events (:data:`~.slot.HEADER_EVENTS`); per job, DATA accepted
    refusal     Out: the operation's answerable drop, whether it opened a slot, its FIFO
                position, job and record's element count
                (:func:`~.answer.refusal_layout`, for :class:`~.answer.ErrorAnswer`)
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

from .element import packet_layout
from .layout import Reason, AccMode, request_layout
from .params import CoreParams, TREE_COUNT_BITS
from .slot import HEADER_EVENTS, RULE_FIELDS, meta_layout, stage_layout, write_layout
from .answer import Kind, refusal_layout
from .leaf import ReqKind

__all__ = ["SlotEffects"]


class SlotEffects(wiring.Component):
    """See the module docstring."""

    def __init__(self, params: CoreParams, *, relay_mine: bool = True):
        """``relay_mine=False`` plants a bug for the tests (a leaf): a relayed RESULT
        carries the record's bitmap even when the parent's lacks this switch's bit."""
        self.params = P = params
        self.relay_mine = relay_mine
        NJ, R = P.jobs, P.records
        super().__init__({
            "p2": In(stage_layout(P)), "c": In(data.StructLayout({k: 1 for k in RULE_FIELDS})),
            "p2_md": In(meta_layout(P)), "p2_bit": In(P.workers),
            "p2_cnt1": In(range(P.workers + 2)), "p2_due": In(32), "p2_init_tag": In(signed(34)),
            "p2_job": In(range(max(2, NJ))), "reinject": In(1),
            "v2": Out(1), "w3": Out(write_layout(P)),
            "push_a": Out(1), "a": Out(request_layout(P)),
            "push_b": Out(1), "b": Out(request_layout(P)),
            "push_hot": Out(R),
            "elem_start": Out(1), "elem_packet": Out(packet_layout(P)),
            "retry": Out(1), "rewind_to": Out(5),
            "events": Out(data.StructLayout(HEADER_EVENTS)), "accepted": Out(NJ),
            **({"p2_wc1": In(TREE_COUNT_BITS + 1)} if P.tree else {}),
            "refusal": Out(refusal_layout(P)),
        })

    def elaborate(self, platform):
        P = self.params
        NJ, R = P.jobs, P.records
        m = Module()
        inc = {n: [] for n in HEADER_EVENTS}
        p2_op, p2_valid, c = self.p2.op, self.p2.valid, self.c
        p2_job, p2_bit, p2_due = self.p2_job, self.p2_bit, self.p2_due
        v2 = self.v2
        m.d.comb += v2.eq(p2_valid & ~self.p2.adj)
        reason2 = p2_op.reason
        is_pkt = v2 & c.pkt
        is_init = v2 & c.init
        defer = Signal()
        m.d.comb += defer.eq(v2 & c.defer)
        retry = self.retry
        with m.If(self.reinject):
            m.d.sync += retry.eq(1)
        with m.Elif(p2_valid & self.p2.reinj):
            m.d.sync += retry.eq(0)
        md2 = self.p2_md
        expired = v2 & c.expire
        reuse = c.reuse
        isdup = ~reuse & c.dup
        nelem_bad = ~reuse & c.nelem_ne
        resend_ = c.join & c.cur_complete
        dup_only = c.join & ~c.cur_complete & isdup
        # (a leaf: a member's DATA at an up record is a duplicate, whose upward DATA goes
        # again, or late; hw/ina/leaf.py)
        at_up = c.join & c.up & ~reuse
        malf3 = c.join & ~c.cur_complete & ~isdup & nelem_bad & ~at_up
        # (another width than the record's: the model's drop_bad_width, a counter the
        # gateware does not keep; the packet is not summed)
        accept = (c.join & ~c.cur_complete & ~isdup & ~nelem_bad & ~(~reuse & c.width_ne)
                  & ~at_up)
        up_resend = at_up & isdup
        late_up = at_up & ~isdup
        relay = c.relay
        completes = accept & Mux(reuse, c.one_n, c.cnt1_n)
        cur_bitmap = Mux(reuse, 0, md2.bitmap)
        cur_count = Mux(reuse, 0, md2.count)
        cur_exp = Mux(reuse, -128, md2.exponent)
        cur_nelem = Mux(reuse, p2_op.nelem, md2.nelem)
        seqs2 = Signal(signed(34))
        m.d.comb += seqs2.eq(p2_op.seq)
        cur_tag = Mux(reuse, seqs2, md2.tag)
        new_count = Mux(reuse, 1, self.p2_cnt1)
        new_exp = Mux(c.new_exp, p2_op.exp, md2.exponent)
        if P.tree:
            # a spine: the workers the sum covers (a child switch's DATA its count) and a
            # child's OVERFLOW; PARTIAL when the workers are fewer than the job's
            cur_wc = Mux(reuse, 0, md2.wcount)
            new_wc = Mux(reuse, p2_op.covers, self.p2_wc1)
            new_lt = Mux(reuse, c.cov_lt_t, c.wc1_lt_t)
            cur_ovf = Mux(reuse, 0, md2.ovf)
            new_ovf = cur_ovf | p2_op.ovf
        mode = Signal(AccMode)
        m.d.comb += mode.eq(Mux(accept, Mux(c.opens, AccMode.OPEN, AccMode.ADD),
                                Mux(relay, AccMode.OPEN, AccMode.NONE)))

        # metadata write, registered (P3); P1a takes it from the register while it lands
        w3 = self.w3
        with m.If(is_init):
            m.d.sync += [w3.en.eq(1), w3.addr.eq(p2_op.rec), w3.data.eq(0),
                         w3.data.tag.eq(self.p2_init_tag),
                         w3.data.complete.eq(1), w3.data.exponent.eq(-128)]
        with m.Else():
            m.d.sync += [
                # every valid operation writes its record back (unchanged when no rule
                # applies), so the bypass needs only the record number
                w3.en.eq(v2), w3.addr.eq(p2_op.rec),
                w3.data.tag.eq(cur_tag),
                w3.data.complete.eq(~reuse & (md2.complete | c.expire) | completes),
                w3.data.bitmap.eq(cur_bitmap | Mux(accept, p2_bit, 0)),
                w3.data.count.eq(Mux(accept, new_count, cur_count)),
                w3.data.exponent.eq(Mux(accept, new_exp, cur_exp)),
                w3.data.due.eq(Mux(reuse, p2_due, md2.due)),
                w3.data.nelem.eq(cur_nelem),
            ]
            if P.tree:
                m.d.sync += [w3.data.wcount.eq(Mux(accept, new_wc, cur_wc)),
                             w3.data.ovf.eq(Mux(accept, new_ovf, cur_ovf))]
            if P.leaf:
                # a job with a parent closes a record up (not complete); a relay completes
                # it with the parent's count, exponent, flags and bitmap bit
                hp = c.haspar
                m.d.sync += [
                    w3.data.complete.eq(Mux(hp, ~reuse & md2.complete | relay,
                                            ~reuse & (md2.complete | c.expire) | completes)),
                    # (also a record reused and completed at once: a job of one member)
                    w3.data.up.eq(hp & ~relay & ((~reuse & (md2.up | c.expire)) | completes)),
                    w3.data.rel.eq(~reuse & (md2.rel | relay)),
                    w3.data.mine.eq(Mux(relay, p2_op.mine, md2.mine)),
                    w3.data.pfl.eq(Mux(relay, p2_op.pfl, md2.pfl)),
                ]
                with m.If(relay):
                    m.d.sync += [w3.data.wcount.eq(p2_op.covers),
                                 w3.data.exponent.eq(p2_op.exp)]

        # requests: a = expired PARTIAL (old contents), b = completion or re-send; registered
        # (P3) before they enter the queue
        p3_a, p3_b = self.a, self.b
        p3_hot = self.push_hot      # P3's record, one-hot (registered with it)
        m.d.sync += p3_hot.eq(1 << p2_op.rec)
        m.d.sync += [
            self.push_a.eq(expired),
            p3_a.rec.eq(p2_op.rec), p3_a.job.eq(p2_job), p3_a.unicast.eq(0),
            p3_a.seq.eq(md2.tag), p3_a.count.eq(md2.count), p3_a.bitmap.eq(md2.bitmap),
            p3_a.exponent.eq(md2.exponent), p3_a.nelem.eq(md2.nelem), p3_a.partial.eq(1),
            self.push_b.eq(v2 & (resend_ | completes | ((up_resend | relay) if P.leaf else 0))),
            p3_b.rec.eq(p2_op.rec), p3_b.job.eq(p2_job), p3_b.unicast.eq(resend_),
            p3_b.worker.eq(p2_op.worker),
            p3_b.seq.eq(cur_tag),
            p3_b.count.eq(Mux(completes, new_count, cur_count)),
            p3_b.bitmap.eq(Mux(completes, cur_bitmap | p2_bit, cur_bitmap)),
            p3_b.exponent.eq(Mux(completes, new_exp, cur_exp)),
            p3_b.nelem.eq(cur_nelem),
            p3_b.partial.eq(Mux(completes, 0, c.cnt_lt_n)),
        ]
        if P.tree:
            m.d.sync += [
                p3_a.count.eq(md2.wcount), p3_a.partial.eq(c.wc_lt_t), p3_a.ovf.eq(md2.ovf),
                p3_b.count.eq(Mux(completes, new_wc, cur_wc)),
                p3_b.partial.eq(Mux(completes, new_lt, c.wc_lt_t)),
                p3_b.ovf.eq(Mux(completes, new_ovf, cur_ovf)),
            ]
        if P.leaf:
            # the kinds (hw/ina/leaf.py): a job with a parent closes up (also at the
            # deadline) and re-sends up; a relay, and a re-send of a relayed RESULT, are
            # the parent's RESULT (its count, exponent, flags; this switch's members as
            # the bitmap when the parent's had this switch's bit)
            hp = c.haspar
            m.d.sync += [
                p3_a.kind.eq(Mux(hp, ReqKind.UP, ReqKind.RESULT)), p3_a.pfl.eq(0),
                p3_b.kind.eq(Mux(hp, Mux(relay | resend_, ReqKind.REL, ReqKind.UP),
                                 ReqKind.RESULT)),
                p3_b.pfl.eq(Mux(relay, p2_op.pfl, md2.pfl)),
            ]
            with m.If(hp & (relay | resend_)):
                mine = Mux(relay, p2_op.mine, md2.mine) if self.relay_mine else 1
                m.d.sync += p3_b.bitmap.eq(Mux(mine, md2.bitmap, 0))
            # (the upward DATA sent again: RETRANSMIT, as the model's stored ``slot.up``)
            m.d.sync += p3_b.unicast.eq(resend_ | up_resend)
            with m.If(relay):
                m.d.sync += [p3_b.count.eq(p2_op.covers), p3_b.exponent.eq(p2_op.exp)]

        resend = v2 & resend_
        inc["rx"].append(is_pkt & ~c.defer)
        inc["rx_data"].append(v2 & c.pkt_ok & ~c.defer)
        inc["drop_truncated"].append(is_pkt & (reason2 == Reason.TRUNCATED))
        inc["drop_bad_version"].append(is_pkt & (reason2 == Reason.BAD_VERSION))
        inc["drop_malformed"] += [is_pkt & (reason2 == Reason.MALFORMED),
                                  v2 & ((c.bignelem | c.badcount) if P.tree or P.narrow else c.bignelem),
                                  v2 & (malf3 | c.res_malf)]
        inc["drop_unknown_job"].append(is_pkt & (reason2 == Reason.UNKNOWN_JOB))
        inc["drop_bad_session"].append(is_pkt & (reason2 == Reason.BAD_SESSION)
                                       | (v2 & c.res_badsess))
        inc["drop_unknown_source"].append(v2 & (c.unksrc | c.res_unksrc))
        inc["drop_stale"].append(v2 & c.stale)
        inc["drop_out_of_window"].append(v2 & c.oow)
        inc["duplicates"] += [resend & isdup, v2 & dup_only]
        inc["late"].append(resend & ~isdup | v2 & late_up)
        inc["resent"].append(resend)
        inc["accepted"].append(v2 & accept)
        m.d.comb += [self.accepted[j].eq(v2 & accept & (p2_job == j)) for j in range(NJ)]
        # (a job with a parent sends its sum up: not a RESULT; the model's ``up``)
        inc["results"] += [expired & ~c.haspar, v2 & completes & ~c.haspar]
        if P.tree:
            inc["partials"] += [expired & c.wc_lt_t, v2 & completes & new_lt]
        else:
            inc["partials"] += [expired, C(0, 1)]
        for name in HEADER_EVENTS:
            assert len(inc[name]) == HEADER_EVENTS[name], name
            m.d.comb += getattr(self.events, name).eq(Cat(inc[name]))

        # the drops the model answers (``SwitchModel._refuse``), for the answer path
        rf = self.refusal
        kinds = ((is_pkt & (reason2 == Reason.UNKNOWN_JOB), Kind.UNKNOWN_JOB),
                 (is_pkt & (reason2 == Reason.BAD_SESSION), Kind.BAD_SESSION),
                 (v2 & c.unksrc, Kind.NOT_MEMBER), (v2 & c.bignelem, Kind.BIG_NELEM),
                 (v2 & c.stale, Kind.STALE), (v2 & malf3, Kind.SLOT_NELEM))
        kind = Kind.NONE
        for cond, k in reversed(kinds):
            kind = Mux(cond, k, kind)
        m.d.comb += [rf.kind.eq(kind), rf.opened.eq(v2 & reuse), rf.pos.eq(p2_op.rewind[:4]),
                     rf.job.eq(p2_job), rf.slot_nelem.eq(md2.nelem)]

        # the flush's rewind target, and the decided packet for the element path
        m.d.comb += self.rewind_to.eq(p2_op.rewind)
        m.d.comb += [self.elem_start.eq(is_pkt & ~defer),
                     self.elem_packet.base.eq(p2_op.base), self.elem_packet.rec.eq(p2_op.rec),
                     self.elem_packet.nelem.eq(p2_op.nelem),
                     self.elem_packet.nbeats.eq(p2_op.nbeats), self.elem_packet.mode.eq(mode)]
        if P.narrow:    # the key (lanes.nkey): the width code below the element count
            m.d.comb += [self.elem_packet.width.eq(p2_op.nelem[:2]),
                         self.elem_packet.nelem.eq(p2_op.nelem[2:])]
        return m
