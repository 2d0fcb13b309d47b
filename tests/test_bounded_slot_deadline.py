"""The derived slot deadline of bounded mode (``host.deadline``).

The scenario of issue 18's run 3, without the lab: four workers, each behind its own
10 Mbit/s link (both ways, a 20 ms tail-drop queue as the lab's tbf), jumbo datagrams
(2,048 elements), a digits-sized bucket (38,282 floats: 19 chunks, call window 8), and
UDP at 9 Mbit/s, 150 ms on / 350 ms off, into worker 0's downlink (the lab's ``mild``
level). The windows, the client's timers and the switch are the real state machines
(``SendWindow``, ``AllreduceCall``, ``SwitchModel``) on a fake clock
(``test_window_machine.Sim``); only the links are modelled here.

Thirty calls. With the fixed 20 ms deadline of run 3, worker 0 loses RESULTs in the flood,
the slots of its chain close without it, the others run 2W sequence numbers ahead and
its result is gone: it fails (AllreduceTooLate), as every rank did on the lab (seeds 1-5
all fail, after 7-18 calls). With the derived deadline (291 ms here) every call completes
on every worker with bitwise-identical results (seeds 1-5).
"""

import heapq
import math

import numpy as np
import pytest

from ina_fabric.host.deadline import (slot_deadline, datagram_seconds,
                                                     short_deadline, choose_deadline,
                                                     SHORT_MARGIN)
from ina_fabric.host.transport.window import WindowConfig, PEAK_FACTOR
from ina_fabric.protocol.fields import HEADER_BYTES, MsgType, GROUP_WORKER

import test_window_machine
from test_window_machine import Sim, SWITCH, addr

RATE = 10e6
QUEUE = 0.020
E = 2048
PAYLOAD = HEADER_BYTES + 4 * E


