"""The worker's send window as a pure state machine: no sockets, no clock of its own.

``SendWindow`` decides, for one ``SwitchClient.allreduce`` call of ``P`` packets with call
window ``w``, which packet goes out when; the caller owns the socket and the clock and
passes the time in with every event::

    win = SendWindow(P, w, WindowConfig.of(client), client_rtt)
    perform(win.start(now))
    while not win.done:
        wait for a RESULT until win.next_wakeup()
        perform(win.on_result(p, now))      # a RESULT for packet p arrived
        perform(win.on_timer(now))          # nothing (useful) arrived

Events in: ``start``, ``on_result(p, now)``, ``on_timer(now)``. Actions out, in the order
they must be performed (plain values):

* ``Send(p, retransmit)``: put packet ``p`` on the wire (RETRANSMIT flag when re-sent);
* ``Deliver(p)``: the RESULT just received is the first for ``p``: apply it (before any
  ``Send`` that follows, since packet ``p + w`` is quantized with what ``p`` agreed);
* ``Abandon(p)``: bounded mode, the result of ``p`` is gone for good: apply zeros;
* ``Hold(p)``: bounded mode, the RESULT just received is for a packet not sent yet (the
  switch closed its slot at the deadline while this worker waited for ``p - w``): keep a
  copy; its ``Deliver(p)`` follows the one of ``p - w`` (it is decoded with the exponent
  ``p - w`` agreed), and ``p`` itself is never sent;
* ``Fail(reason)``: stop the call: ``"unavailable"`` (no RESULT ever came back within
  ``connect_timeout``) or ``"stalled"`` (reliable mode, no progress for ``stall_timeout``).

The rules (the same as the socket loop had before they moved here):

* packets ``0 .. w-1`` go out at ``start``; the first RESULT of ``p`` releases ``p + w``,
  so at most ``w`` packets are ever in flight;
* retransmission timeout: RFC 6298's estimator (``RttEstimator``, kept by the client
  across calls) with Karn's rule (no RTT sample from a packet that was sent twice); a
  packet is overdue ``rto * backoff`` after its last send, and its backoff doubles with
  each re-send, up to 64 (a slow peer, not a loss, is the usual reason a result is late);
* timers are looked at only when no RESULT came in (``on_timer``); then, if anything is
  overdue: no RESULT ever and ``connect_timeout`` without progress: ``Fail("unavailable")``;
  bounded mode and ``giveup`` without progress: every overdue packet is abandoned (and
  releases its successor); reliable mode and ``stall_timeout`` without progress:
  ``Fail("stalled")``; otherwise every overdue packet is re-sent;
* bounded mode: ``rto`` is at least 1.5 deadlines + 2 ms, so a re-send only goes out
  after the switch's deadline (to fetch the stored result the worker missed); a RESULT
  for a packet not sent yet is held (above), and the packet it would have released goes
  out when ``p - w``'s result is in, so never more than ``w`` are in flight.
"""

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["SendWindow", "WindowConfig", "RttEstimator", "Send", "Deliver", "Abandon",
           "Hold", "Fail", "MAX_BACKOFF"]

MAX_BACKOFF = 64


class Send(NamedTuple):
    p: int
    retransmit: bool = False


class Deliver(NamedTuple):
    p: int


class Abandon(NamedTuple):
    p: int


class Hold(NamedTuple):
    p: int


class Fail(NamedTuple):
    reason: str        # "unavailable" or "stalled"


@dataclass(frozen=True)
class WindowConfig:
    """The timers of one call (``SwitchClient``'s fields of the same names)."""
    mode: str = "reliable"
    rto: float = 0.02              # initial retransmission timeout
    min_rto: float = 0.01          # floor of the adaptive timeout
    deadline: float = 0.005        # the switch's per-job deadline (bounded mode)
    connect_timeout: float = 2.0
    stall_timeout: float = 30.0

    @classmethod
    def of(cls, c):
        """The configuration read from anything with these fields (a ``SwitchClient``)."""
        return cls(c.mode, c.rto, c.min_rto, c.deadline, c.connect_timeout, c.stall_timeout)


@dataclass
class RttEstimator:
    """RFC 6298 smoothed RTT and variance; ``answered``: any RESULT ever came back. It
    outlives a call (the client keeps one), so the next call starts from what was learnt."""
    srtt: float = 0.0
    rttvar: float = 0.0
    answered: bool = False

    def sample(self, r: float):
        if not self.srtt:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r

    def rto(self, cfg: WindowConfig) -> float:
        base = cfg.rto if not self.srtt else min(max(self.srtt + 4 * self.rttvar,
                                                     cfg.min_rto), 1.0)
        if cfg.mode == "bounded":
            return max(base, cfg.deadline * 1.5 + 0.002)
        return base

    def giveup(self, cfg: WindowConfig) -> float:
        """Bounded mode: no progress for this long and overdue results are abandoned."""
        return max(20 * self.rto(cfg), 0.5)


