"""The delay line's semantics without root: ``delayline.run`` moves datagrams between two
socketpairs standing in for the TAPs. Delay is held, loss is close to its probability
and seeded, jitter never reorders."""

import json
import multiprocessing as mp
import os
import signal
import socket
import struct
import time

import pytest

from ina_fabric.host.lab import delayline


def _line(fd_a, fd_b, delay, jitter, loss, stats):
    delayline.run(fd_a, fd_b, delay, jitter, loss, seed=7, stats_path=stats)


@pytest.fixture
def line(tmp_path):
    procs = []

    def start(delay=0.0, jitter=0.0, loss=0.0):
        a_ext, a_int = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        b_int, b_ext = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for s in (a_int, b_int):
            s.setblocking(False)
        stats = tmp_path / f"stats{len(procs)}.json"
        p = mp.get_context("fork").Process(target=_line, args=(
            a_int.fileno(), b_int.fileno(), delay, jitter, loss, str(stats)), daemon=True)
        p.start()
        procs.append(p)
        b_ext.settimeout(2.0)
        return a_ext, b_ext, p, stats

    yield start
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)


def _collect(b, fmt="!I"):
    """Read ``b`` on a thread (an unread socketpair would overflow: the line then drops
    what it cannot write, as a full TAP queue would); returns the list it fills."""
    import threading
    got = []

    def read():
        b.settimeout(0.5)
        try:
            while True:
                got.append(struct.unpack(fmt, b.recv(64))[0])
        except (socket.timeout, OSError):
            pass
    t = threading.Thread(target=read, daemon=True)
    t.start()
    return got, t


def _stop(p):
    os.kill(p.pid, signal.SIGTERM)
    p.join(5)
    assert p.exitcode == 0


def test_delay_is_held(line):
    a, b, p, stats = line(delay=0.02)
    owd = []
    for i in range(20):
        a.send(struct.pack("!Id", i, time.monotonic()))
        seq, t0 = struct.unpack("!Id", b.recv(64))
        owd.append(time.monotonic() - t0)
        assert seq == i
    _stop(p)
    owd.sort()
    assert 0.020 <= owd[0] and owd[len(owd) // 2] < 0.022, owd
    st = json.loads(stats.read_text())
    assert st["a_to_b"]["frames"] == 20 and st["a_to_b"]["late_ms"]["p50"] < 1.0


def test_loss_is_seeded_and_close_to_its_probability(line):
    a, b, p, stats = line(loss=0.2)
    got, t = _collect(b)
    for i in range(2000):
        a.send(struct.pack("!I", i))
        if i % 50 == 0:
            time.sleep(0.002)
    t.join(10)
    _stop(p)
    assert 0.15 < 1 - len(got) / 2000 < 0.25
    assert got == sorted(got)
    assert json.loads(stats.read_text())["a_to_b"]["lost"] == 2000 - len(got)


def test_jitter_never_reorders(line):
    a, b, p, _ = line(delay=0.005, jitter=0.003)
    got, t = _collect(b)
    for i in range(300):
        a.send(struct.pack("!I", i))
        time.sleep(0.0005)
    t.join(10)
    _stop(p)
    assert got == list(range(300))
