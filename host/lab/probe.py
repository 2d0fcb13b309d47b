"""Probes that run inside a lab's namespaces, each bounded in time and count so it stops
by itself: TCP throughput, UDP round trips and one-way delay. Each prints one JSON line.

    python -m ina_fabric.host.lab.probe tcp-sink --port 5001 --seconds 5
    python -m ina_fabric.host.lab.probe tcp-send --to 198.18.0.2:5001 --seconds 2
    python -m ina_fabric.host.lab.probe udp-echo --port 5002 --seconds 5
    python -m ina_fabric.host.lab.probe rtt --to 198.18.0.254:5002 --count 50
    python -m ina_fabric.host.lab.probe owd-recv --port 5003 --seconds 5
    python -m ina_fabric.host.lab.probe owd-send --to 198.18.0.2:5003 --rate 80mbit --seconds 2
    python -m ina_fabric.host.lab.probe sink --port 5010 --seconds 30     (TCP and UDP)
    python -m ina_fabric.host.lab.probe bg-tcp --to 198.18.0.2:5010 --seconds 30 --on-ms 200 --off-ms 800
    python -m ina_fabric.host.lab.probe bg-udp --to 198.18.0.2:5010 --rate 50mbit --seconds 30 --on-ms 50 --off-ms 50

One-way delays compare CLOCK_MONOTONIC stamps taken in two namespaces of one machine
(namespaces share the clock). The helpers at the bottom run a probe pair in a Lab.
"""

import argparse
import json
import os
import socket
import struct
import sys
import time

__all__ = ["tcp_throughput", "rtt", "one_way_delay", "quantiles"]

_STAMP = struct.Struct("!Qd")     # sequence, send time (monotonic)


def quantiles(xs, qs=(0.5, 0.99)) -> dict:
    if not xs:
        return {}
    s = sorted(xs)
    return {f"p{q * 100:g}": s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] for q in qs}


