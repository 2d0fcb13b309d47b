"""Which simulator runs the RTL engine: cycles per second of the INA core (the RTL
engine's ``RTL_PARAMS``) in Verilator, Icarus and Amaranth's simulator, side by side in
one run; and the engine itself (Verilator, scoreboard included) under back-to-back DATA.

Per simulator, ``--reps`` repetitions (min / median / max): idle cycles (reset done, no
traffic: the same work for all three, the clock and every register's next state) as the
difference of two run lengths, so start-up and elaboration do not count; for Verilator
also busy cycles (every worker's packet for a slot back to back, results out). The
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


def verilator(P, reps, n_idle, n_slots):
    from ina_fabric.sim.verilator.core import RtlCore, load_job
    from ina_fabric.protocol import pack, MsgType
    from ina_fabric.protocol.jobtable import JobConfig
    core = RtlCore(P)
    idle, busy = [], []
    members = tuple(f"127.0.0.1:{20000 + w}" for w in range(4))
    load_job(core, JobConfig(1, members, window=P.window, elements=P.elements,
                             mcast=("239.1.1.1", 19900)), 0, 1 << 30)
    rng = np.random.default_rng(0)
    seq = 0
    for _ in range(reps):
        t = time.perf_counter()
        core.step(n_idle)
        idle.append(n_idle / (time.perf_counter() - t))
        dgrams = []
        for _ in range(n_slots):
            for w in range(4):
                el = rng.integers(-2 ** 20, 2 ** 20, P.elements).astype(np.int32)
                dgrams.append((pack(el, type=MsgType.DATA, job=1, worker=w, seq=seq),
                               ("127.0.0.1", 20000 + w)))
            seq += 1
        for d, s in dgrams:
            core.push(d, s)
        t = time.perf_counter()
        c0 = core.cycle
        core.run()
        busy.append((core.cycle - c0) / (time.perf_counter() - t))
        core.outputs()
    core.close()
    return {"idle_cycles_per_s": _mmm(idle), "busy_cycles_per_s": _mmm(busy),
            "build_or_load_s": round(core.build_seconds, 3)}


def icarus(P, reps, n1, n2):
    from ina_fabric.hw.ina.core import InaCore
    from ina_fabric.hw.ina.layout import in_layout
    from ina_fabric.sim.common import verilog_of
    with tempfile.TemporaryDirectory(prefix="ina-bench-rtl-") as d:
        d = pathlib.Path(d)
        v = verilog_of(InaCore(P), "ina_core", d / "ina_core.v")
        (d / "tb.v").write_text(TB.replace("{PAYLOAD}", str(in_layout(P.lanes).size)))
        times = {}
        for n in (n1, n2):
            subprocess.run(["iverilog", "-g2012", f"-DCYCLES={n}", "-o", str(d / f"sim{n}"),
                            str(v), str(d / "tb.v")], check=True, capture_output=True)
        out = []
        for _ in range(reps):
            for n in (n1, n2):
                t = time.perf_counter()
                subprocess.run(["vvp", "-n", str(d / f"sim{n}")], check=True,
                               capture_output=True)
                times[n] = time.perf_counter() - t
            out.append((n2 - n1) / max(1e-9, times[n2] - times[n1]))
    return {"idle_cycles_per_s": _mmm(out)}


def amaranth(P, reps, n1, n2):
    from amaranth.sim import Simulator
    from ina_fabric.hw.ina.core import InaCore
    out = []
    for _ in range(reps):
        times = {}
        for n in (n1, n2):
            core = InaCore(P)
            sim = Simulator(core)
            sim.add_clock(8e-9)

            async def tb(ctx, n=n):
                await ctx.tick().repeat(n)
            sim.add_testbench(tb)
            t = time.perf_counter()
            sim.run()
            times[n] = time.perf_counter() - t
        out.append((n2 - n1) / max(1e-9, times[n2] - times[n1]))
    return {"idle_cycles_per_s": _mmm(out)}


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
    sims["verilator"] = verilator(P, args.reps, int(200_000 * q), int(200 * q))
    if "icarus" not in skip:
        sims["icarus"] = icarus(P, args.reps, int(2_000 * q), int(12_000 * q))
    if "amaranth" not in skip:
        sims["amaranth"] = amaranth(P, args.reps, int(100 * q), int(600 * q))
    v = sims["verilator"]["idle_cycles_per_s"]["median"]
    for name, s in sims.items():
        s["verilator_over_this_idle"] = v / s["idle_cycles_per_s"]["median"]
        line = "  ".join(f"{k} {x['min']:,.0f} / {x['median']:,.0f} / {x['max']:,.0f}"
                         for k, x in s.items() if isinstance(x, dict))
        print(f"{name:10s} (min / median / max) {line}; verilator is "
              f"{s['verilator_over_this_idle']:.1f}x", flush=True)
    figs["engine"] = engine(P, int(800 * q))
    e = figs["engine"]
    print(f"engine (verilator + scoreboard): {e['datagrams_per_s']:,.0f} datagrams/s, "
          f"{e['cycles_per_packet']} cycles/packet (ideal {e['ideal_cycles_per_packet']}), "
          f"disagreements {e['disagreements']}")
    write("rtl", figs)
    return 0
