"""The shape of the code, checked (issue 42): no arrow from host/ into sim/, no private
name imported across packages, and no function outside hw/ over 150 lines.

Each rule walks the source with ``ast`` (no import runs). A package is a folder: a name
that starts with ``_`` may be imported only inside the folder that defines it."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: the installed name of each top-level folder (pyproject's package-dir)
PACKAGES = {"ina_fabric": "ina_fabric", "hw": "ina_fabric.hw", "host": "ina_fabric.host",
            "sim": "ina_fabric.sim", "bench": "ina_fabric.bench",
            "constraints": "ina_fabric.constraints"}
#: pyproject's package-dir, reversed: ``ina_fabric.host.x`` lives in ``host/x``
FOLDERS = {v: k for k, v in PACKAGES.items()}
MAX_FUNCTION_LINES = 150


def _sources(*tops):
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "build" not in path.relative_to(ROOT).parts:
                yield path


def _module_of(path: pathlib.Path) -> str:
    """The dotted package (folder) that holds ``path``, as installed."""
    rel = path.relative_to(ROOT).parent.parts
    return ".".join([PACKAGES[rel[0]], *rel[1:]])


def _target(path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` names."""
    if node.level == 0:
        return node.module or ""
    base = _module_of(path).split(".")
    if node.level > 1:
        base = base[:-(node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _folder(module: str, is_package) -> str:
    """The package (folder) that defines ``module``: itself if it is a folder, else its
    parent."""
    return module if is_package(module) else module.rpartition(".")[0]


def _is_package(module: str) -> bool:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in FOLDERS:
            return (ROOT / FOLDERS[head] / pathlib.Path(*parts[n:]) / "__init__.py").exists()
    return False


def _imports(tops):
    for path in _sources(*tops):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                yield path, node, _target(path, node)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    yield path, node, a.name


def private_imports(tops=("host", "ina_fabric", "bench", "sim", "hw")) -> list:
    """``from pkg.mod import _name`` (or ``import pkg._mod``) where ``pkg`` is another
    folder than the importer's, as "file:line: what"."""
    bad = []
    for path, node, target in _imports(tops):
        here = _module_of(path)
        if isinstance(node, ast.ImportFrom):
            there = _folder(target, _is_package)
            for a in node.names:
                private = a.name.startswith("_") and not a.name.startswith("__")
                # a private module of another folder is private too (``from x import _mod``)
                if (private or any(p.startswith("_") and not p.startswith("__")
                                   for p in target.split(".")[len(there.split(".")):])) \
                        and there != here and target.startswith("ina_fabric"):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: "
                               f"from {target} import {a.name}")
        elif target.startswith("ina_fabric"):
            parts = target.split(".")
            for k, p in enumerate(parts):
                if p.startswith("_") and not p.startswith("__") and \
                        ".".join(parts[:k]) != here:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: import {target}")
    return bad


def long_functions(tops=("host", "ina_fabric", "bench", "sim"), limit=MAX_FUNCTION_LINES):
    bad = []
    for path in _sources(*tops):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} ({n} lines)")
    return bad


def test_host_does_not_import_sim():
    """The runtime never imports the test benches (``sim/``): the RTL engine's harness
    is runtime and lives in ``hw/verilator``."""
    bad = [f"{p.relative_to(ROOT)}:{n.lineno}: {t}" for p, n, t in _imports(("host",))
           if t == "ina_fabric.sim" or t.startswith("ina_fabric.sim.")]
    assert not bad, "host/ imports sim/:\n" + "\n".join(bad)


def test_runtime_does_not_import_the_benches_or_the_experiments():
    bad = [f"{p.relative_to(ROOT)}:{n.lineno}: {t}" for p, n, t in _imports(("host", "ina_fabric"))
           if t.startswith("ina_fabric.bench")
           and not str(p.relative_to(ROOT)).startswith("host/commands/")]
    assert not bad, "the runtime imports bench/ (the CLI verbs may):\n" + "\n".join(bad)


def test_the_transport_does_not_import_the_switch():
    bad = [f"{p.relative_to(ROOT)}:{n.lineno}: {t}" for p, n, t in _imports(("host/transport",))
           if t.startswith("ina_fabric.host.switch")]
    assert not bad, "\n".join(bad)


def test_no_private_name_crosses_a_package():
    bad = private_imports()
    assert not bad, "private names imported from another package:\n" + "\n".join(bad)


def test_no_function_outside_hw_is_over_150_lines():
    bad = long_functions()
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(bad)


def test_class_names_are_not_defined_twice():
    """One meaning per name: two ``Topology`` or two ``Replicator`` classes were two
    concepts under one word."""
    seen = {}
    for path in _sources("host", "ina_fabric", "bench"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert not twice, twice


@pytest.mark.parametrize("source, expect", [
    ("from ina_fabric.host.collectives.tar import _recv_exact\n", 1),
    ("from ..collectives.tar import _recv_exact\n", 1),
    ("from .bgjob import _helper\n", 0),
    ("from ina_fabric.host.collectives.tar import recv_exact\n", 0),
])
def test_the_private_import_rule_itself(tmp_path, monkeypatch, source, expect):
    """The walker finds a planted cross-package private import and nothing else."""
    lab = tmp_path / "host" / "lab"
    lab.mkdir(parents=True)
    (tmp_path / "host" / "__init__.py").write_text("")
    (lab / "__init__.py").write_text("")
    (lab / "planted.py").write_text(source)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert len(private_imports(("host",))) == expect


def test_paths_named_in_the_code_exist():
    """A ``host/...``, ``hw/...``, ``bench/...`` or ``sim/...`` file a docstring or
    comment names exists (stale names pointed at host.fastpath, host/quantize.py and
    hw/boards/versa_ecp5.py)."""
    import re
    pat = re.compile(r"\b((?:host|hw|bench|sim|ina_fabric)/[\w/]+\.(?:py|c|h|toml))\b")
    bad = []
    for path in list(_sources("host", "hw", "bench", "sim", "ina_fabric")) + [ROOT / "setup.py"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for ref in pat.findall(line):
                if not (ROOT / ref).exists():
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {ref}")
    dotted = re.compile(r"\bina_fabric\.(?:host|hw|bench|sim|protocol)(?:\.\w+)+")
    for path in list(_sources("host", "hw", "bench", "sim", "ina_fabric")) + [ROOT / "setup.py"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for ref in dotted.findall(line):
                parts = ref.split(".")
                if parts[-1].endswith("_"):        # a pattern (``bench_<name>``)
                    continue
                if not any(_resolves(parts[:k]) for k in range(3, len(parts) + 1)):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {ref}")
    assert not bad, "paths that do not exist:\n" + "\n".join(bad)


def _resolves(parts) -> bool:
    """``ina_fabric.host.x.y`` is a module or package of this checkout."""
    head = ".".join(parts[:2])
    folder = ROOT / FOLDERS[head] if head in FOLDERS else \
        ROOT / "ina_fabric" / parts[1] if parts[1] == "protocol" else None
    if folder is None:
        return False
    rest = parts[2:]
    base = folder.joinpath(*rest) if rest else folder
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()
