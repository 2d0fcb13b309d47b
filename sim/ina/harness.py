"""cocotb harness for the INA core: clock, reset, register access, and one loop that
drives the input stream and collects the output stream cycle by cycle."""

import json
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, ClockCycles

from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regs import (config_writes, counter_addr, job_reg_addr, COUNTER_NAMES,
                         GLOBAL_REGS, READ_LATENCY, WRITE_LATENCY)
from .beats import packers, in_payloads, beats_datagram
from .scoreboard import Scoreboard

__all__ = ["CoreTB", "params_from_env"]

SRC_IP = "10.0.0.254"


def params_from_env() -> CoreParams:
    return CoreParams(**json.loads(os.environ.get("INA_PARAMS", "{}")))


class CoreTB:
    def __init__(self, dut, params: CoreParams | None = None):
        self.dut = dut
        self.P = params or params_from_env()
        self.inp, self.outp = packers(self.P.lanes)
        cocotb.start_soon(Clock(dut.clk, 8, unit="ns").start())

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

    async def configure(self, jobs, deadlines=None):
        """Load JobConfigs; a bounded job's ``deadline`` is taken as cycles."""
        src = next(r.offset for r in GLOBAL_REGS if r.name == "src_ip")
        await self.write(src, int.from_bytes(bytes(int(x) for x in SRC_IP.split(".")), "big"))
        for k, cfg in enumerate(jobs):
            dl = max(1, round(cfg.deadline)) if cfg.mode == "bounded" else 1 << 30
            for addr, val in config_writes(cfg, k, clock_hz=1.0, window_max=self.P.window,
                                           elements_max=self.P.elements,
                                           workers_max=self.P.workers, deadline_cycles=dl):
                await self.write(addr, val)
            # the enable write lands, then the job's records are reset: enable reads 1
            await ClockCycles(self.dut.clk, WRITE_LATENCY)
            for _ in range(20 * self.P.window):
                if await self.read(job_reg_addr(k, "enable")):
                    break
            else:
                raise AssertionError(f"job {k}: enable still reads 0")

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
        it = iter(enumerate(traffic))
        cur, beats, bi, wait = None, [], 0, 0
        driving = False
        o_ready = 1
        obeats = []
        first_cycle = last_cycle = None
        idle = 0
        done_in = False
        unpack = self.outp.unpack
        while True:
            if not driving and not done_in:
                if cur is None or bi >= len(beats):
                    nxt = next(it, None)
                    if nxt is None:
                        done_in = True
                    else:
                        k, cur = nxt
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
            if driving and d.i__ready.value:
                now = int(d.now.value)
                if bi == 0:
                    sb.packet(cur[0], cur[1], now)
                    if first_cycle is None:
                        first_cycle = now
                last_cycle = now
                bi += 1
                driving = False
                d.i__valid.value = 0
            if o_ready and d.o__valid.value:
                v = d.o__payload.value
                if not v.is_resolvable:
                    dbg = {n: str(getattr(d, n).value) for n in ("run", "o_beat", "beat", "nbeats_out", "cur", "copies_left", "maddr")}
                    raise AssertionError(f"output payload has X/Z bits: {v} {dbg}")
                b = unpack(int(v))
                obeats.append(b)
                if b["last"]:
                    sb.output(beats_datagram(obeats, L), obeats[0])
                    obeats = []
                idle = 0
            else:
                idle += 1
            if done_in and not driving and idle > drain:
                break
        return first_cycle, last_cycle
