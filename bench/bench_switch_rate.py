"""The software switch's datagram rate: compiled engine vs the Python model, with a bare
receive loop on the same machine as the ceiling (8 KB DATA datagrams by default).

One sender process plays the N workers of a job (default 4, from N sockets; RESULTs to a
multicast group), 128 sequence numbers in flight, each RESULT releasing the next, as
workers do; so the switch takes N datagrams and sends one RESULT per slot. Bounded in
count and time. Measured for each engine, side by side in one run, over several
repetitions: datagrams the switch took per second of wall time and per second of its own
CPU time (the wall rate is shared with the sender on a small machine; the CPU rate is the
switch's capacity). The ceiling: a Python ``recvfrom_into`` loop that does nothing else,
fed by the same sender. Writes ``switch-rate.json``: per engine ``rate_median`` (wall)
and ``cpu_rate_median``, ``speedup`` (fast / model, both measures) and
``ceiling_rate``.
"""

import multiprocessing as mp
import os
import socket
import struct
import time

import numpy as np

from ina_fabric.bench._results import write
from ina_fabric.protocol.fields import HEADER_BYTES as HEADER

SESSION = 0xBE7C4   # the session of the measured job


def _cpu_seconds(pid) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sender(members, target, elements, seconds, max_count, start_evt, q, window=0,
            group=None):
    """Offer DATA from the bound member sockets (each seq from every member), seq
    counting up. ``window`` > 0: closed loop (each RESULT, multicast to ``group``,
    releases the next seq, as workers do; used against a switch, whose slots need every
    seq); 0: open loop, as fast as it can (against the bare loop)."""
    from ina_fabric.protocol import pack
    from ina_fabric.protocol.fields import field_offsets
    socks = []
    for w, member in enumerate(members):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(member)
        socks.append(sock)
    if group:
        # default buffer sizes: with SO_RCVBUF at 8 MB on this blocking socket the loop
        # ran at 2% of its rate (9k instead of 300k datagrams/s, measured)
        rs = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rs.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        rs.bind(group)
        rs.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                      socket.inet_aton(group[0]) + socket.inet_aton("127.0.0.1"))
        rs.settimeout(1.0)
    bufs = [bytearray(pack(np.arange(elements) % 1000, job=1, worker=w, seq=0, exponent=0,
                           session=SESSION))
            for w in range(len(members))]
    off = field_offsets()["seq"]
    put = struct.Struct(">I").pack_into
    rx = bytearray(65536)
    pairs = list(zip(socks, bufs))

    def offer(seq):
        for sock, buf in pairs:
            put(buf, off, seq & 0xFFFFFFFF)
            sock.sendto(buf, target)

    start_evt.wait()
    t_end = time.monotonic() + seconds
    seqs = 0
    if window:
        for _ in range(window):
            offer(seqs)
            seqs += 1
    try:
        while seqs * len(pairs) < max_count:
            for _ in range(64):
                if window:
                    rs.recv_into(rx)           # a RESULT: one more seq may go
                offer(seqs)
                seqs += 1
            if time.monotonic() >= t_end:
                break
    except socket.timeout:
        pass                                    # a RESULT was lost: the run ends here
    q.put(seqs * len(pairs))
    for sock in socks:
        sock.close()


