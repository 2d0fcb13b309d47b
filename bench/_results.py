"""Shared helper for benchmarks: write figures to bench/results/<name>.json."""

import json
import pathlib
import platform
import time

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def write(name: str, figures: dict) -> pathlib.Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = {"name": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "machine": platform.machine(), "cpus": __import__("os").cpu_count(),
           "figures": figures}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=float) + "\n")
    print(f"wrote {path.relative_to(RESULTS.parent.parent)}")
    return path
