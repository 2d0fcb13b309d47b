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
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.fields import MsgType, VERSION

from .element import beat_layout, packet_layout
from .input_fifo import entry_layout
from .layout import HeaderLayout, Reason, OpKind, AccMode, request_layout
from ina_fabric.protocol.fields import HEADER_BYTES

from .params import CoreParams, HEADER_WORDS, QUEUE_SLACK
from .regfile import job_layout, member_layout, jobs_at

__all__ = ["DEC_LAT", "HEADER_EVENTS", "meta_layout", "HeaderPipeline", "record_of",
           "record_of_py", "seq_at_or_behind", "seq_at_or_behind_py", "due_reached",
           "due_reached_py"]

DEC_LAT = 4   # pop of a packet's last header beat (cycle t) -> its P2 decision (t + 4)

#: the counter events the header pipeline raises (events per cycle): all but the
#: replicator's ``overflows``, the element path's ``stream_errors`` and the control
#: plane's (STATUS_REQ and CONTROL)
HEADER_EVENTS = {
    "rx": 1, "rx_data": 1, "accepted": 1, "duplicates": 2, "late": 1, "results": 2,
    "partials": 1, "resent": 1, "drop_truncated": 1, "drop_malformed": 3,
    "drop_bad_version": 1, "drop_unknown_job": 1, "drop_unknown_source": 1,
    "drop_bad_session": 1, "drop_stale": 1, "drop_out_of_window": 1,
}


def _log2(n):
    return (n - 1).bit_length()


SEQ_MASK = 0xFFFFFFFF


# The compares behind the slot rules, as small functions with Python twins (the model's
# definitions), so tests/test_hw_ina_blocks.py can prove them for every input.
def record_of(seq_low, wbit, lwm):
    """Amaranth: a seq's record within its job, ``Cat(index, set)`` (``lwm + 1`` bits),
    from the low ``lwm + 1`` bits of seq and the job's W as ``wbit`` (``1 << log2 W``,
    W <= 2^lwm, the core's window): index ``seq % W``, set ``(seq // W) % 2``."""
    wset = (seq_low & wbit[:lwm + 1]).any()
    widx = (seq_low & (wbit - 1)[:lwm + 1])[:max(1, lwm)]
    return Cat(widx[:lwm], wset)


