"""cocotb harness for the INA core: clock, reset, register access, and one loop that
drives the input stream and collects the output stream cycle by cycle."""

import json
import os
import random
import re

from collections import deque

import cocotb
from cocotb.clock import Clock
from cocotb.handle import HierarchyObject
from cocotb.triggers import RisingEdge, ClockCycles

from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regs import (config_writes, counter_addr, job_reg_addr, COUNTER_NAMES,
                         GLOBAL_REGS, READ_LATENCY, WRITE_LATENCY, parent_writes)
from .beats import packers, in_payloads, beats_datagram
from .scoreboard import Scoreboard

__all__ = ["CoreTB", "params_from_env"]

SRC_IP = "10.0.0.254"


def params_from_env() -> CoreParams:
    return CoreParams(**json.loads(os.environ.get("INA_PARAMS", "{}")))


class AccCollisionMonitor:
    """Checks the claim behind ``ACC_COLLISION_DONT_CARE`` (hw/ina/synth.py): synthesis
    makes a read of the accumulator memory undefined when it meets the element path's
    write of the same word in the same cycle (simulation returns the old word), so no
    such read's data may be used.

    Sampled each rising edge (cocotb sees the values of the cycle that ends there):

    replicator  port ``acc_rd`` (top-level ``acc_rd__en``/``acc_rd__addr``; synchronous,
                output held while ``en`` is low): a read with ``en`` and
                ``addr == elem.acc_w__addr`` while ``elem.acc_w__en`` taints the port's
                data until the next enabled read. Its data is used while the replicator
                shows an element beat (``o__valid`` and ``replicator.o_beat >= H``: the
                beat's lanes are ``acc__data``). Such a cycle is a violation. Also
                logged: the fewest cycles from a word's last write to a used read of it
                (0 would be a collision).
    element     port ``acc_r`` (``elem.acc_r__addr``, ``en`` always 1): a collision in
                cycle r is by design; it must be forwarded, i.e. ``elem.e1_f2`` (E1 takes
                ``fw2_data``, the write of cycle r, not ``e1_ram``) must be set in r + 2.
    """

    def __init__(self, dut, P):
        self.dut, self.H = dut, P.header_beats
        self.rep_hits = self.rep_reads = self.elem_colls = 0
        self.min_gap = None         # fewest cycles from a word's last write to a used read
        self.violations = []        # (kind, cycle)

    def _elem(self):
        d = self.dut
        # the instance's name carries a number in the generated Verilog (elem$125)
        names = [k for k in d._keys() if re.fullmatch(r"elem(\$\d+)?", str(k).strip("\\"))
                 and isinstance(d[k], HierarchyObject)]
        assert len(names) == 1, f"element path instance: {names}"
        return d[names[0]]

    async def run(self):
        d = self.dut
        el, rep = self._elem(), d.replicator
        w_en, w_addr = el.acc_w__en, el.acc_w__addr
        r_addr, r_en, e1_f2 = el.acc_r__addr, el.acc_r__en, el.e1_f2
        rd_en, rd_addr = d.acc_rd__en, d.acc_rd__addr
        o_valid, o_beat = d.o__valid, rep.o_beat
        taint, gap = False, None
        written = {}                # address -> cycle of its last write
        ecoll = deque([False, False], maxlen=2)     # element-path collisions, r-1 and r-2
        while True:
            await RisingEdge(d.clk)
            we = w_en.value.is_resolvable and int(w_en.value) == 1
            wa = int(w_addr.value) if we else None
            now = int(d.now.value) if d.now.value.is_resolvable else -1
            # element path: the collision of cycle r-2 is forwarded in E1 now
            if ecoll[0] and not (e1_f2.value.is_resolvable and int(e1_f2.value)):
                self.violations.append(("element read not forwarded", now))
            ra = r_addr.value
            c = (we and int(r_en.value) == 1 and ra.is_resolvable and int(ra) == wa)
            self.elem_colls += c
            ecoll.append(c)
            # replicator: the data shown now comes from its last enabled read
            ov, ob = o_valid.value, o_beat.value
            if (taint and ov.is_resolvable and int(ov) and ob.is_resolvable
                    and int(ob) >= self.H):
                self.violations.append(("replicator used a colliding read", now))
            if ov.is_resolvable and int(ov) and ob.is_resolvable and int(ob) >= self.H \
                    and gap is not None:
                self.min_gap = gap if self.min_gap is None else min(self.min_gap, gap)
            if rd_en.value.is_resolvable and int(rd_en.value):
                a = rd_addr.value
                taint = we and a.is_resolvable and int(a) == wa
                w = written.get(int(a)) if a.is_resolvable else None
                gap = 0 if taint else None if w is None else now - w
                self.rep_reads += 1
                self.rep_hits += taint
            if we:
                written[wa] = now

    def check(self):
        self.dut._log.info(
            f"accumulator collisions: element path {self.elem_colls} (forwarded), "
            f"replicator reads {self.rep_reads}, of them colliding {self.rep_hits}, "
            f"closest used read {self.min_gap} cycles after the word's write, "
            f"violations {len(self.violations)}")
        assert not self.violations, (
            f"{len(self.violations)} accumulator read/write collision violations, "
            f"first: {self.violations[0][0]} at cycle {self.violations[0][1]}")


