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
  across calls) with Karn's rule (no RTT sample from a packet that was sent twice),
  floored at ``PEAK_FACTOR`` times the longest RTT sampled in this call or the previous
  one: that is the time a full window takes to come back, queueing included (with N
  workers' windows in the switch's queue, the last packet of a burst waits behind all of
  them, well above the smoothed RTT, and a timer below it re-sends packets that were
  never lost). A packet is overdue ``rto * backoff`` after its last send, and its backoff
  doubles with each re-send, up to 64 (a slow peer, not a loss, is the usual reason a
  result is late), in bounded mode up to 4 (``BOUNDED_MAX_BACKOFF``: there the re-send
  fetches a stored result, which the switch keeps only until its slot is reused);
* a call's first window waits for late peers: in reliable mode, until the first RESULT of
  the call is in, the timeout is at least ``start_wait``. Those results wait for every
  worker to start the call, and workers start calls at different times (the work
  between two calls differs), so a timer set by the RTT alone re-sends whole windows
  that were never lost; once one RESULT is in, all peers have started, and a packet of
  the first window that is still missing is re-sent on the RTT-based timer as usual;
* fast re-send (``FAST_RESEND``, issue 18): a packet sent once whose result is still
  missing when the results of 3 packets sent after it are in goes again at once (then
  the timer rules as for any re-send): a RESULT lost in a full downlink queue costs a
  few datagram times instead of an rto (RESULTs come back in send order, as every
  worker sends in seq order; a reordering costs one duplicate the switch drops);
* timer checks are O(1): packets sent once are kept in send order, so the first one is
  the next to fall due; only re-sent ones (few, with their own backoff) are scanned;
* timers are looked at only when no RESULT came in (``on_timer``); then, if anything is
  overdue: no RESULT ever and ``connect_timeout`` without progress: ``Fail("unavailable")``;
  bounded mode and ``giveup`` without progress: every overdue packet is abandoned (and
  releases its successor); reliable mode and ``stall_timeout`` without progress:
  ``Fail("stalled")``; otherwise every overdue packet is re-sent;
* bounded mode: ``rto`` is the RTT's, as in reliable mode (until issue 18's run 4 it was
  at least 1.5 deadlines + 2 ms, so that a re-send went out only after the switch's
  deadline; with the deadline now derived from the rto, ``slot_deadline``, a lost
  RESULT must be re-fetched well before the next slot of its chain closes); a re-send
  into a slot that is still open is a duplicate the switch drops; ``giveup`` keeps its
  floor of 20 x (1.5 deadlines + 2 ms); a RESULT
  for a packet not sent yet is held (above), and the packet it would have released goes
  out when ``p - w``'s result is in, so never more than ``w`` are in flight.
