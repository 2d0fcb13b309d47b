"""Where things are read from and written to.

Data that ships with the package (board constraints, default topologies, the benchmark
suite) is found through :mod:`importlib.resources`, so a wheel works anywhere. Output is
never written into the package: every command takes ``--out`` (or ``--build-dir``), and
its default is a folder under the current directory (``build/...``, ``bench/results``,
``ina-out/...``), all git-ignored in this repository.
"""

import importlib.resources
import pathlib

__all__ = ["resource", "checkout_root", "BUILD_DIR", "OUT_DIR", "BENCH_RESULTS_DIR"]

#: default folders, relative to the current directory
BUILD_DIR = pathlib.Path("build")
OUT_DIR = pathlib.Path("ina-out")
BENCH_RESULTS_DIR = pathlib.Path("bench") / "results"


def resource(package: str, name: str):
    """A data file shipped in ``package`` (e.g. ``"ina_fabric.constraints"``), as a
    :class:`importlib.resources.abc.Traversable` (``read_text``, ``open``)."""
    return importlib.resources.files(package).joinpath(name)


def checkout_root() -> pathlib.Path | None:
    """The source checkout this package runs from (it has ``tests/`` and
    ``pyproject.toml``), or None for an installed copy."""
    root = pathlib.Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "tests").is_dir():
        return root
    return None
