"""Shared helper for benchmarks: write figures to ``<out>/<name>.json``.

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
           "figures": figures}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=float) + "\n")
    print(f"wrote {path}")
    return path
