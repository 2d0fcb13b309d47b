import os
import socket
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


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
