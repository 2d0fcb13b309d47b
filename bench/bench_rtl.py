"""Which simulator runs the RTL engine: cycles per second of the INA core (the RTL
engine's ``RTL_PARAMS``) in Verilator, Icarus and Amaranth's simulator, side by side in
one run; and the engine itself (Verilator, scoreboard included) under back-to-back DATA.

``--reps`` rounds, the simulators interleaved within each round (so a machine that gets
busier hurts all alike); min / median / max over the rounds, and the per-round ratios of
Verilator's speed to each other's: idle cycles (reset done, no traffic: the same work
for all three, the clock and every register's next state) as the difference of two run
lengths, so start-up and elaboration do not count; for Verilator also busy cycles (every
worker's packet for a slot back to back, results out). The
engine's figures: datagrams per second through ``RtlSwitchModel.process_batch`` (the
core, the model beside it, every output and counter compared), cycles per packet and
the ideal. Writes ``rtl.json``.
"""

import pathlib
import statistics
import subprocess
import tempfile
import time

import numpy as np

from ina_fabric.bench._results import write

TB = """`timescale 1ns/1ps
module tb;
  reg clk = 0, rst = 1;
  ina_core dut(.clk(clk), .rst(rst), .i__valid(1'b0), .i__payload({PAYLOAD}'d0),
               .o__ready(1'b1), .cfg__addr(16'd0), .cfg__w_stb(1'b0), .cfg__w_data(32'd0));
  always #4 clk = ~clk;
  initial begin
    #20 rst = 0;
    #(8 * `CYCLES) $finish;
  end
endmodule
"""


def _mmm(xs):
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


class Verilator:
    def __init__(self, P, n_idle, n_slots):
        from ina_fabric.hw.verilator.core import RtlCore, load_job
        from ina_fabric.protocol.jobtable import JobConfig
        self.P, self.n_idle, self.n_slots = P, n_idle, n_slots
        self.core = RtlCore(P)
        members = tuple(f"127.0.0.1:{20000 + w}" for w in range(4))
        load_job(self.core, JobConfig(1, members, window=P.window, elements=P.elements,
                                      mcast=("239.1.1.1", 19900)), 0, 1 << 30)
        self.rng = np.random.default_rng(0)
        self.seq = 0

    def idle(self):
        t = time.perf_counter()
        self.core.step(self.n_idle)
        return self.n_idle / (time.perf_counter() - t)

    def busy(self):
        from ina_fabric.protocol import pack, MsgType
        core = self.core
        for _ in range(self.n_slots):
            for w in range(4):
                el = self.rng.integers(-2 ** 20, 2 ** 20, self.P.elements).astype(np.int32)
                core.push(pack(el, type=MsgType.DATA, job=1, worker=w, seq=self.seq),
                          ("127.0.0.1", 20000 + w))
            self.seq += 1
        t = time.perf_counter()
        c0 = core.cycle
        core.run()
        rate = (core.cycle - c0) / (time.perf_counter() - t)
        core.outputs()
        return rate


class Icarus:
    def __init__(self, P, n1, n2):
        from ina_fabric.hw.ina.core import InaCore
        from ina_fabric.hw.ina.layout import in_layout
        from ina_fabric.sim.common import verilog_of
        self._tmp = tempfile.TemporaryDirectory(prefix="ina-bench-rtl-")
        d = self.d = pathlib.Path(self._tmp.name)
        v = verilog_of(InaCore(P), "ina_core", d / "ina_core.v")   # (Icarus's fix-ups)
        (d / "tb.v").write_text(TB.replace("{PAYLOAD}", str(in_layout(P.lanes).size)))
        self.ns = (n1, n2)
        for n in self.ns:
            subprocess.run(["iverilog", "-g2012", f"-DCYCLES={n}", "-o", str(d / f"sim{n}"),
                            str(v), str(d / "tb.v")], check=True, capture_output=True)

    def idle(self):
        times = {}
        for n in self.ns:
            t = time.perf_counter()
            subprocess.run(["vvp", "-n", str(self.d / f"sim{n}")], check=True,
                           capture_output=True)
            times[n] = time.perf_counter() - t
        n1, n2 = self.ns
        return (n2 - n1) / max(1e-9, times[n2] - times[n1])


