"""Predicted time to target for each (precision, accumulation) pair.

Notation: ``d`` parameters, ``N`` workers, micro-batch ``b`` samples per worker, ``a``
accumulation steps, so the global batch is ``B = a * b * N``; precision ``q`` bits.

Time per optimizer step (one communication per step)::

    t_comm(q)   = latency + wire_factor * bytes(q) / bandwidth
    t_step(q,a) = a * t_compute + t_codec(q) + t_comm(q) - min(t_comm(q), overlap * t_compute)

``bytes(q)`` is 4d for float32 and ``ceil(d q / 8) + 4 ceil(d / chunk)`` for q-bit integers
with a float32 scale per chunk. On the switch path (``path="switch"``, ``wire_factor`` 1)
it is the elements at the precision's wire width, ``switchpath.switch_payload_bytes``; its
scale call is part of the latency. ``overlap`` is the fraction of one micro-step (the
backward pass of the last micro-batch) that communication can hide behind.

Steps to target, from the noise-scale model of McCandlish et al. 2018 ("An Empirical
Model of Large-Batch Training", eq. 2.11 and sec. 2.3)::

    S(B) = S_min * (1 + B_noise / B)

Quantization adds variance to the gradient the optimizer sees. Each worker quantizes its
own accumulated gradient ``g_i`` (a mean over ``a b`` samples) once, with unbiased
stochastic rounding; the relative error ``r_q = E|Q(g)-g|^2 / |g|^2`` depends on the
precision and on the shape of the gradient, not on its scale (it is measured online, or
modelled as ``kappa2 / (6 L_q^2)`` with ``L_q = 2^(q-1) - 1`` levels and ``kappa2`` the
ratio of a chunk's squared max to the mean square). The N errors are independent, so
the averaged gradient carries extra variance ``sum_i E|e_i|^2 / N^2``, and since
``E|g_i|^2 = |G|^2 (1 + B_noise / (a b))``, relative to the true gradient ``|G|^2``::

    rho_q(a) = (r_q / N) * (1 + B_noise / (a b))

Noise in the update is what sets the step count in the model (the B_noise/B term *is*
variance/|G|^2), so quantization adds rho to it::

    S(q, a) = S_min * (1 + B_noise / B + rho_q(a))

i.e. an effective noise scale ``B_noise_eff = B_noise + B rho_q(a)``: quantization noise
does not shrink when the batch grows, which is why the two knobs interact. Time to target
is ``S(q, a) * t_step(q, a)``. When B_noise changes during training, the controller
minimizes the rate form ``t_step * (1 + B_noise/B + rho)``, seconds per unit of S_min
progress, which has the same argmin.

The pace knob ``r`` (``knobs``) caps the rate a worker's pacer lets its messages onto its
access link at ``r * link_rate``, so the payload moves at ``min(bandwidth, r * link_rate)``.
With the job's own time as the only cost, pacing never pays. What it buys is what the
job leaves to the other tenants of the link: paced at ``r`` it holds at most a share
``r`` of the link at any moment, and the rest is theirs. The objective prices that
share::

    cost per unit of progress = t_step * (1 + B_noise/B + rho) * (1 + rate_price * r)

``rate_price`` (lambda) is what holding the whole link for a second costs relative to
the job's other resources for that second (its workers), the price a shared cloud puts
on a bandwidth tier. At lambda = 0 (the default) the objective is time to target and
every controller keeps ``r = 1``. A per-byte price would not do: in a work-conserving
network the bytes are the same at any pace, so their price would not depend on ``r``.
"""

from dataclasses import dataclass, field, replace
import math

import numpy as np

from .knobs import ConfigError, Knobs, KnobSpace

__all__ = ["JobParams", "CostModel", "payload_bytes", "model_quant_ratio", "GAUSS_KAPPA2",
           "PATHS"]

#: how a job's payload travels: all-gathered over Gloo, or summed in the switch
PATHS = ("gloo", "switch")

