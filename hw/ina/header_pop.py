"""The header pipeline's first stage: pops the input FIFO and parses a packet's header
into registers (see :mod:`.header`).

Ports::

    head, avail, pop, pop_ptr   the input FIFO's head beat, pop
    wait        In: pops wait (a re-run packet, a job initializing)
    flush       In: P2 flushes the younger stages (a re-run); the position is reset
    queue_level In: requests queued; ``q_stop`` Out: nearly full (registered)
    jobs, now   In: the job table (the job and session match, the window), the time
    hdr         Out: the header words, as the header layout
    job_hit, job_hit_hi, sess_hit
                Out: per job, its job id (in two halves) and session (in quarters)
                against the header, registered at the pop
    hrec, wbit, nwm1
                Out: per job, the seq's record, W (``1 << log2 W``), N - 1
    ts, body, len_short, sip, sport, smac
                Out: the datagram's time, UDP length - header (and whether it is
                shorter than the header), source (IP, port, MAC)
    dec, short, rewind
                Out: a header to decode in P0 (a cycle after the pop of its last beat),
                cut short by its datagram's end, and the FIFO position of its first
                element beat
    elem        Out: popped beats, ``DEC_LAT`` cycles later (the element path's)
    horizon     Out: the scanner's time (that of the packet being received)
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.fields import HEADER_BYTES

from .element import beat_layout
from .input_fifo import entry_layout
from .layout import HeaderLayout
from .params import CoreParams, HEADER_WORDS, QUEUE_SLACK
from .regfile import job_layout
from .slot import DEC_LAT, record_of, log2

__all__ = ["HeaderPop"]


class HeaderPop(wiring.Component):
    """See the module docstring."""

    def __init__(self, params: CoreParams):
        self.params = P = params
        NJ, LWM = P.jobs, log2(P.window)
        super().__init__({
            "head": In(entry_layout(P.lanes)), "avail": In(1), "pop": Out(1), "pop_ptr": In(5),
            "wait": In(1), "flush": In(1),
            "queue_level": In(range(2 * P.queue + 1)), "q_stop": Out(1),
            "jobs": In(data.ArrayLayout(job_layout(), NJ)), "now": In(32),
            "hdr": Out(HeaderLayout),
            "job_hit": Out(NJ), "job_hit_hi": Out(NJ), "sess_hit": Out(data.ArrayLayout(4, NJ)),
            "hrec": Out(data.ArrayLayout(LWM + 1, NJ)), "wbit": Out(data.ArrayLayout(33, NJ)),
            "nwm1": Out(data.ArrayLayout(6, NJ)),
            "ts": Out(32), "body": Out(signed(18)), "len_short": Out(1), "sip": Out(32),
            "sport": Out(16), "smac": Out(48),
            "dec": Out(1), "short": Out(1), "rewind": Out(5),
            "elem": Out(beat_layout(P.lanes)), "horizon": Out(32),
        })

    def elaborate(self, platform):
        P = self.params
        L, H = P.lanes, P.header_beats
        NJ = P.jobs
        LWM = log2(P.window)
        m = Module()
        now, jobs = self.now, self.jobs
        # the request queue's room
        q_stop = self.q_stop    # see QUEUE_SLACK (entries in use never exceed requests held)
        m.d.sync += q_stop.eq(self.queue_level > P.queue - QUEUE_SLACK)

        b = self.head
        avail, pop = self.avail, self.pop
        m.d.comb += pop.eq(avail & ~self.wait & ~q_stop)
        # position in the datagram, kept as flags so the pop decision is shallow:
        # at_hdr[k]: the next beat (if not a first beat) is header beat k; in_hdr_r: it is a
        # header beat; posmh: its position minus H (the element beat index), saturating
        at_hdr = Signal(H, init=1)
        in_hdr_r = Signal(init=1)
        posmh = Signal(signed(18))
        hdr_regs = [Signal(32, name=f"hdr_w{k}") for k in range(HEADER_WORDS)]
        m.d.comb += self.hdr.eq(Cat(*reversed(hdr_regs)))
        # the header's job field: which word, which bits (from the generated layout)
        hdr_job = HeaderLayout["job"]
        JOB_WORD = HEADER_WORDS - 1 - hdr_job.offset // 32
        JOB_BIT = hdr_job.offset % 32
        assert JOB_BIT + hdr_job.width <= 32
        job_hit, job_hit_hi = self.job_hit, self.job_hit_hi
        # the header's session (two words): every job's compare, registered at the pop in
        # 16-bit quarters as the job match is, so P0 only ANDs four bits
        SESS_LO = HEADER_WORDS - 1 - HeaderLayout["session"].offset // 32
        assert HeaderLayout["session"].offset % 32 == 0 and HeaderLayout["session"].width == 64
        sess_hit = self.sess_hit
        # the header's seq word, and every job's record index for it (set bit, then the
        # slot's index), also registered at the pop: P0 reads the metadata at them
        SEQ_WORD = HEADER_WORDS - 1 - HeaderLayout["seq"].offset // 32
        assert HeaderLayout["seq"].offset % 32 == 0
        wbit, hrec = self.wbit, self.hrec
        ts_reg = self.ts
        body_reg, len_short = self.body, self.len_short   # UDP length - header, < header
        sip_reg, sport_reg = self.sip, self.sport
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
                         sport_reg.eq(b.src_port), self.smac.eq(b.src_mac)]
        m.d.sync += [dl[0].valid.eq(pop), dl[0].elem.eq(~in_hdr),
                     dl[0].first.eq(b.first), dl[0].e.eq(posmh[:16]), dl[0].data.eq(b.data)]
        m.d.sync += [dl[k].eq(dl[k - 1]) for k in range(1, DEC_LAT)]
        m.d.comb += self.elem.eq(dl[-1])
        horizon = Mux(collecting, ts_reg, Mux(avail, b.ts, now))
        m.d.comb += self.horizon.eq(horizon)

        # to P0: the header, decoded a cycle after the pop of its last beat
        m.d.sync += [self.dec.eq(dec), self.short.eq(~hdr_last),
                     self.rewind.eq(self.pop_ptr + 1)]
        # per-job window constants, registered from the static configuration (a job is
        # configured long before its first packet: enabling it takes 10W cycles)
        for j in range(NJ):
            m.d.sync += [wbit[j].eq(Const(1, 33) << jobs[j].log2_window),
                         self.nwm1[j].eq(jobs[j].nworkers - 1)]

        # flush: everything younger than a re-run packet is dropped
        with m.If(self.flush):
            m.d.sync += [self.dec.eq(0), at_hdr.eq(0), in_hdr_r.eq(0),
                         posmh.eq(0), collecting.eq(0)]
            m.d.sync += [d.valid.eq(0) for d in dl]
        return m
