"""The controller's switch path: gradients summed in the switch, precision on the wire.

``CompressedSwitchCollective`` is the exchange of the real-training experiments when the job
aggregates in the network (``RealSpec.path = "switch"``): every worker sends one copy of
its gradient to the switch (``SwitchClient``, the ``ina`` backend's client) and gets the
sum back, instead of all-gathering N-1 copies over Gloo (``compress.CompressedCollective``).
The precision knob ``q`` sets the element width on the wire, the ``width`` byte of every
DATA and RESULT of the payload call (docs/precision.md): the switch sums the narrow
elements itself, so the bytes shrink both ways.

* ``q`` = 32, 16, 8: the client's own fixed point at that width (``SwitchClient.allreduce(
  precision=)``): a block exponent per packet that the workers agree through the switch,
  ``S = bits - 2 - ceil(log2 N)`` fractional bits (``quantize.scale_bits``), rounding
  stochastic and unbiased at 16 and 8 (the seed shared by every rank, each worker's draws
  its own), to nearest at 32 (as the switch path always sent it). At N = 4 an element is
  int16 with 12 fractional bits, int8 with 4: every element is within ``N 2**(e - S)`` of
  the exact sum (``quantize.error_bound``), ``e`` the packet's agreed exponent.
* ``q`` = 4, which the wire has no width for: the knob's own int4 codes, THC's
  "homomorphic" quantization that the switch sums without knowing it, carried as int8
  elements (:func:`wire_width`: the narrowest width whose fixed point holds an int4 code
  exactly, int8 up to 8 workers). One shared scale per chunk of ``chunk`` elements, the
  same on every worker, so the integer codes of all workers are on one grid and their
  sum is exact. It is agreed in a first, small call through the switch: each worker sends
  ``max|chunk|**4`` and ``max|chunk|``; the sums bound every worker's max (``max <=
  M4**(1/4) <= N**(1/4) max``, and ``max <= M1 <= N max`` where the 4th powers fall below
  the fixed-point resolution), widened by the client's own fixed-point error so the bound
  holds exactly (``_shared_max``); the scale is the bound over ``L = 7``; codes ``c =
  floor(x / s + u)`` (``u`` uniform: unbiased) in ``[-L, L]``. A code below ``2**S`` goes
  through the client's fixed point exactly (its exponent is at most S, the scale
  ``2**(S-e)`` a power of two), so the RESULT is the exact sum of the codes; one that is
  not (an integer in ``[-N L, N L]``) raises on every rank alike. Its error is
  ``|err| < N s`` per element (``s <= N**(1/4) max/L``, or ``N max/L`` for a chunk whose
  4th power is below ``2**-S`` of its packet's largest). It takes the bytes of int8 with a
  coarser grid (int8's step is ``2**(e-4)`` at N = 4, at most max/8; int4's about max/5),
  so a controller that measures both prefers int8.

Measurements, the keys of ``CompressedCollective.take_measurements`` so that
``bench.experiments.realrun``'s controller reads either path: the first (scale) call
waits for the slowest worker (``sync_s``; it also sums ``|g|^2`` for the noise scale);
every ``probe_every``-th call a one-element call with everyone present measures the
switch path's fixed cost (``fixed_s``); the payload call's time less that fixed cost is
the per-byte time (``byte_s``). The cost model (``JobParams(path="switch")``) learns
bandwidth and latency from these, as for Gloo, and prices each precision at the bytes of
its wire width (:func:`switch_payload_bytes`). ``r_q`` (the quantizer's relative error
variance) is computed exactly for every precision from this rank's gradient: per packet
at the client's step ``2**(e - S)`` (16, 8), per chunk at the shared scale (4).
"""

import math
import threading
import time

import numpy as np

from .compress import meter_add
from .knobs import ConfigError, PRECISIONS

__all__ = ["WIRE_WIDTHS", "CODE_BITS", "headroom_bits", "wire_width", "switch_payload_bytes",
           "CompressedSwitchCollective", "switch_collective_from_env"]

#: the element widths of the wire (``fields.WIDTH_BITS``), narrowest first
WIRE_WIDTHS = (8, 16, 32)
#: knob precisions the wire has no width for: sent as the knob's own integer codes
CODE_BITS = (4,)
#: the 4th power of each chunk's max is what the scale call sums
_P = 4


