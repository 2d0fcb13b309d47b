"""Adaptive deadline policy, apart from any mechanism (TAR phases, switch slots).

The policy sees one observation per round (a round is one TAR phase, or one call of the
in-network client) and answers three questions:

* ``calibrating``: during the first ``warmup + calibration`` rounds the mechanism must run
  reliably (TAR over TCP, the switch in reliable mode) and report how long the round took;
* ``deadline()``: after calibration, how long a bounded round may last. It starts at the
  ``percentile`` (P95) of the calibration samples, then follows a moving estimate in the
  style of TCP's RTO: ``srtt + k * rttvar`` (EWMA of the duration and of its deviation),
  with ``k`` fitted at the end of calibration so that the first deadline equals the P95;
* ``early_timeout()``: once every sender's last-percentile (tail-marked) packets are in,
  how much longer to wait: ``early_fraction`` of the expected round time.

Observations of rounds that hit their deadline are censored (the true duration was
longer): they still feed the moving estimate (a lower bound pulls a low estimate up), and
one that lost more than ``target_loss`` of its entries also multiplies an inflation factor
by ``grow`` (multiplicative increase), so a busier network gets more time; other rounds let
the inflation decay back towards 1 (``decay`` per round), so a quiet network gets shorter
deadlines:
``deadline = inflate * (srtt + k * rttvar)``. The deadline stays within ``[min_deadline, max_deadline]``.

``SwitchDeadline`` maps the same policy onto the in-network bounded mode: the switch's
per-job slot deadline (``JobConfig.deadline``) is the policy's deadline scaled from a
whole call to one slot of the self-clocked window.
"""

from dataclasses import dataclass, field

import numpy as np

__all__ = ["DeadlinePolicy", "SwitchDeadline"]


@dataclass
class DeadlinePolicy:
    calibration: int = 5          # K reliable rounds
    warmup: int = 1               # reliable rounds before them, not sampled (connection
                                  # setup, first-touch allocations: a P95 of 5 would be it)
    percentile: float = 95.0
    alpha: float = 0.125          # EWMA gain of the mean (TCP's 1/8)
    beta: float = 0.25            # EWMA gain of the deviation (TCP's 1/4)
    early_fraction: float = 0.25
    target_loss: float = 0.01     # a deadline-ended round losing more than this grows it
    grow: float = 1.25            # multiplicative increase after a lossy deadline round
    decay: float = 0.98           # ... and its slow return towards 1 on good rounds
    max_inflate: float = 16.0
    min_deadline: float = 1e-4
    max_deadline: float = 5.0
    fixed: float | None = None    # a fixed deadline (no calibration, no adaptation)
    samples: list = field(default_factory=list)
    history: list = field(default_factory=list)   # (round, deadline, duration, lost, timed_out)

    def __post_init__(self):
        if self.calibration < 1 and self.fixed is None:
            raise ValueError("deadline policy: calibration must be >= 1 round")
        if not 0 < self.early_fraction <= 1:
            raise ValueError("deadline policy: early_fraction must be in (0, 1]")
        self.srtt = None
        self.rttvar = None
        self.k = 4.0
        self.inflate = 1.0
        self._deadline = self.fixed
        self.rounds = 0

    @property
    def calibrating(self) -> bool:
        return self.fixed is None and self.rounds < self.warmup + self.calibration

    def deadline(self) -> float:
        if self._deadline is None:
            raise RuntimeError("deadline policy still calibrating: run this round reliably")
        return self._deadline

    def expected(self) -> float:
        """The moving estimate of a round's duration (seconds)."""
        if self.srtt is not None:
            return self.srtt
        return self._deadline if self._deadline is not None else self.max_deadline

    def early_timeout(self) -> float:
        return self.early_fraction * self.expected()

    def observe(self, duration: float, lost_fraction: float = 0.0, timed_out: bool = False):
        """Feed one finished round. ``timed_out``: it ended at its deadline."""
        d = float(duration)
        self.rounds += 1
        if self.fixed is not None:
            self.history.append((self.rounds, self.fixed, d, lost_fraction, timed_out))
            return self.fixed
        if self.rounds <= self.warmup:
            pass
        elif self.rounds <= self.warmup + self.calibration:
            self.samples.append(d)
            if self.rounds == self.warmup + self.calibration:
                s = np.asarray(self.samples)
                p = float(np.percentile(s, self.percentile))
                self.srtt = float(s.mean())
                self.rttvar = float(np.mean(np.abs(s - s.mean())))
                self.k = (p - self.srtt) / self.rttvar if self.rttvar > 0 else 4.0
                self.k = float(np.clip(self.k, 1.0, 8.0))
                self._deadline = self._clip(p)
        else:
            if timed_out and lost_fraction > self.target_loss:
                # censored and lossy: the network is slower than our estimate says
                self.inflate = min(self.inflate * self.grow, self.max_inflate)
            else:
                self.inflate = max(1.0, self.inflate * self.decay)
            # every round feeds the estimate; a censored one with its (lower-bound)
            # duration, so a estimate biased low by calibration climbs back
            err = d - self.srtt
            self.srtt += self.alpha * err
            self.rttvar += self.beta * (abs(err) - self.rttvar)
            self._deadline = self._clip(self.inflate * (self.srtt + self.k * self.rttvar))
        self.history.append((self.rounds, self._deadline, d, lost_fraction, timed_out))
        return self._deadline

    def _clip(self, v):
        return float(min(max(v, self.min_deadline), self.max_deadline))


@dataclass
class SwitchDeadline:
    """The same policy, driving the in-network bounded mode's per-job slot deadline.

    One round = one ``SwitchClient.allreduce`` call of ``P = K + W`` packets with a
    window of ``W``: each slot is in flight for about ``call_time * W / P``, so the
    policy observes that per-slot time and its deadline is the switch's slot deadline."""
    policy: DeadlinePolicy = field(default_factory=DeadlinePolicy)

    def slot_time(self, call_seconds: float, packets: int, window: int) -> float:
        return call_seconds * min(window, packets) / max(packets, 1)

    def observe_call(self, call_seconds, packets, window, lost_fraction=0.0,
                     partial_slots=0):
        return self.policy.observe(self.slot_time(call_seconds, packets, window),
                                   lost_fraction, timed_out=partial_slots > 0)

    @property
    def calibrating(self):
        return self.policy.calibrating

    def deadline(self):
        return self.policy.deadline()
