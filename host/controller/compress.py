"""Gradient precision that really changes the bytes on the wire: the Gloo path.

This module is the exchange the real-training experiments use on the Gloo path (the switch
path, where the switch sums the narrow codes, is ``switchpath``): each worker
quantizes its gradient once (``q`` = 16, 8 or 4 bits, one float32 scale per chunk,
unbiased stochastic rounding; or raw float32 for ``q`` = 32), the packed messages are
all-gathered over a Gloo process group of their own, and every worker dequantizes and
sums the N messages in float32. That is the in-network aggregation contract (each worker's
gradient quantized once, summed exactly), done by the hosts, so the cost model's noise
term applies unchanged; each worker sends its message to N-1 peers.

Message layout (one uint8 tensor, the same length on every worker for a given q)::

    float32[2]   |g|^2 of the sender's gradient, E|Q(g)-g|^2 of its quantization
    float32[C]   per-chunk scales (absent for q=32)
    payload      int16 / int8 / two int4 per byte (offset binary) / float32

Bandwidth is limited by a userspace token bucket (``TokenBucket``) whose rate follows a
contention trace, so transfers take the time they would on a shared link of that rate,
and the achieved bandwidth the controller measures is real (bytes over wall time of the
whole exchange, throttle included).
"""

import math
import threading
import time

import numpy as np

from .costmodel import payload_bytes
from .knobs import ConfigError, PRECISIONS

__all__ = ["quantize", "dequantize", "expected_sq_error", "relative_errors", "encode",
           "decode", "message_bytes", "TokenBucket", "CompressedCollective",
           "current_collective", "meter_add"]

HEADER = 8
#: how the messages travel (``CompressedCollective.exchange``)
EXCHANGES = ("ring", "direct")
#: bytes of each worker's message per paced gather (``CompressedCollective.set_pace``)
PACE_CHUNK = 16384


def _levels(bits):
    return 2 ** (bits - 1) - 1


def _check_bits(bits):
    if bits not in PRECISIONS:
        raise ConfigError(f"precision {bits!r}: must be one of {PRECISIONS}")


def _scales(x, bits, chunk):
    n = x.size
    pad = (-n) % chunk
    xp = np.pad(np.abs(x), (0, pad)).reshape(-1, chunk)
    return (xp.max(1) / _levels(bits)).astype(np.float32), pad


def quantize(x: np.ndarray, bits: int, chunk: int = 1024, rng=None):
    """float32 vector -> (integer codes int8/int16 in [-L, L], float32 scale per chunk),
    with unbiased stochastic rounding (E[code * scale] = x)."""
    _check_bits(bits)
    if bits == 32:
        raise ConfigError("quantize: precision 32 is sent as raw float32, not quantized")
    x = np.ascontiguousarray(x, np.float32).ravel()
    if not np.all(np.isfinite(x)):
        raise ValueError("quantize: gradient has non-finite values")
    rng = rng if rng is not None else np.random.default_rng()
    scales, pad = _scales(x, bits, chunk)
    safe = np.where(scales > 0, scales, 1.0).astype(np.float32)
    y = (np.pad(x, (0, pad)).reshape(-1, chunk) / safe[:, None]).ravel()[:x.size]
    codes = np.floor(y + rng.random(x.size, dtype=np.float32))
    L = _levels(bits)
    np.clip(codes, -L, L, out=codes)
    return codes.astype(np.int16 if bits == 16 else np.int8), scales


def dequantize(codes: np.ndarray, scales: np.ndarray, chunk: int = 1024) -> np.ndarray:
    n = codes.size
    pad = (-n) % chunk
    c = np.pad(codes.astype(np.float32), (0, pad)).reshape(-1, chunk)
    return (c * scales[:, None]).ravel()[:n]


def expected_sq_error(x: np.ndarray, bits: int, chunk: int = 1024) -> float:
    """Exact E|Q(x)-x|^2 of stochastic rounding: sum over elements of step^2 f (1 - f),
    f the fractional part of x/step."""
    if bits == 32:
        return 0.0
    x = np.ascontiguousarray(x, np.float32).ravel()
    scales, pad = _scales(x, bits, chunk)
    safe = np.where(scales > 0, scales, 1.0)
    y = np.pad(x, (0, pad)).reshape(-1, chunk) / safe[:, None]
    f = y - np.floor(y)
    return float(((f * (1.0 - f)).sum(1) * scales.astype(np.float64) ** 2).sum())


def relative_errors(x: np.ndarray, precisions=PRECISIONS, chunk: int = 1024) -> dict:
    """r_q = E|Q(x)-x|^2 / |x|^2 for each precision (what the cost model calls r_q)."""
    x = np.ascontiguousarray(x, np.float32).ravel()
    n2 = float(np.dot(x.astype(np.float64), x))
    if n2 == 0:
        return {q: 0.0 for q in precisions}
    return {q: expected_sq_error(x, q, chunk) / n2 for q in precisions}


