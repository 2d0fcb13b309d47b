"""Bench of :class:`~ina_fabric.hw.ina.regfile.RegisterFile`: random bus writes and reads
(every register of the table, the member tables, addresses between and beyond them, jobs
past the core's), random idle cycles on the bus, random counters, ``now`` and
``enable_set`` pulses, against a model of the register table
(:mod:`ina_fabric.protocol.regs`: widths, the ``enable`` rule, ``WRITE_LATENCY`` and
``READ_LATENCY``). Every cycle the bench checks ``r_data``, the job table, ``src_ip``,
``enable_stb``/``enable_value`` and the three member-table read ports (the asynchronous
per-job ports, and the synchronous ones with their enables)."""

import cocotb

from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regfile import TREE_JOB_REGS, LEAF_JOB_REGS, job_layout
from ina_fabric.protocol.regs import (COUNTER_BASE, COUNTER_NAMES, GLOBAL_REGS, ID_VALUE,
                                      JOB_BASE, JOB_REGS, JOB_STRIDE, MEMBER_BASE,
                                      READ_LATENCY, WRITE_LATENCY)
from ina_fabric.sim.bench import Bench, bench_params, unpack

M32 = 0xFFFFFFFF
WIDTH = {r.name: r.width for r in JOB_REGS}
SRC_IP = next(r.offset for r in GLOBAL_REGS if r.name == "src_ip")
#: a leaf's parent registers (CoreParams.leaf), by address
PARENT_REGS = {r.offset: r.name for r in GLOBAL_REGS if r.name.startswith("parent_")}


def _log2(n):
    return (n - 1).bit_length()


def rand_addr(rng, P):
    """An address of the table (most of the time), or one near or past it."""
    NJ, NC = P.jobs, len(COUNTER_NAMES)
    k = rng.random()
    if k < 0.15:
        return rng.randrange(12)                        # the globals, and past them
    if k < 0.25:
        return COUNTER_BASE + rng.randrange(NC + 4)     # the counters, and past them
    if k < 0.6:
        return JOB_BASE + JOB_STRIDE * rng.randrange(NJ + 1) + rng.randrange(JOB_STRIDE)
    if k < 0.9:                                         # members, some past the workers
        w = rng.randrange(32) if rng.random() < 0.3 else rng.randrange(P.workers)
        return MEMBER_BASE + 4 * (32 * rng.randrange(NJ + 1) + w) + rng.randrange(4)
    return rng.getrandbits(16)


