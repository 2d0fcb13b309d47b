"""The userspace delay line: a link's delay, jitter and loss between two TAP devices.

This kernel has no netem (and no eBPF toolchain), so, as mahimahi does, a link that
needs delay is two TAP devices, one in each namespace, and this process between them:
every frame read from one TAP is held until ``arrival + delay (+ jitter)`` and then
written to the other. The lab gives each TAP a tbf for the link's rate (a frame is
serialized at the rate, then propagates), puts the switch side into the bridge and the
addresses on, all through netlink; this process only moves frames.

- **delay**: fixed, per direction (the one-way delay; a round trip sees it twice).
- **jitter**: a normal deviation with this standard deviation added to each frame's
  delay, never below zero and never reordering (a frame leaves no earlier than the one
  before it, as on a wire).
- **loss**: each frame is dropped with this probability (seeded, per direction).

Timing: ``select`` with a microsecond timeout, 1 us timer slack and, where allowed,
SCHED_FIFO, so a frame leaves within tens of microseconds of its time on an idle
machine. Every frame's lateness (time written minus time due) is recorded; the
statistics go to ``--stats`` as JSON when the process ends (SIGTERM) or on SIGUSR1.

    python -m ina_fabric.host.lab.delayline --a NS_A:IF_A --b NS_B:IF_B --delay-ms 20
"""

import argparse
import ctypes
import errno
import fcntl
import json
import os
import random
import select
import signal
import struct
import sys
import time
from collections import deque

__all__ = ["open_tap", "main"]

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
PR_SET_TIMERSLACK = 29


def open_tap(ifname: str) -> int:
    """A (non-persistent) TAP device ``ifname`` in the caller's namespace; its fd. The
    device disappears when the last fd closes (so a dead delay line leaves no link)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TAP | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class _Direction:
    __slots__ = ("src", "dst", "queue", "rng", "last", "frames", "bytes", "lost", "late")

    def __init__(self, src, dst, seed):
        self.src, self.dst = src, dst
        self.queue = deque()
        self.rng = random.Random(seed)
        self.last = 0.0
        self.frames = self.bytes = self.lost = 0
        self.late = []          # seconds past due, one per frame (capped)


def realtime_tune():
    """1 us timer slack; SCHED_FIFO where the system allows it. Returns what took."""
    got = {"timerslack_ns": None, "sched_fifo": False}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0) == 0:
            got["timerslack_ns"] = 1000
    except OSError:
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        got["sched_fifo"] = True
    except (OSError, AttributeError):
        pass
    return got


def _quantiles(xs, qs=(0.5, 0.99, 0.999, 1.0)):
    if not xs:
        return {}
    s = sorted(xs)
    return {f"p{q * 100:g}": s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] * 1e3
            for q in qs}


def run(fd_a, fd_b, delay, jitter, loss, seed, stats_path=None, mtu=65536, tuned=None):
    dirs = {fd_a: _Direction(fd_a, fd_b, 2 * seed), fd_b: _Direction(fd_b, fd_a, 2 * seed + 1)}
    order = list(dirs.values())
    cap = 200_000

    def dump(*_):
        if not stats_path:
            return
        doc = {"delay_ms": delay * 1e3, "jitter_ms": jitter * 1e3, "loss": loss,
               "tuning": tuned or {}}
        for name, d in zip(("a_to_b", "b_to_a"), order):
            doc[name] = {"frames": d.frames, "bytes": d.bytes, "lost": d.lost,
                         "late_ms": _quantiles(d.late)}
        tmp = f"{stats_path}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, stats_path)

    def on_term(*_):
        raise _Stop        # out of select at once (PEP 475 would otherwise resume it)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, dump)
    clock = time.monotonic
    fds = [fd_a, fd_b]
    try:
        _loop(dirs, order, fds, delay, jitter, loss, mtu, clock, cap)
    except _Stop:
        pass
    dump()


class _Stop(Exception):
    pass


def _loop(dirs, order, fds, delay, jitter, loss, mtu, clock, cap):
    while True:
        now = clock()
        due = None
        for d in order:                          # write everything that is due
            q = d.queue
            while q and q[0][0] <= now:
                t, frame = q.popleft()
                try:
                    os.write(d.dst, frame)
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EIO, errno.ENOBUFS):
                        raise
                if len(d.late) < cap:
                    d.late.append(clock() - t)
            if q and (due is None or q[0][0] < due):
                due = q[0][0]
        timeout = 0.5 if due is None else max(0.0, due - clock())
        try:
            ready, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            continue
        for fd in ready:                         # read what arrived, stamp it
            d = dirs[fd]
            for _ in range(256):
                try:
                    frame = os.read(fd, mtu)
                except BlockingIOError:
                    break
                now = clock()
                if loss and d.rng.random() < loss:
                    d.lost += 1
                    continue
                hold = delay
                if jitter:
                    hold = max(0.0, hold + d.rng.gauss(0.0, jitter))
                t = max(now + hold, d.last)
                d.last = t
                d.queue.append((t, frame))
                d.frames += 1
                d.bytes += len(frame)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ina_fabric.host.lab.delayline",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, metavar="NS:IF", help="first TAP: namespace:name")
    ap.add_argument("--b", required=True, metavar="NS:IF", help="second TAP")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay")
    ap.add_argument("--jitter-ms", type=float, default=0.0, help="std. deviation of delay")
    ap.add_argument("--loss", type=float, default=0.0, help="drop probability per frame")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stats", metavar="FILE", help="statistics as JSON, at exit or SIGUSR1")
    args = ap.parse_args(argv)
    from .netns import enter
    fds = []
    for spec in (args.a, args.b):
        ns, _, ifname = spec.rpartition(":")
        if ns:
            enter(ns)
        fds.append(open_tap(ifname))
    tuned = realtime_tune()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    run(fds[0], fds[1], args.delay_ms / 1e3, args.jitter_ms / 1e3, args.loss, args.seed,
        args.stats, tuned=tuned)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
