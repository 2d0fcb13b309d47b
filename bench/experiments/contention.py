"""Bandwidth left to our job on a shared bottleneck, as a function of time.

``BandwidthTrace`` is a piecewise-constant rate with exact transfer-time integration
(a transfer of ``n`` bytes starting at ``t0`` ends when the integral of the rate from
``t0`` reaches ``n``). ``background_trace`` builds one from background training jobs:
each job alternates a compute phase and an all-reduce of its whole gradient, and the
bottleneck is shared max-min fairly among the flows active at each moment (what TCP or
DCQCN converge to). Our job is counted as one flow that is always present, so its rate is
``capacity / (1 + k(t))`` with ``k(t)`` background jobs communicating; this makes our
share slightly pessimistic while we compute, and it decouples the trace from the
controller under test, so every controller sees exactly the same contention.

Contention levels are schedules of how many background jobs are running: a constant
count for the light/medium/heavy comparisons, a changing one for the knob trace.
"""

from dataclasses import dataclass

import numpy as np
from numba import njit

from ina_fabric.host.controller.knobs import ConfigError

__all__ = ["BandwidthTrace", "BackgroundJob", "background_trace", "LEVELS"]


class BandwidthTrace:
    """Rate ``rates[i]`` (bytes/s) on ``[times[i], times[i+1])``; the last rate holds forever."""

    def __init__(self, times, rates):
        self.times = np.asarray(times, np.float64)
        self.rates = np.asarray(rates, np.float64)
        if self.times.ndim != 1 or self.times.shape != self.rates.shape or self.times.size == 0:
            raise ConfigError("bandwidth trace: times and rates must be 1-D, same non-zero length")
        if self.times[0] != 0.0 or np.any(np.diff(self.times) <= 0):
            raise ConfigError("bandwidth trace: times must start at 0 and increase")
        if not np.all(np.isfinite(self.rates)) or np.any(self.rates <= 0):
            bad = self.rates[~(np.isfinite(self.rates) & (self.rates > 0))][0]
            raise ConfigError(f"bandwidth trace: rate {bad!r} bytes/s; every rate must be > 0")
        self._cum = np.concatenate([[0.0], np.cumsum(np.diff(self.times) * self.rates[:-1])])

    @classmethod
    def constant(cls, rate: float):
        return cls([0.0], [rate])

    def __call__(self, t):
        return self.rate_at(t)

    def rate_at(self, t):
        return self.rates[np.searchsorted(self.times, t, side="right") - 1]

    def _bytes_until(self, t):
        i = np.searchsorted(self.times, t, side="right") - 1
        return self._cum[i] + (t - self.times[i]) * self.rates[i]

    def transfer_end(self, t0: float, nbytes: float) -> float:
        """When a transfer of ``nbytes`` that starts at ``t0`` finishes."""
        target = self._bytes_until(t0) + nbytes
        i = int(np.searchsorted(self._cum, target, side="right")) - 1
        return float(self.times[i] + (target - self._cum[i]) / self.rates[i])

    def capped(self, cap: float) -> "BandwidthTrace":
        """This trace with every rate limited to ``cap`` bytes/s (a paced sender)."""
        if not cap > 0:
            raise ConfigError(f"bandwidth cap {cap!r} bytes/s: must be > 0")
        return BandwidthTrace(self.times, np.minimum(self.rates, cap))

    def mean_rate(self, t0: float, t1: float) -> float:
        return float((self._bytes_until(t1) - self._bytes_until(t0)) / (t1 - t0))


@dataclass(frozen=True)
class BackgroundJob:
    """A data-parallel job that shares the bottleneck: per step, ``t_compute`` seconds of
    compute (lognormal jitter ``jitter``), then ``grad_bytes`` on the wire."""
    grad_bytes: float
    t_compute: float
    jitter: float = 0.1


# Number of background jobs per contention level (constant schedules).
LEVELS = {"none": 0, "light": 1, "medium": 2, "heavy": 4}


def background_trace(capacity: float, job: BackgroundJob, schedule, horizon: float,
                     seed: int = 0) -> BandwidthTrace:
    """Our rate over ``[0, horizon)`` beside background jobs.

    ``schedule``: list of ``(t_start, n_jobs)``, sorted, first at 0: how many background
    jobs run from ``t_start`` on. Jobs start with random phases; a job that leaves
    stops at once, and a job that joins starts with a compute phase."""
    if capacity <= 0:
        raise ConfigError(f"bottleneck capacity {capacity!r} bytes/s: must be > 0")
    schedule = sorted(schedule)
    if not schedule or schedule[0][0] != 0:
        raise ConfigError("contention schedule must start at t=0")
    sched_t = np.array([float(s) for s, _ in schedule] + [np.inf])
    sched_n = np.array([n for _, n in schedule], np.int64)
    times, ks = _events(float(capacity), float(job.grad_bytes), float(job.t_compute),
                        float(job.jitter), sched_t, sched_n, float(horizon), int(seed))
    last = np.concatenate([times[1:] > times[:-1], [True]])   # last event at each time
    times, ks = times[last], ks[last]
    keep = np.concatenate([[True], ks[1:] != ks[:-1]])
    return BandwidthTrace(times[keep], capacity / (1 + ks[keep]))


@njit(cache=True)
def _events(capacity, grad_bytes, t_compute, jitter, sched_t, sched_n, horizon, seed):
    """Fluid event simulation of the background jobs: (event times, active senders)."""
    np.random.seed(seed)
    nmax = max(sched_n.max(), 1)
    phase = np.zeros(nmax, np.int64)           # 0 computing, 1 sending
    busy_until = np.empty(nmax)
    for j in range(nmax):
        busy_until[j] = np.random.uniform(0.0, t_compute)
    remaining = np.zeros(nmax)
    times = []
    ks = []
    t = 0.0
    seg = 0
    while t < horizon:
        n_on = sched_n[seg]
        k = 0
        min_rem = np.inf
        t_comp = np.inf
        for j in range(n_on):
            if phase[j] == 1:
                k += 1
                min_rem = min(min_rem, remaining[j])
            else:
                t_comp = min(t_comp, busy_until[j])
        rate = capacity / (1 + k)
        t_send = t + min_rem / rate if k else np.inf
        t_next = min(t_comp, t_send, sched_t[seg + 1], horizon)
        times.append(t)
        ks.append(k)
        for j in range(n_on):
            if phase[j] == 1:
                remaining[j] -= rate * (t_next - t)
        t = t_next
        for j in range(n_on):
            if phase[j] == 1 and remaining[j] <= 1e-6 * grad_bytes:
                phase[j] = 0
                busy_until[j] = t + t_compute * np.random.lognormal(0.0, jitter)
            elif phase[j] == 0 and busy_until[j] <= t:
                phase[j] = 1
                remaining[j] = grad_bytes
        if t >= sched_t[seg + 1]:
            seg += 1
            for j in range(sched_n[seg - 1], sched_n[seg]):
                phase[j] = 0
                busy_until[j] = t + np.random.uniform(0.0, t_compute)
    return np.array(times), np.array(ks)
