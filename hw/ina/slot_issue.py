"""The operation that enters P1a, and the slot metadata it reads (see :mod:`.header`).

One operation enters P1a per cycle: a re-run packet (from P2), a decoded packet (P0), a
job-initialization write, or a deadline-scanner visit, in that priority. The metadata
is one distributed-RAM memory per job, read in the cycle the operation is loaded, at
every job's candidate from each source (one read port each, addressed straight from
registers), the source picked from the outputs, into one register per job (``p1_md``;
P1a picks the job). Two writes are not in the memory yet when P1a's operation is read:
P3's, which lands at the end of that cycle (copied, as ``w4_data``), and P2's (P3's
write register while the operation is in P1a): ``byp0`` and ``byp1`` say which P1a
takes instead of the read.

Ports::

    p0_valid, p0_op   In: the decoded packet (P0)
    hrec              In: per job, the header's record (P0's read address)
    near              In: the packet's record is that of the operation in P1a, P1b, P2
    w3_near           In: ... that of P3's write
    reinject, p2      In: P2 sends its operation back; the operation in P2
    q1, v2            In: the operation in P1b; P2's is valid
    horizon, q_stop, retry
                      In: the scanner's time; the request queue's room; a re-run waits
    w3                In: P3's metadata write
    enable_stb, enable_value, enable_set
                      the job table's ``enable`` handshake: a write of 1 queues the job's
                      initialization (its 2W records reset one at a time through the
                      empty pipeline, then ``enable_set``); a write of 0 cancels it
    init_busy, hold   Out: a job initializes (pops and scans wait; the input holds)
    p1, p1_md, w4_data, byp1, byp0
                      Out: the operation in P1a, and its candidates
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory
from amaranth.lib.wiring import In, Out

from .layout import OpKind
from .params import CoreParams
from .slot import meta_layout, op_layout, stage_layout, write_layout, log2

__all__ = ["SlotIssue"]


class SlotIssue(wiring.Component):
    """See the module docstring."""

    def __init__(self, params: CoreParams):
        self.params = P = params
        NJ, LWM = P.jobs, log2(P.window)
        MetaL = meta_layout(P)
        super().__init__({
            "p0_valid": In(1), "p0_op": In(op_layout(P)),
            "hrec": In(data.ArrayLayout(LWM + 1, NJ)),
            "near": In(3), "w3_near": In(1),
            "reinject": In(1), "p2": In(stage_layout(P)), "q1": In(stage_layout(P)),
            "v2": In(1),
            "horizon": In(32), "q_stop": In(1), "retry": In(1),
            "w3": In(write_layout(P)),
            "enable_stb": In(NJ), "enable_value": In(1), "enable_set": Out(NJ),
            "init_busy": Out(1), "hold": Out(1),
            "p1": Out(stage_layout(P)), "p1_md": Out(data.ArrayLayout(MetaL, NJ)),
            "w4_data": Out(MetaL), "byp1": Out(1), "byp0": Out(1),
        })

    def elaborate(self, platform):
        P = self.params
        NJ, WM, R = P.jobs, P.window, P.records
        LWM = log2(WM)
        BYP2 = P.header_beats == 1   # two-beat packets: a record's operations 2 cycles apart
        m = Module()
        MetaL = meta_layout(P)
        # the slot metadata: one memory per job (2W records: one bank of distributed RAM,
        # each read at the job's own candidate record, so no bank select before the read)
        JR = 2 * WM                             # records per job
        meta_mem = [memory.Memory(shape=MetaL, depth=JR,
                                  init=[{"complete": 1, "exponent": -128}] * JR)
                    for j in range(NJ)]
        for j in range(NJ):
            m.submodules[f"meta{j}"] = meta_mem[j]
        meta_wp = [mem.write_port() for mem in meta_mem]
        meta_rp = {(j, src): meta_mem[j].read_port(domain="comb")
                   for j in range(NJ) for src in ("p0", "p2", "scan")}
        w3 = self.w3
        for j, port in enumerate(meta_wp):
            m.d.comb += [port.en.eq(w3.en & (w3.addr >> (LWM + 1) == j)),
                         port.addr.eq(w3.addr[:LWM + 1]), port.data.eq(w3.data)]

        init_busy = self.init_busy
        init_req = Signal(NJ)       # jobs whose ``enable`` was written 1, waiting to initialize
        init_job = Signal(range(max(2, NJ)))
        init_ptr = Signal(range(2 * WM))
        m.d.comb += self.hold.eq(init_busy | init_req.any())

        p0_valid, p0_op = self.p0_valid, self.p0_op
        p1, q1, p2 = self.p1, self.q1, self.p2
        p1_valid, p1_op = p1.valid, p1.op
        q1_valid, q1_op = q1.valid, q1.op
        p2_op = p2.op
        near1, near2, near3 = self.near[0], self.near[1], self.near[2]
        reinject = self.reinject
        scan_ptr = Signal(range(R))
        if LWM:
            init_rec = Cat(init_ptr[:LWM], init_ptr[LWM], init_job)
        else:
            init_rec = Cat(init_ptr[0], init_job)
        pipe_empty = ~p0_valid & ~p1_valid & ~q1_valid & ~p2.valid
        # a job's initialization writes its records one at a time through the empty
        # pipeline. Registered: while ``init_busy`` nothing enters (no pops, no scans), so
        # a pipeline that was empty, and took no initialization write, still is
        init_go = Signal()
        m.d.sync += init_go.eq(init_busy & pipe_empty & ~init_go)
        scan_ok = (~p0_valid & ~init_busy & ~self.retry & ~self.q_stop
                   & ~(p1_valid & (p1_op.rec == scan_ptr)) & ~(q1_valid & (q1_op.rec == scan_ptr)))
        m.d.sync += [p1_valid.eq(0), p1.reinj.eq(0), p1.adj.eq(0)]
        with m.If(reinject):
            m.d.sync += [p1_valid.eq(1), p1_op.eq(p2_op), p1.reinj.eq(1)]
        with m.Elif(p0_valid):
            m.d.sync += [p1_valid.eq(1),
                         p1.adj.eq((p1_valid & (p1_op.kind == OpKind.PKT) & near1)
                                   | (q1_valid & (q1_op.kind == OpKind.PKT) & near2 & ~BYP2)),
                         p1_op.kind.eq(OpKind.PKT)]
            m.d.sync += [getattr(p1_op, f).eq(getattr(p0_op, f)) for f in (
                "checks", "rec", "seq", "seqm", "ts", "worker", "exp", "nelem", "base",
                "nbeats", "rewind") + (("covers", "ovf") if P.tree else ())
                + (("res", "sess_ok", "mine", "pfl") if P.leaf else ())]
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
                         p1_op.ts.eq(self.horizon)]
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

        # the reads (an initialization needs no metadata: it reads as a scan would)
        p1_md = self.p1_md
        for j in range(NJ):
            m.d.comb += [meta_rp[j, "p0"].addr.eq(self.hrec[j]),
                         meta_rp[j, "p2"].addr.eq(p2_op.rec[:LWM + 1]),
                         meta_rp[j, "scan"].addr.eq(scan_ptr[:LWM + 1])]
            m.d.sync += p1_md[j].eq(Mux(reinject, meta_rp[j, "p2"].data,
                                        Mux(p0_valid, meta_rp[j, "p0"].data,
                                            meta_rp[j, "scan"].data)))
        m.d.sync += self.w4_data.eq(w3.data)

        # which of the four P1a takes: P3's write register (``byp1``), w4 (``byp0``), or the
        # read of the record's job
        def by_src(from_p2, from_p0, from_scan):
            # the operation that enters P1a, in the priority order above
            return Mux(reinject, from_p2, Mux(p0_valid, from_p0, from_scan))
        b1, b0 = Signal(), Signal()
        m.d.comb += [
            b1.eq(self.v2 & by_src(1, near3, p2_op.rec == scan_ptr)),
            b0.eq(w3.en & by_src(w3.addr == p2_op.rec, self.w3_near, w3.addr == scan_ptr)),
        ]
        m.d.sync += [self.byp1.eq(b1), self.byp0.eq(b0)]
        return m