class SendWindow:
    """The window of one call of ``packets`` packets with call window ``window``."""

    __slots__ = ("P", "W", "cfg", "rtt", "bounded", "received", "remaining", "inflight",
                 "tries", "last_progress", "held")

    def __init__(self, packets: int, window: int, cfg: WindowConfig,
                 rtt: RttEstimator | None = None):
        if packets < 1 or window < 1:
            raise ValueError(f"{packets} packets, window {window}: need >= 1 of each")
        self.P, self.W, self.cfg = packets, window, cfg
        self.rtt = rtt if rtt is not None else RttEstimator()
        self.bounded = cfg.mode == "bounded"
        self.received = bytearray(packets)   # 1: result in (applied, held or abandoned)
        self.remaining = packets
        self.inflight = {}     # p -> last send time, in send order
        self.tries = {}        # p -> backoff multiplier; Karn: no RTT samples from these
        self.last_progress = None
        self.held = set()      # results in before their packet was sent

    @property
    def done(self) -> bool:
        return not self.remaining

    def rto(self) -> float:
        return self.rtt.rto(self.cfg)

    def next_wakeup(self):
        """When the earliest in-flight packet becomes overdue (None: nothing in flight)."""
        rto, tries = self.rto(), self.tries
        return min((t + rto * tries.get(p, 1) for p, t in self.inflight.items()),
                   default=None)

    def _send(self, p, now, retransmit=False):
        if retransmit:
            self.tries[p] = min(self.tries.get(p, 1) * 2, MAX_BACKOFF)
        inflight = self.inflight
        inflight.pop(p, None)
        inflight[p] = now
        return Send(p, retransmit)

    # -- events ----------------------------------------------------------------------
    def start(self, now: float):
        self.last_progress = now
        return [self._send(p, now) for p in range(min(self.W, self.P))]

    def on_result(self, p: int, now: float):
        """The first RESULT of packet ``p`` (0 <= p < P): ``[Deliver(p), ...]`` with what
        it releases, or ``[Hold(p)]`` when ``p`` was not sent yet (bounded mode: its slot
        closed at the deadline without this worker); a repeated one: ``[]`` (a
        duplicate, to be ignored)."""
        if self.received[p]:
            return []
        self.received[p] = 1
        self.remaining -= 1
        self.last_progress = now
        self.rtt.answered = True
        q = p - self.W
        if q >= 0 and (not self.received[q] or q in self.held):
            # p goes out only once q's result is in (and delivered); that result then
            # delivers this one and releases p + w (see _release)
            self.held.add(p)
            return [Hold(p)]
        t_sent = self.inflight.pop(p, None)
        if t_sent is not None and p not in self.tries:
            self.rtt.sample(now - t_sent)
        acts = [Deliver(p)]
        self._release(p + self.W, now, acts)
        return acts

    def _release(self, q, now, acts):
        """The result of ``q - w`` is in (or abandoned): send ``q``, or, if its result is
        already held, deliver it and release ``q + w`` in turn."""
        while q < self.P:
            if q not in self.held:
                acts.append(self._send(q, now))
                return
            self.held.discard(q)
            acts.append(Deliver(q))
            q += self.W

    def on_timer(self, now: float):
        rto, tries = self.rto(), self.tries
        # the same sum as next_wakeup's, so a timer fired at next_wakeup() always finds
        # the packet overdue (``now - t >= rto`` can round the other way)
        overdue = [p for p, t in self.inflight.items() if now >= t + rto * tries.get(p, 1)]
        if not overdue:
            return []
        cfg, idle = self.cfg, now - self.last_progress
        if not self.rtt.answered and idle > cfg.connect_timeout:
            return [Fail("unavailable")]
        if self.bounded and idle > self.rtt.giveup(cfg):
            # results gone for good (slot reused): zeros, and the window moves on
            acts = []
            for p in overdue:
                self.received[p] = 1
                self.remaining -= 1
                del self.inflight[p]
                acts.append(Abandon(p))
                self._release(p + self.W, now, acts)
            self.last_progress = now
            return acts
        if not self.bounded and idle > cfg.stall_timeout:
            return [Fail("stalled")]
        return [self._send(p, now, retransmit=True) for p in overdue]