class Model:
    """The register file's state, edge by edge: the bus register, the decoded strobe and
    read register, then the registers."""

    def __init__(self, P):
        self.P = P
        self.ws = 1 << _log2(P.workers)
        self.jobs = [{r.name: 0 for r in JOB_REGS} for _ in range(P.jobs)]
        self.src_ip = 0
        self.mac_hi = 0
        #: a leaf's parent registers (CoreParams.leaf): ip, port, mac (its top latched)
        self.par = {"ip": 0, "port": 0, "mac": 0, "mac_hi": 0}
        n = P.jobs * self.ws
        self.mip, self.mport, self.mmac = [0] * n, [0] * n, [0] * n
        self.bus1 = {"addr": 0, "w_stb": 0, "w_data": 0}     # the bus register
        self.wr2 = None             # the decoded strobe: (what, addr) and its data
        self.wdata = 0
        self.rd2 = 0                # the read register (group value)
        self.r_data = 0
        # a synchronous port's data: None before its first enabled read (X on Icarus)
        self.rd_port = {"member_rd": None, "member_ctl": None}

    def target(self, addr):
        """What a write at ``addr`` lands in: ("src_ip",), ("job", j, name),
        ("member", idx, k) or None."""
        P = self.P
        if addr == SRC_IP:
            return ("src_ip",)
        if P.leaf and addr in PARENT_REGS:
            return ("parent", PARENT_REGS[addr])
        j, off = divmod(addr - JOB_BASE, JOB_STRIDE)
        if 0 <= j < P.jobs and addr >= JOB_BASE:
            r = next((r for r in JOB_REGS if r.offset == off), None)
            if r is not None and r.name in TREE_JOB_REGS and not P.tree:
                return None         # a spine's registers: constant 0 without the option
            if r is not None and r.name in LEAF_JOB_REGS and not P.leaf:
                return None         # a leaf's, without its option
            return ("job", j, r.name) if r else None
        if MEMBER_BASE <= addr < MEMBER_BASE + P.jobs * 32 * 4:
            madr = addr - MEMBER_BASE
            job, w, k = madr >> 7, (madr >> 2) & 31, madr & 3
            if w < P.workers:
                return ("member", job * self.ws + (w & (self.ws - 1)) if self.ws > 1
                        else job, k)
        return None

    def read(self, addr, counters, now):
        P = self.P
        if addr < len(GLOBAL_REGS):
            L, NJ, LWM = P.lanes, P.jobs, _log2(P.window)
            par = self.par
            leaf = ([par["ip"], par["port"], par["mac"] >> 32, par["mac"] & 0xFFFFFFFF]
                    if P.leaf else [0] * 4)     # (constant 0 without the leaf option)
            return [ID_VALUE, L | (NJ << 8) | (P.workers << 16) | (LWM << 24),
                    self.src_ip, now, *leaf][addr]
        if COUNTER_BASE <= addr < COUNTER_BASE + len(COUNTER_NAMES):
            return counters[addr - COUNTER_BASE]
        j, off = divmod(addr - JOB_BASE, JOB_STRIDE)
        if addr >= JOB_BASE and j < P.jobs and off < len(JOB_REGS):
            return self.jobs[j][JOB_REGS[off].name]
        return 0

    def edge(self, bus, counters, now, enable_set, rd_in):
        """One rising edge with these inputs (this cycle's)."""
        # synchronous member reads: the contents before the edge
        for name, (en, addr) in rd_in.items():
            if en:
                self.rd_port[name] = (self.mip[addr], self.mport[addr], self.mmac[addr])
        # the read register samples the registers before the edge
        rd2 = self.read(self.bus1["addr"], counters, now)
        # the registers, from the decoded strobe (set by the edge before)
        for j in range(self.P.jobs):
            if enable_set >> j & 1:
                self.jobs[j]["enable"] = 1
        if self.wr2 is not None:
            t, d = self.wr2, self.wdata
            if t[0] == "src_ip":
                self.src_ip = d
            elif t[0] == "parent":
                name = t[1]
                if name == "parent_ip":
                    self.par["ip"] = d
                elif name == "parent_port":
                    self.par["port"] = d & 0xFFFF
                elif name == "parent_mac_hi":
                    self.par["mac_hi"] = d & 0xFFFF
                else:
                    self.par["mac"] = d | (self.par["mac_hi"] << 32)
            elif t[0] == "job":
                self.jobs[t[1]][t[2]] = 0 if t[2] == "enable" else d & ((1 << WIDTH[t[2]]) - 1)
            else:
                idx, k = t[1], t[2]
                if k == 0:
                    self.mip[idx] = d
                elif k == 1:
                    self.mport[idx] = d & 0xFFFF
                elif k == 2:
                    self.mac_hi = d & 0xFFFF
                else:
                    self.mmac[idx] = d | (self.mac_hi << 32)
        self.r_data = self.rd2
        self.rd2 = rd2
        self.wr2 = self.target(self.bus1["addr"]) if self.bus1["w_stb"] else None
        self.wdata = self.bus1["w_data"]
        self.bus1 = dict(bus)