"""

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["SendWindow", "WindowConfig", "RttEstimator", "Send", "Deliver", "Abandon",
           "Hold", "Fail", "MAX_BACKOFF", "BOUNDED_MAX_BACKOFF", "PEAK_FACTOR",
           "FAST_RESEND", "LOSS_BETA", "DELAY_BETA", "MAX_DELAY_CUT", "DELAY_FACTOR",
           "DELAY_SLACK", "MIN_CWND", "CONGESTED_BETA", "REORDER_RTTS",
           "COALESCE_MIN_INFLIGHT", "COALESCE_SHARE", "COALESCE_MAX", "COALESCE_GAPS"]

MAX_BACKOFF = 64
#: bounded mode: a re-send is a fetch of a result the switch stored when the slot's
#: deadline closed it (no peer is slow at that point: the slot no longer waits), and the
#: result stays only until the others' packets reuse the slot 2W sequence numbers on;
#: a lost RESULT (a congested downlink) must be asked for again soon, not after 64 rto
BOUNDED_MAX_BACKOFF = 4
#: the timeout is at least this many times the longest RTT of this call and the last
PEAK_FACTOR = 2.0
#: fast re-send: a packet sent once whose result is still missing when the results of
#: this many packets sent after it are in goes again at once (TCP's three duplicate
#: ACKs), instead of one rto later
FAST_RESEND = 3

# Congestion control (issue 39, docs/congestion.md): a congestion window ``cwnd`` (in
# datagrams, kept across calls in ``RttEstimator``) caps the packets in flight below the
# call window; AIMD on loss as in ATP/TCP Reno, a delay target on the RESULTs' round
# trips as in Swift. The reasons for each constant are in docs/congestion.md.
#: a loss (a timer re-send or a FAST_RESEND, once the call's first RESULT is in) cuts
#: cwnd to this fraction, at most once per smoothed RTT
LOSS_BETA = 0.5
#: a RESULT whose round trip ``r`` is over the target cuts cwnd by DELAY_BETA x
#: (r - target) / r, at most MAX_DELAY_CUT of it, at most once per smoothed RTT
DELAY_BETA = 0.8
MAX_DELAY_CUT = 0.5
#: the delay target: DELAY_FACTOR x the smallest round trip seen, plus DELAY_SLACK s
DELAY_FACTOR = 1.5
DELAY_SLACK = 0.002
#: cwnd never goes below this (one datagram in flight)
MIN_CWND = 1.0
#: a RESULT with the switch's CONGESTED flag (its slot pool is full; docs/pool.md) cuts
#: cwnd to this fraction instead of growing it, at most once per smoothed RTT (gentler
#: than a loss: nothing was lost, the switch's slots go to its parent)
CONGESTED_BETA = 0.8
#: a CONGESTED RESULT came in within this many smoothed RTTs: no FAST_RESEND (with
#: congestion control on). While the switch's pool marks, the slots it could not hold are
#: summed by its parent, one hop further, so their RESULTs come back after later ones:
#: a reordering, not a loss (in the tenants bench, 3 of 5 DATA of those slots were
#: re-sent at once, and each re-send halved the window); the timer still re-sends them
REORDER_RTTS = 2.0
#: the congestion modes (``WindowConfig.congestion``, ``SwitchClient.congestion``)
CONGESTION = ("aimd", "delay", "off")

# Reading RESULTs in batches (docs/congestion.md, "Reading RESULTs in batches"): a NIC
# coalesces its receive interrupts; a veth, a loopback or a TUN does not, and a worker
# woken for every RESULT (every 66 us at 1 Gbit/s) spent its host's CPU on wake-ups
# (230 per 4 MB call, each a context switch paid partly by the switch that sent it).
# While a standing queue holds the path's round trip over its smallest (srtt over
# base_rtt) and at least COALESCE_MIN_INFLIGHT packets are in flight, the loop waits
# COALESCE_SHARE of that queueing delay, at most COALESCE_MAX seconds, after a read that
# was useful, before it reads again: the packets it releases then go out that much later,
# which only drains a queue that is standing anyway; with no queue it does not wait. Nor
# does it when fewer than COALESCE_GAPS RESULTs would come in the wait (RESULTs come
# srtt / inflight apart): on a slow link a wait would be one more wake-up, not fewer.
COALESCE_MIN_INFLIGHT = 16
COALESCE_SHARE = 0.25
COALESCE_MAX = 200e-6
COALESCE_GAPS = 2.0


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
    start_wait: float = 0.25       # reliable: timeout floor until the call's first RESULT
    #: congestion control (issue 39): "aimd" (a congestion window, halved on loss),
    #: "delay" (the same, also cut when RESULT round trips exceed the delay target) or
    #: "off" (the fixed call window of before)
    congestion: str = "aimd"

    def __post_init__(self):
        if self.congestion not in CONGESTION:
            raise ValueError(f"congestion {self.congestion!r}: expected one of "
                             f"{', '.join(CONGESTION)}")

    @classmethod
    def of(cls, c):
        """The configuration read from anything with these fields (a ``SwitchClient``)."""
        # the client's timers are those of bounded mode for every mode with a deadline
        mode = "reliable" if c.mode == "reliable" else "bounded"
        return cls(mode, c.rto, c.min_rto, c.deadline, c.connect_timeout, c.stall_timeout,
                   c.start_wait, getattr(c, "congestion", "aimd"))


@dataclass
class RttEstimator:
    """RFC 6298 smoothed RTT and variance; ``answered``: any RESULT ever came back;
    ``peak`` / ``last_peak``: the longest RTT sampled in this call / the previous one (the
    queueing delay of a full window). It outlives a call (the client keeps one), so the
    next call starts from what was learnt.

    Congestion control's state lives here too, for the same reason: ``cwnd`` (datagrams;
    0: not set, a call starts it at its window), ``ssthresh`` (below it cwnd grows by one
    per RESULT, above it by one per window), ``base_rtt`` (the smallest round trip
    sampled from a packet sent after its call's first RESULT, in every mode, 0: none;
    the delay target and ``SendWindow.coalesce`` read it), ``cut_at`` (when cwnd was last cut: at most once per RTT),
    ``cuts`` (how many times it was cut, loss or delay), ``congested_at`` (when the last
    RESULT with the switch's CONGESTED flag came in: ``REORDER_RTTS``)."""
    srtt: float = 0.0
    rttvar: float = 0.0
    answered: bool = False
    peak: float = 0.0
    last_peak: float = 0.0
    cwnd: float = 0.0
    ssthresh: float = float("inf")
    base_rtt: float = 0.0
    cut_at: float = float("-inf")
    cuts: float = 0.0
    congested_at: float = float("-inf")

    def sample(self, r: float):
        if not self.srtt:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r
        if r > self.peak:
            self.peak = r

    def new_call(self):
        """A call starts: the peak of the one before becomes ``last_peak``."""
        self.last_peak, self.peak = self.peak, 0.0

    def base_rto(self, cfg: WindowConfig) -> float:
        """The timeout from the RTT alone (RFC 6298, floored at the peak): what the
        ranks exchange to set the switch's slot deadline (``slot_deadline``)."""
        if not self.srtt:
            return cfg.rto
        return min(max(self.srtt + 4 * self.rttvar, cfg.min_rto,
                       PEAK_FACTOR * max(self.peak, self.last_peak)), 1.0)

    def rto(self, cfg: WindowConfig) -> float:
        # bounded mode too: a re-send fetches a RESULT the switch stored (the slot
        # closed), or is a duplicate it drops (the slot still waits); it must come
        # before the next slot of its chain closes, so no longer after 1.5 deadlines
        # (with a deadline derived from the rto, that floor would chase itself)
        return self.base_rto(cfg)

    def giveup(self, cfg: WindowConfig) -> float:
        """Bounded mode: no progress for this long and overdue results are abandoned
        (at least 20 rto and 30 deadlines: the others may wait a deadline per slot)."""
        base = self.base_rto(cfg)
        if cfg.mode == "bounded":
            base = max(base, cfg.deadline * 1.5 + 0.002)
        return max(20 * base, 0.5)


class SendWindow:
    """The window of one call of ``packets`` packets with call window ``window``."""

    __slots__ = ("P", "W", "cfg", "rtt", "bounded", "received", "remaining", "fresh",
                 "resent", "tries", "last_progress", "held", "started", "later", "fast",
                 "cc", "ready", "qhead", "state", "low", "t_first", "lost", "lhead",
                 "lostf", "nlost", "delay")

    def __init__(self, packets: int, window: int, cfg: WindowConfig,
                 rtt: RttEstimator | None = None):
        if packets < 1 or window < 1:
            raise ValueError(f"{packets} packets, window {window}: need >= 1 of each")
        self.P, self.W, self.cfg = packets, window, cfg
        self.rtt = rtt if rtt is not None else RttEstimator()
        self.rtt.new_call()
        self.bounded = cfg.mode == "bounded"
        self.received = bytearray(packets)   # 1: result in (applied, held or abandoned)
        self.remaining = packets
        # in flight: p -> last send time. ``fresh``: sent once, in send order, so its
        # first entry falls due first; ``resent``: re-sent, each with its own backoff
        self.fresh = {}
        self.resent = {}
        self.tries = {}        # p -> backoff multiplier; Karn: no RTT samples from these
        self.last_progress = None
        self.held = set()      # results in before their packet was sent
        self.started = False   # a RESULT of this call is in: every peer has started it
        self.later = {}        # p (sent once) -> results in of packets sent after it
        self.fast = set()      # packets re-sent at once (FAST_RESEND), not by the timer
        # congestion control: released packets wait in ``ready`` (release order, from
        # ``qhead``) while ``cwnd`` packets are in flight; ``state``: 0 not released,
        # 1 released and waiting, 2 sent; ``low``: no packet below it lacks its result
        self.cc = cfg.congestion != "off"
        self.delay = cfg.congestion == "delay"
        self.ready, self.qhead, self.state, self.low = [], 0, bytearray(packets), 0
        self.t_first = float("inf")   # when the call's first RESULT came in
        # reliable mode, a timeout re-sends at most ``limit()`` packets; the others are
        # marked lost (``lostf``, ``nlost`` of them, queued in ``lost`` from ``lhead``):
        # no longer counted in flight, they go again first as results make room
        self.lost, self.lhead, self.lostf, self.nlost = [], 0, bytearray(packets), 0
        if self.cc and not self.rtt.cwnd:
            self.rtt.cwnd = float(window)    # a client's first call: the whole window

    @property
    def done(self) -> bool:
        return not self.remaining

    @property
    def inflight(self) -> int:
        """Packets sent and without a result."""
        return len(self.fresh) + len(self.resent)

    def rto(self) -> float:
        return self.rtt.rto(self.cfg)

    def limit(self) -> int:
        """How many packets may be in flight now: the call window, or less while the
        congestion window is smaller (one more, the lowest packet without a result,
        may go past it: see ``_pump``)."""
        if not self.cc:
            return self.W
        c = int(self.rtt.cwnd)
        return c if c < self.W else self.W

    def timeout(self) -> float:
        """The timeout now: ``rto``, or at least ``start_wait`` while a reliable call has
        no RESULT in yet."""
        rto = self.rtt.rto(self.cfg)
        if not self.started and not self.bounded and rto < self.cfg.start_wait:
            return self.cfg.start_wait
        return rto

    def coalesce(self) -> float:
        """How long the loop may wait, after a read that was useful, before it reads
        RESULTs again (``COALESCE_*``): COALESCE_SHARE of the standing queue's delay
        (``srtt - base_rtt``), at most COALESCE_MAX; 0 while fewer than
        COALESCE_MIN_INFLIGHT packets are in flight, when no round trip is known, or when
        fewer than COALESCE_GAPS RESULTs would come in that time (``srtt / inflight``
        apart)."""
        rt = self.rtt
        n = len(self.fresh) + len(self.resent) - self.nlost
        if not rt.base_rtt or n < COALESCE_MIN_INFLIGHT:
            return 0.0
        d = (rt.srtt - rt.base_rtt) * COALESCE_SHARE
        if d > COALESCE_MAX:
            d = COALESCE_MAX
        if d <= 0.0 or d * n < COALESCE_GAPS * rt.srtt:
            return 0.0
        return d

    def next_wakeup(self):
        """When the earliest in-flight packet becomes overdue (None: nothing in flight)."""
        rto = self.timeout()
        t = None
        for ts in self.fresh.values():
            t = ts + rto
            break
        if self.resent:
            tries = self.tries
            r = min(ts + rto * tries[p] for p, ts in self.resent.items())
            t = r if t is None or r < t else t
        return t

    def _send(self, p, now, retransmit=False):
        if retransmit:
            if self.lostf[p]:
                self.lostf[p] = 0
                self.nlost -= 1
            self.tries[p] = min(self.tries.get(p, 1) * 2,
                                BOUNDED_MAX_BACKOFF if self.bounded else MAX_BACKOFF)
            self.fresh.pop(p, None)
            self.resent.pop(p, None)
            self.resent[p] = now
        else:
            self.fresh[p] = now
            self.state[p] = 2
        return Send(p, retransmit)

    def _pump(self, now, acts):
        """Send packets marked lost (re-sends), then released packets in release order,
        while fewer than ``limit()`` are in flight (the lost ones not counted); then the lowest packet still without a result, if it waits, goes in any
        case: every worker then sends the packet the switch waits on longest, so windows
        of different sizes never wait on each other (worker A's window full of packets
        whose slots wait for B, B's full of packets that wait for A)."""
        limit, ready, state, received = self.limit(), self.ready, self.state, self.received
        lost, i, n = self.lost, self.lhead, len(self.lost)
        while i < n and len(self.fresh) + len(self.resent) - self.nlost < limit:
            p = lost[i]
            i += 1
            if self.lostf[p]:
                acts.append(self._send(p, now, retransmit=True))
        self.lhead = i
        i, n = self.qhead, len(ready)
        while i < n and len(self.fresh) + len(self.resent) - self.nlost < limit:
            p = ready[i]
            i += 1
            if state[p] == 1 and not received[p]:
                acts.append(self._send(p, now))
        self.qhead = i
        lo = self.low
        while lo < self.P and received[lo]:
            lo += 1
        self.low = lo
        if lo < self.P and state[lo] == 1:
            acts.append(self._send(lo, now))

    # -- congestion control (docs/congestion.md) ---------------------------------------
    def _cut(self, now, factor):
        """Multiply cwnd (at most the call window) by ``factor``, at most once per
        smoothed RTT."""
        rt = self.rtt
        if now - rt.cut_at < rt.srtt:
            return
        c = rt.cwnd if rt.cwnd < self.W else float(self.W)
        c *= factor
        rt.cwnd = c if c > MIN_CWND else MIN_CWND
        rt.ssthresh = rt.cwnd
        rt.cut_at = now
        rt.cuts += 1

    def on_local_congestion(self, now: float):
        """This host's own queue refused a send (ENOBUFS; the loop sends it again): the
        path's first hop is full. With congestion control on, cwnd is cut by LOSS_BETA,
        at most once per smoothed RTT, as TCP enters CWR on local congestion; nothing
        was lost, so no action. Returns ``[]``."""
        if self.cc:
            self._cut(now, LOSS_BETA)
        return []

    def _on_rtt(self, r, t_sent, now):
        """A round trip ``r`` of a packet sent once, at ``t_sent``. "aimd": the window
        grows. "delay": compared with the delay target; only a packet sent after the
        call's first RESULT counts (before it, the wait for late peers is in it)."""
        if not self.delay:
            self._grow()
            return
        if t_sent < self.t_first:
            return
        rt = self.rtt
        target = DELAY_FACTOR * rt.base_rtt + DELAY_SLACK
        if r > target:
            f = 1.0 - DELAY_BETA * (r - target) / r
            self._cut(now, f if f > 1.0 - MAX_DELAY_CUT else 1.0 - MAX_DELAY_CUT)
        else:
            self._grow()

    def _grow(self):
        rt = self.rtt
        if rt.cwnd < self.W:
            c = rt.cwnd + (1.0 if rt.cwnd < rt.ssthresh else 1.0 / rt.cwnd)
            rt.cwnd = c if c < self.W else float(self.W)

    def _sent_at(self, p):
        if self.lostf[p]:
            self.lostf[p] = 0
            self.nlost -= 1
        t = self.fresh.pop(p, None)
        return self.resent.pop(p, None) if t is None else t

    # -- events ----------------------------------------------------------------------
    def start(self, now: float):
        self.last_progress = now
        self.ready = list(range(min(self.W, self.P)))
        for p in self.ready:
            self.state[p] = 1
        acts = []
        self._pump(now, acts)
        return acts

    def on_result(self, p: int, now: float, congested: bool = False):
        """The first RESULT of packet ``p`` (0 <= p < P): ``[Deliver(p), ...]`` with what
        it releases, or ``[Hold(p)]`` when ``p`` was not sent yet (bounded mode: its slot
        closed at the deadline without this worker); a repeated one: ``[]`` (a
        duplicate, to be ignored). ``congested``: the RESULT has the switch's CONGESTED
        flag: with congestion control on, cwnd is cut by CONGESTED_BETA instead of
        growing."""
        self.started = True
        if self.t_first == float("inf"):
            self.t_first = now
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
        t_sent = self._sent_at(p)
        if t_sent is not None and p not in self.tries:
            rt = self.rtt
            rt.sample(now - t_sent)
            if t_sent >= self.t_first and (not rt.base_rtt or now - t_sent < rt.base_rtt):
                rt.base_rtt = now - t_sent     # not before the first RESULT: late peers
            if self.cc and not congested:
                self._on_rtt(now - t_sent, t_sent, now)
        elif self.cc and not congested:
            self._grow()         # no sample (Karn), but the path delivered: ACK clock
        if self.cc and congested:
            self._cut(now, CONGESTED_BETA)     # the switch's slots are full
            self.rtt.congested_at = now
        acts = [Deliver(p)]
        self._release(p + self.W, now, acts)
        self._pump(now, acts)
        rt = self.rtt
        if t_sent is not None and not (self.cc and now - rt.congested_at <=
                                       REORDER_RTTS * rt.srtt):
            # packets sent once, before p, still without a result: FAST_RESEND later
            # results and one goes again at once (its RESULT, or its DATA, was lost);
            # not while the switch's pool marks (REORDER_RTTS: its parent's RESULTs
            # come back after later ones)
            due = []
            for q, ts in self.fresh.items():
                if ts >= t_sent:
                    break
                n = self.later.get(q, 0) + 1
                self.later[q] = n
                if n == FAST_RESEND:
                    due.append(q)
            for q in due:
                self.fast.add(q)
                acts.append(self._send(q, now, retransmit=True))
            if due and self.cc:
                self._cut(now, LOSS_BETA)
        return acts

    def _release(self, q, now, acts):
        """The result of ``q - w`` is in (or abandoned): ``q`` may go (``_pump`` sends
        it), or, if its result is already held, deliver it and release ``q + w`` in
        turn."""
        while q < self.P:
            if q not in self.held:
                self.ready.append(q)
                self.state[q] = 1
                return
            self.held.discard(q)
            acts.append(Deliver(q))
            q += self.W

    def on_timer(self, now: float):
        rto, tries = self.timeout(), self.tries
        # the same sums as next_wakeup's, so a timer fired at next_wakeup() always finds
        # the packet overdue (``now - t >= rto`` can round the other way)
        overdue = []
        for p, t in self.fresh.items():
            if now < t + rto:
                break
            overdue.append(p)
        if self.resent:
            late = [p for p, t in self.resent.items() if now >= t + rto * tries[p]]
            if late:
                # in order of last send, as one list of everything in flight would be
                sent = {**self.fresh, **self.resent}
                overdue = sorted(overdue + late, key=sent.__getitem__)
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
                self._sent_at(p)
                acts.append(Abandon(p))
                self._release(p + self.W, now, acts)
                self._pump(now, acts)
            self.last_progress = now
            return acts
        if not self.bounded and idle > cfg.stall_timeout:
            return [Fail("stalled")]
        if self.cc and self.started:
            # a loss (before the call's first RESULT: late peers, not the network)
            self._cut(now, LOSS_BETA)
            if not self.bounded:
                # reliable: no more re-sends at once than the cut window (a whole
                # window re-sent into the queue that just overflowed overflows it
                # again); the others are marked lost: _pump re-sends them as results
                # make room (their timers start again from now, unsent)
                n = self.limit()
                for p in overdue[n:]:
                    self._rearm(p, now)
                    if not self.lostf[p]:
                        self.lostf[p] = 1
                        self.nlost += 1
                        self.lost.append(p)
                overdue = overdue[:n]
        return [self._send(p, now, retransmit=True) for p in overdue]

    def _rearm(self, p, now):
        """Restart ``p``'s timer from ``now`` without sending it (its backoff stays)."""
        if p in self.fresh:
            del self.fresh[p]
            self.fresh[p] = now
        else:
            del self.resent[p]
            self.resent[p] = now
