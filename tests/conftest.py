import os
import socket
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def run_threads(fn, args, timeout=60.0, on_error=None):
    """``fn(a)`` for each of ``args``, each in its own thread (the compiled loops release
    the GIL, so ranks in threads run at once), joined within ``timeout`` each. Returns
    the exceptions they raised; ``on_error()`` runs after each (e.g. a barrier's
    ``abort``, so the other ranks do not wait for one that failed)."""
    errors = []

    def run(a):
        try:
            fn(a)
        except BaseException as e:   # noqa: BLE001 (returned to the test)
            errors.append(e)
            if on_error is not None:
                on_error()
    ts = [threading.Thread(target=run, args=(a,), daemon=True) for a in args]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    return errors


def free_ports(n):
    """n distinct free UDP ports on 127.0.0.1 (bound then released)."""
    from ina_fabric.host.cluster import free_udp_ports
    return free_udp_ports(n)


@pytest.fixture
def ports():
    return free_ports


def consecutive_free_ports(n):
    """A base port b with b..b+n-1 free on 127.0.0.1, below the ephemeral range."""
    import random
    rng = random.Random(os.getpid())
    for _ in range(200):
        base = rng.randrange(20000, 32000 - n)
        socks = []
        try:
            for i in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no consecutive free ports")


@pytest.fixture(scope="module")
def ina_switch():
    """A software switch (empty job table) in a child process, for the module."""
    import multiprocessing as mp
    from ina_fabric.host.cluster import start_switch_process
    addr, proc = start_switch_process(mp.get_context("fork"))
    yield addr
    proc.terminate()
    proc.join(5)


@pytest.fixture
def lab_bench(tmp_path, monkeypatch):
    """For a test that runs an `ina bench ... --lab` end to end: skipped where labs
    cannot be built (not root, no namespaces) or torch is missing; the bench's JSON goes
    to ``tmp_path``; returns ``lab_id(prefix)``, an id unique to this process."""
    from ina_fabric.host.lab import available
    why = available()
    if why is not None:
        pytest.skip(f"ina lab: {why}")
    pytest.importorskip("torch")
    from ina_fabric.bench import _results
    monkeypatch.setattr(_results, "RESULTS", tmp_path)
    return lambda prefix: f"{prefix}{os.getpid() % 100000}"
