"""Run benchmarks. Each benchmark is ``bench/bench_<name>.py`` in the source tree, with a
``main(argv)`` that prints its figures (ratios measured side by side in one run) and
writes them as JSON to ``bench/results/<name>.json``.

    ina bench            list the benchmarks
    ina bench all        run them all (what `make bench` does)
    ina bench tail       run one
"""

import argparse
import importlib.util
import pathlib
import sys

HELP = "run benchmarks (bench/bench_*.py); `ina bench all` runs every one"

BENCH_DIR = pathlib.Path(__file__).resolve().parents[2] / "bench"


def available() -> dict[str, pathlib.Path]:
    return {p.stem.removeprefix("bench_"): p for p in sorted(BENCH_DIR.glob("bench_*.py"))}


def add_arguments(p):
    p.add_argument("name", nargs="?", help="benchmark name, or 'all'")
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="arguments passed to the benchmark (e.g. --quick)")


def _load(path):
    if str(BENCH_DIR.parent) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR.parent))  # so benchmarks can `import bench._results`
    spec = importlib.util.spec_from_file_location(f"bench.{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(args):
    from ..cli import CliError
    benches = available()
    if not args.name:
        for name, path in benches.items():
            doc = (_load(path).__doc__ or "").strip().splitlines()
            print(f"{name:12s} {doc[0] if doc else ''}")
        return 0
    if args.name == "all":
        failed = []
        for name, path in benches.items():
            print(f"=== bench {name} ===", flush=True)
            rc = _load(path).main(list(args.rest))
            if rc:
                failed.append(name)
        if failed:
            print(f"benchmarks that failed: {', '.join(failed)}", file=sys.stderr)
            return 1
        return 0
    if args.name not in benches:
        raise CliError(f"unknown benchmark {args.name!r}; have: {', '.join(benches)}")
    return _load(benches[args.name]).main(list(args.rest)) or 0
