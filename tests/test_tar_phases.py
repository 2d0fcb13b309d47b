"""Bounded TAR's phase decisions (``host.collectives.tar_phases.TarPhases``) with a fake
clock and hypothesis-drawn arrival schedules (loss, duplicates, any order, any delay),
driven the way ``TarUdp._bounded`` drives them: take what has arrived, and when the phase
is due, drain what arrived by then before ending it.

Properties: a phase ends exactly when an independent reading of the rules says (all data
in, or every missing sender past its deadline or its early timeout), so never before all
needed arrivals unless a deadline or the early rule allows it; verdicts are exact (each
chunk accepted once, repeats are duplicates, scatter data after the scatter phase is
late); the same inputs give the same decisions.
"""

import math

import numpy as np
from hypothesis import given, settings, strategies as st, HealthCheck

from ina_fabric.host.collectives.tar_phases import (TarPhases, ACCEPT, DUP, LATE, SCATTER,
                                                    BCAST, DONE)

COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
GAP = 1e-4     # this rank's send time between the end of scatter and the broadcast start


def tail_chunks(k, tail_percent):
    """The chunks ``TarUdp._packets`` marks TAIL: the last ceil(k * tail%) of k."""
    t = max(1, math.ceil(k * tail_percent / 100.0))
    return set(range(k - t, k))


@st.composite
def calls(draw):
    N = draw(st.integers(2, 5))
    r = draw(st.integers(0, N - 1))
    nch = draw(st.lists(st.integers(0, 30), min_size=N, max_size=N))
    sd = draw(st.sampled_from([0.002, 0.01, 0.05]))
    bd = draw(st.sampled_from([0.002, 0.01, 0.05]))
    se = draw(st.sampled_from([0.0, 0.001, 0.004]))
    be = draw(st.sampled_from([0.0, 0.001, 0.004]))
    tail = draw(st.sampled_from([2.0, 10.0, 25.0]))
    # per call: how lossy, how duplicating, and how spread out in time the arrivals are
    # (clustered arrivals exercise the early timeout, spread ones the deadlines)
    loss = draw(st.sampled_from([0, 0, 5, 30]))
    dup = draw(st.sampled_from([0, 10]))
    spread = draw(st.sampled_from([0.001, 0.01, 0.1, 0.3]))
    times = st.one_of(st.floats(0, spread), st.sampled_from([0.0, sd, sd + bd, 0.001]))
    events = []
    for kind, need in (("s", lambda o: nch[r]), ("b", lambda o: nch[o])):
        for o in range(N):
            if o == r:
                continue
            tails = tail_chunks(need(o), tail)
            for c in range(need(o)):
                copies = 0 if draw(st.integers(0, 99)) < loss else \
                    1 + (draw(st.integers(0, 99)) < dup)
                for _ in range(copies):
                    events.append((draw(times), kind, o, c, c in tails))
    events.sort(key=lambda e: e[0])      # stable: same-time events keep draw order
    return N, r, nch, (sd, bd, se, be, tail), events


class Ref:
    """The phase-end rule read independently from a log of accepted arrivals."""

    def __init__(self, need, deadline, early, skew, tail_percent):
        self.need, self.D, self.early, self.skew = need, deadline, early, skew
        # all but the tail-marked chunks (at least one may be missing from k >= 2)
        self.nearly = [k if k <= 1 else len(set(range(k)) - tail_chunks(k, tail_percent))
                       for k in need]
        self.log = [[] for _ in need]     # per sender: (time, tail) of accepted arrivals

    def end(self, t0):
        ends, all_early = [], True
        for s, k in enumerate(self.need):
            log = self.log[s]
            if len(log) >= k:
                continue
            if not log:
                ends.append(t0 + self.D + self.skew)
                all_early = False
                continue
            deadline = max(log[0][0], t0) + self.D
            nearly_at = None
            seen_tail = False
            for i, (t, tail) in enumerate(log):
                seen_tail = seen_tail or tail
                if seen_tail and i + 1 >= self.nearly[s]:
                    nearly_at = t
                    break
            if nearly_at is not None and nearly_at + self.early < deadline:
                ends.append(nearly_at + self.early)
            else:
                ends.append(deadline)
                all_early = False
        return (max(ends) if ends else None), bool(ends) and all_early