class CoreTB:
    def __init__(self, dut, params: CoreParams | None = None):
        self.dut = dut
        self.P = params or params_from_env()
        self.inp, self.outp = packers(self.P.lanes)
        cocotb.start_soon(Clock(dut.clk, 8, unit="ns").start())
        self.acc = AccCollisionMonitor(dut, self.P)
        cocotb.start_soon(self.acc.run())

    async def reset(self):
        d = self.dut
        d.rst.value = 1
        d.i__valid.value = 0
        d.i__payload.value = 0
        d.o__ready.value = 1
        d.cfg__w_stb.value = 0
        d.cfg__addr.value = 0
        d.cfg__w_data.value = 0
        await ClockCycles(d.clk, 3)
        d.rst.value = 0
        await RisingEdge(d.clk)

    async def write(self, addr, value):
        d = self.dut
        d.cfg__addr.value = addr
        d.cfg__w_data.value = value & 0xFFFFFFFF
        d.cfg__w_stb.value = 1
        await RisingEdge(d.clk)
        d.cfg__w_stb.value = 0

    async def read(self, addr):
        d = self.dut
        d.cfg__addr.value = addr
        # one edge more than the latency: cocotb reads the values from before the edge
        await ClockCycles(d.clk, READ_LATENCY + 1)
        return int(d.cfg__r_data.value)

    async def configure(self, jobs, deadlines=None, parent_mac=None):
        """Load JobConfigs; a bounded job's ``deadline`` is taken as cycles. A leaf core's
        parent (``CoreParams.leaf``): the jobs' ``parent``, at ``parent_mac``."""
        src = next(r.offset for r in GLOBAL_REGS if r.name == "src_ip")
        await self.write(src, int.from_bytes(bytes(int(x) for x in SRC_IP.split(".")), "big"))
        parents = {cfg.parent for cfg in jobs if cfg.parent is not None}
        assert len(parents) <= 1, f"one parent per core, not {parents}"
        for parent in parents:
            for addr, val in parent_writes(parent, parent_mac):
                await self.write(addr, val)
        for k, cfg in enumerate(jobs):
            dl = max(1, round(cfg.deadline)) if cfg.mode == "bounded" else 1 << 30
            for addr, val in config_writes(cfg, k, clock_hz=1.0, window_max=self.P.window,
                                           elements_max=self.P.elements,
                                           workers_max=self.P.workers, deadline_cycles=dl,
                                           tree=self.P.tree, leaf=self.P.leaf):
                await self.write(addr, val)
            # the enable write lands, then the job's records are reset: enable reads 1
            await ClockCycles(self.dut.clk, WRITE_LATENCY)
            for _ in range(20 * self.P.window):
                if await self.read(job_reg_addr(k, "enable")):
                    break
            else:
                raise AssertionError(f"job {k}: enable still reads 0")

    async def preload_tags(self, job_index: int, tags: dict):
        """Backdoor: set slot records of job ``job_index`` (its place in the job table)
        to complete, empty records holding ``tags`` ({(set, index): seq}), as if the job
        had run up to there (the front door would need up to 2^32 sequence numbers).
        Writes the header pipeline's metadata memory (``meta<j>``, in its ``SlotIssue``
        stage) through the simulator;
        call it after :meth:`configure` and before traffic. ``Scoreboard.preload_tags``
        does the same to the model. The deadline scanner writes back each record it
        visits (its read of the old word may be in flight), so the words are written
        twice, 8 cycles apart (longer than the pipeline)."""
        from ina_fabric.hw.ina.header import meta_layout
        lay = meta_layout(self.P)
        mem = getattr(self.dut.header.issue, f"meta{job_index}")
        fields = {n: (f.offset, f.width) for n, f in lay}
        words = {}
        for (st, idx), tag in tags.items():
            word = 0
            for name, v in (("tag", tag), ("complete", 1), ("exponent", -128)):
                off, width = fields[name]
                word |= (v & ((1 << width) - 1)) << off
            words[st * self.P.window + idx] = word
        for _ in range(2):
            for a, word in words.items():
                mem[a].value = word
            await ClockCycles(self.dut.clk, 8)

    async def counters(self) -> dict:
        return {n: await self.read(counter_addr(n)) for n in COUNTER_NAMES}

    async def run(self, traffic, sb: Scoreboard, *, seed=0, gap=0.0, backpressure=0.0,
                  drain=2000, gaps=None):
        """Send ``traffic`` ([(datagram, source)]); ``gaps[k]`` idle cycles before packet k
        (or random idles with probability ``gap``). Every accepted datagram goes to the
        scoreboard's model at its first-beat cycle; every output datagram to its
        checker. Returns (first_cycle, last_cycle) of the input beats."""
        d = self.dut
        rng = random.Random(seed)
        L = self.P.lanes
        clk = d.clk
        # (by index: a scoreboard that closes a loop, ``taken`` and ``cycle_hook``, may
        # insert datagrams behind the one being sent: sim/ina/tree_leaf.py)
        pos = 0
        taken = getattr(sb, "taken", None)
        cycle_hook = getattr(sb, "cycle_hook", None)
        cur, beats, bi, wait = None, [], 0, 0
        driving = False
        o_ready = 1
        obeats = []
        first_cycle = last_cycle = None
        idle = 0
        done_in = False
        unpack = self.outp.unpack
        # optional timing hooks (``Scoreboard.timing``: see sim/ina/coverage.py): the
        # cycle count runs with ``now`` (the value cocotb reads at an edge is the cycle
        # that ends there)
        timing = getattr(sb, "timing", None)
        on_last = getattr(sb, "packet_last", None)
        on_out = getattr(sb, "output_first", None)
        cyc = int(d.now.value) if d.now.value.is_resolvable else 0
        o_first = None
        while True:
            if done_in and pos < len(traffic):
                done_in = False
            if not driving and not done_in:
                if cur is None or bi >= len(beats):
                    if pos >= len(traffic):
                        done_in = True
                    else:
                        k, cur = pos, traffic[pos]
                        pos += 1
                        if taken is not None:
                            taken(k)
                        beats = in_payloads(cur[0], cur[1], L, self.inp)
                        bi = 0
                        wait = gaps[k] if gaps else 0
                if not done_in:
                    if wait > 0:
                        wait -= 1
                    elif gap and rng.random() < gap:
                        pass
                    else:
                        d.i__payload.value = beats[bi]
                        d.i__valid.value = 1
                        driving = True
            if backpressure:
                o_ready = 0 if rng.random() < backpressure else 1
                d.o__ready.value = o_ready
            await RisingEdge(clk)
            cyc += 1
            if cycle_hook is not None:
                cycle_hook(cyc)
            if timing is not None:
                ov = d.o__valid.value
                timing.cycle(cyc, bool(ov.is_resolvable and int(ov)), o_ready)
            if driving and d.i__ready.value:
                now = int(d.now.value)
                assert timing is None or now == cyc, f"cycle count {cyc} != now {now}"
                if bi == 0:
                    sb.packet(cur[0], cur[1], now)
                    if first_cycle is None:
                        first_cycle = now
                last_cycle = now
                idle = 0        # the drain counts from the last input or output
                bi += 1
                if bi == len(beats) and on_last is not None:
                    on_last(now)
                driving = False
                d.i__valid.value = 0
            if o_ready and d.o__valid.value:
                v = d.o__payload.value
                if not v.is_resolvable:
                    dbg = {n: str(getattr(d, n).value) for n in ("run", "o_beat", "beat", "nbeats_out", "cur", "copies_left", "maddr")}
                    raise AssertionError(f"output payload has X/Z bits: {v} {dbg}")
                b = unpack(int(v))
                obeats.append(b)
                if b["first"]:
                    o_first = cyc
                if b["last"]:
                    if on_out is not None:
                        on_out(o_first)
                    sb.output(beats_datagram(obeats, L)[:obeats[0]["length"]], obeats[0])
                    obeats = []
                idle = 0
            else:
                idle += 1
            if done_in and not driving and idle > drain:
                break
        return first_cycle, last_cycle
