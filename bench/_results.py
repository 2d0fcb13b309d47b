"""Shared helper for benchmarks: write figures to ``<out>/<name>.json``, with the
machine's load average at the end of the run (``os.getloadavg()``: 1, 5 and 15 minutes),
since ratios measured on these shared cores move with other jobs' load.

``RESULTS`` is ``bench/results`` under the current directory unless ``ina bench --out
DIR`` set it; it is never inside the installed package.
"""

import json
import os
import pathlib
import platform
import time

from ina_fabric.paths import BENCH_RESULTS_DIR

RESULTS = BENCH_RESULTS_DIR


def write(name: str, figures: dict) -> pathlib.Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {"name": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "machine": platform.machine(), "cpus": os.cpu_count(),
           "load_average": [round(x, 2) for x in os.getloadavg()],
           "figures": figures}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=float) + "\n")
    print(f"wrote {path}")
    return path