def drive(N, r, nch, params, events):
    """Run one call's phases over ``events``; returns everything decided, in order."""
    sd, bd, se, be, tail = params
    ph = TarPhases(r, nch, sd, bd, se, be, tail)
    skew = 2 * (sd + bd)
    refs = {SCATTER: Ref(ph.s_need, sd, se, skew, tail),
            BCAST: Ref(ph.b_need, bd, be, skew + sd, tail)}
    t0 = {SCATTER: 0.0}
    ph.start(0.0)
    decisions, ends = [], {}
    i, now = 0, 0.0

    def take(e):
        t, kind, o, c, is_tail = e
        phase_before = ph.phase
        if kind == "s":
            v = ph.on_scatter(o, c, is_tail, now)
            if v == ACCEPT:
                assert phase_before == SCATTER
                refs[SCATTER].log[o].append((now, is_tail))
            elif v == LATE:
                assert phase_before != SCATTER
        else:
            v = ph.on_bcast(o, c, is_tail, now)
            assert v != LATE
            if v == ACCEPT:
                refs[BCAST].log[o].append((now, is_tail))
        decisions.append((now, kind, o, c, v))

    while ph.phase != DONE:
        end = ph.end()
        if end is None or now >= end:
            drained = False
            while i < len(events) and events[i][0] <= now:   # what already arrived
                take(events[i])
                i += 1
                drained = True
            if drained:
                continue
            phase = ph.phase
            ref_end, ref_early = refs[phase].end(t0[phase])
            assert end == ref_end, (phase, end, ref_end)
            clock = ph.scatter if phase == SCATTER else ph.bcast
            assert clock.early == ref_early
            ends[phase] = now
            if phase == SCATTER:
                d = ph.end_scatter(now)
                now += GAP
                t0[BCAST] = now
                ph.start_bcast(now)
            else:
                d = ph.end_bcast(now)
            assert 0.0 <= d <= now - t0[phase] + 1e-12 or end is None
            decisions.append((now, "end", phase, d, clock.early))
            continue
        # wait for the next arrival or the phase end, whichever is first
        nxt = events[i][0] if i < len(events) else math.inf
        now = max(now, min(nxt, end))
        while i < len(events) and events[i][0] <= now:
            take(events[i])
            i += 1
    return ph, decisions, ends, refs


@settings(max_examples=400, **COMMON)
@given(calls())
def test_phases_end_exactly_when_the_rules_say(call):
    N, r, nch, params, events = call
    ph, decisions, ends, refs = drive(N, r, nch, params, events)
    # every chunk accepted once, and only while it could count
    accepted = [(k, o, c) for _, k, o, c, v in decisions if v == ACCEPT]
    assert len(accepted) == len(set(accepted))
    for now, k, o, c, v in decisions:
        if k == "s" and v != LATE:
            assert now <= ends[SCATTER]
        if v == DUP:
            assert (k, o, c) in accepted
    # what is left to resolve: exactly the chunks that never arrived in time
    for o in range(N):
        if o == r:
            assert ph.bgot[o].all() and ph.got[o].all()
            continue
        got_b = {c for k, s, c in accepted if k == "b" and s == o}
        assert set(np.flatnonzero(ph.bgot[o])) == got_b
        got_s = {c for k, s, c in accepted if k == "s" and s == o}
        assert set(np.flatnonzero(ph.got[o])) == got_s
    # a phase with everything in ends at its last needed arrival; one that misses data
    # never ends before every missing sender's deadline (or early timeout)
    recv_s, recv_b = ph.received()
    exp_s, exp_b = ph.expected()
    if recv_s == exp_s:
        last = max((t for log in refs[SCATTER].log for t, _ in log), default=0.0)
        assert ends[SCATTER] == last
    else:
        for s, log in enumerate(refs[SCATTER].log):
            if len(log) < ph.s_need[s]:
                floor = (log[0][0] if log else math.inf)
                assert ends[SCATTER] >= min(floor + params[2], params[0])


@settings(max_examples=200, **COMMON)
@given(calls())
def test_same_inputs_same_decisions(call):
    a = drive(*call)
    b = drive(*call)
    assert a[1] == b[1] and a[2] == b[2]
    assert (a[0].got == b[0].got).all()
    assert all((x == y).all() for x, y in zip(a[0].bgot, b[0].bgot))


