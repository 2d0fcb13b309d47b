"""Shared helpers for cocotb benches: Amaranth to Verilog, then Icarus via cocotb_tools.

    from sim.common import run_cocotb
    run_cocotb(component, toplevel="ina_core", test_module="sim.ina.tb_core",
               name="core_L1", env={"SEED": "1"})

Each call builds in its own directory ``build/sim/<name>`` (so pytest-xdist workers never
share one). With ``INA_WAVES=1`` in the environment, waves are written and the file's path
is printed. Raises AssertionError when a cocotb test fails.
"""

import os
import pathlib
import sys

__all__ = ["ROOT", "BUILD", "run_cocotb", "verilog_of", "waves_enabled"]

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "sim"


def waves_enabled() -> bool:
    return os.environ.get("INA_WAVES", "") not in ("", "0")


def verilog_of(component, toplevel: str, path: pathlib.Path) -> pathlib.Path:
    """Write the Verilog of an Amaranth component (all its ports) to ``path``."""
    from amaranth.back import verilog
    path.parent.mkdir(parents=True, exist_ok=True)
    text = verilog.convert(component, name=toplevel, emit_src=False)
    # Icarus does not run a plain ``always @*`` at time 0, so a combinational signal
    # whose inputs keep their initial values would read X; ``always_comb`` does run.
    text = text.replace("always @*", "always_comb")
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


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
    results = runner.test(test_module=test_module, hdl_toplevel=toplevel,
                          build_dir=build_dir, test_dir=build_dir, waves=waves,
                          testcase=testcase, extra_env=extra_env,
                          results_xml=str(build_dir / "results.xml"))
    if waves:
        found = sorted(build_dir.glob("*.fst")) + sorted(build_dir.glob("*.vcd"))
        print(f"waves: {', '.join(map(str, found)) or 'none found in ' + str(build_dir)}",
              file=sys.stderr)
    ntests, nfailed = get_results(results)
    assert ntests > 0, f"{name}: no cocotb test ran"
    assert nfailed == 0, f"{name}: {nfailed} of {ntests} cocotb tests failed (see {results})"
    return results