def _bare(conn, seconds):
    """The ceiling: receive and count, nothing else."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
    s.bind(("127.0.0.1", 0))
    conn.send(s.getsockname())
    s.settimeout(0.5)
    buf = bytearray(65536)
    n = 0
    t0 = None
    t_last = time.monotonic()
    try:
        while True:
            s.recvfrom_into(buf)
            if t0 is None:
                t0 = time.monotonic()
            n += 1
            t_last = time.monotonic()
    except socket.timeout:
        pass
    conn.send((n, (t_last - t0) if t0 else 0.0))


def measure_switch(ctx, engine, elements, seconds, max_count, workers):
    from ina_fabric.host.cluster import start_switch_process, free_udp_ports
    from ina_fabric.host.switch import send_job, query_status
    from ina_fabric.protocol.jobtable import JobConfig
    addr, proc = start_switch_process(ctx, engine=engine)
    try:
        *ports, gport = free_udp_ports(workers + 1)
        members = [("127.0.0.1", p) for p in ports]
        group = (f"239.18.{gport >> 8}.{gport & 255}", gport)
        send_job(addr, JobConfig(1, tuple(f"{h}:{p}" for h, p in members), window=256,
                                 elements=elements, mcast=group, session=SESSION))
        evt, q = ctx.Event(), ctx.Queue()
        snd = ctx.Process(target=_sender, args=(members, addr, elements, seconds,
                                                max_count, evt, q, 128, group))
        snd.start()
        time.sleep(0.2)
        c0, cpu0, t0 = query_status(addr)["counters"], _cpu_seconds(proc.pid), time.monotonic()
        evt.set()
        sent = q.get(timeout=seconds + 60)
        snd.join(10)
        time.sleep(0.3)                       # let the switch drain its socket buffer
        c1, cpu1, t1 = query_status(addr)["counters"], _cpu_seconds(proc.pid), time.monotonic()
        took = c1["accepted"] - c0["accepted"]
        busy = t1 - t0 - 0.3
        return {"sent": sent, "taken": took, "results": c1["results"] - c0["results"],
                "rate": took / busy, "cpu_rate": took / max(cpu1 - cpu0, 1e-9),
                "cpu_seconds": cpu1 - cpu0}
    finally:
        proc.terminate()
        proc.join(5)


def measure_bare(ctx, elements, seconds, max_count):
    a, b = ctx.Pipe()
    proc = ctx.Process(target=_bare, args=(b, seconds))
    proc.start()
    target = tuple(a.recv())
    evt, q = ctx.Event(), ctx.Queue()
    snd = ctx.Process(target=_sender, args=([("127.0.0.1", 0)], target, elements, seconds,
                                            max_count, evt, q))
    snd.start()
    cpu0 = _cpu_seconds(proc.pid)
    evt.set()
    sent = q.get(timeout=seconds + 60)
    snd.join(10)
    n, busy = a.recv()
    cpu1 = _cpu_seconds(proc.pid)
    proc.join(5)
    return {"sent": sent, "taken": n, "rate": n / max(busy, 1e-9),
            "cpu_rate": n / max(cpu1 - cpu0, 1e-9)}


def _stats(xs):
    return {"min": float(np.min(xs)), "median": float(np.median(xs)), "max": float(np.max(xs))}


def main(argv=()):
    import argparse
    ap = argparse.ArgumentParser(prog="ina bench switch-rate", description=__doc__.strip())
    ap.add_argument("--bytes", type=int, default=8192,
                    help="DATA datagram size in bytes (header included; default 8192)")
    ap.add_argument("--workers", type=int, default=4,
                    help="members of the job (one sender process plays them all; "
                         "default 4)")
    ap.add_argument("--seconds", type=float, default=1.5, help="offered load per run")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (interleaved)")
    ap.add_argument("--quick", action="store_true", help="3 repetitions of 1 s")
    args = ap.parse_args(list(argv))
    if args.quick:
        args.reps, args.seconds = 3, 1.0
    elements = (args.bytes - HEADER) // 4
    if not 1 <= elements <= 16368:
        ap.error(f"--bytes {args.bytes}: a DATA datagram holds {HEADER + 4} .. {HEADER + 4 * 16368} bytes")
    max_count = 5_000_000
    ctx = mp.get_context("fork")
    from ina_fabric.host.switch import fast
    engines = ["model"] + (["fast"] if fast.available() else [])
    if not fast.available():
        print(f"note: {fast.WHY_NOT}")
    runs = {e: [] for e in engines}
    bare = []
    for rep in range(args.reps):
        for e in engines:
            runs[e].append(measure_switch(ctx, e, elements, args.seconds, max_count,
                                          args.workers))
        bare.append(measure_bare(ctx, elements, args.seconds, max_count))
        print(f"rep {rep + 1}/{args.reps}: " + ", ".join(
            f"{e} {runs[e][-1]['rate'] / 1e3:.0f}k/s" for e in engines) +
            f", bare loop {bare[-1]['rate'] / 1e3:.0f}k/s", flush=True)
    fig = {"datagram_bytes": 4 * elements + HEADER, "reps": args.reps,
           "workers": args.workers,
           "seconds": args.seconds, "engines": {}}
    for e in engines:
        fig["engines"][e] = {
            "rate": _stats([r["rate"] for r in runs[e]]),
            "cpu_rate": _stats([r["cpu_rate"] for r in runs[e]]),
            "rate_median": float(np.median([r["rate"] for r in runs[e]])),
            "cpu_rate_median": float(np.median([r["cpu_rate"] for r in runs[e]])),
            "runs": runs[e]}
    fig["ceiling_rate"] = float(np.median([b["rate"] for b in bare]))
    fig["ceiling_cpu_rate"] = float(np.median([b["cpu_rate"] for b in bare]))
    print(f"{4 * elements + HEADER} B datagrams, median of {args.reps} "
          f"(min .. max), datagrams the switch took:")
    for e in engines:
        r, c = fig["engines"][e]["rate"], fig["engines"][e]["cpu_rate"]
        print(f"  {e:5s}: {r['median'] / 1e3:7.1f}k/s wall ({r['min'] / 1e3:.1f} .. "
              f"{r['max'] / 1e3:.1f}), {c['median'] / 1e3:7.1f}k per CPU-second")
    print(f"  bare Python receive loop (ceiling): {fig['ceiling_rate'] / 1e3:.1f}k/s wall, "
          f"{fig['ceiling_cpu_rate'] / 1e3:.1f}k per CPU-second")
    if "fast" in engines:
        fig["speedup"] = fig["engines"]["fast"]["rate_median"] / \
            fig["engines"]["model"]["rate_median"]
        fig["cpu_speedup"] = fig["engines"]["fast"]["cpu_rate_median"] / \
            fig["engines"]["model"]["cpu_rate_median"]
        print(f"  fast / model: {fig['speedup']:.1f}x wall, {fig['cpu_speedup']:.1f}x per "
              f"CPU-second (target >= 10x)")
    write("switch-rate", fig)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