class AmaranthSim:
    def __init__(self, P, n1, n2):
        self.P, self.ns = P, (n1, n2)

    def idle(self):
        from amaranth.sim import Simulator
        from ina_fabric.hw.ina.core import InaCore
        times = {}
        for n in self.ns:
            sim = Simulator(InaCore(self.P))
            sim.add_clock(8e-9)

            async def tb(ctx, n=n):
                await ctx.tick().repeat(n)
            sim.add_testbench(tb)
            t = time.perf_counter()
            sim.run()
            times[n] = time.perf_counter() - t
        n1, n2 = self.ns
        return (n2 - n1) / max(1e-9, times[n2] - times[n1])


def engine(P, n_slots):
    from ina_fabric.host.switch.rtl import RtlSwitchModel
    from ina_fabric.protocol import pack, MsgType
    from ina_fabric.protocol.jobtable import JobConfig
    m = RtlSwitchModel(params=P)
    members = tuple(f"127.0.0.1:{20000 + w}" for w in range(4))
    m.add_job(JobConfig(1, members, window=P.window, elements=P.elements,
                        mcast=("239.1.1.1", 19900)))
    rng = np.random.default_rng(1)
    n, t = 0, time.perf_counter()
    for base in range(0, n_slots, P.window):
        batch = []
        for seq in range(base, min(n_slots, base + P.window)):
            for w in range(4):
                el = rng.integers(-2 ** 20, 2 ** 20, P.elements).astype(np.int32)
                batch.append((pack(el, type=MsgType.DATA, job=1, worker=w, seq=seq),
                              ("127.0.0.1", 20000 + w)))
        n += len(batch)
        m.process_batch(batch, 0.0)
    secs = time.perf_counter() - t
    st = m.rtl_stats()
    m.close()
    return {"datagrams_per_s": n / secs, "datagrams": n,
            "cycles_per_packet": st["cycles_per_packet"],
            "ideal_cycles_per_packet": st["ideal_cycles_per_packet"],
            "disagreements": st["disagreements"]}


def main(argv=()):
    import argparse
    ap = argparse.ArgumentParser(prog="ina bench rtl", description=__doc__.strip())
    ap.add_argument("--reps", type=int, default=3, help="repetitions per simulator")
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    ap.add_argument("--skip", default="", help="comma-separated simulators to leave out "
                    "(icarus, amaranth)")
    args = ap.parse_args(list(argv))
    from ina_fabric.host.switch.rtl import rtl_params, why_not
    why = why_not()
    if why:
        ap.error(why)
    P = rtl_params()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    q = 0.2 if args.quick else 1.0
    figs = {"params": P.__dict__, "simulators": {}}
    sims = figs["simulators"]
    print(f"core: {P.describe()}", flush=True)
    v = Verilator(P, int(200_000 * q), int(200 * q))
    others = {}
    if "icarus" not in skip:
        others["icarus"] = Icarus(P, int(2_000 * q), int(12_000 * q))
    if "amaranth" not in skip:
        others["amaranth"] = AmaranthSim(P, int(100 * q), int(600 * q))
    idle = {name: [] for name in ["verilator", *others]}
    busy = []
    for _ in range(args.reps):          # interleaved: one of each per round
        idle["verilator"].append(v.idle())
        busy.append(v.busy())
        for name, sim in others.items():
            idle[name].append(sim.idle())
    v.core.close()
    for name, xs in idle.items():
        sims[name] = {"idle_cycles_per_s": _mmm(xs)}
        ratios = [a / b for a, b in zip(idle["verilator"], xs)]
        sims[name]["verilator_over_this_idle"] = _mmm(ratios)
    sims["verilator"]["busy_cycles_per_s"] = _mmm(busy)
    sims["verilator"]["build_or_load_s"] = round(v.core.build_seconds, 3)
    for name, s in sims.items():
        line = "  ".join(f"{k} {x['min']:,.1f} / {x['median']:,.1f} / {x['max']:,.1f}"
                         for k, x in s.items() if isinstance(x, dict))
        print(f"{name:10s} (min / median / max) {line}", flush=True)
    figs["engine"] = engine(P, int(800 * q))
    e = figs["engine"]
    print(f"engine (verilator + scoreboard): {e['datagrams_per_s']:,.0f} datagrams/s, "
          f"{e['cycles_per_packet']} cycles/packet (ideal {e['ideal_cycles_per_packet']}), "
          f"disagreements {e['disagreements']}")
    write("rtl", figs)
    return 0
