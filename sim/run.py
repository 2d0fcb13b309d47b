"""``make sim``: run the cocotb benches (tests/test_sim_*.py, tests/test_eth_*.py) through pytest.

    python -m ina_fabric.sim.run [--test NAME] [--waves]

``--test NAME`` selects tests with ``pytest -k NAME``; ``--waves`` sets ``INA_WAVES=1`` so
each bench writes waveforms in its build/sim/<name>/ directory and prints the path.
"""

import argparse
import os
import pathlib
import subprocess
import sys

from ina_fabric.paths import checkout_root


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ina_fabric.sim.run", description=__doc__.splitlines()[0])
    p.add_argument("--test", help="pytest -k expression selecting the benches")
    p.add_argument("--waves", action="store_true", help="write waveforms (INA_WAVES=1)")
    p.add_argument("-n", "--jobs", default=None, help="pytest-xdist workers (default: none)")
    args = p.parse_args(argv)
    root = checkout_root()
    if root is None:
        p.error("the cocotb benches run from a source checkout (its tests/ folder)")
    env = dict(os.environ)
    if args.waves:
        env["INA_WAVES"] = "1"
    tests = sorted(str(t.relative_to(root)) for pattern in ("test_sim_*.py", "test_eth_*.py")
                   for t in (root / "tests").glob(pattern))
    if not tests:
        print("no tests/test_sim_*.py or tests/test_eth_*.py found", file=sys.stderr)
        return 1
    cmd = [sys.executable, "-m", "pytest", "-s" if args.waves else "-q", *tests]
    if args.test:
        cmd += ["-k", args.test]
    if args.jobs:
        cmd += ["-n", args.jobs]
    print(" ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
