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
"""

from dataclasses import dataclass, field, asdict
import math
import socket
import time

import numpy as np

from ina_fabric.protocol.fields import HEADER_BYTES, VERSION, MsgType, Flags, NO_EXPONENT
from ina_fabric.protocol.numpy_view import HEADER_DTYPE, ELEM_DTYPE
from ina_fabric.protocol.jobtable import LINK_DEFAULTS
from . import quantize as Q

_D = LINK_DEFAULTS["ethernet"]

__all__ = ["SwitchClient", "AllreduceStats", "SwitchUnavailable", "AllreduceTimeout"]


class SwitchUnavailable(ConnectionError):
    """No RESULT came back from the switch at all (down, wrong address, job unknown)."""


class AllreduceTimeout(TimeoutError):
    """A reliable allreduce made no progress for ``stall_timeout`` seconds."""


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
        self._ever_answered = False
        self._srtt, self._rttvar = 0.0, 0.0

    # Retransmission timer: TCP's estimator (RFC 6298) with Karn's rule. In bounded mode
    # a worker re-sends only after the switch's deadline, to fetch the stored result.
    def _rtt_sample(self, r):
        if not self._srtt:
            self._srtt, self._rttvar = r, r / 2
        else:
            self._rttvar = 0.75 * self._rttvar + 0.25 * abs(self._srtt - r)
            self._srtt = 0.875 * self._srtt + 0.125 * r

    def _rto(self):
        base = self.rto if not self._srtt else min(max(self._srtt + 4 * self._rttvar,
                                                       self.min_rto), 1.0)
        if self.mode == "bounded":
            return max(base, self.deadline * 1.5 + 0.002)
        return base

    @property
    def giveup(self):
        return max(20 * self._rto(), 0.5)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------------------
    def allreduce(self, values, average: bool = False):
        """Sum (or average) ``values`` (float32, any shape) over the job's workers.

        Returns ``(result, stats)``; ``result`` has the input's shape, dtype float32."""
        t0 = time.perf_counter()
        x = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        n, E = x.size, self.elements
        K = (n + E - 1) // E
        W = self.call_window(K)
        P = K + W
        base = self.seq
        self.seq = (self.seq + P) & 0xFFFFFFFF
        st = AllreduceStats(calls=1, elements=n)
        out = np.zeros(n, np.float32)
        local_exp = Q.local_exponents(x, E) if n else np.zeros(0, np.int8)
        if (local_exp == Q.NONFINITE).any():
            raise ValueError(f"allreduce input holds inf or NaN (chunk "
                             f"{int(np.argmax(local_exp == Q.NONFINITE))})")
        shared_exp = np.full(K, NO_EXPONENT, np.int16)
        done = np.zeros(P, bool)
        inflight = {}     # p -> send time, oldest first (at most W entries)
        tries = {}        # p -> backoff multiplier; Karn: no RTT samples from these
        pkts = {}
        stride = HEADER_BYTES + 4 * E
        bounded = self.mode == "bounded"

        def build(p):
            buf = np.zeros(stride, np.uint8)
            h = buf[:HEADER_BYTES].view(HEADER_DTYPE)[0]
            h["version"], h["type"], h["job"] = VERSION, MsgType.DATA, self.job
            h["worker"], h["seq"] = self.worker, (base + p) & 0xFFFFFFFF
            h["bitmap"] = 1 << self.worker
            h["exponent"] = int(local_exp[p]) if p < K else NO_EXPONENT
            if p == P - 1:
                h["flags"] = Flags.LAST
            nel = 0
            if p >= W:
                j = p - W
                nel = min(E, n - j * E)
                st.clipped += Q.pack_chunk(x, j * E, nel, int(shared_exp[j]), self.sbits, buf)
            h["nelem"] = nel
            return buf[:HEADER_BYTES + 4 * nel].tobytes()

        def send(p, retransmit=False):
            data = pkts.get(p)
            if data is None:
                data = pkts[p] = build(p)
            if retransmit:
                b = bytearray(data)
                b[2] |= Flags.RETRANSMIT
                data = bytes(b)
                st.retransmits += 1
                tries[p] = min(tries.get(p, 1) * 2, 64)
            self.sock.sendto(data, self.switch)
            st.packets_sent += 1
            inflight.pop(p, None)
            inflight[p] = time.monotonic()

        for p in range(min(W, P)):
            send(p)
        remaining = P
        last_progress = time.monotonic()
        sock = self.sock
        rx = self._rxbuf
        mv = memoryview(rx)
        while remaining:
            rto = self._rto()
            now = time.monotonic()
            wake = min((t + rto * tries.get(p, 1) for p, t in inflight.items()),
                       default=now + rto)
            sock.settimeout(max(wake - now, 0.0002))
            try:
                nbytes, src = sock.recvfrom_into(rx)
            except (socket.timeout, BlockingIOError):
                nbytes = 0
            except ConnectionRefusedError:
                nbytes = 0  # ICMP port unreachable from a switch that is down
            now = time.monotonic()
            if nbytes >= HEADER_BYTES:
                h = np.frombuffer(rx, HEADER_DTYPE, count=1)[0]
                p = (int(h["seq"]) - base) & 0xFFFFFFFF
                if (h["type"] == MsgType.RESULT and h["job"] == self.job and p < P
                        and 4 * int(h["nelem"]) == nbytes - HEADER_BYTES):
                    if done[p]:
                        st.duplicates_ignored += 1
                    else:
                        self._ever_answered = True
                        done[p] = True
                        remaining -= 1
                        last_progress = now
                        st.results += 1
                        t_sent = inflight.pop(p, None)
                        if t_sent is not None and p not in tries:
                            self._rtt_sample(now - t_sent)
                        self._apply(h, mv, p, K, W, E, n, out, shared_exp, st)
                        pkts.pop(p, None)
                        if p + W < P:
                            send(p + W)
                    continue
            # timers: retransmit what is overdue, with exponential backoff per packet
            # (a slow peer, not a loss, is the usual reason a result is late)
            overdue = [p for p, t in inflight.items() if now - t >= rto * tries.get(p, 1)]
            if not overdue:
                continue
            if not self._ever_answered and now - last_progress > self.connect_timeout:
                raise SwitchUnavailable(
                    f"no answer from switch {self.switch[0]}:{self.switch[1]} for job "
                    f"{self.job} within {self.connect_timeout}s")
            if bounded and now - last_progress > self.giveup:
                # results gone for good (slot reused): apply zeros, identically counted
                for p in overdue:
                    done[p] = True
                    remaining -= 1
                    del inflight[p]
                    st.abandoned_slots += 1
                    if p >= W:
                        st.entries_lost += min(E, n - (p - W) * E)
                    if p < K:
                        shared_exp[p] = NO_EXPONENT  # send zeros: no exponent agreed
                    if p + W < P:
                        send(p + W)
                last_progress = now
                continue
            if not bounded and now - last_progress > self.stall_timeout:
                raise AllreduceTimeout(
                    f"job {self.job} worker {self.worker}: no progress for "
                    f"{self.stall_timeout}s ({remaining} of {P} packets outstanding)")
            for p in overdue:
                send(p, retransmit=True)
        st.seconds = time.perf_counter() - t0
        self.total.add(st)
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

    def _apply(self, h, mv, p, K, W, E, n, out, shared_exp, st):
        flags = int(h["flags"])
        if p < K:
            shared_exp[p] = int(h["exponent"])
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
        out[j * E: j * E + nel] = Q.dequantize(elems, int(shared_exp[j]), self.sbits, rescale)