def message_bytes(n: int, bits: int, chunk: int = 1024) -> int:
    return HEADER + payload_bytes(n, bits, chunk)


def encode(x: np.ndarray, bits: int, chunk: int = 1024, rng=None) -> np.ndarray:
    """One worker's message (uint8) for gradient x at this precision."""
    x = np.ascontiguousarray(x, np.float32).ravel()
    _check_bits(bits)
    norm2 = float(np.dot(x.astype(np.float64), x))
    if bits == 32:
        head = np.array([norm2, 0.0], np.float32)
        return np.concatenate([head.view(np.uint8), x.view(np.uint8)])
    codes, scales = quantize(x, bits, chunk, rng)
    err = expected_sq_error(x, bits, chunk)
    head = np.array([norm2, err], np.float32)
    if bits == 4:
        u = (codes.astype(np.int16) + 8).astype(np.uint8)       # 1..15
        if u.size % 2:
            u = np.append(u, np.uint8(8))
        payload = (u[0::2] | (u[1::2] << 4)).astype(np.uint8)
    else:
        payload = codes.view(np.uint8)
    return np.concatenate([head.view(np.uint8), scales.view(np.uint8), payload])


def decode(msg: np.ndarray, n: int, bits: int, chunk: int = 1024):
    """(gradient float32[n], |g|^2, expected quantization error) from one message."""
    msg = np.ascontiguousarray(msg, np.uint8)
    if msg.size != message_bytes(n, bits, chunk):
        raise ValueError(f"message of {msg.size} bytes, expected {message_bytes(n, bits, chunk)}"
                         f" for {n} elements at {bits} bits")
    norm2, err = (float(v) for v in msg[:HEADER].view(np.float32))
    if bits == 32:
        return msg[HEADER:].view(np.float32).copy(), norm2, err
    nch = math.ceil(n / chunk)
    scales = msg[HEADER:HEADER + 4 * nch].view(np.float32)
    body = msg[HEADER + 4 * nch:]
    if bits == 4:
        codes = np.empty(2 * body.size, np.int8)
        codes[0::2] = (body & 0x0F).astype(np.int8) - 8
        codes[1::2] = (body >> 4).astype(np.int8) - 8
        codes = codes[:n]
    else:
        codes = body.view(np.int16 if bits == 16 else np.int8)
    return dequantize(codes, scales, chunk), norm2, err



def meter_add(m: dict, *, sent, seconds, sync, fixed, byte_s, codec, n, small, big, rq,
              **extra):
    """One exchange into an exchange meter ``m`` (the cost model's online figures): its
    bytes and times, the payload's time (``byte_s``, floored at 1 us), the codec's CPU
    time, the quantization sample (``rq``: precision -> relative error, or None) and any
    path-specific counts in ``extra``. Both exchange paths (Gloo and the switch) use it."""
    m["bytes"] += sent
    m["seconds"] += seconds
    m["sync_s"] += sync
    m["fixed_s"] += fixed
    m["byte_s"] += max(byte_s, 1e-6)
    m["codec_s"] += codec
    m["calls"] += 1
    m["elements"] += n
    m["small_sq"] += small
    m["big_sq"] += big
    for key, v in extra.items():
        m[key] += v
    if rq is not None:
        for q, r in rq.items():
            m["rq_sum"][q] = m["rq_sum"].get(q, 0.0) + r
        m["rq_n"] += 1

class TokenBucket:
    """Userspace rate limiter: ``take(n)`` blocks until n bytes of credit have accrued at
    ``rate_fn(t)`` bytes/s (t seconds since ``start``), with at most ``burst`` bytes saved."""

    def __init__(self, rate_fn, burst: float = 16384, start: float = None):
        self.rate_fn = rate_fn
        self.burst = float(burst)
        self.start = time.perf_counter() if start is None else start
        self._credit = self.burst
        self._last = self.start

    def _refill(self, now):
        t0, t1 = self._last - self.start, now - self.start
        self._credit = min(self.burst, self._credit + self._integral(t0, t1))
        self._last = now

    def _integral(self, t0, t1):
        mean = getattr(self.rate_fn, "mean_rate", None)
        if mean is not None and t1 > t0:
            return mean(t0, t1) * (t1 - t0)
        return float(self.rate_fn(t0)) * (t1 - t0)

    def take(self, n: float):
        """Wait until n bytes may be sent; returns seconds waited."""
        waited = 0.0
        self._refill(time.perf_counter())
        self._credit -= n
        while self._credit < 0:
            rate = float(self.rate_fn(time.perf_counter() - self.start))
            if rate <= 0:
                raise ConfigError(f"token bucket rate {rate} bytes/s: must be > 0")
            dt = min(-self._credit / rate, 0.05)
            time.sleep(dt)
            waited += dt
            self._refill(time.perf_counter())
        return waited


