"""`ina switch` as a service: bad input is counted, it stays up, status and shutdown work."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from ina_fabric.protocol import pack, MsgType, HEADER_BYTES
from ina_fabric.host.switch import query_status

INA = [sys.executable, "-m", "ina_fabric.host.cli"]


@pytest.fixture
def switch(ports):
    sport, wport = ports(2)
    proc = subprocess.Popen(INA + ["switch", "--listen", f"127.0.0.1:{sport}",
                                   "--workers", f"127.0.0.1:{wport}", "--elements", "16"],
                            stderr=subprocess.PIPE, text=True)
    addr = ("127.0.0.1", sport)
    for _ in range(100):
        try:
            query_status(addr, timeout=0.1)
            break
        except OSError:
            time.sleep(0.1)
    yield proc, addr, wport
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_every_kind_of_bad_datagram_is_counted(switch):
    proc, addr, wport = switch
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", wport))
    bad = {
        "drop_truncated": [b"", b"\x01\x01", pack(np.ones(4), job=1)[:-3]],
        "drop_bad_version": [pack(np.ones(4), job=1, version=9)],
        "drop_unknown_job": [pack(np.ones(4), job=42)],
        "drop_malformed": [pack(np.ones(4), job=1) + b"xx", pack(np.ones(17), job=1),
                           os.urandom(3) + b"\x09" + os.urandom(40)],
    }
    bad["drop_malformed"][-1] = b"\x01\x07" + bad["drop_malformed"][-1][2:]  # unknown type
    for dgrams in bad.values():
        for d in dgrams:
            s.sendto(d, addr)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.sendto(pack(np.ones(4), job=1, worker=0), addr)  # unconfigured source
    time.sleep(0.3)
    c = query_status(addr)["counters"]
    for reason, dgrams in bad.items():
        assert c[reason] == len(dgrams), reason
    assert c["drop_unknown_source"] == 1
    # still serving: a good packet from the only worker completes its slot
    s.settimeout(2)
    s.sendto(pack(np.arange(16), job=1, worker=0, seq=0), addr)
    reply, _ = s.recvfrom(4096)
    assert reply[1] == MsgType.RESULT and len(reply) == HEADER_BYTES + 64
    assert proc.poll() is None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_clean_shutdown(switch, sig):
    proc, addr, _ = switch
    proc.send_signal(sig)
    assert proc.wait(timeout=5) == 0
    assert "ina switch stopped; counters" in proc.stderr.read()


def test_status_cli(switch):
    _, addr, _ = switch
    out = subprocess.run(INA + ["switch", "--status", "--address", f"127.0.0.1:{addr[1]}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert json.loads(out.stdout)["jobs"]["1"]["workers"] == 1


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "jobs.toml"
    bad.write_text('[[job]]\nid = 1\nworkers = ["127.0.0.1:1"]\nwindow = 0\n')
    out = subprocess.run(INA + ["switch", "--config", str(bad)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and "window 0 not in" in out.stderr
    out = subprocess.run(INA + ["switch"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    out = subprocess.run(INA + ["switch", "--status", "--address", "127.0.0.1:1"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "no answer" in out.stderr


def test_every_verb_has_help():
    from ina_fabric.host.cli import build_parser
    sub = build_parser()._subparsers._group_actions[0]
    for verb in sub.choices:
        out = subprocess.run(INA + [verb, "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "usage: ina" in out.stdout, verb