def headroom_bits(workers: int) -> int:
    return math.ceil(math.log2(max(int(workers), 1)))


def _scale_bits(workers: int, width: int) -> int:
    """The client's fractional bits at ``width`` (``quantize.scale_bits``), or 0 where the
    sum of ``workers`` leaves none."""
    return width - 2 - headroom_bits(workers)


def wire_width(bits: int, workers: int) -> int:
    """The element width on the wire for the precision knob ``bits`` with ``workers``
    workers: ``bits`` itself for 32, 16 and 8 (the narrowest wider one where the sum of
    ``workers`` leaves the width no fractional bit); for 4, the narrowest width whose
    fixed point carries an int4 code (``|c| < 2**3``) exactly (``S >= 3``: int8 up to 8
    workers). ConfigError for a precision the knob does not have, or a job too large."""
    if bits not in PRECISIONS:
        raise ConfigError(f"precision {bits!r}: must be one of {PRECISIONS}")
    need = bits - 1 if bits in CODE_BITS else 1
    for w in WIRE_WIDTHS:
        if w >= min(bits, 32) and _scale_bits(workers, w) >= need:
            return w
    raise ConfigError(f"int{bits} with {workers} workers: no wire width leaves the sum "
                      f"{need} fractional bit(s)")


def switch_payload_bytes(params: int, bits: int, workers: int, chunk: int = 1024) -> int:
    """Element bytes one worker sends the switch (and gets back) for one gradient at the
    precision knob ``bits``: ``params`` elements of its wire width (:func:`wire_width`).
    The scale call's ``4 (ceil(d / chunk) + 2)`` bytes and the 28-byte headers are part of
    the fixed cost."""
    return int(params) * wire_width(bits, workers) // 8


def _chunk_max(x, chunk):
    n = x.size
    pad = (-n) % chunk
    return np.pad(np.abs(x), (0, pad)).reshape(-1, chunk).max(1).astype(np.float64)