def record_of_py(seq, window, window_max):
    """The model's record of ``seq`` (set, index) as the core numbers it in a job."""
    return ((seq // window) % 2) * window_max + seq % window


def seq_at_or_behind(tag, seq):
    """Amaranth: seq is the record's tag or before it in 32-bit serial-number arithmetic,
    ``(tag - seq) mod 2^32 < 2^31`` (the sign of a 32-bit subtraction: one carry chain).
    The slot rules join ``seq == tag`` first, so what is left of it is the model's
    stale drop (``(tag - seq) mod 2^32`` in 1 .. 2^31 - 1); the rest is out of window."""
    return ~(tag[:32] - seq[:32])[31]


def seq_at_or_behind_py(tag, seq):
    return ((tag - seq) & SEQ_MASK) < 1 << 31


def due_reached(ts, due):
    """Amaranth: a record due at ``due`` has expired at time ``ts`` (``due <= ts``,
    modulo 2^32, so the cycle counter may wrap; deadlines stay below 2^31 cycles)."""
    return ~(ts - due)[31]


def due_reached_py(ts, due):
    return ((ts - due) & SEQ_MASK) < 1 << 31


def meta_layout(P: CoreParams) -> data.StructLayout:
    """The metadata of one slot record: its tag (the seq it holds, 34-bit signed),
    whether it is complete, the bitmap and count of the workers that joined, the larger
    exponent, when it is due (opened + deadline) and its element count."""
    return data.StructLayout({
        "tag": signed(34), "complete": 1, "bitmap": P.workers,
        "count": range(P.workers + 1), "exponent": signed(8), "due": 32,
        "nelem": range(P.elements + 1),
    })


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

    ``duplicate_check=False`` plants a bug for the tests: a worker's repeated
    contribution to an open slot is added again.
    """

    def __init__(self, params: CoreParams, *, duplicate_check: bool = True):
        self.params = P = params
        self.duplicate_check = duplicate_check
        ws = 1 << _log2(P.workers)
        super().__init__({
            "jobs": In(data.ArrayLayout(job_layout(), P.jobs)),
            "enable_stb": In(P.jobs),
            "enable_value": In(1),
            "enable_set": Out(P.jobs),
            "member": In(memory.ReadPort.Signature(
                addr_width=_log2(P.jobs * ws), shape=member_layout(mac=False))).array(P.jobs),
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
        })

    def elaborate(self, platform):
        P = self.params
        L, H, EB = P.lanes, P.header_beats, P.elem_beats
        NJ, WM, R = P.jobs, P.window, P.records
        LWM = _log2(WM)
        WS = 1 << _log2(P.workers)          # member table stride per job
        LWS = _log2(P.workers)
        LL = _log2(L)
        BYP2 = H == 1       # two-beat packets: a record's operations may be two cycles apart
        m = Module()
        now, jobs = self.now, self.jobs

        def jf(name, idx):
            return jobs_at(jobs, name, idx)

        inc = {n: [] for n in HEADER_EVENTS}

        MetaL = meta_layout(P)
        ReqL = request_layout(P)
        # the slot metadata: one memory per job (2W records: one bank of distributed RAM,
        # each read at the job's own candidate record, so no bank select before the read)
        JR = 2 * WM                             # records per job
        meta_mem = [memory.Memory(shape=MetaL, depth=JR,
                                  init=[{"complete": 1, "exponent": -128}] * JR)
                    for j in range(NJ)]
        for j in range(NJ):
            m.submodules[f"meta{j}"] = meta_mem[j]

        # slot metadata: asynchronous reads (distributed RAM on ECP5) in the cycle an
        # operation is loaded into P1a, into a register (see P1a)
        meta_wp = [mem.write_port() for mem in meta_mem]
        # one read port per source of P1a's operation, each at a register: the decoded
        # packet's candidate record (``p0``), the re-run operation's (``p2``), the scanner's
        meta_rp = {(j, src): meta_mem[j].read_port(domain="comb")
                   for j in range(NJ) for src in ("p0", "p2", "scan")}

        init_busy = Signal()
        init_req = Signal(NJ)       # jobs whose ``enable`` was written 1, waiting to initialize
        init_job = Signal(range(max(2, NJ)))
        init_ptr = Signal(range(2 * WM))

        # the request queue's room
        q_stop = Signal()     # see QUEUE_SLACK (entries in use never exceed requests held)
        m.d.sync += q_stop.eq(self.queue_level > P.queue - QUEUE_SLACK)

        m.d.comb += self.hold.eq(init_busy | init_req.any())

        # ---------------------------------------------------------------- pop and parse
        b = self.head
        avail, pop = self.avail, Signal()
        m.d.comb += self.pop.eq(pop)
        n_flush = Signal(init=1)    # (low: P2 flushes; see ``reinject``)
        m.d.comb += self.rewind_n.eq(n_flush)
        retry = Signal()            # a deferred packet is being re-run: pops wait
        m.d.comb += pop.eq(avail & ~retry & ~init_busy & ~q_stop)
        # position in the datagram, kept as flags so the pop decision is shallow:
        # at_hdr[k]: the next beat (if not a first beat) is header beat k; in_hdr_r: it is a
        # header beat; posmh: its position minus H (the element beat index), saturating
        at_hdr = Signal(H, init=1)
        in_hdr_r = Signal(init=1)
        posmh = Signal(signed(18))
        hdr_regs = [Signal(32, name=f"hdr_w{k}") for k in range(HEADER_WORDS)]
        # the header's job field: which word, which bits (from the generated layout)
        hdr_job = HeaderLayout["job"]
        JOB_WORD = HEADER_WORDS - 1 - hdr_job.offset // 32
        JOB_BIT = hdr_job.offset % 32
        assert JOB_BIT + hdr_job.width <= 32
        job_hit = [Signal(name=f"job{j}_hit") for j in range(NJ)]
        # the header's session (two words): every job's compare, registered at the pop in
        # 16-bit quarters as the job match is, so P0 only ANDs four bits
        SESS_LO = HEADER_WORDS - 1 - HeaderLayout["session"].offset // 32
        assert HeaderLayout["session"].offset % 32 == 0 and HeaderLayout["session"].width == 64
        sess_hit = [Signal(4, name=f"job{j}_sess_hit") for j in range(NJ)]
        job_hit_hi = [Signal(name=f"job{j}_hit_hi") for j in range(NJ)]
        # the header's seq word, and every job's record index for it (set bit, then the
        # slot's index), also registered at the pop: P0 reads the metadata at them
        SEQ_WORD = HEADER_WORDS - 1 - HeaderLayout["seq"].offset // 32
        assert HeaderLayout["seq"].offset % 32 == 0
        wbit = [Signal(33, name=f"job{j}_wbit") for j in range(NJ)]     # W
        hrec = [Signal(LWM + 1, name=f"job{j}_hrec") for j in range(NJ)]
        ts_reg = Signal(32)
        body_reg, len_short = Signal(signed(18)), Signal()   # UDP length - header, < header
        sip_reg, sport_reg = Signal(32), Signal(16)
        collecting = Signal()
        in_hdr = b.first | in_hdr_r
        hdr_last = Mux(b.first, H == 1, at_hdr[H - 1])     # the beat ends the header
        dec = pop & in_hdr & (hdr_last | b.last)
        # delay line from the pop to the element path's S0 (DEC_LAT stages), so a beat
        # reaches S0 after its packet's decision
        DlL = beat_layout(L)
        dl = [Signal(DlL, name=f"dl{k}") for k in range(DEC_LAT)]
        with m.If(pop):
            with m.If(b.first):
                m.d.sync += [at_hdr.eq(0b10 if H > 1 else 0), in_hdr_r.eq(H > 1),
                             posmh.eq(1 - H)]
            with m.Else():
                m.d.sync += [at_hdr.eq(at_hdr << 1), in_hdr_r.eq(in_hdr_r & ~at_hdr[H - 1]),
                             posmh.eq(Mux(posmh == 0xFFFF, posmh, posmh + 1))]
            m.d.sync += collecting.eq(~dec & ~b.last)
        # the header registers load from the head beat, popped or not, and whether or not
        # there is one (an empty FIFO shows an old beat): a beat that waits loads the same
        # values again when it is popped; the beat after a packet's last header beat is
        # never a header beat of that packet, so P0 (one cycle after that pop) sees the
        # header; and a first beat loads only between headers (``collecting``: a header
        # is being popped), so neither waiting for the pop nor for a beat is on this path
        for k in range(HEADER_WORDS):
            hb = k // L
            with m.If(Mux(b.first, (hb == 0) & ~collecting, at_hdr[hb])):
                m.d.sync += hdr_regs[k].eq(b.data[k % L])
                if k == JOB_WORD:   # the job-table match, one stage early, in two halves
                    field = b.data[k % L][JOB_BIT:JOB_BIT + hdr_job.width]
                    hw_ = hdr_job.width // 2
                    m.d.sync += [job_hit[j].eq(field[:hw_] == jobs[j].job_id[:hw_])
                                 for j in range(NJ)]
                    m.d.sync += [job_hit_hi[j].eq(field[hw_:] == jobs[j].job_id[hw_:hdr_job.width])
                                 for j in range(NJ)]
                if k in (SESS_LO - 1, SESS_LO):
                    reg = "session_hi" if k == SESS_LO - 1 else "session_lo"
                    q = 2 if k == SESS_LO - 1 else 0
                    word = b.data[k % L]
                    for j in range(NJ):
                        ref = getattr(jobs[j], reg)
                        m.d.sync += [sess_hit[j][q].eq(word[:16] == ref[:16]),
                                     sess_hit[j][q + 1].eq(word[16:] == ref[16:])]
                if k == SEQ_WORD:
                    # a job's window is at most the core's (config_writes refuses
                    # others), so only the low LWM + 1 bits of seq hold its set bit
                    sq = b.data[k % L][:LWM + 1]
                    for j in range(NJ):
                        m.d.sync += hrec[j].eq(record_of(sq, wbit[j], LWM))
        with m.If(b.first & ~collecting):
            m.d.sync += [ts_reg.eq(b.ts), body_reg.eq(b.length - HEADER_BYTES),
                         len_short.eq(b.length < HEADER_BYTES), sip_reg.eq(b.src_ip),
                         sport_reg.eq(b.src_port)]
        m.d.sync += [dl[0].valid.eq(pop), dl[0].elem.eq(~in_hdr),
                     dl[0].first.eq(b.first), dl[0].e.eq(posmh[:16]), dl[0].data.eq(b.data)]
        m.d.sync += [dl[k].eq(dl[k - 1]) for k in range(1, DEC_LAT)]
        horizon = Mux(collecting, ts_reg, Mux(avail, b.ts, now))

        # ---------------------------------------------------------------- P0: decode
        p0_valid, p0_short = Signal(name="p0_valid"), Signal(name="p0_short")
        p0_rewind = Signal(5, name="p0_rewind")
        m.d.sync += [p0_valid.eq(dec), p0_short.eq(~hdr_last), p0_rewind.eq(self.pop_ptr + 1)]
        hdr = data.View(HeaderLayout, Cat(*reversed(hdr_regs)))
        # per-job window constants, registered from the static configuration (a job is
        # configured long before its first packet: enabling it takes 10W cycles)
        nwm1 = [Signal(6, name=f"job{j}_nworkers_m1") for j in range(NJ)]   # N - 1
        for j in range(NJ):
            m.d.sync += [wbit[j].eq(Const(1, 33) << jobs[j].log2_window),
                         nwm1[j].eq(jobs[j].nworkers - 1)]
        # every job's candidate in parallel, then the matching job's (priority to the lowest)
        hits = [jobs[j].enable & job_hit[j] & job_hit_hi[j] for j in range(NJ)]
        unkjob = ~Cat(hits).any()

        def by_job(values, shape):
            out = Signal(shape)
            sel = values[0]
            for j in range(1, NJ):
                sel = Mux(hits[j] & ~Cat(hits[:j]).any(), values[j], sel)
            m.d.comb += out.eq(sel)
            return out

        recs, seqms = [], []
        for j in range(NJ):
            recs.append(Cat(hrec[j], Const(j, range(max(2, NJ)))))
            seqms.append(hdr.seq - Cat(C(0, 1), wbit[j]))     # seq - 2W
        rec = by_job(recs, range(R))
        seqm = by_job(seqms, signed(34))   # seq - 2W: the tag a reusable record must have
        bad_worker = by_job([hdr.worker >= jobs[j].nworkers for j in range(NJ)], 1)
        big_nelem = by_job([hdr.nelem > jobs[j].elements for j in range(NJ)], 1)
        bad_session = by_job([~sess_hit[j].all() for j in range(NJ)], 1)

        # the checks, in the model's priority order; P1a turns them into one reason
        body = body_reg
        nelem4 = hdr.nelem * 4
        CHECKS = ((Reason.TRUNCATED, p0_short | len_short),
                  (Reason.BAD_VERSION, hdr.version != VERSION),
                  (Reason.CONTROL, (hdr.type == MsgType.STATUS_REQ) | (hdr.type == MsgType.CONTROL)),
                  (Reason.MALFORMED, hdr.type != MsgType.DATA),
                  (Reason.TRUNCATED, body < nelem4), (Reason.MALFORMED, body != nelem4),
                  (Reason.UNKNOWN_JOB, unkjob), (Reason.BAD_SESSION, bad_session),
                  (Reason.UNKNOWN_SOURCE, bad_worker),
                  (Reason.BIG_NELEM, big_nelem))
        checks = Cat(c for _, c in CHECKS)

        def first_reason(bits):
            out = Signal(Reason)
            sel = Reason.OK
            for k in reversed(range(len(CHECKS))):
                sel = Mux(bits[k], CHECKS[k][0], sel)
            m.d.comb += out.eq(sel)
            return out
        # member table: read in P0 by (job, worker) and compared with the source (in three
        # parts, registered); P1a picks the job's
        p1_src_eq = [Signal(3, name=f"p1_src_eq{j}") for j in range(NJ)]   # ip lo, hi, port
        for j in range(NJ):
            midx = j * WS + hdr.worker[:max(1, LWS)] if WS > 1 else j
            m.d.comb += self.member[j].addr.eq(midx)
            ipm, portm = self.member[j].data.ip, self.member[j].data.port
            m.d.sync += p1_src_eq[j].eq(Cat(ipm[:16] == sip_reg[:16], ipm[16:] == sip_reg[16:],
                                            portm == sport_reg))

        # ---------------------------------------------------------------- P1: read, compare
        # One operation enters P1a per cycle: a re-run packet (from P2), a decoded packet
        # (P0), a job-initialization write, or a deadline-scanner visit. Two operations on
        # one record are never less than three cycles apart (the scanner skips the records
        # in P1a and P1b, a scan visit followed by a packet to its record within two cycles
        # is dropped, and a packet that follows a packet to its record within two cycles is
        # re-run), so P1a sees every earlier write: from the memory, or from P3's write
        # register while it lands.
        OpL = data.StructLayout({
            "kind": OpKind, "checks": len(CHECKS), "reason": Reason, "rec": range(R), "seq": 32,
            "seqm": signed(34), "ts": 32, "worker": 8, "exp": signed(8), "nelem": 16,
            "base": range(R * EB + 1), "nbeats": 16, "rewind": 5, "src_ok": 1,
        })
        def stage(name):    # an operation's registers in one stage
            return (Signal(name=f"{name}_valid"), Signal(OpL, name=f"{name}_op"),
                    Signal(name=f"{name}_reinj"), Signal(name=f"{name}_adj"))
        p1_valid, p1_op, p1_reinj, p1_adj = stage("p1")
        q1_valid, q1_op, q1_reinj, q1_adj = stage("q1")
        p2_valid, p2_op, p2_reinj, p2_adj = stage("p2")
        # P2 sends its operation back to P1a (defer, or too close behind its record's last
        # operation): decided in P1b and registered, once for the operation pipeline and
        # once (inverted, so synthesis keeps both) for the flush of the input side
        reinject = Signal()
        scan_ptr = Signal(range(R))
        if LWM:
            init_rec = Cat(init_ptr[:LWM], init_ptr[LWM], init_job)
        else:
            init_rec = Cat(init_ptr[0], init_job)
        pipe_empty = ~p0_valid & ~p1_valid & ~q1_valid & ~p2_valid
        # a job's initialization writes its records one at a time through the empty
        # pipeline. Registered: while ``init_busy`` nothing enters (no pops, no scans), so
        # a pipeline that was empty, and took no initialization write, still is
        init_go = Signal()
        m.d.sync += init_go.eq(init_busy & pipe_empty & ~init_go)
        scan_ok = (~p0_valid & ~init_busy & ~retry & ~q_stop
                   & ~(p1_valid & (p1_op.rec == scan_ptr)) & ~(q1_valid & (q1_op.rec == scan_ptr)))
        # the packet in P0 against the operations in P1a (one cycle ahead) and P1b (two)
        near1 = by_job([p1_op.rec == recs[j] for j in range(NJ)], 1)
        near2 = by_job([q1_op.rec == recs[j] for j in range(NJ)], 1)
        near3 = by_job([p2_op.rec == recs[j] for j in range(NJ)], 1)
        # P1a's operation takes P3's write register instead of its read (the write lands
        # at the end of that cycle; registered with the operation, see below)
        byp1 = Signal()
        v2 = Signal()
        # a scan visit to the record that the packet in P0 needs next is dropped (the
        # scanner comes back to it); a packet right behind a packet to its record is re-run
        scan_cancel1 = p0_valid & (p1_op.kind == OpKind.SCAN) & near1
        scan_cancel2 = p0_valid & (q1_op.kind == OpKind.SCAN) & near2
        m.d.sync += [p1_valid.eq(0), p1_reinj.eq(0), p1_adj.eq(0)]
        with m.If(reinject):
            m.d.sync += [p1_valid.eq(1), p1_op.eq(p2_op), p1_reinj.eq(1)]
        with m.Elif(p0_valid):
            m.d.sync += [p1_valid.eq(1),
                         p1_adj.eq((p1_valid & (p1_op.kind == OpKind.PKT) & near1)
                                   | (q1_valid & (q1_op.kind == OpKind.PKT) & near2 & ~BYP2)),
                         p1_op.kind.eq(OpKind.PKT), p1_op.checks.eq(checks), p1_op.rec.eq(rec),
                         p1_op.seq.eq(hdr.seq), p1_op.seqm.eq(seqm), p1_op.ts.eq(ts_reg),
                         p1_op.worker.eq(hdr.worker), p1_op.exp.eq(hdr.exponent),
                         p1_op.nelem.eq(hdr.nelem), p1_op.base.eq(rec * EB),
                         p1_op.nbeats.eq((hdr.nelem + (L - 1)) >> LL),
                         p1_op.rewind.eq(p0_rewind)]
        with m.Elif(init_go):
            m.d.sync += [p1_valid.eq(1), p1_op.kind.eq(OpKind.INIT), p1_op.rec.eq(init_rec),
                         init_ptr.eq(init_ptr + 1)]
            with m.If(init_ptr == 2 * WM - 1):
                m.d.sync += init_busy.eq(0)
                for j in range(NJ):
                    with m.If(init_job == j):
                        m.d.comb += self.enable_set[j].eq(1)
        with m.Else():
            # the scanner's visit, loaded whether or not it may go (so the load does not
            # wait for ``scan_ok``: an invalid operation is never looked at)
            m.d.sync += [p1_valid.eq(scan_ok), p1_op.kind.eq(OpKind.SCAN), p1_op.rec.eq(scan_ptr),
                         p1_op.ts.eq(horizon)]
            with m.If(scan_ok):
                m.d.sync += scan_ptr.eq(Mux(scan_ptr == R - 1, 0, scan_ptr + 1))
        # a job's initialization starts when none runs, the lowest requested job first; a
        # write of 1 to ``enable`` requests one (after the one running, even for the same
        # job), a write of 0 cancels the request and stops the job's running one. Both
        # disable the job until its initialization is over (``enable`` reads 1 then).
        with m.If(~init_busy & init_req.any()):
            m.d.sync += [init_busy.eq(1), init_ptr.eq(0)]
            for j in reversed(range(NJ)):
                with m.If(init_req[j]):
                    m.d.sync += [init_job.eq(j), init_req.eq(init_req & ~(1 << j))]
        for j in range(NJ):
            with m.If(self.enable_stb[j]):
                with m.If(self.enable_value):
                    m.d.sync += init_req[j].eq(1)
                with m.Else():
                    m.d.sync += init_req[j].eq(0)
                    with m.If(init_busy & (init_job == j)):
                        m.d.sync += init_busy.eq(0)
        # The metadata is read in the cycle the operation is loaded into P1a: every job's
        # memory at its candidate from each source (one read port each, addressed straight
        # from registers), the source picked from the outputs, into one register per job
        # (``p1_md``; P1a picks the job). An initialization needs no metadata: it reads as a
        # scan would. Two writes are not in the memory yet when P1a's operation is read:
        # P3's, which lands at the end of that cycle (it is copied, as ``w4_data``), and
        # P2's (P3's write register while the operation is in P1a).
        w3_en = Signal(name="w3_en")
        w3_addr = Signal(range(R), name="w3_addr")
        w3_data = Signal(MetaL, name="w3_data")
        w4_data = Signal(MetaL, name="w4_data")
        p1_md = [Signal(MetaL, name=f"p1_md{j}") for j in range(NJ)]
        for j in range(NJ):
            m.d.comb += [meta_rp[j, "p0"].addr.eq(hrec[j]),
                         meta_rp[j, "p2"].addr.eq(p2_op.rec[:LWM + 1]),
                         meta_rp[j, "scan"].addr.eq(scan_ptr[:LWM + 1])]
            m.d.sync += p1_md[j].eq(Mux(reinject, meta_rp[j, "p2"].data,
                                        Mux(p0_valid, meta_rp[j, "p0"].data,
                                            meta_rp[j, "scan"].data)))
        m.d.sync += w4_data.eq(w3_data)
        # which of the four P1a takes: P3's write register (``byp1``), w4 (``byp0``), or the
        # read of the record's job
        def by_src(from_p2, from_p0, from_scan):
            # the operation that enters P1a, in the priority order above
            return Mux(reinject, from_p2, Mux(p0_valid, from_p0, from_scan))
        b1, b0 = Signal(), Signal()
        m.d.comb += [
            b1.eq(v2 & by_src(1, near3, p2_op.rec == scan_ptr)),
            b0.eq(w3_en & by_src(w3_addr == p2_op.rec,
                                 by_job([w3_addr == recs[j] for j in range(NJ)], 1),
                                 w3_addr == scan_ptr)),
        ]
        byp0 = Signal()
        m.d.sync += [byp1.eq(b1), byp0.eq(b0)]

        # P1a: the metadata (or P3's write of it, while it lands) and every compare on it,
        # into registers; P1b then applies the rules from registered bits only
        p3_push_a, p3_push_b = Signal(name="p3_push_a"), Signal(name="p3_push_b")
        p3_a, p3_b = Signal(ReqL, name="p3_a"), Signal(ReqL, name="p3_b")   # P3's requests
        p1_job = Signal(range(max(2, NJ)))
        m.d.comb += p1_job.eq(p1_op.rec >> (LWM + 1))
        md1 = Signal(MetaL)
        m.d.comb += md1.eq(Mux(byp1, w3_data, Mux(byp0, w4_data, Array(p1_md)[p1_job])))
        n1 = jf("nworkers", p1_job)
        bit1 = Signal(P.workers)
        m.d.comb += bit1.eq(1 << p1_op.worker[:5])
        # (the compares, in three parts, are only those of the packet from P0; a re-run
        # packet keeps the result of its own check, ``src_ok`` in the op: it
        # may be re-run because it followed a packet to its record, whatever its source)
        src_ok1 = Mux(p1_reinj, p1_op.src_ok, Array(p1_src_eq)[p1_job].all())
        pend1 = self.pending.bit_select(p1_op.rec, 1) | (byp1 & (p3_push_a | p3_push_b))
        w1 = Signal(signed(35))
        w2 = Signal(signed(35))
        m.d.comb += [w1.eq(Array(wbit)[p1_job]), w2.eq(Cat(C(0, 1), Array(wbit)[p1_job]))]
        init_idx = p1_op.rec[:LWM] if LWM else C(0, 1)
        init_set = p1_op.rec[LWM]
        def below(a, b):
            """a < b as the sign of an explicit subtraction: a carry chain straight from the
            operands (synthesis keeps a subtraction a chain; a compare it may turn into
            LUTs)."""
            a = Cat(a, C(0, 1)).as_signed() if not a.shape().signed else a
            b = Cat(b, C(0, 1)).as_signed() if not b.shape().signed else b
            d = a - b
            return d[len(d) - 1]

        def eq_chain(a, b):
            """a == b for wide values as two magnitude compares: two carry chains side by
            side (a tree of LUTs would be four levels deep or more)."""
            return ~below(a, b) & ~below(b, a)

        def md_compares(mdx, op, n, nm1, bit):
            """Every compare of an operation against its record's metadata."""
            # sequence numbers compare modulo 2^32 (the model's serial-number arithmetic):
            # only the tag's low 32 bits count (the initial tags are negative)
            return {"late": due_reached(op.ts, mdx.due), "complete": mdx.complete,
                    "eq_seqm": eq_chain(mdx.tag[:32], op.seqm[:32]),
                    "eq_seq": eq_chain(mdx.tag[:32], op.seq),
                    "lt": seq_at_or_behind(mdx.tag, op.seq), "cnt1_n": mdx.count == nm1,
                    "cnt0": mdx.count == 0, "cnt_lt_n": mdx.count < n,
                    "nelem_ne": ~eq_chain(op.nelem, mdx.nelem)}
        CmpL = data.StructLayout({k: 1 for k in (
            "late", "complete", "eq_seqm", "eq_seq", "lt", "cnt1_n", "one_n", "cnt0",
            "cnt_lt_n", "nelem_ne", "nelem_nz", "src_ok", "pend", "enable",
            "bounded", "ok", "pkt", "may_expire")})
        q1c = Signal(CmpL)
        q1_md = Signal(MetaL)
        q1_bit = Signal(P.workers)
        q1_due = Signal(32)
        q1_init_tag = Signal(signed(34))
        q1_job = Signal(range(max(2, NJ)))
        reason1 = first_reason(p1_op.checks)
        m.d.sync += [
            q1_valid.eq(p1_valid & ~reinject & ~scan_cancel1), q1_op.eq(p1_op),
            q1_op.reason.eq(reason1), q1_op.src_ok.eq(src_ok1), q1_reinj.eq(p1_reinj),
            q1_adj.eq(p1_adj),
            q1_md.eq(md1), q1_bit.eq(bit1), q1_job.eq(p1_job),
            q1_due.eq(p1_op.ts + jf("deadline", p1_job)),
            q1_init_tag.eq(init_idx + Mux(init_set, w1, 0) - w2),
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
        cands = [(byp1, md_compares(w3_data, p1_op, n1, nm1, bit1)),
                 (~byp1 & byp0, md_compares(w4_data, p1_op, n1, nm1, bit1))]
        cands += [(~byp1 & ~byp0 & (p1_job == j), md_compares(p1_md[j], p1_op, n1, nm1, bit1))
                  for j in range(NJ)]
        # every compare, by name:
        for k in cands[0][1]:
            # one LUT per candidate (its select and its compare), then their OR (kept
            # apart: synthesis would chain them)
            terms = [Signal(name=f"q1c_{k}_t{n}", attrs={"keep": 1}) for n in range(len(cands))]
            m.d.comb += [t.eq(sel & c[k]) for t, (sel, c) in zip(terms, cands)]
            m.d.sync += getattr(q1c, k).eq(Cat(terms).any())
        q1m = q1c      # the compares in use in P1b
        if BYP2:
            # L >= 5: a packet may follow a packet to its record two cycles later (two-beat
            # packets), so P1b may need P3's write, which P1a could not see: the compares
            # run on it too and the registered select picks one
            q1_sel = Signal()
            m.d.sync += q1_sel.eq(p2_valid & ~p2_adj & (p2_op.rec == p1_op.rec))
            cw = md_compares(w3_data, q1_op, jf("nworkers", q1_job), Array(nwm1)[q1_job], q1_bit)
            q1m = Signal(CmpL)
            m.d.comb += q1m.eq(q1c)
            for k, v in cw.items():
                m.d.comb += getattr(q1m, k).eq(Mux(q1_sel, v, getattr(q1c, k)))
            m.d.comb += q1m.pend.eq(q1c.pend | ((p3_push_a | p3_push_b) & (p3_a.rec == q1_op.rec)))
            q1_mdx = Signal(MetaL)
            m.d.comb += q1_mdx.eq(Mux(q1_sel, w3_data, q1_md))
        else:
            q1_mdx = q1_md

        # P1b: the slot rules, from registered bits. Validity is applied in P2 (an invalid
        # or flushed operation writes nothing and requests nothing), so these assume it.
        k_pkt1 = q1_op.kind == OpKind.PKT
        k_scan1 = (q1_op.kind == OpKind.SCAN) & q1m.enable
        k_pkt_ok1 = q1m.pkt & q1m.src_ok
        # any operation at time ts may fire its record when it is due (the model's
        # ``process`` ticks before it even parses the packet)
        k_expire1 = q1m.may_expire & ~q1m.complete & q1m.late
        k_reuse1 = k_pkt_ok1 & (q1m.complete | k_expire1) & q1m.eq_seqm
        # reuse waits while the record's last result is queued or being sent, or expires now
        k_defer1 = k_reuse1 & q1m.nelem_nz & (k_expire1 | q1m.pend)
        reuse1 = k_reuse1 & ~k_defer1
        join1 = k_pkt_ok1 & ~k_defer1 & (k_reuse1 | q1m.eq_seq)
        cur_complete1 = (q1m.complete | k_expire1) & ~reuse1
        # the worker's bit, selected here from the registered bitmap (off P1a's path)
        dup1 = (C(0) if not self.duplicate_check
                else q1_mdx.bitmap.bit_select(q1_op.worker[:5], 1))
        # (join, completeness, duplicate and element count combine in P2)
        R2 = ("defer", "expire", "reuse", "join", "cur_complete", "dup", "nelem_ne",
              "one_n", "cnt1_n", "opens", "new_exp", "stale", "oow", "unksrc", "bignelem",
              "pkt", "scan", "init", "pkt_ok", "cnt_lt_n")
        c = Signal(data.StructLayout({k: 1 for k in R2}))
        early_ok1 = (q1_op.reason == Reason.OK) | (q1_op.reason == Reason.BIG_NELEM)
        p2_md = Signal(MetaL)
        p2_bit = Signal(P.workers)
        p2_cnt1 = Signal(range(P.workers + 2))
        p2_due = Signal(32)
        p2_init_tag = Signal(signed(34))
        p2_job = Signal(range(max(2, NJ)))
        m.d.sync += [
            p2_valid.eq(q1_valid & ~reinject & ~scan_cancel2), p2_op.eq(q1_op),
            # (a scan is never re-run, so a cancelled scan need not be looked at here)
            reinject.eq(q1_valid & ~reinject & (q1_adj | k_defer1)),
            n_flush.eq(~(q1_valid & ~reinject & (q1_adj | k_defer1))),
            p2_reinj.eq(q1_reinj), p2_adj.eq(q1_adj), p2_md.eq(q1_mdx), p2_job.eq(q1_job),
            p2_bit.eq(q1_bit), p2_cnt1.eq(q1_mdx.count + 1), p2_due.eq(q1_due),
            p2_init_tag.eq(q1_init_tag),
            c.defer.eq(k_defer1), c.expire.eq(k_expire1), c.reuse.eq(reuse1), c.join.eq(join1),
            c.cur_complete.eq(cur_complete1), c.dup.eq(dup1), c.nelem_ne.eq(q1m.nelem_ne),
            c.one_n.eq(q1m.one_n), c.cnt1_n.eq(q1m.cnt1_n),
            c.opens.eq(reuse1 | q1m.cnt0),
            # the larger exponent (compared here from registers, off P1a's path)
            c.new_exp.eq(reuse1 | (q1_op.exp > q1_mdx.exponent)),
            c.stale.eq(k_pkt_ok1 & ~join1 & q1m.lt),
            c.oow.eq(k_pkt_ok1 & ~join1 & ~q1m.lt & ~k_defer1),
            c.unksrc.eq(k_pkt1 & ((q1_op.reason == Reason.UNKNOWN_SOURCE)
                                  | (early_ok1 & ~q1m.src_ok))),
            c.bignelem.eq(k_pkt1 & (q1_op.reason == Reason.BIG_NELEM) & q1m.src_ok),
            c.pkt.eq(k_pkt1), c.scan.eq(k_scan1), c.init.eq(q1_op.kind == OpKind.INIT),
            c.pkt_ok.eq(k_pkt_ok1), c.cnt_lt_n.eq(q1m.cnt_lt_n),
        ]

        # ---------------------------------------------------------------- P2: effects
        m.d.comb += v2.eq(p2_valid & ~p2_adj)
        reason2 = p2_op.reason
        is_pkt = v2 & c.pkt
        is_init = v2 & c.init
        defer = Signal()
        m.d.comb += defer.eq(v2 & c.defer)
        with m.If(reinject):
            m.d.sync += retry.eq(1)
        with m.Elif(p2_valid & p2_reinj):
            m.d.sync += retry.eq(0)
        md2 = p2_md
        expired = v2 & c.expire
        reuse = c.reuse
        isdup = ~reuse & c.dup
        nelem_bad = ~reuse & c.nelem_ne
        resend_ = c.join & c.cur_complete
        dup_only = c.join & ~c.cur_complete & isdup
        malf3 = c.join & ~c.cur_complete & ~isdup & nelem_bad
        accept = c.join & ~c.cur_complete & ~isdup & ~nelem_bad
        completes = accept & Mux(reuse, c.one_n, c.cnt1_n)
        cur_bitmap = Mux(reuse, 0, md2.bitmap)
        cur_count = Mux(reuse, 0, md2.count)
        cur_exp = Mux(reuse, -128, md2.exponent)
        cur_nelem = Mux(reuse, p2_op.nelem, md2.nelem)
        seqs2 = Signal(signed(34))
        m.d.comb += seqs2.eq(p2_op.seq)
        cur_tag = Mux(reuse, seqs2, md2.tag)
        new_count = Mux(reuse, 1, p2_cnt1)
        new_exp = Mux(c.new_exp, p2_op.exp, md2.exponent)
        mode = Signal(AccMode)
        m.d.comb += mode.eq(Mux(accept, Mux(c.opens, AccMode.OPEN, AccMode.ADD), AccMode.NONE))

        # metadata write, registered (P3); P1a takes it from the register while it lands
        with m.If(is_init):
            m.d.sync += [w3_en.eq(1), w3_addr.eq(p2_op.rec), w3_data.eq(0),
                         w3_data.tag.eq(p2_init_tag),
                         w3_data.complete.eq(1), w3_data.exponent.eq(-128)]
        with m.Else():
            m.d.sync += [
                # every valid operation writes its record back (unchanged when no rule
                # applies), so the bypass needs only the record number
                w3_en.eq(v2), w3_addr.eq(p2_op.rec),
                w3_data.tag.eq(cur_tag),
                w3_data.complete.eq(~reuse & (md2.complete | c.expire) | completes),
                w3_data.bitmap.eq(cur_bitmap | Mux(accept, p2_bit, 0)),
                w3_data.count.eq(Mux(accept, new_count, cur_count)),
                w3_data.exponent.eq(Mux(accept, new_exp, cur_exp)),
                w3_data.due.eq(Mux(reuse, p2_due, md2.due)),
                w3_data.nelem.eq(cur_nelem),
            ]
        for j, port in enumerate(meta_wp):
            m.d.comb += [port.en.eq(w3_en & (w3_addr >> (LWM + 1) == j)),
                         port.addr.eq(w3_addr[:LWM + 1]), port.data.eq(w3_data)]

        # requests: a = expired PARTIAL (old contents), b = completion or re-send; registered
        # (P3) before they enter the queue
        m.d.comb += [self.push_a.eq(p3_push_a), self.a.eq(p3_a), self.push_b.eq(p3_push_b),
                     self.b.eq(p3_b)]
        p3_hot = Signal(R)      # P3's record, one-hot (registered with it)
        m.d.sync += p3_hot.eq(1 << p2_op.rec)
        m.d.comb += self.push_hot.eq(p3_hot)
        m.d.sync += [
            p3_push_a.eq(expired),
            p3_a.rec.eq(p2_op.rec), p3_a.job.eq(p2_job), p3_a.unicast.eq(0),
            p3_a.seq.eq(md2.tag), p3_a.count.eq(md2.count), p3_a.bitmap.eq(md2.bitmap),
            p3_a.exponent.eq(md2.exponent), p3_a.nelem.eq(md2.nelem), p3_a.partial.eq(1),
            p3_push_b.eq(v2 & (resend_ | completes)),
            p3_b.rec.eq(p2_op.rec), p3_b.job.eq(p2_job), p3_b.unicast.eq(resend_),
            p3_b.worker.eq(p2_op.worker),
            p3_b.seq.eq(cur_tag),
            p3_b.count.eq(Mux(completes, new_count, cur_count)),
            p3_b.bitmap.eq(Mux(completes, cur_bitmap | p2_bit, cur_bitmap)),
            p3_b.exponent.eq(Mux(completes, new_exp, cur_exp)),
            p3_b.nelem.eq(cur_nelem),
            p3_b.partial.eq(Mux(completes, 0, c.cnt_lt_n)),
        ]

        resend = v2 & resend_
        inc["rx"].append(is_pkt & ~c.defer)
        inc["rx_data"].append(v2 & c.pkt_ok & ~c.defer)
        inc["drop_truncated"].append(is_pkt & (reason2 == Reason.TRUNCATED))
        inc["drop_bad_version"].append(is_pkt & (reason2 == Reason.BAD_VERSION))
        inc["drop_malformed"] += [is_pkt & (reason2 == Reason.MALFORMED), v2 & c.bignelem,
                                  v2 & malf3]
        inc["drop_unknown_job"].append(is_pkt & (reason2 == Reason.UNKNOWN_JOB))
        inc["drop_bad_session"].append(is_pkt & (reason2 == Reason.BAD_SESSION))
        inc["drop_unknown_source"].append(v2 & c.unksrc)
        inc["drop_stale"].append(v2 & c.stale)
        inc["drop_out_of_window"].append(v2 & c.oow)
        inc["duplicates"] += [resend & isdup, v2 & dup_only]
        inc["late"].append(resend & ~isdup)
        inc["resent"].append(resend)
        inc["accepted"].append(v2 & accept)
        m.d.comb += [self.accepted[j].eq(v2 & accept & (p2_job == j)) for j in range(NJ)]
        inc["results"] += [expired, v2 & completes]
        inc["partials"].append(expired)

        # flush: a deferred packet (or one that followed its slot's previous operation
        # within two cycles) goes back to P1a; everything younger is dropped and the input
        # is rewound to the packet's first element beat
        m.d.comb += self.rewind_to.eq(p2_op.rewind)
        with m.If(~n_flush):
            m.d.sync += [p0_valid.eq(0), at_hdr.eq(0), in_hdr_r.eq(0),
                         posmh.eq(0), collecting.eq(0)]
            m.d.sync += [d.valid.eq(0) for d in dl]

        # ---------------------------------------------------------------- to the element path
        m.d.comb += [self.elem.eq(dl[-1]), self.elem_start.eq(is_pkt & ~defer),
                     self.elem_packet.base.eq(p2_op.base), self.elem_packet.rec.eq(p2_op.rec),
                     self.elem_packet.nelem.eq(p2_op.nelem),
                     self.elem_packet.nbeats.eq(p2_op.nbeats), self.elem_packet.mode.eq(mode)]
        for name in HEADER_EVENTS:
            assert len(inc[name]) == HEADER_EVENTS[name], name
            m.d.comb += getattr(self.events, name).eq(Cat(inc[name]))
        return m