def _addr(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


def _ready():
    print("ready", flush=True)


def _realtime():
    """SCHED_FIFO (below the delay line's) for the one-way-delay probes, where allowed:
    a measuring instrument should not be the thing that is late."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))
        return True
    except (OSError, AttributeError):
        return False


def tcp_sink(port, seconds):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(1)
    srv.settimeout(seconds)
    _ready()
    end = time.monotonic() + seconds
    conn, _ = srv.accept()
    conn.settimeout(max(0.1, end - time.monotonic()))
    buf = bytearray(1 << 20)
    total, first, last = 0, None, None
    try:
        while time.monotonic() < end:
            n = conn.recv_into(buf)
            if not n:
                break
            now = time.monotonic()
            if first is None:
                first, first_n = now, n
            total += n
            last = now
    except socket.timeout:
        pass
    conn.close()
    srv.close()
    span = (last - first) if first is not None and last > first else 0.0
    bits = (total - first_n) * 8 / span if span else 0.0
    return {"bytes": total, "seconds": span, "bits_per_s": bits}


def tcp_send(to, seconds):
    s = socket.create_connection(_addr(to), timeout=5)
    s.settimeout(seconds + 5)
    data = b"\0" * (1 << 18)
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end:
        sent += s.send(data)
    s.close()
    return {"bytes": sent}


def _receive_until(s, end, recv):
    """``recv()``'s result for each datagram that ``s`` receives before monotonic time
    ``end``; stops at the deadline (the socket's timeout is set to what is left)."""
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        s.settimeout(left)
        try:
            got = recv()
        except socket.timeout:
            return
        yield got


def udp_echo(port, seconds):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    _ready()
    n = 0
    for data, src in _receive_until(s, time.monotonic() + seconds,
                                    lambda: s.recvfrom(65536)):
        s.sendto(data, src)
        n += 1
    return {"echoed": n}


def rtt_probe(to, count, interval, timeout=1.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    dest = _addr(to)
    rtts, lost = [], 0
    for i in range(count):
        t = time.monotonic()
        s.sendto(_STAMP.pack(i, t), dest)
        try:
            while True:
                data, _ = s.recvfrom(64)
                seq, t0 = _STAMP.unpack_from(data)
                if seq == i:
                    rtts.append((time.monotonic() - t0) * 1e3)
                    break
        except socket.timeout:
            lost += 1
        time.sleep(max(0.0, interval - (time.monotonic() - t)))
    return {"count": count, "lost": lost, "rtt_ms": quantiles(rtts, (0.5, 0.99, 1.0)),
            "samples_ms": rtts}


def owd_recv(port, seconds):
    rt = _realtime()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("0.0.0.0", port))
    _ready()
    owd = []
    buf = bytearray(65536)
    start = None            # the first 0.2 s of the stream (ARP, slow paths) is not counted
    for _ in _receive_until(s, time.monotonic() + seconds, lambda: s.recv_into(buf)):
        now = time.monotonic()
        seq, t0 = _STAMP.unpack_from(buf)
        if seq == 2**64 - 1:
            break
        start = t0 if start is None else start
        if t0 - start >= 0.2:
            owd.append((now - t0) * 1e3)
    return {"received": len(owd), "realtime": rt,
            "owd_ms": quantiles(owd, (0.0, 0.5, 0.99, 0.999, 1.0))}


def owd_send(to, rate_bits, seconds, size=1200):
    """Datagrams of ``size`` bytes paced at ``rate_bits``, each stamped with its send time."""
    # not real-time: a sender that falls behind spins, and real-time spinning would eat
    # the RT budget the delay line and the receiver need (the kernel throttles all RT)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dest = _addr(to)
    pad = b"\0" * (size - _STAMP.size)
    gap = size * 8 / rate_bits
    t0 = time.monotonic()
    i = 0
    while True:
        now = time.monotonic()
        if now - t0 >= seconds:
            break
        due = t0 + i * gap
        if now < due:
            time.sleep(min(due - now, 0.001) if due - now > 0.0002 else 0)
            continue
        s.sendto(_STAMP.pack(i, time.monotonic()) + pad, dest)
        i += 1
    for _ in range(3):
        s.sendto(_STAMP.pack(2**64 - 1, 0.0), dest)
    return {"sent": i, "seconds": time.monotonic() - t0}


def _on(t0, on, off):
    """True in the on-part of an on/off cycle that began at t0 (off = 0: always on)."""
    return not off or (time.monotonic() - t0) % (on + off) < on


def bg_tcp(to, seconds, on, off):
    """Background TCP bulk flow: one connection, sending as fast as the link takes it
    during each on-period, silent during each off-period, for ``seconds`` in all."""
    s = socket.create_connection(_addr(to), timeout=5)
    s.settimeout(1.0)
    data = b"\0" * (1 << 16)
    t0 = time.monotonic()
    sent = 0
    while (now := time.monotonic()) - t0 < seconds:
        if not _on(t0, on, off):
            time.sleep(min(0.005, off))
            continue
        try:
            sent += s.send(data)
        except socket.timeout:
            pass
    s.close()
    return {"bytes": sent, "seconds": time.monotonic() - t0}


def bg_udp(to, rate_bits, seconds, on, off, size=1200):
    """Background UDP bursts: datagrams of ``size`` bytes paced at ``rate_bits`` during
    each on-period, nothing during each off-period, for ``seconds`` in all."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dest = _addr(to)
    data = b"\0" * size
    gap = size * 8 / rate_bits
    t0 = time.monotonic()
    sent, credit_t = 0, t0
    while (now := time.monotonic()) - t0 < seconds:
        if not _on(t0, on, off):
            time.sleep(min(0.002, off))
            credit_t = time.monotonic()
            continue
        if now < credit_t:
            time.sleep(min(credit_t - now, 0.001))
            continue
        try:
            s.sendto(data, dest)
            sent += 1
        except OSError:
            pass
        credit_t += gap
    return {"datagrams": sent, "seconds": time.monotonic() - t0}


def sink(port, seconds):
    """Drain TCP connections and UDP datagrams on ``port`` for ``seconds``."""
    import selectors
    sel = selectors.DefaultSelector()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(16)
    srv.setblocking(False)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", port))
    udp.setblocking(False)
    sel.register(srv, selectors.EVENT_READ, "accept")
    sel.register(udp, selectors.EVENT_READ, "udp")
    _ready()
    end = time.monotonic() + seconds
    got = {"tcp_bytes": 0, "udp_bytes": 0}
    buf = bytearray(1 << 16)
    while (left := end - time.monotonic()) > 0:
        for key, _ in sel.select(min(left, 0.5)):
            try:
                if key.data == "accept":
                    c, _ = srv.accept()
                    c.setblocking(False)
                    sel.register(c, selectors.EVENT_READ, "tcp")
                elif key.data == "udp":
                    got["udp_bytes"] += udp.recv_into(buf)
                else:
                    n = key.fileobj.recv_into(buf)
                    if not n:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                    got["tcp_bytes"] += n
            except (BlockingIOError, ConnectionError):
                pass
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ina_fabric.host.lab.probe",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("tcp-sink", "udp-echo", "owd-recv", "sink"):
        p = sub.add_parser(name)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--seconds", type=float, default=5.0, help="stops after this long")
    p = sub.add_parser("tcp-send")
    p.add_argument("--to", required=True)
    p.add_argument("--seconds", type=float, default=2.0)
    p = sub.add_parser("rtt")
    p.add_argument("--to", required=True)
    p.add_argument("--count", type=int, default=50)
    p.add_argument("--interval-ms", type=float, default=10.0)
    p = sub.add_parser("owd-send")
    p.add_argument("--to", required=True)
    p.add_argument("--rate", default="10mbit")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--size", type=int, default=1200)
    for name in ("bg-tcp", "bg-udp"):
        p = sub.add_parser(name)
        p.add_argument("--to", required=True)
        p.add_argument("--seconds", type=float, default=10.0, help="stops after this long")
        p.add_argument("--on-ms", type=float, default=100.0)
        p.add_argument("--off-ms", type=float, default=0.0)
        if name == "bg-udp":
            p.add_argument("--rate", default="10mbit", help="while on")
            p.add_argument("--size", type=int, default=1200)
    a = ap.parse_args(argv)
    if a.what == "tcp-sink":
        out = tcp_sink(a.port, a.seconds)
    elif a.what == "tcp-send":
        out = tcp_send(a.to, a.seconds)
    elif a.what == "udp-echo":
        out = udp_echo(a.port, a.seconds)
    elif a.what == "rtt":
        out = rtt_probe(a.to, a.count, a.interval_ms / 1e3)
    elif a.what == "sink":
        out = sink(a.port, a.seconds)
    elif a.what == "bg-tcp":
        out = bg_tcp(a.to, a.seconds, a.on_ms / 1e3, a.off_ms / 1e3)
    elif a.what == "bg-udp":
        from .topology import parse_rate
        out = bg_udp(a.to, parse_rate(a.rate), a.seconds, a.on_ms / 1e3, a.off_ms / 1e3,
                     a.size)
    elif a.what == "owd-recv":
        out = owd_recv(a.port, a.seconds)
    else:
        from .topology import parse_rate
        out = owd_send(a.to, parse_rate(a.rate), a.seconds, a.size)
    try:
        print(json.dumps(out), flush=True)
    except BrokenPipeError:          # started as a service: nobody reads the result
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


# -- helpers: a probe pair in a Lab ---------------------------------------------------

def _server(lab, node, argv):
    import subprocess
    p = lab.popen(node, [sys.executable, "-m", "ina_fabric.host.lab.probe", *argv],
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if line.strip() != "ready":
        p.kill()
        raise RuntimeError(f"probe {argv[0]} in {node} did not start: {p.stderr.read()}")
    return p


def _finish(p, timeout):
    out, err = p.communicate(timeout=timeout)
    if p.returncode:
        raise RuntimeError(f"probe exited {p.returncode}: {err}")
    return json.loads(out.strip().splitlines()[-1])


def _client(lab, node, argv, timeout):
    r = lab.run(node, [sys.executable, "-m", "ina_fabric.host.lab.probe", *argv],
                timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"probe {argv[0]} in {node} exited {r.returncode}: {r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def tcp_throughput(lab, src, dst, seconds=2.0, port=5001) -> float:
    """Bits per second of one TCP flow from ``src`` to ``dst`` over ``seconds``."""
    sink = _server(lab, dst, ["tcp-sink", "--port", port, "--seconds", seconds + 5])
    try:
        _client(lab, src, ["tcp-send", "--to", f"{lab.address(dst)}:{port}",
                           "--seconds", seconds], timeout=seconds + 20)
        return _finish(sink, seconds + 10)["bits_per_s"]
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()


def rtt(lab, src, dst, count=50, interval_ms=10.0, port=5002) -> dict:
    """UDP round trips from ``src`` to an echo in ``dst``: P50/P99/max in ms, lost."""
    echo = _server(lab, dst, ["udp-echo", "--port", port,
                              "--seconds", count * (interval_ms / 1e3 + 1.0) + 5])
    try:
        return _client(lab, src, ["rtt", "--to", f"{lab.address(dst)}:{port}", "--count",
                                  count, "--interval-ms", interval_ms],
                       timeout=count * (interval_ms / 1e3 + 1.0) + 10)
    finally:
        echo.kill()
        echo.wait()


def one_way_delay(lab, src, dst, rate="10mbit", seconds=2.0, size=1200, port=5003) -> dict:
    """One-way delays (ms quantiles) of datagrams paced at ``rate`` from ``src`` to ``dst``."""
    recv = _server(lab, dst, ["owd-recv", "--port", port, "--seconds", seconds + 5])
    try:
        sent = _client(lab, src, ["owd-send", "--to", f"{lab.address(dst)}:{port}",
                                  "--rate", rate, "--seconds", seconds, "--size", size],
                       timeout=seconds + 20)
        got = _finish(recv, seconds + 10)
        got["sent"] = sent["sent"]
        return got
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()


if __name__ == "__main__":
    raise SystemExit(main())