class CompressedSwitchCollective:
    """``allreduce(np.ndarray) -> (sum, stats)`` through the switch at the precision
    knob ``bits`` (``set_precision``), on the wire at ``width_for(bits)``; see the
    module docstring.

    ``client``: a ``SwitchClient`` of this rank's job (or anything with
    ``allreduce(float32 array, precision=) -> (sum, stats)`` and ``nworkers``,
    ``elements``: a test's fake); ``clock``: seconds (``time.perf_counter``; a fake in
    tests)."""

    def __init__(self, rank, world, client, bits=32, chunk=1024, seed=0, error_every=10,
                 probe_every=10, epoch_file=None, clock=time.perf_counter, state=None):
        self.rank, self.world, self.client = rank, world, client
        self.chunk = int(chunk)
        self.set_precision(bits)
        self.widths = {q: wire_width(q, world) for q in PRECISIONS}   # every one fits
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
        """The element width on the wire for precision ``bits`` (:func:`wire_width`)."""
        return self.widths[bits] if bits in self.widths else wire_width(bits, self.world)

    def precision_for(self, bits: int):
        """The client's ``Precision`` of the payload call at knob ``bits``: the wire
        width; stochastic rounding for the narrow widths, nearest for int32 and for the
        int4 codes (integers: exact either way)."""
        from ina_fabric.host.transport.precision import Precision
        w = self.width_for(bits)
        return Precision(w, "stochastic" if bits == w and w != 32 else "nearest")

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
    def _call(self, v, precision=32):
        out, st = self.client.allreduce(np.ascontiguousarray(v, np.float32),
                                        precision=precision)
        return np.asarray(out, np.float32), st

    def _elements(self) -> int:
        return max(int(getattr(self.client, "elements", 1)), 1)

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

    def _steps(self, x: np.ndarray, width: int) -> np.ndarray:
        """Per element of ``x``: the client's rounding step at ``width``, ``2**(e - S)``
        with ``e`` this rank's exponent of the element's packet (the agreed one is the
        max over the ranks: alike for gradients that are alike); 0 in a zero packet."""
        from ina_fabric.host.transport import quantize as Q
        E = self._elements()
        e = Q.local_exponents(x, E).astype(np.int64)
        S = _scale_bits(self.world, width)
        step = np.where((e == Q.NO_EXPONENT) | (e == Q.NONFINITE), 0.0,
                        np.ldexp(1.0, (e - S).clip(-1000, 1000)))
        return np.repeat(step, E)[:x.size]

    @staticmethod
    def _variance(y: np.ndarray, step: np.ndarray) -> float:
        """Sum over elements of stochastic rounding's variance, ``f (1 - f) step**2``,
        ``y`` the values in steps."""
        f = y - np.floor(y)
        return float((f * (1.0 - f) * step ** 2).sum())

    def allreduce(self, x: np.ndarray):
        """Sum of every worker's x, each quantized once at the current precision on the
        wire width of :meth:`width_for`. Three calls through the switch: the scales and
        the squared norms (int32; waits for the slowest worker), on every
        ``probe_every``-th exchange one element (the fixed cost), and the payload."""
        x = np.ascontiguousarray(x, np.float32).ravel()
        if not np.all(np.isfinite(x)):
            raise ValueError("switch path: gradient has non-finite values")
        n, bits, N = x.size, self.bits, self.world
        width = self.width_for(bits)
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
        E = self._elements()
        # [max**4 per chunk | max per chunk | |g|^2], each part from a packet of its own
        one_at = -(-nch // E) * E
        head_at = 2 * one_at
        head = np.zeros(head_at + 1, np.float64)
        head[:nch] = cmax ** _P
        head[one_at:one_at + nch] = cmax
        norm2 = float(np.dot(x.astype(np.float64), x))
        head[head_at] = norm2
        t0 = clock()
        hsum = self._call(head.astype(np.float32))[0].astype(np.float64)
        t_head = clock()
        if self.calls % self.probe_every == 0:
            self._call(np.zeros(1, np.float32))
            self._fixed = clock() - t_head
        t1 = clock()
        sync, fixed = t_head - t0, self._fixed
        sent = n * width // 8
        prec = self.precision_for(bits)
        if bits not in CODE_BITS:
            total, st = self._call(x, prec)
            t2 = clock()
            clipped = int(getattr(st, "clipped", 0) or 0)
            err_est = 0.0
            if width != 32:
                step = self._steps(x, width)
                err_est = self._variance(x / np.where(step > 0, step, 1.0), step)
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
            err_est = self._variance(y, np.repeat(safe, self.chunk)[:n])
            tp = clock()
            summed, _ = self._call(codes.astype(np.float32), prec)
            t2 = clock()
            tc -= tp - t1      # (the coding is codec time, not the payload's)
            t1 = tp
            s64 = summed.astype(np.float64)
            if s64.size and (np.abs(s64).max() > N * L or np.any(s64 != np.rint(s64))):
                raise ValueError(f"switch path: the int{bits} codes did not come back as "
                                 f"an exact sum (a RESULT off the integers of "
                                 f"[-{N * L}, {N * L}] at int{width})")
            total = (np.pad(s64, (0, pad)).reshape(-1, self.chunk)
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
                       "fixed_seconds": fixed, "bits": bits, "width": width}

    def relative_errors(self, x, bound) -> dict:
        """r_q = E|Q(x)-x|^2 / |x|^2 of this path's quantizer for every precision,
        exactly (sum of ``step^2 f (1 - f)``): the client's per-packet step at the narrow
        wire widths (:meth:`_steps`), the scales this call agreed (``max bound / L``) for
        the int4 codes, 0 at int32."""
        n2 = float(np.dot(x.astype(np.float64), x))
        if n2 == 0:
            return {q: 0.0 for q in PRECISIONS}
        pad = (-x.size) % self.chunk
        out = {}
        for q in PRECISIONS:
            w = self.width_for(q)
            if q == 32:
                out[q] = 0.0
            elif q in CODE_BITS:
                s = bound / (2 ** (q - 1) - 1)
                safe = np.where(s > 0, s, 1.0)
                y = np.pad(x.astype(np.float64), (0, pad)).reshape(-1, self.chunk) / \
                    safe[:, None]
                out[q] = self._variance(y, np.broadcast_to(safe[:, None], y.shape)) / n2
            else:
                step = self._steps(x, w)
                out[q] = self._variance(x / np.where(step > 0, step, 1.0), step) / n2
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
