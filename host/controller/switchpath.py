"""The controller's switch path: gradients summed in the switch, precision on the wire.

``CompressedSwitchCollective`` is the exchange of the real-training experiments when the job
aggregates in the network (``RealSpec.path = "switch"``): every worker sends one copy of
its gradient to the switch (``SwitchClient``, the ``ina`` backend's client) and gets the
sum back, instead of all-gathering N-1 copies over Gloo (``compress.CompressedCollective``).
The precision knob ``q`` sets how many bits each element takes on the wire.

What the switch sums today is a 32-bit container per element: the client turns float32
into int32 fixed point with a block exponent that the workers agree through the switch
(``host.transport.quantize``). A float32 holding an integer below ``2**24`` goes through
that exactly (its exponent is at most 24, the scale ``2**(S-e)`` is a power of two, and
the sum comes back as the same integer). So a narrow precision packs several host-
quantized elements into one container, THC-style "homomorphic" quantization that the
switch sums without knowing it:

* one shared scale per chunk of ``chunk`` elements, the same on every worker, so the
  integer codes of all workers are on one grid and their sum is exact. It is agreed in a
  first, small call through the switch: each worker sends ``max|chunk|**4`` and
  ``max|chunk|``; the sums bound every worker's max (``max <= M4**(1/4) <= N**(1/4) max``,
  and ``max <= M1 <= N max`` where the 4th powers fall below the fixed-point resolution),
  widened by the client's own fixed-point error so the bound holds exactly
  (``_shared_max``); the scale is the bound over ``L``;
* codes ``c = floor(x / s + u)`` (``u`` uniform: unbiased stochastic rounding) in
  ``[-L, L]``, ``L = 2**(q-1) - 1``, offset to ``c + L`` in ``[0, 2L]``;
* ``k = floor(usable / (q + h))`` codes per container, each in a field of ``q + h`` bits,
  ``h = ceil(log2 N)`` bits of headroom, so the sum of N workers' fields never carries
  into the next field; ``usable`` = 24 bits (the exact range of a float32 integer);
* the sum is unpacked field by field, less ``N L`` per field, times the scale. Every
  worker unpacks the same RESULT the same way, so every rank gets the same sum.

At N = 4 (h = 2): int4 packs 4 codes per container (4x fewer bytes than int32), int8 2,
int16 1 (no saving: the switch path's own int32 is as small and more precise).

The error of the sum is that of the stochastic rounding, ``|err| < N s`` per element
(``s <= N**(1/4) max/L``, or ``N max/L`` for a chunk whose 4th power is below ``2**-S``
of its packet's largest), with ``E|err|^2 = sum_i E|Q(x_i) - x_i|^2`` (unbiased); at
q = 32 the client's own bound, ``N 2**-S`` of the chunk's max.

**Narrow widths on the wire** (int8/int16 per packet): when the client takes a width per
call, ``CompressedSwitchCollective.width_for`` is the one place that changes (return the width for
``q`` instead of 32, and ``_payload`` passes it to the client): the packing then gives
way to the switch's own narrow sum.

Measurements, the keys of ``CompressedCollective.take_measurements`` so that
``bench.experiments.realrun``'s controller reads either path: the first (scale) call
waits for the slowest worker (``sync_s``); every ``probe_every``-th call a one-element
call with everyone present measures the switch path's fixed cost (``fixed_s``); the
payload call's time less that fixed cost is the per-byte time (``byte_s``). The cost
model (``JobParams(path="switch")``) learns bandwidth and latency from these, as for Gloo.
"""

import math
import threading
import time

import numpy as np

from .compress import meter_add
from .knobs import ConfigError, PRECISIONS

__all__ = ["USABLE_BITS", "headroom_bits", "codes_per_container", "switch_payload_bytes",
           "pack", "unpack", "CompressedSwitchCollective", "switch_collective_from_env"]

#: bits of a 32-bit container that a float32 integer carries exactly (its mantissa)
USABLE_BITS = 24
#: the 4th power of each chunk's max is what the scale call sums
_P = 4


def headroom_bits(workers: int) -> int:
    return math.ceil(math.log2(max(int(workers), 1)))


def codes_per_container(bits: int, workers: int, usable: int = USABLE_BITS) -> int:
    """How many ``bits``-bit codes one container carries with the headroom of ``workers``
    (1 for 32: the client's own int32 fixed point)."""
    if bits not in PRECISIONS:
        raise ConfigError(f"precision {bits!r}: must be one of {PRECISIONS}")
    if bits == 32:
        return 1
    k = usable // (bits + headroom_bits(workers))
    if k < 1:
        raise ConfigError(f"int{bits} with {workers} workers needs {bits + headroom_bits(workers)}"
                          f" bits per field: more than the {usable} a container carries")
    return k


