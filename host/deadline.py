"""Deadlines, one owner: how long a round may wait for what is missing.

Two rules live here, both policy (numbers in, a deadline out), apart from any mechanism:

* **The switch's slot deadline in bounded mode, derived from what the job knows**
  (``slot_deadline``, ``short_deadline``, ``choose_deadline``, and ``SlotDeadlineTuner``,
  which tracks the ranks' agreed timeout and clean exchanges call by call; the DDP hook
  does the exchanges and moves the switch's deadline). See "The derived slot deadline".
* **An adaptive deadline learned from the rounds themselves** (``DeadlinePolicy``, one per
  TAR phase; ``SwitchDeadline`` maps it onto the switch's slot deadline). See "The
  adaptive policy".

The derived slot deadline
-------------------------
A fixed deadline is right for one link only: ``--switch-deadline-ms 20`` was chosen at
100 Mbit/s and made every bounded run fail at 10 Mbit/s on the lab (issue 18, run 3),
where one call window of 8 jumbo datagrams (8,220 B) takes 52 ms on a worker's link.
What failed was the recovery of a lost RESULT: a worker behind a flooded downlink loses
the RESULT of packet ``p``; it can send ``p + w`` only once it has re-fetched ``p``'s
result (a re-send of ``p``, answered from the switch's stored result) after its
retransmission timeout ``rto``. Meanwhile the others have ``p``'s result, send ``p + w``,
and the slot of ``p + w`` closes ``deadline`` after it opened. With a deadline far below
``rto`` it always closes without that worker, which then runs behind the others on every
packet of that chain; it catches up only by re-fetching, and once the others are 2W
sequence numbers ahead (the switch reuses the slot) its result is gone: AllreduceTooLate.

The rule (``slot_deadline``)::

    deadline = wire + refetch x rto          (refetch = 2, within [floor, cap])
    wire     = w x datagram_bytes x 8 / rate (one call window on a worker's link)
    rto      = max(rto_link, rto_measured)
    rto_link = PEAK_FACTOR x (w + 1) x datagram_bytes x 8 / rate

* ``wire``: a slot may close only once every worker's data of the window can be on the
  wire (at 10 Mbit/s, 52 ms for 8 datagrams of 8,220 B);
* ``refetch x rto``: a worker that lost the RESULT of ``p`` re-fetches it after its
  ``rto``, and its ``p + w`` still joins the slot of ``p + w`` (opened when the others
  got ``p``'s result) with one more ``rto`` to spare for the re-fetch's round trip and
  queueing: the deadline is comfortably above the retransmit timeout, so one lost
  RESULT costs every worker one ``rto`` (as in reliable mode) instead of making one
  worker fall behind for good;
* ``rto_link``: before any RTT is measured, what the client's timer converges to with a
  full window (``window.PEAK_FACTOR`` times the longest RTT: a packet behind its own
  window on the uplink, then its RESULT on the downlink), known from the link rate
  (``INA_LINK_RATE``, bit/s; the lab sets it);
* ``rto_measured``: the largest of the ranks' RTT-based timeouts (``RttEstimator.base_rto``),
  exchanged every ``RETUNE_CALLS`` calls. TAR's phases agree on the median of the
  ranks' estimates (one rank's outlier does not decide); here it is the maximum, because
  the rank that must be covered is exactly the outlier: the one behind a congested
  downlink, whose re-fetches take longest;
* ``floor``: the installed deadline's default (5 ms) when nothing is known; ``cap``: 1 s.

A long deadline costs nothing while every worker's data arrives: a slot closes as soon as
all N contributions are in. It costs only when a contribution is missing (a compute
straggler, a lost DATA), and then it is the time the others wait, as in reliable mode,
but bounded.

Rank 0 installs the job with the rule applied to the job's window (a generous first
value), sets it from the first call's own window before its first packet, and moves it
live (``send_job(update=True)``: only the deadline changes, slots and data in flight
stay) whenever the agreed figure moves by more than ``RETUNE_CHANGE``.

The loss-aware rule (``choose_deadline``, rule ``loss-aware``). The ``2 x rto`` above pays
for one thing only: a RESULT lost on the way to a worker, which that worker must
re-fetch before the next slot of its chain closes. A RESULT that reaches a worker
re-served (unicast, flagged RETRANSMIT: the switch's answer to a re-send of a slot that
already closed) with that worker's own DATA in its bitmap is exactly such a loss (its
DATA was in, so the group's RESULT was sent after it and never came), and each client
counts those (``refetched``). One without the worker's bit answers a late contribution
(a straggler, a skipped worker, DATA stuck in a congested uplink): not counted.
The ranks add up their counts at every exchange. While none is seen, nothing needs the
re-fetch margin, and the slot closes at::

    short = wire + max(wire, SHORT_MARGIN)

one call window on the wire plus one more: a contribution stuck behind a congested
uplink, or lost there, costs the others at most one window time, instead of
``2 x rto`` (three to five window times). ``SHORT_MARGIN`` (15 ms) keeps the margin above
the scheduling jitter of a shared host, where one window takes under a millisecond on
the wire (at 100 Mbit/s: 5 ms, and ``short`` is 20 ms). The job starts on the derived
rule; after ``CLEAN_INTERVALS`` exchanges in a row without a re-fetched RESULT on any
rank (the first exchanges come after calls 4 and 8) it moves to ``short``, and back to
the derived rule at the first exchange that shows one. At 10 Mbit/s with jumbo datagrams ``short`` is 105 ms, next to the fixed
100 ms that runs 33-34 of issue 18 chose by hand (``docs/tail.md``); under a flooded
downlink, where RESULTs are lost, the derived rule stays in force.

The adaptive policy
-------------------
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

from .transport.window import PEAK_FACTOR

__all__ = ["slot_deadline", "short_deadline", "choose_deadline", "datagram_seconds",
           "SlotDeadlineTuner", "DeadlinePolicy", "SwitchDeadline",
           "RULES", "RETUNE_CALLS", "EARLY_EXCHANGES", "RETUNE_CHANGE", "REFETCH",
           "DEADLINE_CAP", "DEADLINE_FLOOR", "SHORT_MARGIN", "CLEAN_INTERVALS", "UDP_IP_BYTES"]



#: bytes a datagram costs on the wire beyond its UDP payload (IPv4 + UDP + Ethernet)
UDP_IP_BYTES = 20 + 8 + 18
#: rto's a lost RESULT may take to be re-fetched before the next slot of its chain closes
REFETCH = 2.0
DEADLINE_CAP = 1.0
DEADLINE_FLOOR = 0.005
#: the ranks exchange their timeouts every this many calls (from the first call on),
#: and once after each of the first calls in ``EARLY_EXCHANGES``, so that a clean link
#: is known (and the loss-aware rule's short deadline in force) after 4 calls, not 16
RETUNE_CALLS = 16
EARLY_EXCHANGES = (4, 8)
#: and rank 0 moves the switch's deadline when the rule's value moved by more than this
RETUNE_CHANGE = 0.2
#: the loss-aware rule's smallest margin beyond one window on the wire (seconds)
SHORT_MARGIN = 0.015
#: exchanges in a row without a re-fetched RESULT before the short deadline applies
CLEAN_INTERVALS = 1
#: ``derived``: always ``slot_deadline``; ``loss-aware``: ``short_deadline`` while no
#: RESULT is lost (``choose_deadline``)
RULES = ("derived", "loss-aware")


def datagram_seconds(payload_bytes: int, rate_bps: float | None) -> float:
    """Seconds one datagram of ``payload_bytes`` (UDP payload) takes at ``rate_bps``
    (0 when the rate is unknown)."""
    if not rate_bps:
        return 0.0
    return (payload_bytes + UDP_IP_BYTES) * 8 / float(rate_bps)


def slot_deadline(window: int, payload_bytes: int, rate_bps: float | None = None,
                  rto: float | None = None, refetch: float = REFETCH,
                  floor: float = DEADLINE_FLOOR, cap: float = DEADLINE_CAP) -> float:
    """The slot deadline (seconds) for a call window of ``window`` datagrams of
    ``payload_bytes`` each, on links of ``rate_bps`` (None: unknown) and with ``rto``
    the largest measured retransmission timeout of the job's ranks (None: none yet).
    See the module docstring for the rule."""
    t = datagram_seconds(payload_bytes, rate_bps)
    wire = window * t
    rto_link = PEAK_FACTOR * (window + 1) * t
    r = max(rto_link, rto or 0.0)
    return min(max(wire + refetch * r, floor), cap)


def short_deadline(window: int, payload_bytes: int, rate_bps: float | None = None,
                   margin: float = SHORT_MARGIN, cap: float = DEADLINE_CAP) -> float:
    """The loss-aware rule's deadline while no RESULT is lost: one call window on the
    wire plus ``max(window on the wire, margin)``."""
    wire = window * datagram_seconds(payload_bytes, rate_bps)
    return min(wire + max(wire, margin), cap)


def choose_deadline(rule: str, window: int, payload_bytes: int,
                    rate_bps: float | None = None, rto: float | None = None,
                    clean_intervals: int = 0) -> float:
    """The slot deadline under ``rule`` (one of ``RULES``): ``clean_intervals`` is how
    many exchanges in a row no rank saw a re-fetched RESULT (0 before the first)."""
    if rule not in RULES:
        raise ValueError(f"unknown slot-deadline rule {rule!r}; have {', '.join(RULES)}")
    if rule == "loss-aware" and clean_intervals >= CLEAN_INTERVALS:
        return short_deadline(window, payload_bytes, rate_bps)
    return slot_deadline(window, payload_bytes, rate_bps, rto)

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


@dataclass
class SlotDeadlineTuner:
    """The derived slot deadline of one job, call by call, with no I/O: what the DDP hook
    (``InaHookState``) asks before each call and tells after each exchange of the ranks'
    timeouts; the hook does the exchanges and moves the switch's deadline.

    ``rule``: one of ``RULES``; ``link_rate``: bit/s of the workers' links (None:
    unknown); ``agreed_rto``: the ranks' largest RTT-based timeout at the last exchange;
    ``clean_intervals``: exchanges in a row in which no rank re-fetched a RESULT;
    ``history``: (call, deadline) at the first value and at every move."""
    rule: str = "loss-aware"
    link_rate: float | None = None
    agreed_rto: float | None = None
    clean_intervals: int = 0
    calls: int = 0
    window: int = 0
    history: list = field(default_factory=list)

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"INA_DEADLINE_RULE={self.rule!r}: have {', '.join(RULES)}")

    def deadline(self, window: int, payload_bytes: int) -> float:
        """The rule's deadline for a call window of ``window`` datagrams."""
        self.window = window
        return choose_deadline(self.rule, window, payload_bytes, self.link_rate,
                               self.agreed_rto, self.clean_intervals)

    @staticmethod
    def should_move(current: float, new: float) -> bool:
        """Whether the switch's deadline is worth a live update (moved > RETUNE_CHANGE)."""
        return abs(new - current) > RETUNE_CHANGE * current

    def moved(self, deadline: float):
        self.history.append((self.calls, deadline))

    def call_done(self) -> bool:
        """Count one call; True when the ranks exchange their timeouts after it."""
        self.calls += 1
        return self.calls % RETUNE_CALLS == 0 or self.calls in EARLY_EXCHANGES

    def agreed(self, rto: float | None, refetched: int):
        """The exchange's outcome: the largest timeout and the ranks' summed re-fetches."""
        self.agreed_rto = rto or None
        self.clean_intervals = 0 if refetched else self.clean_intervals + 1