# E[max |x|^2] / E[x^2] over a 1024-element chunk of a Gaussian vector (about 3.3 sigma).
GAUSS_KAPPA2 = 10.9


def payload_bytes(params: int, precision: int, chunk: int = 1024) -> int:
    """Bytes one worker puts on the wire for one gradient at this precision."""
    if precision == 32:
        return 4 * params
    return math.ceil(params * precision / 8) + 4 * math.ceil(params / chunk)


def model_quant_ratio(precision: int, kappa2: float = GAUSS_KAPPA2) -> float:
    """Modelled r_q = E|Q(g)-g|^2/|g|^2 for stochastic rounding with a per-chunk max
    scale: step = max/L, mean variance step^2/6 (uniform fractional part)."""
    if precision == 32:
        return 0.0
    levels = 2 ** (precision - 1) - 1
    return kappa2 / (6.0 * levels * levels)


def _positive(name, value, allow_zero=False):
    if not isinstance(value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
        raise ConfigError(f"{name}={value!r}: must be a finite number")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name}={value!r}: must be {'>= 0' if allow_zero else '> 0'}"
                          + (" bytes/s" if name == "bandwidth" else ""))


@dataclass(frozen=True)
class JobParams:
    """What the cost model knows about the job and the network right now."""
    params: int                 # d, gradient elements
    workers: int                # N
    micro_batch: int            # b, samples per worker per micro-step
    t_compute: float            # seconds per micro-step (forward + backward)
    bandwidth: float            # bytes/s this worker gets on the bottleneck
    b_noise: float              # gradient noise scale, in samples
    s_min: float = 1.0          # steps to target at infinite batch (scale only)
    wire_factor: float = 1.0    # bottleneck bytes per payload byte (in-network: 1)
    overlap: float = 0.0        # fraction of one micro-step comm can hide behind
    latency: float = 0.0        # seconds per communication, independent of size
    chunk: int = 1024           # elements per quantization scale
    quant_ratio: dict = field(default_factory=dict)  # precision -> r_q (measured)
    kappa2: float = GAUSS_KAPPA2                      # for precisions not measured
    codec_s: dict = field(default_factory=dict)       # precision -> seconds per step
    link_rate: float = 0.0      # bytes/s of a worker's access link (the pace's reference);
    #                             0: the measured bandwidth
    rate_price: float = 0.0     # lambda: price of holding the whole link, per second,
    #                             relative to the job's other costs per second
    path: str = "gloo"          # how the payload travels: "gloo" (q-bit messages with
    #                             per-chunk scales, ``payload_bytes``) or "switch" (summed
    #                             in the switch at the wire width:
    #                             ``switchpath.switch_payload_bytes``)

    def __post_init__(self):
        for name in ("params", "workers", "micro_batch", "chunk"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"{name}={v!r}: must be an integer >= 1")
        _positive("bandwidth", self.bandwidth)
        _positive("t_compute", self.t_compute, allow_zero=True)
        _positive("b_noise", self.b_noise, allow_zero=True)
        _positive("s_min", self.s_min)
        _positive("wire_factor", self.wire_factor)
        _positive("latency", self.latency, allow_zero=True)
        _positive("kappa2", self.kappa2, allow_zero=True)
        _positive("link_rate", self.link_rate, allow_zero=True)
        _positive("rate_price", self.rate_price, allow_zero=True)
        if not 0.0 <= self.overlap <= 1.0:
            raise ConfigError(f"overlap={self.overlap!r}: must be in [0, 1]")
        if self.path not in PATHS:
            raise ConfigError(f"path={self.path!r}: must be one of {', '.join(PATHS)}")
        for q, r in self.quant_ratio.items():
            _positive(f"quant_ratio[{q}]", r, allow_zero=True)
        for q, s in self.codec_s.items():
            _positive(f"codec_s[{q}]", s, allow_zero=True)

    def with_(self, **kw) -> "JobParams":
        return replace(self, **kw)


