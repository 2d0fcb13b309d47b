"""The phase decisions of bounded TAR (``TarUdp``) as a pure state machine: no sockets, no
clock of its own; the caller passes the time in with every event.

One call at rank ``r`` has two phases: *scatter* (every peer sends this rank its part of
shard ``r``) and *broadcast* (every owner sends its reduced shard). ``TarPhases`` keeps which
chunk came from whom, tells the caller what to do with each datagram, and when each phase
ends::

    ph = TarPhases(rank, nch, s_deadline, b_deadline, s_early, b_early, tail_percent)
    ph.start(now)
    verdict = ph.on_scatter(sender, chunk, tail, now)     # or ph.on_bcast(...)
    ph.end()            # when the current phase ends (None: all its data is in)
    ph.due(now)         # it may end now (the caller drains its socket first)
    ph.end_scatter(now); ph.start_bcast(now2); ph.end_bcast(now3)

Verdicts: ``ACCEPT`` (new data: add or place it), ``DUP`` (that chunk from that sender is
already in), ``LATE`` (a scatter datagram after the scatter phase ended). What is left to
resolve after the broadcast is ``bgot`` (per owner, which broadcast chunks arrived).

When a phase ends (``PhaseClock``), per sender: ``deadline`` after its first datagram (or
after the phase start, whichever is later), or ``early`` after it became *nearly done* (a
tail-marked datagram is in and at most its tail-marked share of datagrams, at least one,
is missing), whichever comes first; a sender not heard from at all gets ``deadline +
skew`` from the phase start; and none later than ``hold x deadline`` after the phase start
(the straggler bound). ``deadline`` is the median of this rank's own estimate and the
estimates its peers' datagrams carry (``proposal``). The phase ends when every sender is
complete or past its end.
"""

import math

import numpy as np

__all__ = ["allowance", "PhaseClock", "TarPhases", "ACCEPT", "DUP", "LATE", "SCATTER",
           "BCAST", "DONE"]

ACCEPT, DUP, LATE = "accept", "dup", "late"
SCATTER, BCAST, DONE = 1, 2, 3


def allowance(k: int, tail_percent: float) -> int:
    """How many of a sender's ``k`` datagrams may still be missing when its early timeout
    starts: the tail-marked ones, ``ceil(k * tail_percent / 100)``, at least one when
    ``k >= 2`` (so a 5-datagram phase has an early timeout too), never all of them."""
    if k <= 1:
        return 0
    return min(k - 1, max(1, math.ceil(k * tail_percent / 100.0)))


class PhaseClock:
    """When one bounded phase ends (see the module docstring). ``need[s]``: datagrams
    expected from sender ``s``.

    Three rules beyond "all in" (each one a test in ``tests/test_tar_phases.py``):

    * *agreed deadline*: every datagram carries its sender's own deadline estimate for
      this phase (``proposal``); the deadline used is the median of this rank's own
      (``deadline``) and every estimate heard so far, so all ranks that hear each other
      use the same one and one rank's outlier estimate (a slow starter's, a fast one's)
      does not decide the phase (OptiReduce's rule);
    * *early timeout scaled to the datagram count*: a sender is *nearly done* once a
      tail-marked datagram is in and at most ``allowance(k)`` of its ``k`` are missing
      (the tail-marked count, at least one for ``k >= 2``); it then gets only ``early``
      more (with a fixed 2% allowance, a phase of fewer than 50 datagrams per sender
      never had an early timeout);
    * *straggler bound*: no sender holds the phase longer than ``hold x deadline`` after
      the phase start (``hold=None``: no bound), however late it started: a straggler
      that starts its call late is cut off there and its data is counted missing."""

    def __init__(self, need, deadline, early, skew, tail_percent=2.0, hold=None):
        self.need, self.own, self.early_t, self.skew = need, deadline, early, skew
        self.hold = hold
        n = len(need)
        self.nearly = [k - allowance(k, tail_percent) for k in need]
        self.nearly_at = [None] * n
        self.cnt = [0] * n
        self.first = [None] * n
        self.last = [None] * n
        self.tail = [None] * n
        self.proposal = [None] * n
        self.deadline = deadline
        self.t0 = None
        self.early = False
        self.held = False
        self._end = None
        self._dirty = True

    def start(self, t0):
        self.t0 = t0
        self._dirty = True

    def arrive(self, s, now, tail, proposal=None):
        c = self.cnt[s] = self.cnt[s] + 1
        if proposal is not None and self.proposal[s] is None:
            self.proposal[s] = float(proposal)
            heard = [p for p in self.proposal if p is not None]
            self.deadline = float(np.median([self.own] + heard))
            self._dirty = True
        self.last[s] = now
        if self.first[s] is None:
            self.first[s] = now
            self._dirty = True
        if tail and self.tail[s] is None:
            self.tail[s] = now
            self._dirty = True
        if self.tail[s] is not None and c >= self.nearly[s] and self.nearly_at[s] is None:
            self.nearly_at[s] = now
            self._dirty = True
        if c == self.need[s]:
            self._dirty = True

    def end(self):
        """The time the phase ends, or None when all data is in."""
        if self._dirty:
            self._dirty = False
            ends = []
            early = True
            cap = self.t0 + self.hold * self.deadline if self.hold is not None else None
            held = False
            for s, need in enumerate(self.need):
                if self.cnt[s] >= need:
                    continue
                if self.first[s] is None:
                    e = self.t0 + self.deadline + self.skew
                    early = False
                else:
                    e = max(self.first[s], self.t0) + self.deadline
                    nearly = self.tail[s] is not None and self.cnt[s] >= self.nearly[s]
                    if nearly and self.nearly_at[s] + self.early_t < e:
                        e = self.nearly_at[s] + self.early_t
                    else:
                        early = False
                if cap is not None and e > cap:
                    e, held = cap, True
                ends.append(e)
            self._end = max(ends) if ends else None
            self.early = bool(ends) and early and not held
            self.held = held and self._end == cap
        return self._end

    def arrived(self):
        """How long the data that did arrive took: per sender heard from, from the later
        of its first datagram and the phase start to its last one. For a phase that lost
        datagrams for good (dropped in a queue, not late) this, not the deadline, is what
        the round took."""
        return max((self.last[s] - max(self.first[s], self.t0)
                    for s, k in enumerate(self.need) if k and self.first[s] is not None),
                   default=0.0)

    def duration(self, now):
        """The phase's duration as the policy sees it: for complete senders, from the
        later of their first datagram and the phase start to their last one; for
        incomplete ones (censored), until now."""
        d = 0.0
        for s, need in enumerate(self.need):
            if need == 0:
                continue
            if self.first[s] is None:
                d = max(d, now - self.t0)
            elif self.cnt[s] >= need:
                d = max(d, self.last[s] - max(self.first[s], self.t0))
            else:
                d = max(d, now - max(self.first[s], self.t0))
        return d


