"""The header pipeline: pops the input FIFO, decodes each packet's header and applies the
slot rules to its record's metadata, one operation per cycle; also the deadline scanner
and the job initializer, which feed operations into the same pipeline.

Fixed latency (a packet whose last header beat is popped in cycle t is decided in cycle
t + ``DEC_LAT`` = t+4):

* pop: the FIFO's head beat; position kept as flags; header words into registers (they
  load from the head beat whether or not it is popped), the job-table match and every
  job's record index for the seq too.
* P0: decode from registers: the checks that need only the header and the UDP length
  (truncated, version, type, body length, unknown job, worker out of range), every
  job's ``seq - 2W`` in parallel, then the matching job's; every job's member-table
  entry for the header's worker. The slot metadata is read here, for whichever
  operation enters P1a next (distributed RAM, one memory per job, one read port per
  source of operations, all addressed from registers), into registers.
* P1a: every compare on the metadata (tags, expiry, counts, element count: carry
  chains), run on four candidates at once: the read of the record's job, a copy of
  the write that landed while it was read, and P3's write register (the write that
  lands now); a registered one-hot select picks one. Also the source check, the
  reason, the record's pending-request count.
* P1b: the slot rules from those registered bits (expire, reuse, defer, join, stale,
  out of window), the worker's bitmap bit, and whether the operation goes back to P1a.
* P2: accept / complete / re-send / duplicate, the larger exponent; the metadata write
  and up to two output requests (an expired PARTIAL, then a completion or a re-send)
  into registers.
* P3: the metadata write and the requests land.

A packet that P1b defers (it would reuse a record whose result is still queued or being
sent, or that expires right now), or that followed an operation on its record within
two cycles, goes back to P1a from P2; everything younger is flushed and the FIFO's pop
pointer is rewound to the packet's first element beat (popped beats stay in the FIFO
until their packet's decision is final). Pops wait until the packet passes. With
one-beat headers (L >= 5) packets two cycles apart are normal, so P1b also compares
P3's write register and picks it when it holds the record.

Popped beats go on to the element path through a DEC_LAT-stage delay line, so a beat
arrives the cycle after its packet's decision.

Time: ``now`` counts cycles. A packet's time is the cycle its first beat is accepted; a
slot whose ``opened + deadline <= time`` (kept as ``due``) is expired for every
operation, so the scanner only has to catch slots that no packet touches (the model's
``tick``).

One component per stage, joined here (their registers are where their stage is)::

    head ─► HeaderPop ─► HeaderDecode (P0) ─► SlotIssue (P1a's operation, the
            (pop, parse)                     metadata memories, scanner, initializer)
            ─► SlotCompare (P1a) ─► SlotRules (P1b) ─► SlotEffects (P2, P3) ─► requests
                 ▲                        │ reinject, flush           │ P3's write
                 └────────────────────────┴───────────────────────────┘

What they share (the metadata, an operation's registers, the compares with their
Python twins) is in :mod:`.slot`.
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.fields import Flags

from .answer import capture_layout, refusal_layout
from .lanes import nkey, width_byte, width_checks, words_hw
from .element import beat_layout, packet_layout
from .input_fifo import entry_layout
from .layout import request_layout
from .params import CoreParams
from .regfile import job_layout, member_layout
from .header_pop import HeaderPop
from .header_decode import HeaderDecode
from .slot_issue import SlotIssue
from .slot_compare import SlotCompare
from .slot_rules import SlotRules
from .slot_effects import SlotEffects
from .slot import (DEC_LAT, HEADER_EVENTS, meta_layout, op_layout, record_of, record_of_py,
                   seq_at_or_behind, seq_at_or_behind_py, due_reached, due_reached_py, log2)

__all__ = ["DEC_LAT", "HEADER_EVENTS", "meta_layout", "HeaderPipeline", "record_of",
           "record_of_py", "seq_at_or_behind", "seq_at_or_behind_py", "due_reached",
           "due_reached_py"]


class HeaderPipeline(wiring.Component):
    """Header decode and slot rules (see the module docstring for the stages).

    jobs, enable_stb, enable_value, enable_set
                  the job table, and its ``enable`` handshake with the register file
                  (a write of 1 queues the job's initialization: its 2W records are
                  reset one at a time through the empty pipeline, then ``enable_set``)
    member        per job, an asynchronous read port on the member table (the source
                  check)
    now           the cycle counter
    head, avail, pop, pop_ptr, rewind_n, rewind_to, hold
                  the input FIFO (:class:`~.input_fifo.InputFifo`): its head beat, pop,
                  rewind; ``hold`` stops its input while a job initializes
    queue_level   requests in the request queue (pops stop while it is nearly full)
    pending       per record, whether it has requests not yet sent
    push_a, a, push_b, b, push_hot
                  an operation's up to two requests (an expired PARTIAL, then a
                  completion or a re-send) and its record, one-hot
    elem, elem_start, elem_packet
                  popped beats after the delay line, and each decided packet, for the
                  element path (:class:`~.element.ElementPath`)
    events        counter events (:data:`HEADER_EVENTS`)
    cap, refusal  for the answer to refused DATA (:class:`~.answer.ErrorAnswer`): each
                  packet decoded in P0 with its FIFO position, and P2's operation

    ``duplicate_check=False`` plants a bug for the tests: a worker's repeated
    contribution to an open slot is added again; ``child_counts=False``: a spine counts a
    child switch's DATA as one worker; ``relay_mine=False``: a leaf relays its members'
    bitmap whatever the parent's bitmap says.
    """

    def __init__(self, params: CoreParams, *, duplicate_check: bool = True,
                 child_counts: bool = True, relay_mine: bool = True):
        self.params = P = params
        self.duplicate_check = duplicate_check
        self.child_counts = child_counts
        self.relay_mine = relay_mine
        ws = 1 << log2(P.workers)
        super().__init__({
            "jobs": In(data.ArrayLayout(job_layout(), P.jobs)),
            "enable_stb": In(P.jobs),
            "enable_value": In(1),
            "enable_set": Out(P.jobs),
            "member": In(memory.ReadPort.Signature(
                addr_width=log2(P.jobs * ws), shape=member_layout(mac=False))).array(P.jobs),
            "now": In(32),
            "head": In(entry_layout(P.lanes)),
            "avail": In(1),
            "pop": Out(1),
            "pop_ptr": In(5),
            "rewind_n": Out(1, init=1),
            "rewind_to": Out(5),
            "hold": Out(1),
            "queue_level": In(range(2 * P.queue + 1)),
            "pending": In(P.records),
            "push_a": Out(1), "a": Out(request_layout(P)),
            "push_b": Out(1), "b": Out(request_layout(P)),
            "push_hot": Out(P.records),
            "elem": Out(beat_layout(P.lanes)),
            "elem_start": Out(1),
            "elem_packet": Out(packet_layout(P)),
            "events": Out(data.StructLayout(HEADER_EVENTS)),
            "accepted": Out(P.jobs),    # job j's DATA accepted (the control plane's idle)
            "cap": Out(capture_layout()),
            "refusal": Out(refusal_layout(P)),
            # a leaf (CoreParams.leaf): the parent switch's address
            **({"parent": In(data.StructLayout({"ip": 32, "port": 16}))} if P.leaf else {}),
        })

    def elaborate(self, platform):
        P = self.params
        L, EB, NJ = P.lanes, P.elem_beats, P.jobs
        LL = log2(L)
        m = Module()
        m.submodules.pop = pop = HeaderPop(P)
        m.submodules.p0 = dec = HeaderDecode(P)
        m.submodules.issue = iss = SlotIssue(P)
        m.submodules.p1a = cmp = SlotCompare(P)
        m.submodules.p1b = rul = SlotRules(P, duplicate_check=self.duplicate_check,
                                            child_counts=self.child_counts)
        m.submodules.p2 = eff = SlotEffects(P, relay_mine=self.relay_mine)
        jobs = self.jobs

        # pop and parse
        m.d.comb += [pop.head.eq(self.head), pop.avail.eq(self.avail), self.pop.eq(pop.pop),
                     pop.pop_ptr.eq(self.pop_ptr), pop.wait.eq(eff.retry | iss.init_busy),
                     pop.flush.eq(~rul.n_flush), pop.queue_level.eq(self.queue_level),
                     pop.jobs.eq(jobs), pop.now.eq(self.now)]
        # P0
        m.d.comb += [dec.hdr.eq(pop.hdr), dec.job_hit.eq(pop.job_hit),
                     dec.job_hit_hi.eq(pop.job_hit_hi), dec.sess_hit.eq(pop.sess_hit),
                     dec.hrec.eq(pop.hrec), dec.wbit.eq(pop.wbit), dec.body.eq(pop.body),
                     dec.len_short.eq(pop.len_short), dec.short.eq(pop.short),
                     dec.sip.eq(pop.sip), dec.sport.eq(pop.sport), dec.jobs.eq(jobs),
                     dec.near_rec[0].eq(iss.p1.op.rec), dec.near_rec[1].eq(cmp.q1.op.rec),
                     dec.near_rec[2].eq(rul.p2.op.rec), dec.near_rec[3].eq(eff.w3.addr)]
        for j in range(NJ):
            wiring.connect(m, wiring.flipped(self.member[j]), dec.member[j])
        # the packet P0 hands to P1a
        hdr = pop.hdr
        p0_op = Signal(op_layout(P))
        m.d.comb += [p0_op.checks.eq(dec.checks), p0_op.rec.eq(dec.rec),
                     p0_op.seq.eq(hdr.seq), p0_op.seqm.eq(dec.seqm), p0_op.ts.eq(pop.ts),
                     p0_op.worker.eq(hdr.worker), p0_op.exp.eq(hdr.exponent),
                     p0_op.nelem.eq(hdr.nelem), p0_op.base.eq(dec.rec * EB),
                     p0_op.nbeats.eq((hdr.nelem + (L - 1)) >> LL), p0_op.rewind.eq(pop.rewind)]
        if P.tree:
            m.d.comb += [p0_op.covers.eq(hdr.count),
                         p0_op.ovf.eq((hdr.flags & int(Flags.OVERFLOW)) != 0)]
        if P.leaf:      # a parent's RESULT (hw/ina/leaf.py)
            m.d.comb += [p0_op.res.eq(dec.res), p0_op.sess_ok.eq(dec.res_sess_ok),
                         p0_op.mine.eq(dec.res_mine),
                         p0_op.pfl.eq(hdr.flags & ~int(Flags.RETRANSMIT) & 0xFF)]
            m.d.comb += dec.parent.eq(self.parent)
        if P.narrow:    # the record's key holds the width; beats of packed lane words
            code = width_checks(P.widths, width_byte(hdr), hdr.nelem)[3]
            m.d.comb += [p0_op.nelem.eq(nkey(code, hdr.nelem)),
                         p0_op.nbeats.eq((words_hw(P.widths, code, hdr.nelem) + (L - 1)) >> LL)]
        # P1a's operation
        m.d.comb += [iss.p0_valid.eq(pop.dec), iss.p0_op.eq(p0_op), iss.hrec.eq(pop.hrec),
                     iss.near.eq(dec.near[:3]), iss.w3_near.eq(dec.near[3]),
                     iss.reinject.eq(rul.reinject), iss.p2.eq(rul.p2), iss.q1.eq(cmp.q1),
                     iss.v2.eq(eff.v2), iss.horizon.eq(pop.horizon), iss.q_stop.eq(pop.q_stop),
                     iss.retry.eq(eff.retry), iss.w3.eq(eff.w3),
                     iss.enable_stb.eq(self.enable_stb), iss.enable_value.eq(self.enable_value),
                     self.enable_set.eq(iss.enable_set), self.hold.eq(iss.hold)]
        # P1a
        p3_push = Cat(eff.push_a, eff.push_b)
        m.d.comb += [cmp.p1.eq(iss.p1), cmp.p1_md.eq(iss.p1_md), cmp.w4_data.eq(iss.w4_data),
                     cmp.byp1.eq(iss.byp1), cmp.byp0.eq(iss.byp0), cmp.w3_data.eq(eff.w3.data),
                     cmp.src_eq.eq(dec.src_eq), cmp.pending.eq(self.pending),
                     cmp.p3_push.eq(p3_push), cmp.jobs.eq(jobs), cmp.wbit.eq(pop.wbit),
                     cmp.nwm1.eq(pop.nwm1), cmp.reinject.eq(rul.reinject),
                     cmp.p0_valid.eq(pop.dec), cmp.near1.eq(dec.near[0])]
        if P.leaf:
            m.d.comb += cmp.par_eq.eq(dec.par_eq)
        # P1b
        m.d.comb += [rul.q1.eq(cmp.q1), rul.q1c.eq(cmp.q1c), rul.q1_md.eq(cmp.q1_md),
                     rul.q1_bit.eq(cmp.q1_bit), rul.q1_due.eq(cmp.q1_due),
                     rul.q1_init_tag.eq(cmp.q1_init_tag), rul.q1_job.eq(cmp.q1_job),
                     rul.jobs.eq(jobs), rul.nwm1.eq(pop.nwm1), rul.w3_data.eq(eff.w3.data),
                     rul.p3_push.eq(p3_push), rul.p3_a_rec.eq(eff.a.rec),
                     rul.p1_rec.eq(iss.p1.op.rec), rul.p0_valid.eq(pop.dec),
                     rul.near2.eq(dec.near[1])]
        # P2, P3
        m.d.comb += [eff.p2.eq(rul.p2), eff.c.eq(rul.c), eff.p2_md.eq(rul.p2_md),
                     eff.p2_bit.eq(rul.p2_bit), eff.p2_cnt1.eq(rul.p2_cnt1),
                     eff.p2_due.eq(rul.p2_due), eff.p2_init_tag.eq(rul.p2_init_tag),
                     eff.p2_job.eq(rul.p2_job), eff.reinject.eq(rul.reinject)]
        if P.tree:
            m.d.comb += eff.p2_wc1.eq(rul.p2_wc1)
        # out: requests, the flush and rewind, the element path, events
        m.d.comb += [self.push_a.eq(eff.push_a), self.a.eq(eff.a), self.push_b.eq(eff.push_b),
                     self.b.eq(eff.b), self.push_hot.eq(eff.push_hot),
                     self.rewind_n.eq(rul.n_flush), self.rewind_to.eq(eff.rewind_to),
                     self.elem.eq(pop.elem), self.elem_start.eq(eff.elem_start),
                     self.elem_packet.eq(eff.elem_packet), self.events.eq(eff.events),
                     self.accepted.eq(eff.accepted)]
        # for the answer path: the packet in P0 (its header, time and source), P2's drop
        cp = self.cap
        m.d.comb += [cp.valid.eq(pop.dec), cp.pos.eq(pop.rewind[:4]), cp.job.eq(hdr.job),
                     cp.worker.eq(hdr.worker), cp.seq.eq(hdr.seq), cp.seq1.eq(hdr.seq + 1),
                     cp.session.eq(hdr.session),
                     cp.ts.eq(pop.ts), cp.sip.eq(pop.sip), cp.sport.eq(pop.sport),
                     cp.smac.eq(pop.smac), self.refusal.eq(eff.refusal)]
        return m
