"""The core's register file: the bus decoder, the job table, the member tables, and the
read side of every register (the table itself is data: :mod:`ina_fabric.protocol.regs`)."""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory
from amaranth.lib.wiring import In, Out

from .params import CoreParams
from .regs import (RegBus, GLOBAL_REGS, LEAF_GLOBAL_REGS, JOB_REGS, COUNTER_NAMES, COUNTER_BASE, JOB_BASE,
                   JOB_STRIDE, MEMBER_BASE, ID_VALUE)

__all__ = ["job_layout", "member_layout", "jobs_at", "RegisterFile", "TREE_JOB_REGS",
           "LEAF_JOB_REGS"]

#: the job registers of a spine (``CoreParams.tree``): constant 0 in a core without it
TREE_JOB_REGS = ("children", "total_workers")
#: the job registers of a leaf (``CoreParams.leaf``): constant 0 in a core without it
LEAF_JOB_REGS = ("parent", "up_index")


def _log2(n):
    return (n - 1).bit_length()


def job_layout() -> data.StructLayout:
    """One entry of the job table: every register of :data:`JOB_REGS`, at its width."""
    return data.StructLayout({r.name: r.width for r in JOB_REGS})


def member_layout(mac: bool) -> data.StructLayout:
    """One member-table entry as a read port shows it (``mac`` for the replicator's)."""
    return data.StructLayout({"ip": 32, "port": 16, **({"mac": 48} if mac else {})})


def jobs_at(jobs, name, idx):
    """Field ``name`` of the job table entry ``idx`` (a Value): a mux over the jobs of
    that field alone."""
    return Array(getattr(jobs[j], name) for j in range(len(jobs)))[idx]


