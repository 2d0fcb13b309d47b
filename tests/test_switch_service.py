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
from ina_fabric.protocol.fields import VERSION
from ina_fabric.host.switch import query_status

INA = [sys.executable, "-m", "ina_fabric.host.cli"]

SESSION = 0x5EED   # the session of the job `ina switch --workers` holds here


@pytest.fixture
def switch(ports):
    sport, wport = ports(2)
    # SIGINT at its default, as from a terminal: a suite started in the background (a
    # shell's `&` ignores SIGINT) would pass that on, and the switch rightly keeps an
    # ignored SIGINT ignored (test_no_hang_cli)
    proc = subprocess.Popen(INA + ["switch", "--listen", f"127.0.0.1:{sport}",
                                   "--workers", f"127.0.0.1:{wport}", "--elements", "16",
                                   "--session", str(SESSION)],
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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
        "drop_bad_session": [pack(np.ones(4), job=1, session=SESSION + 1)],
        "drop_malformed": [pack(np.ones(4), job=1, session=SESSION) + b"xx",
                           pack(np.ones(17), job=1, session=SESSION),
                           os.urandom(3) + b"\x09" + os.urandom(40)],
    }
    bad["drop_malformed"][-1] = bytes([VERSION, 7]) + bad["drop_malformed"][-1][2:]  # unknown type
    for dgrams in bad.values():
        for d in dgrams:
            s.sendto(d, addr)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.sendto(pack(np.ones(4), job=1, worker=0, session=SESSION), addr)  # not a member
    time.sleep(0.3)
    c = query_status(addr)["counters"]
    for reason, dgrams in bad.items():
        assert c[reason] == len(dgrams), reason
    assert c["drop_unknown_source"] == 1
    # still serving: a good packet from the only worker completes its slot
    s.settimeout(2)
    s.sendto(pack(np.arange(16), job=1, worker=0, seq=0, session=SESSION), addr)
    # the fixable refusals above were answered with ERRORs (issue 43), header only
    reply, _ = s.recvfrom(4096)
    while reply[1] == MsgType.ERROR:
        assert len(reply) == HEADER_BYTES
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
    out = subprocess.run(INA + ["switch", "--local-workers", "2"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--base-port" in out.stderr
    big = tmp_path / "big.toml"
    big.write_text('[[job]]\nid = 1\nworkers = ["127.0.0.1:1"]\nwindow = "big"\n')
    # each of these printed a traceback before
    for args, needle in [
            (["allreduce", "--size", "4Mx"], "bad size"),
            (["allreduce", "--size", "-5"], "bad size"),
            (["switch", "--config", str(big)], "window = 'big' is not an integer"),
            (["switch", "--listen", "127.0.0.1:99999"], "port 0..65535"),
            (["switch", "--listen", "127.0.0.1:0", "--pace-rate", "fast"], "bad rate 'fast'"),
            (["switch", "--listen", "127.0.0.1:0", "--engine", "model", "--pace-rate",
              "100mbit"], "needs the fast engine"),
            (["allreduce", "--switch", "127.0.0.1:9", "--session", "1", "--workers", "2",
              "--size", "64K"],
             "no answer from switch"),
            (["train", "--elements", "20000", "--workers", "2", "--backends", "ina"],
             "elements 20000 not in"),
            (["train", "--window", "0", "--workers", "2", "--backends", "ina"],
             "window 0 not in")]:
        out = subprocess.run(INA + args, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and needle in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr, args
    out = subprocess.run(INA + ["switch", "--status", "--address", "127.0.0.1:1"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "no answer" in out.stderr


def _commands(parser, path=()):
    """Every (sub)command path of the ina parser."""
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield path + (name,), sub
                yield from _commands(sub, path + (name,))


def test_every_command_has_help_and_description():
    """Every verb and sub-verb: --help exits 0 quickly, has a description, and shows the
    defaults of its options."""
    from ina_fabric.host.cli import build_parser
    for path, sub in _commands(build_parser()):
        assert sub.description, f"ina {' '.join(path)}: no description"
        text = sub.format_help()
        for action in sub._actions:
            if action.option_strings and action.default not in (None, False) and \
                    action.default != "==SUPPRESS==":
                assert f"(default: {action.default})" in " ".join(text.split()), \
                    f"ina {' '.join(path)} {action.option_strings[0]}: default not shown"
    sub = build_parser()._subparsers._group_actions[0]
    for verb in sub.choices:
        out = subprocess.run(INA + [verb, "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "usage: ina" in out.stdout, verb


def test_help_never_runs_anything(tmp_path):
    """`ina bench NAME --help` prints the benchmark's flags and runs nothing (it ran the
    packetize benchmark before); nothing is written."""
    from ina_fabric.host.commands.bench import available
    for name in available():
        out = subprocess.run(INA + ["bench", "--out", str(tmp_path / "r"), name, "--help"],
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 0 and "usage: ina bench" in out.stdout, (name, out.stderr)
    assert list(tmp_path.iterdir()) == []


def test_switch_starts_with_no_job_and_takes_one_by_control(ports):
    """`ina switch` with no job flags serves, and a job installed by CONTROL works."""
    from ina_fabric.host.switch import send_job
    from ina_fabric.protocol.jobtable import JobConfig
    sport, w0, w1 = ports(3)
    proc = subprocess.Popen(INA + ["switch", "--listen", f"127.0.0.1:{sport}"],
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(100):
            try:
                st = query_status(("127.0.0.1", sport), timeout=0.2)
                break
            except OSError:
                time.sleep(0.1)
        assert st["jobs"] == [] or st["jobs"] == {}
        send_job(("127.0.0.1", sport), JobConfig(7, (f"127.0.0.1:{w0}", f"127.0.0.1:{w1}")))
        jobs = query_status(("127.0.0.1", sport))["jobs"]
        assert "7" in jobs or any(j.get("job") == 7 for j in jobs)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "no jobs yet" in proc.stderr.read()


def test_bounded_deadline_fires_without_other_traffic(ports):
    """A deadline that falls due while a datagram is processed still fires: the server
    used settimeout(0.0), got BlockingIOError (an OSError), counted it as an error and
    spun without calling tick, holding the PARTIAL until unrelated traffic arrived."""
    import threading
    from ina_fabric.host.switch import SwitchServer
    from ina_fabric.protocol import unpack
    from ina_fabric.protocol.jobtable import JobConfig
    w0, w1 = ports(2)
    job = JobConfig(3, (f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"), window=4, elements=4,
                    deadline=1e-6, mode="bounded")
    server = SwitchServer([job], "127.0.0.1", 0)
    t = threading.Thread(target=server.serve_forever, kwargs={"install_signals": False},
                         daemon=True)
    t.start()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", w0))
    s.settimeout(2.0)
    try:
        s.sendto(pack(np.ones(4), job=3, worker=0, seq=0, session=job.session),
                 server.address)
        data, _ = s.recvfrom(65536)      # before the fix: nothing within 2 s
        hdr, elems = unpack(data)
        assert hdr["type"] == MsgType.RESULT and list(elems) == [1, 1, 1, 1]
        assert server.errors == 0
    finally:
        server.stop()
        t.join(timeout=2)
        server.close()
        s.close()


def test_port_is_bound_exclusively(ports):
    """A second switch (or any process) cannot bind the same UDP port and take the
    traffic (SO_REUSEADDR allowed it)."""
    from ina_fabric.host.switch import SwitchServer
    first = SwitchServer([], "127.0.0.1", 0)
    try:
        with pytest.raises(OSError):
            SwitchServer([], "127.0.0.1", first.address[1])
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError):
            s.bind(first.address)
        s.close()
    finally:
        first.close()


def test_control_and_status_need_the_key(switch, tmp_path):
    """Against a running `ina switch`: an unsealed CONTROL installs nothing and gets no
    reply, a 20-byte STATUS_REQ gets nothing back (it got 597 B), and `--status` with
    another key file gets no answer; with the key, both work."""
    from ina_fabric.host.switch import send_job
    from ina_fabric.protocol.jobtable import JobConfig
    _, addr, wport = switch
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.5)
    rogue = JobConfig(9, (f"127.0.0.1:{wport}",))
    s.sendto(pack(None, type=MsgType.CONTROL) + rogue.to_bytes(), addr)
    s.sendto(pack(None, type=MsgType.STATUS_REQ), addr)
    with pytest.raises(socket.timeout):
        s.recvfrom(65536)
    st = query_status(addr)
    # (52 bytes cannot hold an entry and the trailer: malformed before the tag is read)
    assert "9" not in st["jobs"] and st["counters"]["drop_malformed"] == 1
    assert st["counters"]["status_unpadded"] == 1
    other = tmp_path / "other.key"
    other.write_text("ab" * 32)
    out = subprocess.run(INA + ["switch", "--status", "--switch", f"{addr[0]}:{addr[1]}",
                                "--key-file", str(other)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "control key" in out.stderr
    send_job(addr, rogue)                   # with the key (the machine's key file)
    assert "9" in query_status(addr)["jobs"]


def test_a_paced_switch_sends_a_worker_results_no_faster_than_its_rate():
    """``pace_rate`` (issue 18): the RESULTs to one worker leave no faster than its
    downlink, so a burst of slots closing at once waits in the switch's queue instead of
    overflowing the worker's link queue. Two workers, 64 RESULTs with 8 KB of data each:
    at 16 Mbit/s that is at least 0.27 s per worker (unpaced, a few ms on loopback); the
    sums are exact and the engine counts the datagrams it held back."""
    from ina_fabric.host.switch import SwitchServer, fast
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.host.cluster import free_udp_ports
    from ina_fabric.protocol.jobtable import JobConfig
    from test_client_fastpath import _against_switch
    if not fast.available():
        pytest.skip(fast.WHY_NOT or "")
    with pytest.raises(ValueError, match="needs the fast engine"):
        SwitchServer([], "127.0.0.1", 0, engine="model", pace_rate=1e6, key=None)
    rate, n, E = 16e6, 64 * 2048, 2048
    ports = free_udp_ports(2)
    job = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=64, elements=E)
    outs, took, errors = {}, {}, []

    def worker(address, w):
        try:
            with SwitchClient(address, 1, w, 2, 64, E, bind=("127.0.0.1", ports[w]),
                              session=job.session) as c:
                t0 = time.monotonic()
                outs[w] = c.allreduce(np.full(n, w + 1.0, np.float32))[0]
                took[w] = time.monotonic() - t0
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    _, counters = _against_switch(job, worker, range(2), key=None, pace_rate=rate)
    assert not errors, errors
    for w in range(2):
        assert np.array_equal(outs[w], np.full(n, 3.0, np.float32))
        # the 64 RESULTs that carry data, at least (the header-only ones come on top)
        assert took[w] >= 64 * (HEADER_BYTES + 4 * E + 46) * 8 / rate * 0.95, took
    assert counters["pace_held"] > 0, counters
