"""One island's side of a round's exchange: its update leaves once, paced, from the
round's start plus its send offset; the aggregate of its inbound islands comes back from
its edge as one stream. No training here, only datagrams (numpy over one buffer).

Values travel as int32 fixed point with one exponent for the whole cycle (``EXPONENT``:
parameters are clipped to ``|v| < 2**EXPONENT``), so no exponent has to be agreed
per chunk and a sender needs no answer before it sends (the windowed allreduce of
``host.transport`` agrees exponents one window early; a multicast stream cannot).
``scale_bits(n)`` leaves headroom for the sum of ``n`` islands.

Sequence numbers: an edge job is installed once per run and used once per cycle, so the
c-th use of a job numbers its packets ``c * P .. c * P + P - 1`` (P packets per update):
every sender of the job and its edge agree without a word.
"""

from dataclasses import dataclass
import math
import os
import select
import socket
import time

import numpy as np

from ina_fabric.protocol.fields import HEADER_BYTES, VERSION, MsgType, Flags
from ina_fabric.protocol.numpy_view import HEADER_DTYPE, ELEM_DTYPE

__all__ = ["EXPONENT", "Quantizer", "packets", "ExchangeResult", "exchange", "mix",
           "paced"]

EXPONENT = 4


class paced:
    """Run the exchange with the calling thread at SCHED_FIFO (where allowed): the
    stand-in for a NIC's hardware pacing. On these shared cores a sender at normal
    priority leaves 10-20 ms late now and then, and at line rate it never catches up."""

    def __init__(self, priority=5):
        self.priority, self.on = priority, False

    def __enter__(self):
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self.priority))
            self.on = True
        except (OSError, AttributeError):
            pass
        return self

    def __exit__(self, *exc):
        if self.on:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


@dataclass(frozen=True)
class Quantizer:
    """``q = rint(v * 2**(S - EXPONENT))``, ``S = 30 - ceil(log2 n)``: the sum of ``n``
    values with ``|v| < 2**EXPONENT`` stays below 2**30."""
    n: int

    @property
    def scale(self) -> float:
        return 2.0 ** (30 - math.ceil(math.log2(max(self.n, 1))) - EXPONENT)

    def quantize(self, v: np.ndarray) -> np.ndarray:
        lim = 2.0 ** EXPONENT * (1 - 2 ** -20)
        return np.rint(np.clip(v, -lim, lim) * self.scale)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return q / self.scale


def packets(values: np.ndarray, job: int, seq0: int, elements: int, quant: Quantizer,
            session: int = 0):
    """The update as ``P`` DATA datagrams in one structured array (header + E elements
    each; the last one zero-padded); ``arr.tobytes()`` of a row is the datagram."""
    v = np.asarray(values, np.float64).reshape(-1)
    p = -(-v.size // elements)
    dt = np.dtype([("h", HEADER_DTYPE), ("e", ELEM_DTYPE, (elements,))])
    arr = np.zeros(p, dt)
    h = arr["h"]
    h["version"], h["type"], h["exponent"] = VERSION, MsgType.DATA, EXPONENT
    h["job"], h["worker"], h["nelem"], h["session"] = job, 0, elements, session
    h["seq"] = (seq0 + np.arange(p)) & 0xFFFFFFFF
    flat = np.zeros(p * elements)
    flat[:v.size] = quant.quantize(v)
    arr["e"] = flat.reshape(p, elements)
    return arr


@dataclass
class ExchangeResult:
    sum: np.ndarray | None     # dequantized sum of the inbound islands (None: none)
    count: np.ndarray | None   # per chunk: how many inbound islands it holds
    t_sent: float              # when the last datagram left (monotonic)
    t_done: float              # when the last aggregate datagram arrived (or gave up)
    sent: int                  # datagrams sent
    received: int              # aggregate datagrams received (distinct seqs)
    partial: int               # of which PARTIAL (closed at the edge's deadline)
    missing: int               # seqs that never came (given up at the timeout)
    late_s: float = 0.0        # the latest any datagram left after its due time


def exchange(sock, values, *, start: float, offset: float, rate: float, send_job,
             send_to, edge_job, seq0: int, elements: int, quant: Quantizer, session: int,
             timeout: float, clock=time.monotonic) -> ExchangeResult:
    """Send ``values`` under ``send_job`` to ``send_to`` (the edge replicator) paced at
    ``rate`` payload bytes/s from ``start + offset``, and receive the aggregate of edge
    job ``edge_job`` until every seq is in or ``timeout`` after
    ``start``. ``send_job=None``: nothing to send; ``edge_job=None``: nothing inbound."""
    v = np.asarray(values, np.float64).reshape(-1)
    npk = -(-v.size // elements)
    out = None
    if send_job is not None:
        arr = packets(v, send_job, seq0, elements, quant, session)
        rows = [arr[i:i + 1].tobytes() for i in range(npk)]
        gap = elements * 4 / rate
    else:
        rows, gap = [], 0.0
    acc = np.zeros((npk, elements), np.int64) if edge_job is not None else None
    count = np.zeros(npk, np.int64) if edge_job is not None else None
    got = np.zeros(npk, bool)
    received = partial = 0
    buf = bytearray(65536)
    hv = memoryview(buf)
    t0 = start + offset
    i, t_sent, t_done, late = 0, start, start, 0.0
    end = start + timeout
    fd = sock.fileno()
    while True:
        now = clock()
        while i < len(rows) and now >= t0 + i * gap:       # due: send (catch up in bursts)
            late = max(late, now - (t0 + i * gap))
            sock.sendto(rows[i], send_to)
            i += 1
            now = clock()
        if i == len(rows) and i:
            t_sent = t_sent if t_sent > start else now
        done_rx = edge_job is None or received == npk
        if i == len(rows) and done_rx:
            break
        if now >= end:
            break
        wake = end if i == len(rows) else min(end, t0 + i * gap)
        r, _, _ = select.select([fd], [], [], max(0.0, wake - now))
        if not r:
            continue
        while True:
            try:
                n = sock.recv_into(buf, 65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if n < HEADER_BYTES or edge_job is None:
                continue
            h = np.frombuffer(hv[:HEADER_BYTES], HEADER_DTYPE, count=1)[0]
            if h["type"] != MsgType.RESULT or h["job"] != edge_job or \
                    int(h["session"]) != session:
                continue
            p = (int(h["seq"]) - seq0) & 0xFFFFFFFF
            if p >= npk or got[p] or int(h["nelem"]) != elements:
                continue
            got[p] = True
            acc[p] = np.frombuffer(hv[HEADER_BYTES:HEADER_BYTES + 4 * elements],
                                   ELEM_DTYPE)
            count[p] = int(h["count"])
            received += 1
            partial += bool(int(h["flags"]) & Flags.PARTIAL)
            t_done = clock()
    if edge_job is not None:
        out = quant.dequantize(acc.reshape(-1)[:v.size].astype(np.float64))
        count = np.where(got, count, 0)
    else:
        t_done = max(t_done, t_sent)
    return ExchangeResult(out, count, t_sent, t_done, i, received, partial,
                          (npk - received) if edge_job is not None else 0, late)


def mix(own: np.ndarray, res: ExchangeResult, elements: int) -> np.ndarray:
    """``(own + sum of inbound) / (1 + contributors)`` per chunk: the clique's average
    where every stream arrived, the average of those that did elsewhere."""
    if res.sum is None:
        return own
    c = np.repeat(res.count, elements)[:own.size]
    return (own + res.sum) / (1.0 + c)