def test_early_timeout_cuts_the_last_percentile():
    """One sender of 100 chunks, tail 2%: the 98th chunk and a tail chunk in, the phase
    ends ``early`` later, not at the deadline."""
    ph = TarPhases(0, [100, 0], 1.0, 1.0, 0.003, 0.003, 2.0)
    ph.start(0.0)
    for c in range(97):
        assert ph.on_scatter(1, c, False, 0.001) == ACCEPT
    assert ph.end() == 1.001                  # the deadline, from the first datagram
    assert ph.on_scatter(1, 99, True, 0.002) == ACCEPT
    assert ph.end() == 0.002 + 0.003 and ph.scatter.early
    assert ph.on_scatter(1, 99, True, 0.0025) == DUP
    assert not ph.due(0.0049) and ph.due(0.005)
    ph.end_scatter(0.005)
    assert ph.on_scatter(1, 98, False, 0.006) == LATE


def test_early_timeout_fires_for_a_five_datagram_phase():
    """Issue 18: with a fixed 2% allowance a sender of fewer than 50 datagrams had no
    early timeout (the phase waited for the deadline). Now one datagram of five may be
    missing: the tail-marked last one in, four of five in, the phase ends ``early``
    later."""
    ph = TarPhases(0, [5, 0], 1.0, 1.0, 0.003, 0.003, 2.0)
    ph.start(0.0)
    for c in (0, 1, 2):
        assert ph.on_scatter(1, c, False, 0.001) == ACCEPT
    assert ph.end() == 1.001                     # three of five: the deadline
    assert ph.on_scatter(1, 4, True, 0.002) == ACCEPT    # the tail one; chunk 3 is lost
    assert ph.end() == 0.002 + 0.003 and ph.scatter.early
    ph.end_scatter(0.005)
    assert not ph.got[1, 3]


def test_early_timeout_waits_for_the_tail_marked_datagram():
    ph = TarPhases(0, [5, 0], 1.0, 1.0, 0.003, 0.003, 2.0)
    ph.start(0.0)
    for c in (0, 1, 2, 3):                       # four of five, but not the tail one
        ph.on_scatter(1, c, False, 0.001)
    assert ph.end() == 1.001 and not ph.scatter.early


def test_ranks_agree_on_the_median_of_the_carried_estimates():
    """Three ranks with their own scatter deadlines 10, 40 and 20 ms: each one's
    datagrams carry its estimate, and every rank that heard the others uses the median,
    20 ms, whatever its own was; a missing sender then gets 20 ms from its first
    datagram on every rank."""
    own = [0.010, 0.040, 0.020]
    phases = [TarPhases(r, [2, 2, 2], own[r], 1.0, 0.001, 0.001, 2.0) for r in range(3)]
    for r, ph in enumerate(phases):
        ph.start(0.0)
        assert ph.scatter.deadline == own[r]    # before it hears anyone: its own
        for s in range(3):
            if s != r:
                ph.on_scatter(s, 0, False, 0.001, proposal=own[s])
        assert ph.scatter.deadline == 0.020
        assert ph.end() == 0.001 + 0.020
    # one far-off estimate does not move the median beyond the others
    ph = TarPhases(0, [1] * 5, 0.010, 1.0, 0.001, 0.001, 2.0)
    ph.start(0.0)
    for s, p in zip((1, 2, 3, 4), (0.011, 0.012, 5.0, 0.009)):
        ph.on_scatter(s, 0, False, 0.0, proposal=p)
    assert ph.scatter.deadline == 0.011


def test_straggler_hold_bound():
    """A straggler heard only 2.5 deadlines after the phase start would hold the phase
    until its own deadline (3.5); one never heard from until deadline + skew. With
    ``hold=3`` neither holds it past 3 deadlines, and the phase says it was ``held``."""
    D = 0.010
    free = TarPhases(0, [4, 0, 0], D, D, 0.001, 0.001, 2.0)
    held = TarPhases(0, [4, 0, 0], D, D, 0.001, 0.001, 2.0, hold=3.0)
    for ph in (free, held):
        ph.start(0.0)
        for c in range(4):
            ph.on_scatter(1, c, c == 3, 0.001)           # rank 1 on time, complete
    # rank 2 never heard: D + skew (2 x both deadlines) unbound, 3 D with the bound
    assert free.end() == 0.05 and held.end() == 0.03 and held.scatter.held
    for ph in (free, held):
        ph.on_scatter(2, 0, False, 2.5 * D)            # the straggler starts, late
    assert free.end() == 2.5 * D + D and not free.scatter.held
    assert held.end() == 3 * D and held.scatter.held and not held.scatter.early
    assert not held.due(0.0299) and held.due(0.03)
    held.end_scatter(0.03)
    assert held.counts().tolist() == [3, 2, 2, 2]   # the rest of rank 2 counted missing
