"""Background training jobs for the lab: the traffic of a data-parallel job that shares our
job's links, arriving and leaving on a schedule.

A background job has one rank per host (the hosts our own job runs on: tenants sharing
a NIC). Per step every rank computes for ``compute`` seconds (sleeping: the compute
itself would happen on an accelerator and does not touch the links) and then all-reduces
a ``nbytes`` float32 gradient with a ring all-reduce over TCP (reduce-scatter, then
all-gather: 2(N-1) steps of nbytes/N to the next rank, the same pattern as Gloo's ring and
NCCL's), summing what it receives. Each host's uplink carries 2(N-1)/N x nbytes per step.

The job is present only during its ``active`` intervals (seconds from the epoch):
rank 0 decides each step whether to run it and passes a token around the ring first,
so every rank agrees; outside the intervals the job sleeps (it has left) and starts
again when the next interval begins (it has arrived). The epoch is CLOCK_MONOTONIC
seconds (shared by every namespace), read from ``--epoch`` or, with ``--epoch-file``,
from a file the controlled job writes when its training starts, so contention follows
the training's own clock. Everything is bounded by ``--seconds``.

    python -m ina_fabric.host.lab.bgjob --rank 0 --world 4 --port 6200 \\
        --next 198.18.0.2:6200 --bytes 600000 --compute 0.15 --active 0:30,50:80 \\
        --epoch-file /run/x/epoch --seconds 120

Prints one JSON line at the end: steps, bytes sent, seconds busy.
"""

import argparse
import json
import signal
import socket
import sys
import struct
import threading
import time

import numpy as np

# imported here, not at the first step: ina_fabric.host.collectives takes ~0.7 s to
# import, which would eat into the job's first active interval (a 0.6 s one ran 1 step)
from ina_fabric.host.collectives.tar import recv_exact

__all__ = ["intervals_for", "main"]

TOKEN = struct.Struct("!cd")       # command (G go, X exit), compute seconds


def intervals_for(schedule, job: int, horizon: float):
    """The intervals during which background job number ``job`` (0-based) is present
    under ``schedule`` [(t_start, n_jobs)]: job j runs while n > j."""
    out = []
    sched = sorted(schedule) + [(horizon, 0)]
    for (t0, n), (t1, _) in zip(sched, sched[1:]):
        if n > job and t1 > t0:
            if out and out[-1][1] == t0:
                out[-1] = (out[-1][0], t1)
            else:
                out.append((t0, t1))
    return out


def _ring_recv(sock, n, buf=None):
    return recv_exact(sock, n, buf, who="background job ring")


def _ring_allreduce(data, rank, world, nxt, prv):
    """In-place sum of ``data`` (float32) over the ring."""
    chunks = np.array_split(np.arange(data.size), world)
    bounds = [(int(c[0]) if c.size else 0, int(c[-1]) + 1 if c.size else 0) for c in chunks]
    sent = 0

    def exchange(send_i, recv_i, add):
        nonlocal sent
        s0, s1 = bounds[send_i]
        r0, r1 = bounds[recv_i]
        out = data[s0:s1].tobytes()
        th = threading.Thread(target=nxt.sendall, args=(out,))
        th.start()
        got = np.frombuffer(_ring_recv(prv, (r1 - r0) * 4), np.float32)
        th.join()
        sent += len(out)
        if add:
            data[r0:r1] += got
        else:
            data[r0:r1] = got

    for s in range(world - 1):
        exchange((rank - s) % world, (rank - s - 1) % world, True)
    for s in range(world - 1):
        exchange((rank + 1 - s) % world, (rank - s) % world, False)
    return sent


def _connect(addr, deadline):
    host, port = addr.rsplit(":", 1)
    while True:
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _epoch(args, deadline):
    if args.epoch is not None:
        return args.epoch
    while time.monotonic() < deadline:
        try:
            with open(args.epoch_file) as f:
                text = f.read().strip()
            if text:
                return float(text)
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ina_fabric.host.lab.bgjob",
                                 description="one rank of a background training job")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True, help="this rank listens here")
    ap.add_argument("--next", required=True, help="ip:port of rank+1")
    ap.add_argument("--bytes", type=int, required=True, help="gradient bytes per step")
    ap.add_argument("--compute", type=float, required=True, help="seconds per step")
    ap.add_argument("--jitter", type=float, default=0.1, help="lognormal sigma of compute")
    ap.add_argument("--active", default="", help="t0:t1,t2:t3 seconds from the epoch")
    ap.add_argument("--epoch", type=float, help="CLOCK_MONOTONIC of t=0")
    ap.add_argument("--epoch-file", help="or: a file that will hold it")
    ap.add_argument("--seconds", type=float, default=600.0, help="hard bound on the run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # still print the summary
    if args.world < 2 or not 0 <= args.rank < args.world:
        ap.error("need world >= 2 and 0 <= rank < world")
    if args.epoch is None and not args.epoch_file:
        ap.error("--epoch or --epoch-file")
    if not 0 < args.seconds <= 3600:
        ap.error("--seconds in (0, 3600]")
    start = time.monotonic()
    deadline = start + args.seconds
    active = [tuple(float(x) for x in iv.split(":")) for iv in args.active.split(",") if iv]
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("0.0.0.0", args.port))
    lsock.listen(1)
    lsock.settimeout(max(deadline - time.monotonic(), 1))
    nxt = _connect(args.next, deadline)
    prv, _ = lsock.accept()
    prv.settimeout(None)
    rng = np.random.default_rng(args.seed * 1009 + args.rank)
    data = np.ones(max(args.bytes // 4, args.world), np.float32)
    steps, sent, busy = 0, 0, 0.0
    epoch = _epoch(args, deadline) if args.rank == 0 else None
    try:
        while True:
            if args.rank == 0:
                cmd, comp = b"X", 0.0
                now = time.monotonic()
                if epoch is not None:
                    for t0, t1 in active:
                        if epoch + t1 > now and epoch + t0 < deadline - 1.0:
                            wait = epoch + t0 - now
                            if wait > 0:
                                time.sleep(wait)
                            cmd = b"G"
                            comp = args.compute * float(rng.lognormal(0.0, args.jitter))
                            break
                nxt.sendall(TOKEN.pack(cmd, comp))
                _ring_recv(prv, TOKEN.size)
            else:
                cmd, comp = TOKEN.unpack(_ring_recv(prv, TOKEN.size))
                nxt.sendall(TOKEN.pack(cmd, comp))
            if cmd != b"G":
                break
            time.sleep(comp)
            t = time.monotonic()
            sent += _ring_allreduce(data, args.rank, args.world, nxt, prv)
            data.fill(1.0)
            busy += time.monotonic() - t
            steps += 1
    finally:
        print(json.dumps({"rank": args.rank, "steps": steps, "bytes": sent,
                          "busy_s": round(busy, 3)}), flush=True)
        for s in (nxt, prv, lsock):
            s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