def switch_payload_bytes(params: int, bits: int, workers: int, chunk: int = 1024,
                         usable: int = USABLE_BITS) -> int:
    """Bytes one worker sends the switch for one gradient at this precision: the packed
    containers (the scale call's ``4 (ceil(d / chunk) + 2)`` bytes are a fixed cost)."""
    return 4 * math.ceil(params / codes_per_container(bits, workers, usable))


def _field(bits, workers):
    return bits + headroom_bits(workers)


def pack(codes: np.ndarray, bits: int, workers: int, usable: int = USABLE_BITS) -> np.ndarray:
    """Integer codes in [-L, L] -> float32 containers (exact integers < 2**usable): code
    ``j * C + c`` in field j of container c (C containers)."""
    L = 2 ** (bits - 1) - 1
    k = codes_per_container(bits, workers, usable)
    f = _field(bits, workers)
    n = codes.size
    C = -(-n // k)
    planes = np.full(k * C, L, np.int64)          # padding: code 0 (offset L)
    planes[:n] = codes.astype(np.int64) + L
    if planes.min(initial=0) < 0 or planes.max(initial=0) > 2 * L:
        raise ValueError(f"pack: codes outside [-{L}, {L}] for int{bits}")
    planes = planes.reshape(k, C)
    out = np.zeros(C, np.int64)
    for j in range(k):
        out |= planes[j] << (f * j)
    return out.astype(np.float32)


def unpack(sums: np.ndarray, n: int, bits: int, workers: int,
           usable: int = USABLE_BITS) -> np.ndarray:
    """The switch's sum of ``workers`` packed vectors -> the sum of their codes (int64,
    ``n`` of them). ValueError if a container is not an exact non-negative integer below
    ``2**usable`` (a sum that did not come through exactly)."""
    L = 2 ** (bits - 1) - 1
    k = codes_per_container(bits, workers, usable)
    f = _field(bits, workers)
    s = np.asarray(sums, np.float64)
    if s.size and (s.min() < 0 or s.max() >= 2.0 ** usable or np.any(s != np.rint(s))):
        raise ValueError("unpack: the switch's sum is not an exact packed integer "
                         "(a container overflowed or was rounded)")
    s = s.astype(np.int64)
    mask = (1 << f) - 1
    planes = np.stack([(s >> (f * j)) & mask for j in range(k)])
    return planes.ravel()[:n] - workers * L


def _chunk_max(x, chunk):
    n = x.size
    pad = (-n) % chunk
    return np.pad(np.abs(x), (0, pad)).reshape(-1, chunk).max(1).astype(np.float64)


class CompressedSwitchCollective:
    """``allreduce(np.ndarray) -> (sum, stats)`` through the switch at the precision
    knob ``bits`` (``set_precision``); see the module docstring.

    ``client``: a ``SwitchClient`` of this rank's job (or anything with
    ``allreduce(float32 array) -> (sum, stats)`` and ``nworkers``, ``elements``:
    a test's fake); ``clock``: seconds (``time.perf_counter``; a fake in tests)."""

    def __init__(self, rank, world, client, bits=32, chunk=1024, seed=0, error_every=10,
                 probe_every=10, epoch_file=None, clock=time.perf_counter, state=None,
                 usable=USABLE_BITS):
        self.rank, self.world, self.client = rank, world, client
        self.chunk, self.usable = int(chunk), int(usable)
        self.set_precision(bits)
        for q in PRECISIONS:        # every precision fits (refused at construction)
            codes_per_container(q, world, self.usable)
        self.rng = np.random.default_rng(seed * 7919 + rank)
        self.error_every, self.probe_every = error_every, probe_every
        self.epoch_file = epoch_file if rank == 0 else None
        self.clock = clock
        self.state = state          # the hook state that installed the job (closed here)
        self._fixed = 0.0
        self.calls = 0
        self.total_bytes = 0
        self.pace = 1.0
        self._lock = threading.Lock()
        self._reset()
        from . import compress
        compress._CURRENT["c"] = self      # the controller on rank 0 reads the meters

    # -- knobs ------------------------------------------------------------------------
    def set_precision(self, bits: int):
        if bits not in PRECISIONS:
            raise ConfigError(f"precision {bits!r}: must be one of {PRECISIONS}")
        self.bits = int(bits)

    def set_pace(self, pace: float):
        """The switch path has no pacer of its own (the client paces at the link rate,
        INA_PACE_RATE): only 1 is taken."""
        if pace != 1:
            raise ConfigError(f"pace {pace!r}: the switch path is unpaced (1 only)")

    def width_for(self, bits: int) -> int:
        """The element width on the wire for precision ``bits``: 32 while the switch sums
        only 32-bit containers (narrow precisions are packed into them)."""
        return 32

    # -- meters -----------------------------------------------------------------------
    def _reset(self):
        self.m = {"bytes": 0, "seconds": 0.0, "calls": 0, "elements": 0, "sync_s": 0.0,
                  "fixed_s": 0.0, "byte_s": 0.0, "codec_s": 0.0, "pace_wait_s": 0.0,
                  "clipped": 0, "small_sq": 0.0, "big_sq": 0.0, "rq_sum": {}, "rq_n": 0}

    def take_measurements(self) -> dict:
        with self._lock:
            m = self.m
            self._reset()
        return m

    # -- the exchange -----------------------------------------------------------------
    def _call(self, v):
        out, _ = self.client.allreduce(np.ascontiguousarray(v, np.float32))
        return np.asarray(out, np.float32)

    def _widened(self, summed: np.ndarray) -> np.ndarray:
        """The switch's sum of non-negative values, widened to an upper bound of the
        exact sum: plus the client's fixed-point error bound (``N 2**-S`` of the largest
        value of its packet, taken twice over), times ``1 + 2**-20`` (the float32
        rounding of each value on its way in)."""
        N, E = self.world, max(int(getattr(self.client, "elements", summed.size)), 1)
        S = 30 - headroom_bits(N)
        pad = (-summed.size) % E
        blk = np.pad(summed, (0, pad)).reshape(-1, E)
        slack = N * 2.0 ** (1 - S) * np.abs(blk).max(1, keepdims=True)
        return np.maximum(blk + slack, 0.0).ravel()[:summed.size] * (1.0 + 2.0 ** -20)

    def _shared_max(self, sum4: np.ndarray, sum1: np.ndarray) -> np.ndarray:
        """Per chunk, an upper bound of every worker's max|chunk| that every worker
        computes alike from the switch's sums of ``max**4`` and of ``max``: the smaller
        of ``(sum max**4)**(1/4)`` (at most ``N**(1/4)`` times the max) and ``sum max``
        (at most N times; it holds where a chunk's 4th power is below the fixed-point
        resolution of its packet, ``2**-S`` of the packet's largest)."""
        return np.minimum(self._widened(sum4) ** (1.0 / _P), self._widened(sum1))

    def allreduce(self, x: np.ndarray):
        """Sum of every worker's x, each quantized once at the current precision (raw
        through the client's int32 at 32). Three calls through the switch: the scales
        (and the squared norms: waits for the slowest worker), on every
        ``probe_every``-th exchange one element (the fixed cost), and the payload."""
        x = np.ascontiguousarray(x, np.float32).ravel()
        if not np.all(np.isfinite(x)):
            raise ValueError("switch path: gradient has non-finite values")
        n, bits, N = x.size, self.bits, self.world
        if self.epoch_file and self.calls == 0:
            import os
            tmp = f"{self.epoch_file}.tmp"
            with open(tmp, "w") as f:
                f.write(repr(time.monotonic()))
            os.replace(tmp, self.epoch_file)
        clock = self.clock
        tc = clock()
        cmax = _chunk_max(x, self.chunk)
        nch = cmax.size
        E = max(int(getattr(self.client, "elements", 1)), 1)
        # [max**4 per chunk | max per chunk | |g|^2], each part from a packet of its own
        one_at = -(-nch // E) * E
        head_at = 2 * one_at
        head = np.zeros(head_at + 1, np.float64)
        head[:nch] = cmax ** _P
        head[one_at:one_at + nch] = cmax
        norm2 = float(np.dot(x.astype(np.float64), x))
        head[head_at] = norm2
        t0 = clock()
        hsum = self._call(head.astype(np.float32)).astype(np.float64)
        t_head = clock()
        if self.calls % self.probe_every == 0:
            self._call(np.zeros(1, np.float32))
            self._fixed = clock() - t_head
        t1 = clock()
        sync, fixed = t_head - t0, self._fixed
        if bits == 32:
            sent = 4 * n
            total = self._call(x)
            t2 = clock()
            err_est = 0.0
            clipped = 0
        else:
            L = 2 ** (bits - 1) - 1
            bound = self._shared_max(hsum[:nch], hsum[one_at:one_at + nch])
            scales = bound / L
            safe = np.where(scales > 0, scales, 1.0)
            pad = (-n) % self.chunk
            y = (np.pad(x.astype(np.float64), (0, pad)).reshape(-1, self.chunk)
                 / safe[:, None]).ravel()[:n]
            codes = np.floor(y + self.rng.random(n))
            # the shared bound holds every worker's max, so no code is outside [-L, L];
            # one that were would be clipped and counted (``clipped``), never wrapped
            clipped = int(np.count_nonzero(np.abs(codes) > L))
            if clipped:
                np.clip(codes, -L, L, out=codes)
            f = y - np.floor(y)
            step2 = np.repeat(safe ** 2, self.chunk)[:n]
            err_est = float((f * (1.0 - f) * step2).sum())
            packed = pack(codes, bits, N, self.usable)
            sent = 4 * packed.size
            tp = clock()
            summed = self._call(packed)
            t2 = clock()
            tc -= tp - t1      # (the packing is codec time, not the payload's)
            t1 = tp
            csum = unpack(summed, n, bits, N, self.usable).astype(np.float64)
            total = (np.pad(csum, (0, pad)).reshape(-1, self.chunk)
                     * scales[:, None]).ravel()[:n].astype(np.float32)
        mean = total.astype(np.float64) / N
        small = float(hsum[head_at]) / N
        # the quantization noise in the mean: this worker's exact expected error, taken
        # for every worker's (their gradients are alike; the sum of theirs is not sent)
        big = float(mean @ mean) - err_est / N
        rq = self.relative_errors(x, self._shared_max(hsum[:nch], hsum[one_at:one_at + nch])) \
            if self.calls % self.error_every == 0 else None
        codec = max((t0 - tc) + (clock() - t2), 0.0)
        with self._lock:
            meter_add(self.m, sent=sent, seconds=t2 - t1, sync=sync, fixed=fixed,
                      byte_s=t2 - t1 - fixed, codec=codec, n=n, small=small, big=big,
                      rq=rq, clipped=clipped)
        self.calls += 1
        self.total_bytes += sent
        return total, {"bytes": sent, "seconds": t2 - t1, "sync_seconds": sync,
                       "fixed_seconds": fixed, "bits": bits,
                       "width": self.width_for(bits)}

    def relative_errors(self, x, bound) -> dict:
        """r_q = E|Q(x)-x|^2 / |x|^2 of this path's quantizer for every precision, with
        the scales this call agreed (``max bound / L_q``), exactly (sum of
        ``step^2 f (1 - f)``)."""
        n2 = float(np.dot(x.astype(np.float64), x))
        if n2 == 0:
            return {q: 0.0 for q in PRECISIONS}
        pad = (-x.size) % self.chunk
        xp = np.pad(x.astype(np.float64), (0, pad)).reshape(-1, self.chunk)
        out = {}
        for q in PRECISIONS:
            if q == 32:
                out[q] = 0.0
                continue
            s = bound / (2 ** (q - 1) - 1)
            safe = np.where(s > 0, s, 1.0)
            y = xp / safe[:, None]
            f = y - np.floor(y)
            out[q] = float(((f * (1 - f)).sum(1) * safe ** 2).sum()) / n2
        return out

    def close(self):
        from . import compress
        if compress._CURRENT.get("c") is self:
            del compress._CURRENT["c"]
        state, self.state = self.state, None
        if state is not None:
            state.close()


def switch_collective_from_env(rank, world, bits=32, seed=0, epoch_file=None):
    """This rank's ``CompressedSwitchCollective`` on the switch that INA_SWITCH names (the lab's,
    ``run_training_lab``), its job installed by rank 0 through the ``ina`` backend's
    setup (``host.ddp.hook.setup_hook_state``; reliable mode). A switch that does not
    answer raises on every rank (no fallback to Gloo: the run would measure Gloo)."""
    from ina_fabric.host.ddp.hook import setup_hook_state
    state = setup_hook_state(mode="reliable", fallback_to_gloo=False, average=False)
    if not state.use_switch:
        state.close()
        raise RuntimeError("switch path: the switch is not usable (see the warning above)")
    return CompressedSwitchCollective(rank, world, state.collective, bits=bits, seed=seed,
                            epoch_file=epoch_file, state=state)
