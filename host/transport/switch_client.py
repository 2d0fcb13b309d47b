"""The worker side of in-network aggregation: a windowed, self-clocked UDP client.

``SwitchClient.allreduce(values)`` sums a float32 vector across the job's workers through
a switch (``ina switch`` or the FPGA). Per call, with K chunks of E elements and window W:

* the call's window ``w`` is a power of two dividing the job's window W (``call_window``);
* packet ``p`` (seq ``base + p``, p = 0 .. K+w-1) carries the data of chunk ``p - w`` (none
  for p < w) and this worker's exponent proposal for chunk ``p`` (see ``host.quantize``);
* packets 0..w-1 go out at once; the RESULT of ``p`` releases packet ``p + w``;
* reliable mode: a packet without a result after ``rto`` is sent again (RETRANSMIT), and
  the switch re-serves a stored result to a worker that repeats a completed seq;
* bounded mode: the switch closes a slot at its deadline with a PARTIAL result; the
  client re-sends only after the deadline (to fetch a stored result it missed), rescales
  a partial sum by N/count, and counts exactly the entries that came from fewer than N
  workers. Every worker applies the very same stored result, so replicas stay identical.

Sequence numbers continue across calls (``base`` advances by K+w), so all workers of a
job must make the same sequence of calls with the same sizes, as DDP does.

The window, timers and give-up rule are the pure ``host.transport.window.SendWindow``;
``AllreduceCall`` is a call's data side (packets out, results in), also without I/O; the
socket loop in ``SwitchClient.allreduce`` receives, decodes and performs their actions.
"""

from dataclasses import dataclass, field, asdict
import socket
import time

import numpy as np

from ina_fabric.protocol.fields import (HEADER_BYTES, VERSION, MsgType, Flags, NO_EXPONENT,
                                        GROUP_WORKER)
from ina_fabric.protocol.numpy_view import HEADER_DTYPE, ELEM_DTYPE
from ina_fabric.protocol.jobtable import LINK_DEFAULTS
from . import quantize as Q
from .window import SendWindow, WindowConfig, RttEstimator, Send, Deliver, Abandon, Hold

_D = LINK_DEFAULTS["ethernet"]

__all__ = ["SwitchClient", "AllreduceCall", "AllreduceStats", "SwitchUnavailable",
           "AllreduceTimeout", "AllreduceInconsistent"]


class SwitchUnavailable(ConnectionError):
    """No RESULT came back from the switch at all (down, wrong address, job unknown)."""


class AllreduceTimeout(TimeoutError):
    """A reliable allreduce made no progress for ``stall_timeout`` seconds."""


class AllreduceInconsistent(RuntimeError):
    """The switch answered a reliable call with a PARTIAL result (the job was installed
    again as bounded under this run). Every worker gets the same RESULT, so every worker
    raises."""


@dataclass
class AllreduceStats:
    calls: int = 0
    elements: int = 0
    packets_sent: int = 0
    retransmits: int = 0
    results: int = 0
    duplicates_ignored: int = 0
    partial_slots: int = 0
    entries_lost: int = 0        # entries of results that came from fewer than N workers
    overflow_slots: int = 0
    clipped: int = 0             # local values clipped by a non-agreed exponent
    abandoned_slots: int = 0     # bounded mode: results never recovered (zeros applied)
    foreign_ignored: int = 0     # datagrams not from the switch, or not a valid RESULT
    seconds: float = 0.0

    def add(self, other: "AllreduceStats"):
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def as_dict(self):
        return asdict(self)


