"""P0 of the header pipeline: decodes a popped header from registers (see :mod:`.header`).

Ports::

    hdr, job_hit, job_hit_hi, sess_hit, hrec, wbit, body, len_short, short, sip, sport
                In: from :class:`~.header_pop.HeaderPop`
    jobs        In: the job table
    member      per job, an asynchronous read port on the member table (the source)
    near_rec    In: the records of the operations in P1a, P1b, P2 and P3's write
    checks      Out: the checks, in the model's priority order (:data:`~.slot.CHECK_REASONS`)
    rec, seqm   Out: the packet's record, and ``seq - 2W`` (the tag a reusable record has)
    near        Out: per ``near_rec``, the packet's record is that one
    src_eq      Out: per job, the member-table entry of the header's worker against the
                source (ip low, ip high, port), registered

A leaf (``CoreParams.leaf``; :mod:`.leaf`) also takes a RESULT for a job whose ``parent``
register is 1 (the model's ``_has_parent``: another RESULT is malformed at the type
check). Its source and session are checked in the slot rules, source first (the model's
``_from_parent``), so none of the DATA's later checks applies to it here; ``parent``
(In) is the parent's address, and these come out:

    res         Out: the header is a RESULT (of a job with a parent)
    res_sess_ok, res_mine
                Out: it carries the job's session; the parent's bitmap has the job's
                ``up_index`` bit (this switch's members are in the sum)
    par_eq      Out: the source against the parent's address (ip low, ip high, port),
                registered as ``src_eq``
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.fields import MsgType, VERSION

from .lanes import width_byte, width_checks
from .layout import HeaderLayout
from .params import CoreParams
from .regfile import job_layout, member_layout
from .slot import CHECK_REASONS, log2

__all__ = ["HeaderDecode", "NEAR"]

#: the records a decoded packet is compared with (``near``)
NEAR = 4


class HeaderDecode(wiring.Component):
    """See the module docstring."""

    def __init__(self, params: CoreParams):
        self.params = P = params
        NJ, LWM = P.jobs, log2(P.window)
        ws = 1 << log2(P.workers)
        super().__init__({
            "hdr": In(HeaderLayout),
            "job_hit": In(NJ), "job_hit_hi": In(NJ), "sess_hit": In(data.ArrayLayout(4, NJ)),
            "hrec": In(data.ArrayLayout(LWM + 1, NJ)), "wbit": In(data.ArrayLayout(33, NJ)),
            "body": In(signed(18)), "len_short": In(1), "short": In(1),
            "sip": In(32), "sport": In(16),
            "jobs": In(data.ArrayLayout(job_layout(), NJ)),
            "member": In(memory.ReadPort.Signature(
                addr_width=log2(NJ * ws), shape=member_layout(mac=False))).array(NJ),
            "near_rec": In(data.ArrayLayout(range(P.records), NEAR)),
            "checks": Out(len(CHECK_REASONS)), "rec": Out(range(P.records)),
            "seqm": Out(signed(34)), "near": Out(NEAR),
            "src_eq": Out(data.ArrayLayout(3, NJ)),
            **({"parent": In(data.StructLayout({"ip": 32, "port": 16})),
                "res": Out(1), "res_sess_ok": Out(1), "res_mine": Out(1),
                "par_eq": Out(3)} if P.leaf else {}),
        })

    def elaborate(self, platform):
        P = self.params
        NJ, R = P.jobs, P.records
        WS = 1 << log2(P.workers)          # member table stride per job
        LWS = log2(P.workers)
        m = Module()
        jobs, hdr, wbit = self.jobs, self.hdr, self.wbit
        # every job's candidate in parallel, then the matching job's (priority to the lowest)
        hits = [jobs[j].enable & self.job_hit[j] & self.job_hit_hi[j] for j in range(NJ)]
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
            recs.append(Cat(self.hrec[j], Const(j, range(max(2, NJ)))))
            seqms.append(hdr.seq - Cat(C(0, 1), wbit[j]))     # seq - 2W
        m.d.comb += [self.rec.eq(by_job(recs, range(R))),
                     # seq - 2W: the tag a reusable record must have
                     self.seqm.eq(by_job(seqms, signed(34)))]
        bad_worker = by_job([hdr.worker >= jobs[j].nworkers for j in range(NJ)], 1)
        big_nelem = by_job([hdr.nelem > jobs[j].elements for j in range(NJ)], 1)
        bad_session = by_job([~self.sess_hit[j].all() for j in range(NJ)], 1)
        # a spine: a child switch's DATA covers 1 .. the job's workers (the model's
        # drop_malformed, after the source and element checks)
        bad_count = (by_job([jobs[j].children & ((hdr.count == 0)
                                                 | (hdr.count > jobs[j].total_workers))
                             for j in range(NJ)], 1) if P.tree else C(0, 1))
        for k in range(NEAR):
            m.d.comb += self.near[k].eq(by_job([self.near_rec[k] == recs[j]
                                                for j in range(NJ)], 1))

        # the checks, in the model's priority order; P1a turns them into one reason
        # (the width byte: one the core does not take is malformed right after the type,
        # as in the model; an int32-only core takes only 0)
        body = self.body
        bad_width, nbytes, width_ne, _ = width_checks(P.widths, width_byte(hdr), hdr.nelem)
        not_data = hdr.type != MsgType.DATA
        if P.leaf:
            # a RESULT of a job with a parent goes on (its own checks are the slot rules')
            res = Signal()
            m.d.comb += res.eq((hdr.type == MsgType.RESULT) & ~unkjob
                               & by_job([jobs[j].parent for j in range(NJ)], 1))
            m.d.comb += [self.res.eq(res), self.res_sess_ok.eq(~bad_session),
                         self.res_mine.eq(by_job([hdr.bitmap.bit_select(jobs[j].up_index, 1)
                                                  for j in range(NJ)], 1))]
            not_data = not_data & ~res
            bad_session, bad_worker = bad_session & ~res, bad_worker & ~res
            big_nelem, bad_count, width_ne = big_nelem & ~res, bad_count & ~res, width_ne & ~res
            par = self.parent
            m.d.sync += self.par_eq.eq(Cat(par.ip[:16] == self.sip[:16],
                                           par.ip[16:] == self.sip[16:],
                                           par.port == self.sport))
        checks = (self.short | self.len_short,
                  hdr.version != VERSION,
                  (hdr.type == MsgType.STATUS_REQ) | (hdr.type == MsgType.CONTROL),
                  not_data | bad_width,
                  body < nbytes, body != nbytes,
                  unkjob, bad_session,
                  bad_worker,
                  big_nelem, bad_count,
                  width_ne)
        assert len(checks) == len(CHECK_REASONS)
        m.d.comb += self.checks.eq(Cat(checks))
        # member table: read in P0 by (job, worker) and compared with the source (in three
        # parts, registered); P1a picks the job's
        sip, sport = self.sip, self.sport
        for j in range(NJ):
            midx = j * WS + hdr.worker[:max(1, LWS)] if WS > 1 else j
            m.d.comb += self.member[j].addr.eq(midx)
            ipm, portm = self.member[j].data.ip, self.member[j].data.port
            m.d.sync += self.src_eq[j].eq(Cat(ipm[:16] == sip[:16], ipm[16:] == sip[16:],
                                              portm == sport))
        return m
