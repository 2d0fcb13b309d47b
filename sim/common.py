"""Shared helpers for cocotb benches: Amaranth to Verilog, then Icarus via cocotb_tools.

    from ina_fabric.sim.common import run_cocotb
    run_cocotb(component, toplevel="ina_core", test_module="ina_fabric.sim.ina.tb_core",
               name="core_L1", env={"SEED": "1"})

Each call builds in its own directory ``build/sim/<name>`` under the current directory (so pytest-xdist workers never
share one). With ``INA_WAVES=1`` in the environment, waves are written and the file's path
is printed. Raises AssertionError when a cocotb test fails.
"""

import os
import pathlib
import re
import sys

__all__ = ["ROOT", "BUILD", "run_cocotb", "verilog_of", "waves_enabled"]

import ina_fabric
from ina_fabric.paths import BUILD_DIR

#: the folder that holds the ``ina_fabric`` package (the checkout, or site-packages):
#: on PYTHONPATH for the simulator's embedded Python
ROOT = pathlib.Path(ina_fabric.__file__).resolve().parents[1]
#: each bench builds in BUILD/<name>, under the current directory
BUILD = BUILD_DIR.resolve() / "sim"


def waves_enabled() -> bool:
    return os.environ.get("INA_WAVES", "") not in ("", "0")


def verilog_of(component, toplevel: str, path: pathlib.Path) -> pathlib.Path:
    """Write the Verilog of an Amaranth component (all its ports) to ``path``."""
    from amaranth.back import verilog
    path.parent.mkdir(parents=True, exist_ok=True)
    text = kick_comb(verilog.convert(component, name=toplevel, emit_src=False,
                                      ports=_ports(component)))
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _ports(component):
    """A component's ports for the Verilog, without the constant ones (an
    ``always_ready`` stream's ``ready``); None (all of them) when none is constant."""
    from amaranth.hdl import Const, Value
    from amaranth.hdl._ir import PortDirection
    from amaranth.lib import wiring
    if not isinstance(component, wiring.Component):
        return None
    flat = list(component.signature.flatten(component))
    if not any(isinstance(v, Const) for _, _, v in flat):
        return None
    return {"__".join(map(str, path)): (Value.cast(v), PortDirection.Input
                                         if m.flow == wiring.In else PortDirection.Output)
            for path, m, v in flat if not isinstance(v, Const)}


_TRIGGER = re.compile(r"^\s*reg (\\\$auto\$verilog_backend[^ ]*) += 0;", re.M)
_ONE_LINER = re.compile(r"always @\*\n(\s+)([^\n]*;)\n")


def kick_comb(text: str) -> str:
    """Icarus does not run ``always @*`` at time 0. Yosys makes its multi-line blocks
    read a trigger register (initialized to 0, so it changes at time 0), but not the
    one-line blocks, whose outputs then read X until an input changes. Give them the
    same trigger, and set the trigger at #1 rather than in its declaration (Icarus
    initializes declarations before the blocks wait on them). ``always_comb`` would
    also do, but simulates 15x slower."""
    out = []
    for part in re.split(r"(?m)^(?=module )", text):
        m = _TRIGGER.search(part)
        if m:
            trig = m.group(1)
            # initialize it after time 0, so that its change wakes every block up
            part = part.replace(m.group(0), f"  reg {trig} ;\n  initial #1 {trig} = 1'b0;", 1)
            part = _ONE_LINER.sub(lambda mm: f"always @* begin\n{mm.group(1)}if ({trig} ) "
                                  f"begin end\n{mm.group(1)}{mm.group(2)}\n  end\n", part)
        out.append(part)
    return "".join(out)


def run_cocotb(component_or_sources, *, toplevel: str, test_module: str, name: str,
               env: dict | None = None, testcase=None, timescale=("1ns", "1ps")):
    """Build ``component_or_sources`` (an Amaranth component, or a list of Verilog files)
    with Icarus and run the cocotb tests of ``test_module`` on it."""
    from cocotb_tools.runner import get_runner, get_results
    build_dir = BUILD / name
    build_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(component_or_sources, (list, tuple)):
        sources = [pathlib.Path(s) for s in component_or_sources]
    else:
        sources = [verilog_of(component_or_sources, toplevel, build_dir / f"{toplevel}.v")]
    waves = waves_enabled()
    runner = get_runner("icarus")
    runner.build(sources=sources, hdl_toplevel=toplevel, build_dir=build_dir,
                 timescale=timescale, waves=waves, always=True)
    extra_env = {"PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    extra_env.update({k: str(v) for k, v in (env or {}).items()})
    try:
        results = runner.test(test_module=test_module, hdl_toplevel=toplevel,
                          build_dir=build_dir, test_dir=build_dir, waves=waves,
                          testcase=testcase, extra_env=extra_env,
                          results_xml=str(build_dir / "results.xml"))
    except SystemExit as e:  # cocotb_tools exits when a test fails
        raise AssertionError(f"{name}: cocotb tests failed (exit {e.code}); "
                             f"see {build_dir / 'results.xml'}") from None
    if waves:
        found = sorted(build_dir.glob("*.fst")) + sorted(build_dir.glob("*.vcd"))
        print(f"waves: {', '.join(map(str, found)) or 'none found in ' + str(build_dir)}",
              file=sys.stderr)
    ntests, nfailed = get_results(results)
    assert ntests > 0, f"{name}: no cocotb test ran"
    assert nfailed == 0, f"{name}: {nfailed} of {ntests} cocotb tests failed (see {results})"
    return results
