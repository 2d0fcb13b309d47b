"""The gateware's shape: no function in hw/ is longer than 250 lines (an ``elaborate``
that grows past it is a block that wants splitting into components)."""

import ast
import pathlib

HW = pathlib.Path(__file__).resolve().parents[1] / "hw"
MAX_LINES = 250


def _functions():
    for path in sorted(HW.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(HW.parent), node


def test_no_function_in_hw_is_longer_than_250_lines():
    long = [f"{p}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p, n in _functions() if n.end_lineno - n.lineno + 1 > MAX_LINES]
    assert not long, "functions over 250 lines: " + "; ".join(long)


def test_the_walk_sees_the_elaborates():
    """(The test above would pass on an empty walk.)"""
    names = {(str(p), n.name) for p, n in _functions()}
    assert ("hw/ina/control.py", "elaborate") in names
    assert ("hw/ina/header.py", "elaborate") in names
    assert len(names) > 50