class TarPhases:
    """The two phases of one bounded TAR call at ``rank``; ``nch[o]``: chunks of shard
    ``o``. ``skew``: a peer never heard from in a phase may be up to one bounded call
    behind (its previous call hit its deadlines), and in the broadcast phase also behind
    by our scatter, so it gets that much longer before it counts as lost, unless
    ``hold`` (the straggler bound, in deadlines from the phase start) cuts it first."""

    def __init__(self, rank, nch, s_deadline, b_deadline, s_early, b_early,
                 tail_percent=2.0, hold=None):
        N, r = len(nch), rank
        self.rank, self.nch = r, [int(k) for k in nch]
        self.got = np.zeros((N, self.nch[r]), bool)    # scatter: chunk c of shard r from s
        self.got[r] = True
        self.bgot = [np.zeros(k, bool) for k in self.nch]   # broadcast: chunk c of shard o
        self.bgot[r][:] = True
        self.s_need = [0 if o == r else self.nch[r] for o in range(N)]
        self.b_need = [0 if o == r else self.nch[o] for o in range(N)]
        skew = 2 * (s_deadline + b_deadline)
        self.scatter = PhaseClock(self.s_need, s_deadline, s_early, skew, tail_percent,
                                  hold)
        self.bcast = PhaseClock(self.b_need, b_deadline, b_early, skew + s_deadline,
                                tail_percent, hold)
        self.phase = SCATTER
        self.s_time = self.b_time = 0.0

    # -- events ----------------------------------------------------------------------
    def start(self, now):
        """The scatter phase starts (this rank's scatter datagrams are going out)."""
        self.scatter.start(now)

    def on_scatter(self, sender, chunk, tail, now, proposal=None):
        """A scatter datagram: chunk ``chunk`` of shard ``rank`` from ``sender``, which
        carries ``proposal``, the sender's own scatter deadline (seconds), if any."""
        if self.phase != SCATTER:
            return LATE
        if self.got[sender, chunk]:
            return DUP
        self.got[sender, chunk] = True
        self.scatter.arrive(sender, now, tail, proposal)
        return ACCEPT

    def on_bcast(self, sender, chunk, tail, now, proposal=None):
        """A broadcast datagram: chunk ``chunk`` of shard ``sender`` (it may come while
        this rank is still in its scatter phase: it counts)."""
        if self.bgot[sender][chunk]:
            return DUP
        self.bgot[sender][chunk] = True
        self.bcast.arrive(sender, now, tail, proposal)
        return ACCEPT

    def end(self):
        """When the current phase ends; None when all its data is in."""
        return (self.scatter if self.phase == SCATTER else self.bcast).end()

    def due(self, now) -> bool:
        """The current phase may end now (all in, or its end has come)."""
        e = self.end()
        return e is None or now >= e

    def end_scatter(self, now):
        """The scatter phase ends at ``now``: its duration (for the deadline policy)."""
        assert self.phase == SCATTER
        self.s_time = self.scatter.duration(now)
        self.phase = BCAST
        return self.s_time

    def start_bcast(self, now):
        """This rank's broadcast datagrams are going out."""
        self.bcast.start(now)

    def end_bcast(self, now):
        assert self.phase == BCAST
        self.b_time = self.bcast.duration(now)
        self.phase = DONE
        return self.b_time

    # -- the outcome -----------------------------------------------------------------
    def counts(self):
        """Contributors per chunk of shard ``rank`` (the rescale factor is N / count)."""
        return self.got.sum(axis=0)

    def received(self):
        """(scatter, broadcast) datagrams received."""
        return sum(self.scatter.cnt), sum(self.bcast.cnt)

    def expected(self):
        return sum(self.s_need), sum(self.b_need)