@dataclass
class SwitchClient:
    """One worker of one job. ``bind`` must match the job table's member address."""
    switch: tuple[str, int]
    job: int
    worker: int
    nworkers: int
    window: int = _D.window        # defaults: ina_fabric.protocol.jobtable.LINK_DEFAULTS
    elements: int = _D.elements
    mode: str = _D.mode
    bind: tuple[str, int] = ("0.0.0.0", 0)
    rto: float = 0.02              # initial retransmission timeout (seconds)
    min_rto: float = 0.01          # floor of the adaptive timeout
    max_inflight_bytes: int = 1 << 20
    deadline: float = _D.deadline  # the switch's per-job deadline (bounded mode), seconds
    connect_timeout: float = 2.0   # no result at all for this long: SwitchUnavailable
    stall_timeout: float = 30.0    # reliable: no progress for this long: AllreduceTimeout
    impairment: object = None      # host.transport.impair.Impairment on the uplink
    seq: int = 0                   # next base sequence number
    total: AllreduceStats = field(default_factory=AllreduceStats)

    def __post_init__(self):
        if self.mode not in ("reliable", "bounded"):
            raise ValueError(f"mode {self.mode!r}: expected reliable or bounded")
        if not 0 <= self.worker < self.nworkers <= 32:
            raise ValueError(f"worker {self.worker} of {self.nworkers}: need 0 <= w < N <= 32")
        try:
            self.switch = (socket.gethostbyname(self.switch[0]), int(self.switch[1]))
        except (OSError, ValueError, IndexError) as e:
            raise ValueError(f"bad switch address {self.switch!r}: {e}") from None
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        sock.bind(self.bind)
        self.address = sock.getsockname()
        if self.impairment is not None and self.impairment.active:
            from .impair import ImpairedSocket
            sock = ImpairedSocket(sock, self.impairment)
        self.sock = sock
        self.sbits = Q.scale_bits(self.nworkers)
        self._rxbuf = bytearray(HEADER_BYTES + 4 * 16384 + 64)
        self._rtt = RttEstimator()

    # Retransmission timer: TCP's estimator (RFC 6298) with Karn's rule, kept across calls;
    # the window's rules are in ``host.transport.window``.
    def _rto(self):
        return self._rtt.rto(WindowConfig.of(self))

    @property
    def giveup(self):
        return self._rtt.giveup(WindowConfig.of(self))

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------------------
    def allreduce(self, values, average: bool = False):
        """Sum (or average) ``values`` (float32, any shape) over the job's workers.

        Returns ``(result, stats)``; ``result`` has the input's shape, dtype float32.
        The socket loop: receive, decode, feed the ``SendWindow``, perform its actions."""
        t0 = time.perf_counter()
        x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        W = self.call_window(-(-x.size // self.elements))
        call = AllreduceCall(x, self.job, self.worker, self.nworkers, self.elements,
                             self.seq, W)
        self.seq = (self.seq + call.P) & 0xFFFFFFFF
        win = SendWindow(call.P, W, WindowConfig.of(self), self._rtt)
        sock, switch, rx = self.sock, self.switch, self._rxbuf
        mv = memoryview(rx)
        h, nbytes = None, 0

        def perform(actions):
            for a in actions:
                kind = type(a)
                if kind is Send:
                    sock.sendto(call.packet(a.p, a.retransmit), switch)
                elif kind is Deliver:
                    call.apply(h, mv, a.p)
                elif kind is Abandon:
                    call.abandon(a.p)
                elif kind is Hold:
                    call.hold(a.p, rx[:nbytes])
                elif a.reason == "unavailable":
                    raise SwitchUnavailable(
                        f"no answer from switch {switch[0]}:{switch[1]} for job "
                        f"{self.job} within {self.connect_timeout}s")
                else:
                    raise AllreduceTimeout(
                        f"job {self.job} worker {self.worker}: no progress for "
                        f"{self.stall_timeout}s ({win.remaining} of {call.P} packets "
                        f"outstanding)")

        perform(win.start(time.monotonic()))
        while not win.done:
            now = time.monotonic()
            wake = win.next_wakeup()
            sock.settimeout(max(wake - now, 0.0002) if wake is not None
                            else max(win.rto(), 0.0002))
            try:
                nbytes, src = sock.recvfrom_into(rx)
            except (socket.timeout, BlockingIOError):
                nbytes = 0
            except ConnectionRefusedError:
                nbytes = 0  # ICMP port unreachable from a switch that is down
            now = time.monotonic()
            if nbytes and tuple(src) != switch:
                call.stats.foreign_ignored += 1   # only the switch's RESULTs count
                nbytes = 0
            if nbytes >= HEADER_BYTES:
                h = np.frombuffer(rx, HEADER_DTYPE, count=1)[0]
                p = call.result_index(h, nbytes)
                if p is None:
                    call.stats.foreign_ignored += 1
                elif self.mode == "reliable" and int(h["flags"]) & Flags.PARTIAL:
                    raise AllreduceInconsistent(
                        f"job {self.job} worker {self.worker}: the switch answered a "
                        f"reliable call with a PARTIAL result (was the job installed "
                        f"again as bounded?)")
                if p is not None:
                    actions = win.on_result(p, now)
                    if actions:
                        perform(actions)
                    else:
                        call.stats.duplicates_ignored += 1
                    continue
            perform(win.on_timer(now))
        st = call.stats
        st.seconds = time.perf_counter() - t0
        self.total.add(st)
        out = call.out
        if average:
            out /= self.nworkers
        return out.reshape(np.shape(values)), st

    def call_window(self, chunks: int) -> int:
        """The window of one call: a power of two that divides the job's window (so
        that a slot's result is never overwritten before every worker has it; see the
        README), about half the chunk count: fewer header-only packets for small buckets
        at the cost of a few more round trips. It also keeps at most
        ``max_inflight_bytes`` on the wire, so N workers' bursts fit the switch's socket
        buffer instead of overflowing it."""
        cap = max(1, min(chunks // 2, self.window,
                         self.max_inflight_bytes // (4 * self.elements)))
        w = 1
        while w * 2 <= cap and self.window % (w * 2) == 0:
            w *= 2
        return w



class AllreduceCall:
    """The data side of one call, without I/O or clock: DATA packet ``p`` (built on first
    use, kept until its result is in), the RESULT of ``p`` applied, or zeros for an
    abandoned one. ``SendWindow`` says when; ``stats`` counts what was done."""

    def __init__(self, x, job, worker, nworkers, elements, base, window):
        n, E = x.size, elements
        self.x, self.n, self.E, self.W = x, n, E, window
        self.K = K = (n + E - 1) // E
        self.P = K + window
        self.job, self.worker, self.nworkers, self.base = job, worker, nworkers, base
        self.sbits = Q.scale_bits(nworkers)
        self.stats = AllreduceStats(calls=1, elements=n)
        self.out = np.zeros(n, np.float32)
        self.local_exp = Q.local_exponents(x, E) if n else np.zeros(0, np.int8)
        if (self.local_exp == Q.NONFINITE).any():
            raise ValueError(f"allreduce input holds inf or NaN (chunk "
                             f"{int(np.argmax(self.local_exp == Q.NONFINITE))})")
        self.shared_exp = np.full(K, NO_EXPONENT, np.int16)
        self.pkts = {}
        self.held = {}      # p -> a RESULT that came before packet p was sent

    def _build(self, p):
        K, W, E, n = self.K, self.W, self.E, self.n
        buf = np.zeros(HEADER_BYTES + 4 * E, np.uint8)
        h = buf[:HEADER_BYTES].view(HEADER_DTYPE)[0]
        h["version"], h["type"], h["job"] = VERSION, MsgType.DATA, self.job
        h["worker"], h["seq"] = self.worker, (self.base + p) & 0xFFFFFFFF
        h["bitmap"] = 1 << self.worker
        h["exponent"] = int(self.local_exp[p]) if p < K else NO_EXPONENT
        if p == self.P - 1:
            h["flags"] = Flags.LAST
        nel = 0
        if p >= W:
            j = p - W
            nel = min(E, n - j * E)
            self.stats.clipped += Q.pack_chunk(self.x, j * E, nel, int(self.shared_exp[j]),
                                               self.sbits, buf)
        h["nelem"] = nel
        return buf[:HEADER_BYTES + 4 * nel].tobytes()

    def packet(self, p, retransmit=False) -> bytes:
        """The DATA datagram of packet ``p``, counted as sent."""
        data = self.pkts.get(p)
        if data is None:
            data = self.pkts[p] = self._build(p)
        st = self.stats
        st.packets_sent += 1
        if retransmit:
            b = bytearray(data)
            b[2] |= Flags.RETRANSMIT
            data = bytes(b)
            st.retransmits += 1
        return data

    def nelem_of(self, p) -> int:
        """Elements packet ``p`` carries (and its RESULT must carry)."""
        return min(self.E, self.n - (p - self.W) * self.E) if p >= self.W else 0

    def result_index(self, h, nbytes):
        """The packet index of a RESULT of this call (header ``h``, ``nbytes`` long), or
        None for anything else: every field is checked before use (type, version, job,
        seq in this call, the element count this packet has, the length, the count of
        contributors, the worker field)."""
        p = (int(h["seq"]) - self.base) & 0xFFFFFFFF
        if (h["type"] == MsgType.RESULT and h["version"] == VERSION and h["job"] == self.job
                and p < self.P and int(h["nelem"]) == self.nelem_of(p)
                and 4 * int(h["nelem"]) == nbytes - HEADER_BYTES
                and int(h["count"]) <= self.nworkers
                and int(h["worker"]) in (self.worker, GROUP_WORKER)):
            return p
        return None

    def hold(self, p, datagram):
        """Keep the RESULT of ``p`` (a copy) until ``SendWindow`` delivers it."""
        self.held[p] = bytes(datagram)

    def apply(self, h, mv, p):
        """The first RESULT of ``p`` (header ``h``, datagram in ``mv``; or the one held)."""
        data = self.held.pop(p, None)
        if data is not None:
            h, mv = np.frombuffer(data, HEADER_DTYPE, count=1)[0], memoryview(data)
        st = self.stats
        st.results += 1
        self.pkts.pop(p, None)
        K, W, E, n = self.K, self.W, self.E, self.n
        flags = int(h["flags"])
        if p < K:
            self.shared_exp[p] = int(h["exponent"])
        if flags & Flags.OVERFLOW:
            st.overflow_slots += 1
        count = int(h["count"])
        partial = bool(flags & Flags.PARTIAL) or count < self.nworkers
        nel = int(h["nelem"])
        if partial:
            st.partial_slots += 1
            st.entries_lost += nel
        if p < W or nel == 0:
            return
        j = p - W
        if count == 0:
            return
        elems = np.frombuffer(mv, ELEM_DTYPE, count=nel, offset=HEADER_BYTES)
        rescale = self.nworkers / count if partial else 1.0
        self.out[j * E: j * E + nel] = Q.dequantize(elems, int(self.shared_exp[j]),
                                                    self.sbits, rescale)

    def abandon(self, p):
        """Bounded mode: the result of ``p`` is gone for good; zeros, identically counted."""
        st = self.stats
        st.abandoned_slots += 1
        if p >= self.W:
            st.entries_lost += self.nelem_of(p)
        if p < self.K:
            self.shared_exp[p] = NO_EXPONENT  # send zeros: no exponent agreed
