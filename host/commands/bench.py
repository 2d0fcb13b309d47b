"""Run benchmarks. Each benchmark is a module ``ina_fabric.bench.bench_<name>`` (the
``bench/`` folder of the repository, shipped in the package) with a ``main(argv)`` that
parses its own flags, prints its figures (ratios measured side by side in one run) and
writes them as JSON to ``<out>/<name>.json``.

    ina bench                     list the benchmarks
    ina bench all                 run them all (what `make bench` does)
    ina bench tail --quick        run one, with its own flags
    ina bench tail --help         that benchmark's flags (runs nothing)
    ina bench --out DIR tail      figures to DIR/tail.json (default: bench/results)
"""

import argparse
import importlib
import pkgutil
import sys

HELP = "run benchmarks; `ina bench` lists them, `ina bench all` runs every one"


def available() -> dict[str, str]:
    """Benchmark name -> module name, found in the installed ``ina_fabric.bench``."""
    from ina_fabric import bench
    return {m.name.removeprefix("bench_").replace("_", "-"): f"{bench.__name__}.{m.name}"
            for m in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name)
            if m.name.startswith("bench_")}


def add_arguments(p):
    from ina_fabric.paths import BENCH_RESULTS_DIR
    p.add_argument("--out", metavar="DIR", default=str(BENCH_RESULTS_DIR),
                   help="folder for the JSON figures (default: %(default)s, under the "
                        "current directory)")
    p.add_argument("name", nargs="?", help="benchmark name, or 'all'; none lists them")
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="the benchmark's own flags (`ina bench NAME --help` lists them)")


def run(args):
    import pathlib
    from ..cli import CliError
    from ina_fabric.bench import set_results_dir
    set_results_dir(pathlib.Path(args.out))
    benches = available()
    if not args.name:
        for name, mod in benches.items():
            doc = (importlib.import_module(mod).__doc__ or "").strip().splitlines()
            print(f"{name:14s} {doc[0] if doc else ''}")
        return 0
    if args.name == "all":
        failed = []
        for name, mod in benches.items():
            print(f"=== bench {name} ===", flush=True)
            if importlib.import_module(mod).main(list(args.rest)):
                failed.append(name)
        if failed:
            print(f"benchmarks that failed: {', '.join(failed)}", file=sys.stderr)
            return 1
        return 0
    args.name = args.name.replace("_", "-")     # `ina bench lab_allreduce` = lab-allreduce
    if args.name not in benches:
        raise CliError(f"unknown benchmark {args.name!r}; have: {', '.join(benches)}")
    try:
        return importlib.import_module(benches[args.name]).main(list(args.rest)) or 0
    except SystemExit as e:  # argparse inside the benchmark: --help, or a usage error
        return e.code if isinstance(e.code, int) else 0