_CURRENT = {}


def current_collective():
    """The CompressedCollective built in this process (the controller on rank 0 reads its
    measurements), or None."""
    return _CURRENT.get("c")


class CompressedCollective:
    """``allreduce(np.ndarray) -> (sum, stats)`` through quantized all-gather on its own
    Gloo group, throttled by a token bucket; ``set_precision(bits)`` changes the knob.

    Measurements, accumulated until ``take_measurements()``: payload bytes sent, seconds
    spent sending them (throttle included; ``byte_s`` without the fixed cost of one
    all-gather, ``fixed_s``), seconds spent waiting for the slowest worker (``sync_s``),
    seconds of codec CPU time (``codec_s``: encode, decode and sum, r_q samples), squared
    norms for the noise scale (mean over workers of |g_i|^2, and of the all-reduced mean
    corrected for quantization noise), and r_q for every precision on a sample of calls."""

    def __init__(self, rank, world, bits=32, chunk=1024, rate_fn=None, group=None,
                 seed=0, error_every=10, start=None, epoch_file=None, probe_every=10,
                 exchange="ring", link_rate=None, pace=1.0, pace_chunk=PACE_CHUNK):
        import torch.distributed as dist
        _check_bits(bits)
        if exchange not in EXCHANGES:
            raise ConfigError(f"exchange {exchange!r}: expected one of {', '.join(EXCHANGES)}")
        #: "ring": Gloo's all-gather (N-1 steps in sequence, each a trip through the
        #: sender's uplink and the receiver's downlink); "direct": every worker sends its
        #: message to every peer at once (Gloo point-to-point), one trip for all
        self.exchange = exchange
        self.rank, self.world, self.bits, self.chunk = rank, world, bits, chunk
        self.group = group if group is not None else dist.new_group(backend="gloo")
        self.bucket = TokenBucket(rate_fn, start=start) if rate_fn is not None else None
        #: the pace knob: payload paced at ``pace * link_rate`` bytes/s, ``pace_chunk``
        #: bytes of each message at a time (``set_pace``)
        if link_rate is not None and not (math.isfinite(link_rate) and link_rate > 0):
            raise ConfigError(f"link_rate {link_rate!r} bytes/s: must be > 0")
        if int(pace_chunk) < 1:
            raise ConfigError(f"pace_chunk {pace_chunk!r}: must be >= 1 byte")
        self.link_rate, self.pace_chunk = link_rate, int(pace_chunk)
        self.pace, self.pacer = 1.0, None
        self.set_pace(pace)
        self.rng = np.random.default_rng(seed * 7919 + rank)
        self.error_every = error_every
        # the fixed cost of an all-gather is measured on every probe_every-th call (the
        # probe is one more round trip through queues that other jobs fill) and reused
        self.probe_every = probe_every
        self._fixed = 0.0
        # rank 0 writes CLOCK_MONOTONIC at its first exchange here: the clock that lab
        # contention schedules follow (``host.lab.bgjob --epoch-file``)
        self.epoch_file = epoch_file if rank == 0 else None
        self.calls = 0
        self.total_bytes = 0
        self._lock = threading.Lock()
        self._reset()
        _CURRENT["c"] = self

    def _reset(self):
        self.m = {"bytes": 0, "seconds": 0.0, "calls": 0, "elements": 0, "sync_s": 0.0,
                  "fixed_s": 0.0, "byte_s": 0.0, "codec_s": 0.0, "pace_wait_s": 0.0, "small_sq": 0.0, "big_sq": 0.0,
                  "rq_sum": {}, "rq_n": 0}

    def set_precision(self, bits: int):
        _check_bits(bits)
        self.bits = int(bits)

    def set_pace(self, pace: float):
        """Pace the payload at ``pace`` times the link rate (1: unpaced). The pacer is
        a token bucket of one chunk per peer: each chunk of the message waits for its
        credit, so the bytes leave spread over the exchange, not in one burst."""
        if not (isinstance(pace, (int, float)) and math.isfinite(pace) and 0 < pace <= 1):
            raise ConfigError(f"pace {pace!r}: must be a fraction of the link in (0, 1]")
        if pace < 1 and self.link_rate is None:
            raise ConfigError("pace < 1 needs the link rate (CompressedCollective(link_rate=))")
        if pace != self.pace or (pace < 1 and self.pacer is None):
            self.pace = float(pace)
            rate = self.pace * self.link_rate if pace < 1 else None
            self.pacer = TokenBucket(lambda t: rate, burst=(self.world - 1) * self.pace_chunk) \
                if pace < 1 else None

    def take_measurements(self) -> dict:
        with self._lock:
            m = self.m
            self._reset()
        return m

    def allreduce(self, x: np.ndarray):
        """Sum of every worker's x, each quantized once at the current precision.

        Three phases: the 8-byte headers are all-gathered first (this also waits for the
        slowest worker: ``sync_s``); on every ``probe_every``-th call a second 8-byte
        all-gather, now with everyone present, measures the fixed cost of one all-gather
        (``fixed_s``, reused in between: in a lab beside background jobs each all-gather
        is a round trip through filled queues, and a probe on every call cost about a
        quarter of a step); then the payload goes
        through the token bucket and the all-gather. Per-byte time is the payload phase
        less the fixed cost, so the bandwidth seen by the controller does not depend on
        the message size, and the fixed costs go to the cost model as latency."""
        import torch
        x = np.ascontiguousarray(x, np.float32).ravel()
        n, bits, N = x.size, self.bits, self.world
        if self.epoch_file and self.calls == 0:
            import os
            tmp = f"{self.epoch_file}.tmp"
            with open(tmp, "w") as f:
                f.write(repr(time.monotonic()))
            os.replace(tmp, self.epoch_file)
        tc = time.perf_counter()
        msg = encode(x, bits, self.chunk, self.rng)
        t0 = time.perf_counter()
        heads = [torch.empty(HEADER, dtype=torch.uint8) for _ in range(N)]
        self._gather(heads, torch.from_numpy(msg[:HEADER].copy()))
        t_head = time.perf_counter()
        if self.calls % self.probe_every == 0:
            probe = [torch.empty(HEADER, dtype=torch.uint8) for _ in range(N)]
            self._gather(probe, torch.from_numpy(msg[:HEADER].copy()))
            self._fixed = time.perf_counter() - t_head
        t1 = time.perf_counter()
        sync, fixed = t_head - t0, self._fixed
        body = msg[HEADER:]
        sent = (N - 1) * body.size
        if self.bucket is not None:
            self.bucket.take(sent)
        out = [torch.empty(body.size, dtype=torch.uint8) for _ in range(N)]
        paced = self._paced_gather(out, torch.from_numpy(body))
        t2 = time.perf_counter()
        parts = [decode(np.concatenate([h.numpy(), o.numpy()]), n, bits, self.chunk)
                 for h, o in zip(heads, out)]
        total = np.sum([p[0] for p in parts], axis=0, dtype=np.float32)
        mean = total.astype(np.float64) / N
        small = float(np.mean([p[1] for p in parts]))
        big = float(mean @ mean) - sum(p[2] for p in parts) / N ** 2
        rq = relative_errors(x, PRECISIONS, self.chunk) if self.calls % self.error_every == 0 \
            else None
        # CPU time of the codec (encode; decode, sum and the r_q sample): a cost per
        # exchange that backward() also waits for, kept apart from compute
        codec = (t0 - tc) + (time.perf_counter() - t2)
        with self._lock:
            # the pacer's waits are left out of byte_s: the meter measures the share the
            # link gives, which the cost model caps by the pace itself
            meter_add(self.m, sent=sent, seconds=t2 - t1, sync=sync, fixed=fixed,
                      byte_s=t2 - t1 - fixed - paced, codec=codec, n=n, small=small,
                      big=big, rq=rq, pace_wait_s=paced)
        self.calls += 1
        self.total_bytes += sent
        return total, {"bytes": sent, "seconds": t2 - t1, "sync_seconds": sync,
                       "fixed_seconds": fixed, "bits": bits}

    def _paced_gather(self, outs, mine):
        """``_gather`` of the payload, through the pacer when one is set: one gather per
        ``pace_chunk`` bytes, each after its credit ((N-1) x the chunk, the bytes it puts
        on the uplink). Returns the seconds the pacer waited."""
        if self.pacer is None:
            self._gather(outs, mine)
            return 0.0
        waited, step = 0.0, self.pace_chunk
        for lo in range(0, max(mine.numel(), 1), step):
            hi = min(lo + step, mine.numel())
            waited += self.pacer.take((self.world - 1) * (hi - lo))
            self._gather([o[lo:hi] for o in outs], mine[lo:hi])
        return waited

    def _gather(self, outs, mine):
        """Every worker's ``mine`` into ``outs`` (one tensor per rank, ``outs[rank]``
        this worker's own), by the configured exchange."""
        import torch.distributed as dist
        if self.exchange == "ring":
            dist.all_gather(outs, mine, group=self.group)
            return
        outs[self.rank].copy_(mine)
        peers = [r for r in range(self.world) if r != self.rank]
        # receives first, so no peer's message waits for a buffer; then one send to each
        reqs = [dist.irecv(outs[r], src=r, group=self.group) for r in peers]
        reqs += [dist.isend(mine, dst=r, group=self.group) for r in peers]
        for r in reqs:
            r.wait()

    def close(self):
        if _CURRENT.get("c") is self:
            del _CURRENT["c"]