@cocotb.test()
async def test_register_file(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    assert (WRITE_LATENCY, READ_LATENCY) == (2, 3), "the model's pipeline"
    NJ, NC = P.jobs, len(COUNTER_NAMES)
    b = Bench(dut, seed=p["seed"])
    rng = b.rng
    JL = job_layout()
    JS = sum(WIDTH.values())
    m = Model(P)
    naddr = NJ * m.ws
    ports = ["member_rd", "member_ctl"]
    await b.reset(bus__addr=0, bus__w_stb=0, bus__w_data=0, now=0, counters=0, enable_set=0,
                  **{f"{q}__{f}": 0 for q in ports for f in ("addr", "en")},
                  **{f"member_p0__{j}__addr": 0 for j in range(NJ)})
    m.edge({"addr": 0, "w_stb": 0, "w_data": 0}, [0] * NC, 0, 0,
           {q: (0, 0) for q in ports})     # the edge after the reset
    # a write to every job register first (and a member of each job): the rest random
    script = [(JOB_BASE + JOB_STRIDE * j + r.offset, 1) for j in range(NJ) for r in JOB_REGS]
    script += [(MEMBER_BASE + 4 * 32 * j + k, 1) for j in range(NJ) for k in range(4)]
    ops = mem_reads = 0
    for cyc in range(p["n"]):
        if rng.random() < p["idle"]:
            bus = {"addr": rand_addr(rng, P), "w_stb": 0, "w_data": rng.getrandbits(32)}
        elif script:
            a, _ = script.pop(0)
            bus = {"addr": a, "w_stb": 1, "w_data": rng.getrandbits(32)}
        else:
            bus = {"addr": rand_addr(rng, P), "w_stb": int(rng.random() < p.get("writes", 0.5)),
                   "w_data": rng.getrandbits(32)}
        ops += bus["w_stb"]
        counters = [rng.getrandbits(32) for _ in range(NC)]
        now = rng.getrandbits(32)
        enable_set = 0
        if rng.random() < 0.05:
            enable_set = 1 << rng.randrange(NJ)
        rd_in = {q: (rng.getrandbits(1), rng.randrange(naddr)) for q in ports}
        p0 = [rng.randrange(naddr) for _ in range(NJ)]
        for k, v in bus.items():
            b.wr(f"bus__{k}", v)
        b.wr("counters", sum(c << (32 * k) for k, c in enumerate(counters)))
        b.wr("now", now)
        b.wr("enable_set", enable_set)
        for q in ports:
            b.wr(f"{q}__en", rd_in[q][0])
            b.wr(f"{q}__addr", rd_in[q][1])
        for j in range(NJ):
            b.wr(f"member_p0__{j}__addr", p0[j])
        # the combinational outputs of this cycle: the enable strobe and the P0 reads
        await b.settle()
        t = m.wr2
        stb = (1 << t[1]) if t is not None and t[0] == "job" and t[2] == "enable" else 0
        assert b.rd("enable_stb") == stb, f"cycle {cyc}: enable_stb"
        if stb:
            assert b.rd("enable_value") == m.wdata & 1, f"cycle {cyc}: enable_value"
        for j in range(NJ):
            got = b.rd(f"member_p0__{j}__data")
            want = m.mip[p0[j]] | (m.mport[p0[j]] << 32)
            assert got == want, f"cycle {cyc}: member_p0[{j}] at {p0[j]}: {got:#x} != {want:#x}"
        await b.step()
        # the registered outputs as the edge found them (the model before the edge)
        assert b.rd("bus__r_data") == m.r_data, \
            f"cycle {cyc}: r_data {b.rd('bus__r_data'):#x} != {m.r_data:#x}"
        assert b.rd("src_ip") == m.src_ip, f"cycle {cyc}: src_ip"
        v = b.rd("jobs")
        for j in range(NJ):
            got = unpack(JL, (v >> (JS * j)) & ((1 << JS) - 1))
            assert got == m.jobs[j], f"cycle {cyc}: job {j}: {got} != {m.jobs[j]}"
        for q in ports:
            if m.rd_port[q] is None:
                continue
            ip, port, mac = m.rd_port[q]
            got = b.rd(f"{q}__data")
            assert got == ip | (port << 32) | (mac << 48), f"cycle {cyc}: {q}"
            mem_reads += rd_in[q][0]
        m.edge(bus, counters, now, enable_set, rd_in)
    assert ops > p["n"] // 4 and mem_reads > p["n"] // 4, (ops, mem_reads)