class LinkNet:
    """Per worker one link each way at ``rate`` with a tail-drop queue of ``queue``
    seconds (a datagram that would wait longer is dropped, as tbf drops it), a fixed
    propagation delay, and a flood of 1,500-byte packets at ``flood_rate`` during the on
    periods into worker 0's downlink (they take the link and the queue, and are not
    delivered). The same interface as ``test_window_machine.Net``."""

    def __init__(self, rate=RATE, queue=QUEUE, flood_rate=9e6, on=0.150, off=0.350,
                 prop=0.0002, paced=False):
        self.rate, self.queue, self.prop, self.paced = rate, queue, prop, paced
        self.flood_rate, self.on, self.off = flood_rate, on, off
        self.free = {}           # link -> the time its queue is empty
        self.heap, self.k = [], 0
        self.flood_t = 0.0       # the next flood packet
        self.dropped = {}        # link -> our datagrams dropped in its queue
        self.dropped_results = {}  # link -> of those, group RESULTs (not re-served copies)

    def _flood(self, now):
        key = ("down", addr(0))
        gap = 1500 * 8 / self.flood_rate
        period = self.on + self.off
        while self.flood_t <= now:
            t = self.flood_t
            if (t % period) < self.on:
                free = max(self.free.get(key, 0.0), t)
                if free - t <= self.queue:
                    self.free[key] = free + (1500 + 46) * 8 / self.rate
                self.flood_t += gap
            else:
                self.flood_t = (t // period + 1) * period

    def send(self, now, src, dst, data):
        key = ("up", src) if dst == SWITCH else ("down", dst)
        if key == ("down", addr(0)) and self.flood_rate:
            self._flood(now)
        free = max(self.free.get(key, 0.0), now)
        # paced (SwitchClient.pace_rate): the sender holds a datagram until the link
        # has room, so its own uplink queue never overflows
        if free - now > self.queue and not (self.paced and key[0] == "up"):
            self.dropped[key] = self.dropped.get(key, 0) + 1
            if len(data) > 6 and data[1] == MsgType.RESULT and data[6] == GROUP_WORKER:
                self.dropped_results[key] = self.dropped_results.get(key, 0) + 1
            return
        self.free[key] = free + datagram_seconds(len(data), self.rate)
        self.k += 1
        heapq.heappush(self.heap, (self.free[key] + self.prop, self.k, 0, src, dst, data))

    def next_time(self):
        return self.heap[0][0] if self.heap else None

    def pop(self):
        t, _, _, src, dst, data = heapq.heappop(self.heap)
        return t, src, dst, data


class Worker(test_window_machine.Worker):
    """A worker that computes between calls: its next call starts a draw of
    ``compute`` (median 40 ms, lognormal, seeded per worker and call) after the last
    one ended, so the workers start each call at different times, as DDP ranks do."""

    def next_call(self, now):
        if getattr(self, "_starting", False) or self.k < 0:
            self._starting = False
            self.pending = None
            return super().next_call(now)
        rng = np.random.default_rng([self.sim.seed, self.i, self.k])
        self.pending = now + 0.04 * float(np.exp(0.5 * rng.standard_normal()))
        self.win = None

    def start_pending(self):
        self._starting = True
        self.next_call(self.pending)


class ComputeSim(Sim):
    """``Sim`` with workers that compute between calls (``Worker`` above)."""

    def __init__(self, *a, seed=1, **kw):
        super().__init__(*a, **kw)
        self.seed = seed
        self.workers = [Worker(wk.i, wk.n, wk.inputs, wk.E, wk.w, wk.cfg, self,
                               wk.too_late_raises) for wk in self.workers]
        for wk in self.workers:
            wk.pending = None


def run(deadline, calls=30, n=4, seed=1, window=8, flood_rate=9e6, paced=False):
    rng = np.random.default_rng(seed)
    inputs = [[rng.standard_normal(38_282).astype(np.float32) for _ in range(calls)]
              for _ in range(n)]
    cfg = WindowConfig("bounded", rto=0.02, min_rto=0.01, deadline=deadline,
                       connect_timeout=1e9)
    sim = ComputeSim(n, inputs, E, window, 64, cfg, [], too_late_raises=True, seed=seed)
    sim.net = LinkNet(flood_rate=flood_rate, paced=paced)
    return sim.run()


def test_rule_on_the_lab_links():
    t = datagram_seconds(PAYLOAD, RATE)
    assert t == pytest.approx((8220 + 46) * 8 / 1e7)
    # one call window on the wire, plus two of the timeouts a full window gives
    assert slot_deadline(8, PAYLOAD, RATE) == pytest.approx(8 * t + 2 * PEAK_FACTOR * 9 * t)
    assert 0.25 < slot_deadline(8, PAYLOAD, RATE) < 0.35          # 10 Mbit/s: ~290 ms
    assert 0.02 < slot_deadline(8, PAYLOAD, 100e6) < 0.035        # 100 Mbit/s: ~29 ms
    # a measured timeout above the link's raises it; nothing known: the floor
    assert slot_deadline(8, PAYLOAD, RATE, rto=0.3) == pytest.approx(8 * t + 0.6)
    assert slot_deadline(8, PAYLOAD) == 0.005
    assert slot_deadline(8, PAYLOAD, rto=0.03) == pytest.approx(0.06)
    assert slot_deadline(64, PAYLOAD, RATE) == 1.0                # the cap


@pytest.mark.parametrize("seed", [1, 3])
def test_fixed_20ms_deadline_fails_under_a_flooded_downlink(seed):
    sim = run(0.020, seed=seed)
    failed = [wk for wk in sim.workers if wk.failed]
    assert failed and all(wk.failed[0] == "too_late" for wk in failed)
    assert sim.net.dropped.get(("down", addr(0)), 0) > 0


@pytest.mark.parametrize("seed", [1, 3])
def test_derived_deadline_completes_with_identical_replicas(seed):
    d = slot_deadline(8, PAYLOAD, RATE)
    sim = run(d, seed=seed)
    assert sim.net.dropped.get(("down", addr(0)), 0) > 0       # RESULTs were lost
    for wk in sim.workers:
        assert wk.failed is None and len(wk.outs) == 30
    for k in range(30):
        for wk in sim.workers[1:]:
            np.testing.assert_array_equal(wk.outs[k], sim.workers[0].outs[k])
    assert sum(s.retransmits for s in sim.workers[0].stats) > 0


def test_loss_aware_rule_on_the_lab_links():
    """The short deadline is one call window on the wire plus one more (at least
    SHORT_MARGIN); the loss-aware rule takes it only after a clean exchange."""
    t = datagram_seconds(PAYLOAD, RATE)
    assert short_deadline(8, PAYLOAD, RATE) == pytest.approx(16 * t)          # ~106 ms
    assert short_deadline(8, PAYLOAD, 100e6) == pytest.approx(0.8 * t + SHORT_MARGIN)
    derived = slot_deadline(8, PAYLOAD, RATE, rto=0.2)
    assert choose_deadline("derived", 8, PAYLOAD, RATE, 0.2, clean_intervals=5) == derived
    assert choose_deadline("loss-aware", 8, PAYLOAD, RATE, 0.2, clean_intervals=0) == derived
    assert choose_deadline("loss-aware", 8, PAYLOAD, RATE, 0.2, clean_intervals=1) == \
        pytest.approx(16 * t)
    with pytest.raises(ValueError, match="unknown slot-deadline rule 'short'"):
        choose_deadline("short", 8, PAYLOAD, RATE)


def test_a_result_lost_in_the_flood_is_counted_as_refetched():
    """The loss-aware rule's signal: a worker whose group RESULT was dropped on its
    downlink gets it re-served (unicast, RETRANSMIT) and counts it; workers whose
    downlinks lost no group RESULT count none. (Only the group's RESULTs: a unicast copy
    re-served to a worker that had its result by then loses nothing; with congestion
    control's re-send order, workers 2 and 3 lose two such copies each at seed 1.)"""
    sim = run(short_deadline(8, PAYLOAD, RATE), seed=1)
    down = {w: sim.net.dropped_results.get(("down", addr(w)), 0) for w in range(4)}
    refetched = [sum(s.refetched for s in wk.stats) for wk in sim.workers]
    assert down[0] > 0 and 0 < refetched[0] <= down[0]
    for w in range(1, 4):
        assert (refetched[w] == 0) == (down[w] == 0), (w, down, refetched)
    for wk in sim.workers:          # and at the short deadline every call completed
        assert wk.failed is None and len(wk.outs) == 30


class _FakeClient:
    """What ``InaHookState``'s deadline tuning reads of a ``SwitchClient``."""
    elements, deadline = E, None

    class _rtt:
        srtt = 0.0
        cwnd, cuts = 8.0, 0          # what the hook reports of congestion control

    @staticmethod
    def call_window(packets):
        return min(packets, 8)


class _OnePeer:
    rank, world = 0, 1

    def allreduce(self, v):
        pass


def test_the_hook_moves_to_the_short_deadline_after_a_clean_exchange_and_back():
    from ina_fabric.host.ddp.hook import InaHookState
    from ina_fabric.host.deadline import SlotDeadlineTuner
    st = InaHookState(_FakeClient(), None, peers=_OnePeer())
    st.tuner = SlotDeadlineTuner("loss-aware", RATE)
    size = 38_282
    st.tune_deadline(size)
    assert st.collective.deadline == pytest.approx(slot_deadline(8, PAYLOAD, RATE))
    st.agree_rto()                           # a clean interval
    st.tune_deadline(size)
    assert st.collective.deadline == pytest.approx(short_deadline(8, PAYLOAD, RATE))
    st.stats.refetched += 2                  # a RESULT was re-fetched
    st.agree_rto()
    assert st.tuner.clean_intervals == 0 and st.extra_stats["refetched_results"] == 2
    st.tune_deadline(size)
    assert st.collective.deadline == pytest.approx(slot_deadline(8, PAYLOAD, RATE))
    st.close(remove=False)


def test_the_ranks_exchange_after_calls_4_and_8_then_every_16():
    """A clean link is known after 4 calls (the short deadline in force from the 5th),
    not after 16; then the exchanges come every RETUNE_CALLS calls."""
    from ina_fabric.host.ddp.hook import InaHookState
    from ina_fabric.host.transport.switch_client import AllreduceStats

    class Client(_FakeClient):
        def allreduce(self, arr, out=None):
            return arr, AllreduceStats()

    from ina_fabric.host.deadline import SlotDeadlineTuner
    st = InaHookState(Client(), None, peers=_OnePeer())
    st.tuner = SlotDeadlineTuner("loss-aware", RATE)
    at = []

    class Spy(InaHookState):        # __slots__: the exchange is spied on in a subclass
        __slots__ = ()

        def agree_rto(self):
            at.append(self.tuner.calls)
    st.__class__ = Spy
    for _ in range(48):
        st.reduce_array(np.zeros(38_282, np.float32))
    assert at == [4, 8, 16, 32, 48]
    st.close(remove=False)
