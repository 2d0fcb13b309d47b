"""The package as a user gets it: one ``ina_fabric`` namespace, the dependency rule
between its parts, and a wheel installed into a fresh venv that works from anywhere."""

import ast
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _imports(path: pathlib.Path, package: str):
    """Absolute module names a file imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.module


def _module_package(path: pathlib.Path) -> str:
    """The installed package name of a source file's folder (via package-dir)."""
    rel = path.parent.relative_to(ROOT).parts
    mapping = {v: k for k, v in PYPROJECT["tool"]["setuptools"]["package-dir"].items()}
    return ".".join([mapping[rel[0]], *rel[1:]])


@pytest.mark.parametrize("folder,forbidden", [
    ("hw", ("ina_fabric.host", "ina_fabric.sim", "host", "sim")),
    ("ina_fabric/protocol", ("ina_fabric.host", "ina_fabric.hw", "ina_fabric.sim",
                             "host", "hw", "sim", "amaranth", "torch")),
])
def test_dependency_rule(folder, forbidden):
    """hw never imports host (the wire format and the register table are shared in
    ina_fabric.protocol), and protocol imports neither side."""
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        pkg = _module_package(path) if folder != "ina_fabric/protocol" else "ina_fabric.protocol"
        for mod in _imports(path, pkg):
            if mod and any(mod == f or mod.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)


def test_every_package_folder_is_listed():
    """Each folder with an __init__.py is a package in pyproject.toml (else the wheel
    silently lacks it)."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set()
    for top in PYPROJECT["tool"]["setuptools"]["package-dir"].values():
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(_module_package(init))
    assert found - listed == set(), f"packages missing from pyproject.toml: {found - listed}"
    assert listed - found == set(), f"listed but not on disk: {listed - found}"


def test_no_generic_top_level_names():
    tops = {p.split(".")[0] for p in PYPROJECT["tool"]["setuptools"]["packages"]}
    assert tops == {"ina_fabric"}


@pytest.mark.slow
@pytest.mark.xdist_group("wheel")
def test_wheel_in_fresh_venv(tmp_path):
    """pip install '.[torch,hw,sim]' from a clean copy of the tree into a new venv, then
    from an unrelated directory: ina --help, ina bench (every benchmark listed),
    ina switch --help, the compiled switch engine, python -m ina_fabric.hw.build --help, a
    2-worker ina allreduce."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((ROOT / f).read_bytes())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py, ina = venv / "bin" / "python", venv / "bin" / "ina"
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # the CPU build on disk first (a bare `torch` would resolve to a CUDA build here)
    subprocess.run(pip + ["torch==2.13.0"], check=True)
    subprocess.run(pip + [f"{src}[torch,hw,sim]"], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*cmd, timeout=300):
        r = subprocess.run([str(c) for c in cmd], cwd=elsewhere, env=env, text=True,
                           capture_output=True, timeout=timeout)
        assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    assert "allreduce" in run(ina, "--help")
    listed = {line.split()[0] for line in run(ina, "bench").splitlines() if line.strip()}
    shipped = {p.stem.removeprefix("bench_").replace("_", "-")
               for p in (ROOT / "bench").glob("bench_*.py")}
    assert listed == shipped
    assert "--listen" in run(ina, "switch", "--help")
    # the compiled data path was built by pip (setup.py), not only in the checkout
    run(py, "-c", "from ina_fabric.host.switch import fast; assert fast.available(), "
                  "fast.WHY_NOT")
    run(py, "-c", "from ina_fabric.host.transport import fastcall; "
                  "assert fastcall.available(), fastcall.WHY_NOT")
    assert "--board" in run(py, "-m", "ina_fabric.hw.build", "--help")
    out = run(ina, "allreduce", "--workers", "2", "--size", "64k", "--iterations", "2")
    assert "quantization bound" in out, out
    # nothing was written into the installed package, nor outside the working folder
    site = pathlib.Path(run(py, "-c", "import ina_fabric, os; "
                                      "print(os.path.dirname(ina_fabric.__file__))").strip())
    assert not (site / "bench" / "results").exists()
    assert not (site.parent / "build").exists()
    # the installed package is not the checkout
    assert not str(site).startswith(str(ROOT))