class CostModel:
    """Evaluates the formulas of the module docstring for one JobParams."""

    def __init__(self, p: JobParams):
        self.p = p

    def quant_ratio(self, precision: int) -> float:
        r = self.p.quant_ratio.get(precision)
        return model_quant_ratio(precision, self.p.kappa2) if r is None else float(r)

    def paced_bandwidth(self, pace: float = 1.0) -> float:
        """Bytes/s the payload moves at under this pace: the share the job measured, or
        the pacer's cap ``pace * link_rate`` if that is lower."""
        p = self.p
        if pace >= 1.0:
            return p.bandwidth
        return min(p.bandwidth, pace * (p.link_rate or p.bandwidth))

    def wire_bytes(self, precision: int) -> int:
        """Payload bytes one worker sends per exchange on this job's path."""
        p = self.p
        if p.path == "switch":
            from .switchpath import switch_payload_bytes
            return switch_payload_bytes(p.params, precision, p.workers, p.chunk)
        return payload_bytes(p.params, precision, p.chunk)

    def comm_time(self, precision: int, pace: float = 1.0) -> float:
        p = self.p
        return p.latency + p.wire_factor * self.wire_bytes(precision) / \
            self.paced_bandwidth(pace)

    def step_time(self, k: Knobs) -> float:
        p = self.p
        comm = self.comm_time(k.precision, k.pace)
        hidden = min(comm, p.overlap * p.t_compute)
        return k.accum * p.t_compute + p.codec_s.get(k.precision, 0.0) + comm - hidden

    def batch(self, k: Knobs) -> int:
        return k.accum * self.p.micro_batch * self.p.workers

    def quant_noise(self, k: Knobs) -> float:
        """rho_q(a): quantization variance of the averaged gradient over |G|^2."""
        p = self.p
        return self.quant_ratio(k.precision) / p.workers * (
            1.0 + p.b_noise / (k.accum * p.micro_batch))

    def noise_factor(self, k: Knobs) -> float:
        """S(q,a) / S_min = 1 + B_noise/B + rho_q(a)."""
        return 1.0 + self.p.b_noise / self.batch(k) + self.quant_noise(k)

    def effective_noise_scale(self, k: Knobs) -> float:
        return self.p.b_noise + self.batch(k) * self.quant_noise(k)

    def steps_to_target(self, k: Knobs) -> float:
        return self.p.s_min * self.noise_factor(k)

    def price(self, k: Knobs) -> float:
        """Cost of one second of the job relative to its workers alone: 1 + lambda r."""
        return 1.0 + self.p.rate_price * k.pace

    def rate(self, k: Knobs) -> float:
        """Cost per unit of S_min progress, what the controllers minimize: seconds per
        unit of progress times the price of a second at this pace (at lambda = 0, the
        seconds alone)."""
        return self.step_time(k) * self.noise_factor(k) * self.price(k)

    def time_to_target(self, k: Knobs) -> float:
        return self.steps_to_target(k) * self.step_time(k)

    def cost_to_target(self, k: Knobs) -> float:
        """Time to target times the price of a second (seconds at lambda = 0)."""
        return self.time_to_target(k) * self.price(k)

    def best(self, candidates) -> Knobs:
        """The candidate with the lowest predicted time to target (ties: first listed)."""
        candidates = list(candidates)
        if not candidates:
            raise ConfigError("empty knob set: nothing to choose from")
        rates = [self.rate(k) for k in candidates]
        return candidates[int(np.argmin(rates))]

    def table(self, space: KnobSpace) -> np.ndarray:
        """Predicted cost to target (time to target at lambda = 0), rows =
        space.precisions, columns = space.accums, at the default pace."""
        r = space.default.pace
        return np.array([[self.cost_to_target(Knobs(q, a, r)) for a in space.accums]
                         for q in space.precisions])
