"""host/oneline.py: which errors are shown as one line (the user's to fix, raised in
INA's code) and which keep their traceback (bugs, and errors from outside INA)."""

from ina_fabric.host.oneline import is_ours, one_line


def _raised(exc):
    try:
        raise exc
    except BaseException as e:         # noqa: BLE001 (the test's own raise)
        return e


def test_actionable_errors_raised_in_ina_are_one_line():
    from ina_fabric.host.commands import parse_size
    try:
        parse_size("lots")
    except ValueError as e:
        assert is_ours(e)
        assert "\n" not in one_line(e) and "lots" in one_line(e)
    else:
        raise AssertionError("parse_size took 'lots'")
    assert not is_ours(_raised(ValueError("raised in a test, not in INA")))


def test_bugs_keep_their_traceback():
    # NotImplementedError and RecursionError are RuntimeErrors, but never the user's to fix
    assert not is_ours(_raised(NotImplementedError("no such path")))
    assert not is_ours(_raised(RecursionError("deep")))
    assert not is_ours(_raised(KeyError("k")))
    assert not is_ours(ValueError("never raised: no traceback"))


def test_errors_from_outside_ina_keep_their_traceback():
    import json
    try:
        json.loads("{")
    except ValueError as e:
        assert not is_ours(e)


def test_the_line_and_its_newline_go_in_one_write(monkeypatch):
    """stderr to a pipe writes through: ``print`` wrote the line and its newline apart,
    and under torchrun two ranks' lines came out as one ("...tracebackrank 0: ...")."""
    import sys
    from ina_fabric.host import oneline
    from ina_fabric.host.commands import parse_size
    writes = []

    class Pipe:
        def write(self, s):
            writes.append(s)

        def flush(self):
            pass

    try:
        parse_size("lots")
    except ValueError as e:
        exc = e
    monkeypatch.delenv("INA_DEBUG", raising=False)
    monkeypatch.setattr(sys, "stderr", Pipe())
    oneline._hook(ValueError, exc, exc.__traceback__)
    oneline._hook(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert len(writes) == 2 and all(w.endswith("\n") and w.count("\n") == 1
                                    for w in writes), writes