class RegisterFile(wiring.Component):
    """Decodes the register bus (registered, then one registered strobe per register, so
    every decoder starts from flip-flops: a write lands two cycles after ``w_stb``) and
    reads in two registered steps (``r_data`` shows ``addr`` three cycles later).

    bus          the register bus (:data:`RegBus`)
    now          the cycle counter (a read-only register)
    counters     the counter values (:class:`~.counters.Counters`)
    jobs         the job table, one :func:`job_layout` entry per job, as registers
    src_ip       the ``src_ip`` register
    enable_stb   job j's ``enable`` is written (bit j); ``enable_value`` the bit written.
                 A write clears ``enable``; the job initializer queues or cancels the
                 job's reset and sets ``enable`` through ``enable_set`` when it is done
    member_p0    per job, a read port (asynchronous: distributed RAM) on the member
                 table at the job's entries, for the header pipeline's source check
    member_rd    a synchronous read port (with enable) for the replicator
    member_ctl   another, for the control plane (a live update compares the members)
    parent       a leaf's parent switch (``CoreParams.leaf``; 0 without it): ip, port, mac
    """

    def __init__(self, params: CoreParams):
        self.params = P = params
        self._ws = 1 << _log2(P.workers)        # member table stride per job
        aw = _log2(P.jobs * self._ws)
        super().__init__({
            "bus": In(RegBus),
            "now": In(32),
            "counters": In(data.ArrayLayout(32, len(COUNTER_NAMES))),
            "jobs": Out(data.ArrayLayout(job_layout(), P.jobs)),
            "src_ip": Out(32),
            "parent": Out(data.StructLayout({"ip": 32, "port": 16, "mac": 48})),
            "enable_stb": Out(P.jobs),
            "enable_value": Out(1),
            "enable_set": In(P.jobs),
            "member_p0": Out(memory.ReadPort.Signature(
                addr_width=aw, shape=member_layout(mac=False))).array(P.jobs),
            "member_rd": Out(memory.ReadPort.Signature(
                addr_width=aw, shape=member_layout(mac=True))),
            "member_ctl": Out(memory.ReadPort.Signature(
                addr_width=aw, shape=member_layout(mac=True))),
        })

    def elaborate(self, platform):
        P = self.params
        NJ, WS, L = P.jobs, self._ws, P.lanes
        LWS, LWM = _log2(P.workers), _log2(P.window)
        jobs = self.jobs
        m = Module()

        # member tables in distributed RAM: P0 reads them in the same cycle as the header
        dist = {"ram_style": "distributed"}
        m.submodules.mip = mip = memory.Memory(shape=32, depth=NJ * WS, init=[], attrs=dist)
        m.submodules.mport = mport = memory.Memory(shape=16, depth=NJ * WS, init=[],
                                                   attrs=dist)
        m.submodules.mmac = mmac = memory.Memory(shape=48, depth=NJ * WS, init=[])
        mip_w, mport_w, mmac_w = mip.write_port(), mport.write_port(), mmac.write_port()
        # P0 reads every job's entry for the header's worker (asynchronous)
        mip_rj = [mip.read_port(domain="comb") for _ in range(NJ)]
        mport_rj = [mport.read_port(domain="comb") for _ in range(NJ)]
        mip_r2, mport_r2, mmac_r2 = mip.read_port(), mport.read_port(), mmac.read_port()
        for j in range(NJ):
            p = self.member_p0[j]
            m.d.comb += [mip_rj[j].addr.eq(p.addr), mport_rj[j].addr.eq(p.addr),
                         p.data.ip.eq(mip_rj[j].data), p.data.port.eq(mport_rj[j].data)]
        p = self.member_rd
        for port in (mip_r2, mport_r2, mmac_r2):
            m.d.comb += [port.addr.eq(p.addr), port.en.eq(p.en)]
        m.d.comb += [p.data.ip.eq(mip_r2.data), p.data.port.eq(mport_r2.data),
                     p.data.mac.eq(mmac_r2.data)]
        mip_r3, mport_r3, mmac_r3 = mip.read_port(), mport.read_port(), mmac.read_port()
        p = self.member_ctl
        for port in (mip_r3, mport_r3, mmac_r3):
            m.d.comb += [port.addr.eq(p.addr), port.en.eq(p.en)]
        m.d.comb += [p.data.ip.eq(mip_r3.data), p.data.port.eq(mport_r3.data),
                     p.data.mac.eq(mmac_r3.data)]

        # the bus: registered on the way in, then decoded into one registered strobe
        # per register (a write lands two cycles later; reads show three cycles later),
        # so the decoders start from flip-flops and every write is one enable
        bus = Signal(data.StructLayout({"addr": 16, "w_stb": 1, "w_data": 32}))
        m.d.sync += [bus.addr.eq(self.bus.addr), bus.w_stb.eq(self.bus.w_stb),
                     bus.w_data.eq(self.bus.w_data)]
        wdata = Signal(32)
        m.d.sync += wdata.eq(bus.w_data)
        m.d.comb += self.enable_value.eq(wdata[0])

        def strobe(name, cond):
            s = Signal(name=f"wr_{name}")
            m.d.sync += s.eq(bus.w_stb & cond)
            return s
        mac_hi = Signal(16)
        madr = bus.addr - MEMBER_BASE
        m_in = (bus.addr >= MEMBER_BASE) & (bus.addr < MEMBER_BASE + NJ * 32 * 4)
        m_job, m_w, m_k = madr[7:7 + _log2(max(2, NJ))], madr[2:7], madr[0:2]
        m_ok = m_in & (m_w < P.workers)
        m_idx = Signal(range(NJ * WS))
        m.d.sync += m_idx.eq(m_job * WS + m_w[:max(1, LWS)] if WS > 1 else m_job)
        wr_m = [strobe(f"member_{k}", m_ok & (m_k == k)) for k in range(4)]
        m.d.comb += [
            mip_w.addr.eq(m_idx), mport_w.addr.eq(m_idx), mmac_w.addr.eq(m_idx),
            mip_w.data.eq(wdata), mport_w.data.eq(wdata), mmac_w.data.eq(Cat(wdata, mac_hi)),
            mip_w.en.eq(wr_m[0]), mport_w.en.eq(wr_m[1]), mmac_w.en.eq(wr_m[3]),
        ]
        with m.If(wr_m[2]):
            m.d.sync += mac_hi.eq(wdata)
        src_ip_addr = next(r.offset for r in GLOBAL_REGS if r.name == "src_ip")
        with m.If(strobe("src_ip", bus.addr == src_ip_addr)):
            m.d.sync += self.src_ip.eq(wdata)
        if P.leaf:      # the parent switch (a core without the leaf option: constant 0)
            par = self.parent
            goff = {r.name: r.offset for r in GLOBAL_REGS}
            par_mac_hi = Signal(16)
            with m.If(strobe("parent_ip", bus.addr == goff["parent_ip"])):
                m.d.sync += par.ip.eq(wdata)
            with m.If(strobe("parent_port", bus.addr == goff["parent_port"])):
                m.d.sync += par.port.eq(wdata)
            with m.If(strobe("parent_mac_hi", bus.addr == goff["parent_mac_hi"])):
                m.d.sync += par_mac_hi.eq(wdata)
            with m.If(strobe("parent_mac_lo", bus.addr == goff["parent_mac_lo"])):
                m.d.sync += par.mac.eq(Cat(wdata, par_mac_hi))
        for j in range(NJ):
            for r in JOB_REGS:
                if r.name in TREE_JOB_REGS and not P.tree:
                    continue        # (a core without the tree option: they stay 0)
                if r.name in LEAF_JOB_REGS and not P.leaf:
                    continue        # (nor the leaf's without the leaf option)
                wr = strobe(f"job{j}_{r.name}",
                            bus.addr == JOB_BASE + JOB_STRIDE * j + r.offset)
                if r.name == "enable":
                    # set by the job initializer when the job's reset is done; a write
                    # clears it (and queues or cancels the reset there)
                    m.d.comb += self.enable_stb[j].eq(wr)
                    with m.If(self.enable_set[j]):
                        m.d.sync += jobs[j].enable.eq(1)
                    with m.If(wr):
                        m.d.sync += jobs[j].enable.eq(0)
                else:
                    with m.If(wr):
                        m.d.sync += getattr(jobs[j], r.name).eq(wdata)

        # reads, in two registered steps (the registers of each group at the low
        # address bits, then the group), so ``r_data`` shows ``addr`` three cycles later
        def pad(values, n):
            return Array([*values, *[C(0, 32)] * (n - len(values))])
        glob = [C(ID_VALUE, 32), C(L | (NJ << 8) | (P.workers << 16) | (LWM << 24), 32),
                self.src_ip, self.now]
        if P.leaf:
            glob += [self.parent.ip, self.parent.port, self.parent.mac[32:],
                     self.parent.mac[:32]]
        NG = 1 << _log2(len(glob))
        NC = 1 << _log2(len(COUNTER_NAMES))
        NR = 1 << _log2(len(JOB_REGS))
        NJP = 1 << _log2(max(2, NJ))
        job_words = []
        for j in range(NJP):
            words = [getattr(jobs[j], r.name) for r in JOB_REGS] if j < NJ else []
            job_words += words + [C(0, 32)] * (NR - len(words))
        assert COUNTER_BASE % NC == 0 and NR == JOB_STRIDE and JOB_BASE % (NR * NJP) == 0
        # groups of at most 16 words, each read into a register at the low address bits
        groups = [pad(glob, NG)]
        cnt_words = [self.counters[k] for k in range(len(COUNTER_NAMES))]
        groups += [pad(cnt_words[k:k + 16], 16) for k in range(0, NC, 16)]
        groups += [Array(job_words[k:k + 16]) for k in range(0, len(job_words), 16)]
        bases = ([0] + [COUNTER_BASE + k for k in range(0, NC, 16)]
                 + [JOB_BASE + k for k in range(0, len(job_words), 16)])
        ends = ([len(glob)] + [COUNTER_BASE + min(k + 16, len(COUNTER_NAMES)) for k in range(0, NC, 16)]
                + [JOB_BASE + k + len(JOB_REGS) for k in range(0, len(job_words), 16)])
        rd_regs = [Signal(32, name=f"rd_group{g}") for g in range(len(groups))]
        rd_grp = Signal(range(len(groups) + 1))     # 0: no register there
        a_ = bus.addr
        sel = C(0, len(rd_grp))
        for g in reversed(range(len(groups))):
            m.d.sync += rd_regs[g].eq(groups[g][a_[:_log2(len(groups[g]))]])
            sel = Mux((a_ >= bases[g]) & (a_ < ends[g]), g + 1, sel)
        m.d.sync += rd_grp.eq(sel)
        with m.Switch(rd_grp):
            for g in range(len(groups)):
                with m.Case(g + 1):
                    m.d.sync += self.bus.r_data.eq(rd_regs[g])
            with m.Default():
                m.d.sync += self.bus.r_data.eq(0)
        return m
