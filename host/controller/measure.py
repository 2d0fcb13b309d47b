"""Online measurements the controller feeds into the cost model.

* ``BandwidthMeter``: achieved bytes/s of each communication (bytes over the transfer's
  wall time), smoothed as a ratio of moving averages so one short transfer cannot swing it.
* ``ComputeMeter``: seconds per micro-step (forward + backward).
* ``NoiseScaleEstimator``: the "simple" gradient noise scale ``B_noise = tr(Sigma)/|G|^2``
  of McCandlish et al. 2018, appendix A.1, from squared gradient norms measured at two
  batch sizes. With ``E|g_B|^2 = |G|^2 + tr(Sigma)/B``, two measurements at ``B_small`` and
  ``B_big`` give the unbiased estimates::

      |G|^2     = (B_big |g_big|^2 - B_small |g_small|^2) / (B_big - B_small)
      tr(Sigma) = (|g_small|^2 - |g_big|^2) / (1/B_small - 1/B_big)

  and, as the paper advises, the two are averaged separately (exponential moving
  average) before taking the ratio, since the ratio of noisy estimates is biased. In data
  parallel training both norms are free: ``g_small`` is a worker's own accumulated
  gradient (``a b`` samples) and ``g_big`` the all-reduced one (``a b N`` samples).
* ``QuantErrorMeter``: relative quantization error ``r_q`` per precision (see costmodel).
"""

import math

import numpy as np

from .knobs import ConfigError

__all__ = ["Ewma", "BandwidthMeter", "ComputeMeter", "NoiseScaleEstimator", "QuantErrorMeter"]


class Ewma:
    """Exponential moving average with bias correction (as in Adam): well defined from
    the first sample, ``value`` is None before it."""

    def __init__(self, beta: float = 0.9):
        if not 0.0 <= beta < 1.0:
            raise ConfigError(f"smoothing beta={beta!r}: must be in [0, 1)")
        self.beta = beta
        self._m = 0.0
        self._w = 0.0
        self.count = 0

    def update(self, x: float) -> float:
        self._m = self.beta * self._m + (1.0 - self.beta) * float(x)
        self._w = self.beta * self._w + (1.0 - self.beta)
        self.count += 1
        return self.value

    @property
    def value(self):
        return None if self._w == 0 else self._m / self._w


class BandwidthMeter:
    """Achieved bandwidth (bytes/s) from (bytes, seconds) of each communication."""

    def __init__(self, beta: float = 0.7):
        self._bytes = Ewma(beta)
        self._secs = Ewma(beta)

    def record(self, nbytes: float, seconds: float):
        if nbytes < 0 or seconds <= 0 or not math.isfinite(seconds):
            raise ValueError(f"bandwidth sample ({nbytes} bytes, {seconds} s): need bytes >= 0"
                             " and a positive finite duration")
        self._bytes.update(nbytes)
        self._secs.update(seconds)

    @property
    def value(self):
        s = self._secs.value
        return None if not s else self._bytes.value / s


class ComputeMeter:
    """Seconds per micro-step.

    The first ``warmup`` samples stand only until a later one arrives; they are not
    averaged in. The first control interval holds the first forward and backward passes
    and the first exchange's set-up: on the lab it measured 0.2-0.7 s per micro-step
    against a steady 0.02-0.03 s. Averaged in with ``beta`` 0.8, it kept the estimate 2-8x
    high for tens of intervals, so every larger accumulation looked that much dearer, the
    most for a controller that started at a = 1 (docs/control.md, "A seventh run")."""

    def __init__(self, beta: float = 0.8, warmup: int = 1):
        if warmup < 0:
            raise ConfigError(f"compute warm-up samples {warmup!r}: must be >= 0")
        self._t = Ewma(beta)
        self.warmup = warmup
        self._n = 0
        self._warm = None

    def record(self, seconds: float, micro_steps: int = 1):
        if seconds < 0 or micro_steps < 1:
            raise ValueError(f"compute sample ({seconds} s over {micro_steps} micro-steps)")
        self._n += 1
        if self._n <= self.warmup:
            self._warm = seconds / micro_steps
        else:
            self._t.update(seconds / micro_steps)

    @property
    def value(self):
        v = self._t.value
        return self._warm if v is None else v


class NoiseScaleEstimator:
    """B_noise (in samples) from pairs of squared gradient norms at two batch sizes."""

    def __init__(self, beta: float = 0.95):
        self._g2 = Ewma(beta)
        self._s = Ewma(beta)

    def record(self, b_small: float, g2_small: float, b_big: float, g2_big: float):
        """One pair: |g|^2 of a gradient averaged over b_small samples, and of one averaged
        over b_big > b_small samples (the big one may contain the small one)."""
        if not 0 < b_small < b_big:
            raise ValueError(f"noise scale needs 0 < b_small < b_big, got {b_small}, {b_big}")
        g2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
        s = (g2_small - g2_big) / (1.0 / b_small - 1.0 / b_big)
        self._g2.update(g2)
        self._s.update(s)

    @property
    def count(self):
        return self._g2.count

    @property
    def grad_sq(self):
        return self._g2.value

    @property
    def trace_sigma(self):
        return self._s.value

    @property
    def value(self):
        """B_noise = tr(Sigma)/|G|^2, or None while the estimate is not meaningful
        (no samples yet, or a non-positive |G|^2 estimate)."""
        g2, s = self._g2.value, self._s.value
        if g2 is None or g2 <= 0:
            return None
        return max(s, 0.0) / g2


class QuantErrorMeter:
    """r_q = E|Q(g)-g|^2/|g|^2 per precision, smoothed."""

    def __init__(self, beta: float = 0.8):
        self.beta = beta
        self._r = {}

    def record(self, precision: int, ratio: float):
        if ratio < 0 or not math.isfinite(ratio):
            raise ValueError(f"quantization error ratio {ratio!r} must be finite and >= 0")
        self._r.setdefault(precision, Ewma(self.beta)).update(ratio)

    def record_all(self, ratios: dict):
        for q, r in ratios.items():
            self.record(q, r)

    @property
    def value(self) -> dict:
        return {q: e.value for q, e in self._r.items()}
