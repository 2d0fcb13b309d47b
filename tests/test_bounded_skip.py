"""Mode ``bounded-skip``: a straggler holds a job for one slot deadline, not one per
window of slots (issue 18, run 7; the semantics in ``host/switch/model.py``).

By hand on the reference model (the C engine is held to the model by
``test_switch_engine``'s random traffic, which draws this mode too), then end to end:
real UDP sockets, the compiled switch, three ``SwitchClient`` workers (the C loop and the
Python loop), one of them sleeping before every call as a compute straggler does.
"""

import threading

import numpy as np
import pytest

from ina_fabric.host.switch.model import SwitchModel
from ina_fabric.protocol.fields import Flags, HEADER_BYTES
from ina_fabric.protocol.jobtable import JobConfig, ConfigError
from ina_fabric.protocol.numpy_view import pack, unpack

ADDR = [("127.0.0.1", 7100 + w) for w in range(3)]


def job(mode, deadline=0.1, window=2):
    return JobConfig(1, tuple(f"{a}:{p}" for a, p in ADDR), window=window, elements=4,
                     deadline=deadline, mode=mode, session=5)


def data(w, seq, v=None):
    return pack(np.full(4, w + 1 if v is None else v, np.int64), job=1, worker=w, seq=seq,
                session=5)


def results(out):
    """[(seq, bitmap, partial)] of the group RESULTs in ``out`` (one per slot)."""
    seen = {}
    for _, d in out:
        h, _ = unpack(d)
        seen.setdefault(int(h["seq"]), (int(h["bitmap"]), bool(h["flags"] & Flags.PARTIAL)))
    return sorted((s, b, p) for s, (b, p) in seen.items())


def test_a_straggler_is_skipped_after_one_deadline_and_waited_for_once_it_is_back():
    m = SwitchModel([job("bounded-skip")])
    for s in (0, 1):                               # workers 0 and 1; 2 is late
        for w in (0, 1):
            assert m.process(data(w, s), ADDR[w], 0.01 * s) == []
    assert m.status()["jobs"][1]["absent"] == []
    # slot 0's deadline: it closes without 2, and slot 1 (deadline 0.11) with it
    out = m.tick(0.1)
    assert results(out) == [(0, 0b011, True), (1, 0b011, True)]
    assert m.counters["skipped"] == 1
    assert m.status()["jobs"][1]["absent"] == [2]
    # the next slots close as soon as 0 and 1 are in, long before their deadline
    assert m.process(data(0, 2), ADDR[0], 0.11) == []
    out = m.process(data(1, 2), ADDR[1], 0.12)
    assert results(out) == [(2, 0b011, True)]
    assert m.counters["skipped"] == 2 and m.counters["partials"] == 3
    # worker 2 comes back: its late DATA is answered from the stored result; its DATA
    # for slot 0 missed that slot's deadline (0.1) by far: still a deadline behind, so
    # still absent
    out = m.process(data(2, 0), ADDR[2], 0.2)
    assert len(out) == 1 and out[0][0] == ADDR[2]
    assert unpack(out[0][1])[0]["flags"] & Flags.RETRANSMIT
    assert m.status()["jobs"][1]["absent"] == [2]
    # its DATA for slot 2 (opened at 0.11) came before that slot's deadline: it would
    # have been in the sum in plain bounded mode, so the job waits for it again
    out = m.process(data(2, 2), ADDR[2], 0.205)
    assert len(out) == 1 and out[0][0] == ADDR[2]
    assert m.status()["jobs"][1]["absent"] == []
    assert m.process(data(0, 3), ADDR[0], 0.21) == []
    assert m.process(data(1, 3), ADDR[1], 0.21) == []       # no longer enough
    out = m.process(data(2, 3), ADDR[2], 0.22)
    assert results(out) == [(3, 0b111, False)]
    assert m.counters["skipped"] == 2


def test_late_data_within_a_deadline_of_the_skip_does_not_re_admit_the_worker():
    """The hold-off (run 40): a worker behind a flooded uplink delivers DATA a queue's
    delay late. That DATA is answered, but for one deadline after the skip it does not
    make the next slots wait for the worker again; a contribution in time does, and so
    does late DATA once the deadline has passed, if it came before its own slot's
    deadline (late DATA that missed it does not: the worker is still behind)."""
    for engine in _engines():
        m = engine([job("bounded-skip")])
        m.process(data(0, 0), ADDR[0], 0.0)
        m.process(data(1, 0), ADDR[1], 0.0)
        m.tick(0.1)                                   # slot 0 closes without worker 2
        assert m.status()["jobs"][1]["absent"] == [2]
        out = m.process(data(2, 0), ADDR[2], 0.12)    # late: answered, still absent
        assert len(out) == 1 and out[0][0] == ADDR[2]
        assert m.status()["jobs"][1]["absent"] == [2]
        m.process(data(0, 1), ADDR[0], 0.13)
        assert results(m.process(data(1, 1), ADDR[1], 0.13)) == [(1, 0b011, True)]
        # a contribution in time (it joins open slot 2): waited for again at once
        m.process(data(0, 2), ADDR[0], 0.14)
        m.process(data(2, 2), ADDR[2], 0.14)
        assert m.status()["jobs"][1]["absent"] == []
        assert results(m.process(data(1, 2), ADDR[1], 0.15)) == [(2, 0b111, False)]
        # absent again (at 0.31); slot 4 opens at 0.4 and closes without it
        m.process(data(0, 3), ADDR[0], 0.2)
        m.process(data(1, 3), ADDR[1], 0.2)
        m.tick(0.31)
        assert m.status()["jobs"][1]["absent"] == [2]
        m.process(data(0, 4), ADDR[0], 0.4)
        assert results(m.process(data(1, 4), ADDR[1], 0.4)) == [(4, 0b011, True)]
        m.process(data(2, 4), ADDR[2], 0.405)         # late: before the hold-off ends
        assert m.status()["jobs"][1]["absent"] == [2]
        m.process(data(2, 3), ADDR[2], 0.42)          # a deadline on, but slot 3's passed
        assert m.status()["jobs"][1]["absent"] == [2]
        m.process(data(2, 4), ADDR[2], 0.42)          # a deadline on, before slot 4's
        assert m.status()["jobs"][1]["absent"] == []


def _engines():
    """The reference model, and the C engine where it is built (the random traffic of
    ``test_switch_engine`` holds the two together; this names the rule)."""
    from ina_fabric.host.switch import fast
    return [SwitchModel] + ([fast.FastSwitchModel] if fast.available() else [])


def test_open_slots_close_when_a_deadline_makes_their_missing_worker_absent():
    """Slots already open, waiting only for the worker that a deadline just found
    missing, close with that deadline's result, in opening order."""
    m = SwitchModel([job("bounded-skip", window=4)])
    m.process(data(0, 0), ADDR[0], 0.0)
    m.process(data(1, 0), ADDR[1], 0.0)
    for s in (1, 2):
        m.process(data(0, s), ADDR[0], 0.05)
        m.process(data(1, s), ADDR[1], 0.05)
    m.process(data(0, 3), ADDR[0], 0.05)           # only worker 0: stays open
    out = m.tick(0.1)
    assert results(out) == [(0, 0b011, True), (1, 0b011, True), (2, 0b011, True)]
    assert m.counters["skipped"] == 2
    assert m.status()["jobs"][1]["open_slots"] == 1
    out = m.process(data(1, 3), ADDR[1], 0.06)
    assert results(out) == [(3, 0b011, True)]


def test_plain_bounded_waits_a_deadline_for_every_slot():
    m = SwitchModel([job("bounded")])
    for s in (0, 1):
        for w in (0, 1):
            m.process(data(w, s), ADDR[w], 0.0)
    assert len(results(m.tick(0.1))) == 2
    m.process(data(0, 2), ADDR[0], 0.11)
    assert m.process(data(1, 2), ADDR[1], 0.12) == []       # waits for worker 2
    assert len(results(m.tick(0.22))) == 1
    assert m.counters["skipped"] == 0 and "absent" not in m.status()["jobs"][1]


def test_a_live_change_to_another_mode_forgets_the_absent_workers():
    m = SwitchModel([job("bounded-skip")])
    m.process(data(0, 0), ADDR[0], 0.0)
    m.tick(0.1)
    assert m.jobs[1].absent == 0b110
    m.retune(1, mode="bounded")
    assert m.jobs[1].absent == 0


def test_the_mode_crosses_the_wire_and_a_bad_mode_is_refused():
    from ina_fabric.protocol.jobtable import parse_control
    cfg = job("bounded-skip")
    op, back = parse_control(cfg.to_bytes())
    assert op == "install" and back.mode == "bounded-skip" and back == cfg
    with pytest.raises(ConfigError, match="mode 'nope'"):
        job("nope")


def _straggler_run(mode, engine, calls=6, sleep=0.4, deadline=0.06, carry=False,
                   residuals=None):
    """Three clients, window 2, 8 chunks a call (10 packets: 5 window generations), each
    computing 30 ms before a call; worker 2 sleeps ``sleep`` more before calls 1 and 4.
    Returns (outputs, switch counters)."""
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.host.cluster import free_udp_ports
    from test_client_fastpath import _against_switch
    ports = free_udp_ports(3)
    cfg = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=2, elements=64,
                    deadline=deadline, mode=mode, session=77)
    outs, errors = [[] for _ in range(3)], []

    def worker(address, w):
        try:
            with SwitchClient(address, 1, w, 3, 2, 64, mode,
                              bind=("127.0.0.1", ports[w]), deadline=deadline,
                              engine=engine, session=cfg.session, carry=carry) as c:
                for k in range(calls):
                    threading.Event().wait(0.03 + (sleep if w == 2 and k in (1, 4) else 0))
                    x = np.full(512, float(w + 1 + k), np.float32)
                    outs[w].append(c.allreduce(x)[0])
                if residuals is not None:
                    residuals[w] = (c._residual.get(512, np.zeros(512, np.float32)),
                                    c.total.carried_entries)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    _, counters = _against_switch(cfg, worker, range(3), key=None)
    assert not errors, errors
    return outs, counters


@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_sleeping_worker_costs_one_deadline_per_call_not_one_per_window(engine):
    from ina_fabric.host.transport import fastcall
    if engine == "c" and not fastcall.available():
        pytest.skip(fastcall.WHY_NOT or "")
    for mode in ("bounded", "bounded-skip"):
        outs, c = _straggler_run(mode, engine)
        for k in range(6):                          # every replica applies the same sum
            for w in (1, 2):
                assert np.array_equal(outs[w][k], outs[0][k]), (mode, w, k)
        at_deadline = c["partials"] - c["skipped"]
        if mode == "bounded":
            # 5 generations of slots, each waiting a deadline for the sleeper
            assert c["skipped"] == 0 and at_deadline >= 2 * 4, c
            bounded_deadlines = at_deadline
        else:
            assert c["skipped"] > 0 and at_deadline < bounded_deadlines, c
            assert at_deadline <= 4 * 2, c            # about one per call


def test_a_switch_without_the_mode_drops_its_control_as_the_gateware_does():
    """The gateware runs reliable and bounded only; its scoreboard (a model built with
    ``GATEWARE_MODES``) drops a bounded-skip install as malformed, as the core does,
    and refuses one from a job file."""
    from ina_fabric.host.commands.hw_config import control_datagram
    from ina_fabric.protocol.jobtable import GATEWARE_MODES
    key = b"k" * 32
    m = SwitchModel(key=key, modes=GATEWARE_MODES)
    sealed = [control_datagram(job(mode), key) for mode in ("bounded-skip", "bounded")]
    assert m.process(sealed[0], ADDR[0], 0.0) == []
    assert m.counters["drop_malformed"] == 1 and 1 not in m.jobs
    assert m.process(sealed[1], ADDR[0], 0.0) != []
    assert m.jobs[1].cfg.mode == "bounded"
    with pytest.raises(ConfigError, match="not run by this switch"):
        SwitchModel([job("bounded-skip")], modes=GATEWARE_MODES)


@pytest.mark.parametrize("engine", ["c", "python"])
def test_carry_sends_a_left_out_contribution_with_the_next_call(engine):
    """Carry mode: nothing a worker contributes is lost, only delayed. Over the run, the
    sums every replica applied plus what is still carried equal the sum of every
    worker's inputs (up to the 30-bit fixed point), and the partial sums are not
    rescaled."""
    from ina_fabric.host.transport import fastcall
    if engine == "c" and not fastcall.available():
        pytest.skip(fastcall.WHY_NOT or "")
    residuals = {}
    outs, c = _straggler_run("bounded-skip", engine, carry=True, residuals=residuals)
    assert c["partials"] > 0
    for k in range(6):
        for w in (1, 2):
            assert np.array_equal(outs[w][k], outs[0][k]), (w, k)
    applied = np.sum(outs[0], axis=0)
    carried = sum(r for r, _ in residuals.values())
    sent = sum(float(w + 1 + k) for w in range(3) for k in range(6))
    np.testing.assert_allclose(applied + carried, sent, rtol=1e-5)
    assert sum(n for _, n in residuals.values()) > 0         # worker 2 was left out
    # without carry the partial sums are rescaled: the total is not what was sent
    outs, _ = _straggler_run("bounded-skip", engine)
    assert not np.allclose(np.sum(outs[0], axis=0), sent, rtol=1e-3)


def test_carry_needs_a_bounded_mode():
    from ina_fabric.host.transport import SwitchClient
    with pytest.raises(ValueError, match="only in a bounded mode"):
        SwitchClient(("127.0.0.1", 9), 1, 0, 2, carry=True, session=1)


def test_a_worker_late_by_more_than_its_receive_buffer_still_gets_every_result():
    """Issue 18, the transformer on the lab: in a bounded mode the others' slots close
    without a worker that is still computing, and every RESULT of the call waits in its
    socket until it starts. 4 MiB (``rmem_max``) held about 0.3 s of them at 100 Mbit/s;
    past that the kernel dropped the rest, the slots were reused by the time the worker
    asked again, and the job failed with AllreduceTooLate. Now the client's buffers are
    sized past ``rmem_max`` (``sockbuf``) and a worker 0.6 s late with 5 MB of RESULTs
    queued applies the same sums as the others."""
    import socket
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.host.transport.sockbuf import size_buffers
    from ina_fabric.host.cluster import free_udp_ports
    from test_client_fastpath import _against_switch
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if size_buffers(probe, 64 << 20) < 64 << 20:
        probe.close()
        pytest.skip("cannot size a socket buffer past rmem_max here (no CAP_NET_ADMIN)")
    probe.close()
    n, N, calls = 1_300_000, 3, 3
    ports = free_udp_ports(N)
    cfg = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=32, elements=2048,
                    deadline=0.02, mode="bounded", session=78)
    outs, errors = [[] for _ in range(N)], []

    def worker(address, w):
        try:
            with SwitchClient(address, 1, w, N, 32, 2048, "bounded",
                              bind=("127.0.0.1", ports[w]), deadline=0.02,
                              session=cfg.session, pace_rate=400e6) as c:
                for k in range(calls):
                    threading.Event().wait(0.6 if (w == 2 and k == 1) else 0.02)
                    outs[w].append(c.allreduce(np.full(n, w + 1.0, np.float32))[0])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    _, counters = _against_switch(cfg, worker, range(N), key=None)
    assert not errors, errors
    assert counters["partials"] > 0, counters      # the late worker's slots closed without it
    for k in range(calls):
        for w in (1, 2):
            assert np.array_equal(outs[w][k], outs[0][k]), (w, k)


def test_socket_drops_counts_what_a_full_receive_buffer_dropped():
    import socket
    from ina_fabric.host.transport.sockbuf import socket_drops
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    assert socket_drops(rx) == 0
    for _ in range(200):
        tx.sendto(b"x" * 8000, rx.getsockname())
    assert socket_drops(rx) > 0
    rx.close()
    tx.close()


def _lab_call_times(engine, late_s, deadline, calls=2):
    """The one-rack straggler of ``ina bench fabric`` on a fake clock: 4 workers, each
    behind its own 100 Mbit/s link both ways (50 ms tail-drop queues, as the lab's tbf),
    1 MB calls of 2,048-element datagrams, call window 64, job window 256, bounded-skip;
    a barrier before every call, and worker 1 starts the odd calls ``late_s`` late. The
    windows, timers and the switch are the real state machines (``SendWindow``,
    ``AllreduceCall``, the engine); RESULTs that arrive between calls wait in the
    worker's socket, as a real one's do. Returns per call the slowest of the other
    workers' times."""
    import test_window_machine as TW
    from test_bounded_slot_deadline import LinkNet
    from ina_fabric.host.transport.window import WindowConfig
    N, E, w, n = 4, 2048, 64, (1 << 20) // 4

    class Worker(TW.Worker):
        def next_call(self, now):
            if self.go:                           # the barrier released this worker
                self.go = False
                return super().next_call(now)
            self.ended.append(now)                # done: wait at the barrier
            self.call = self.win = None

    rng = np.random.default_rng(1)
    inputs = [[rng.standard_normal(n).astype(np.float32) for _ in range(calls)]
              for _ in range(N)]
    cfg = WindowConfig("bounded", rto=0.02, min_rto=0.01, deadline=deadline,
                       connect_timeout=1e9)
    sim = TW.Sim(N, inputs, E, w, 256, cfg, [], max_events=10 ** 7)
    sim.model = engine([JobConfig(TW.JOB, tuple("%s:%d" % TW.addr(i) for i in range(N)),
                                  window=256, elements=E, deadline=deadline,
                                  mode="bounded-skip", session=TW.SESSION)])
    sim.net = LinkNet(rate=100e6, queue=0.050, flood_rate=0, prop=0.0002)
    sim.workers = ws = [Worker(i, N, inputs[i], E, w, cfg, sim) for i in range(N)]
    for wk in ws:
        wk.go, wk.ended, wk.pending, wk.inbox = False, [], None, []
    by_addr = {TW.addr(i): wk for i, wk in enumerate(ws)}
    now, k = 0.0, -1
    while True:
        if all(wk.win is None and wk.pending is None for wk in ws):
            k += 1                                 # everyone at the barrier
            if k == calls:
                break
            for wk in ws:
                wk.pending = now + (late_s if k % 2 and wk.i == 1 else 0.0)
        cands = [(t, what, wk) for t, what, wk in
                 [(sim.net.next_time(), 0, None), (sim.model.next_deadline(), 1, None)]
                 + [(wk.win.next_wakeup(), 2, wk) if wk.win else (wk.pending, 3, wk)
                    for wk in ws] if t is not None]
        t, what, wk = min(cands, key=lambda c: (c[0], c[1]))
        now = max(now, t)
        if what == 0:
            _, src, dst, data = sim.net.pop()
            if dst == TW.SWITCH:
                sim.route(sim.model.process(data, src, now), now)
            elif by_addr[dst].win is not None:
                by_addr[dst].receive(data, now)
            else:
                by_addr[dst].inbox.append(data)   # waits in its socket
        elif what == 1:
            sim.route(sim.model.tick(now), now)
        elif what == 2:
            wk.timer(now)
        else:
            wk.pending, wk.go = None, True
            wk.next_call(now)
            inbox, wk.inbox = wk.inbox, []
            for data in inbox:
                if wk.win is not None:
                    wk.receive(data, now)
    for wk in ws[1:]:
        for c in range(1, calls):
            assert np.array_equal(wk.outs[c], ws[0].outs[c])
    return [max(wk.ended[c] - wk.started[c] for wk in ws if wk.i != 1)
            for c in range(calls)]


@pytest.mark.parametrize("engine", _engines(), ids=lambda e: e.__name__)
def test_a_straggler_two_deadlines_late_costs_the_others_one_deadline(engine):
    """The lab's one-rack straggler (``ina bench fabric --straggler-ms 60 --deadline-ms
    20``), deterministic. Worker 1 starts 60 ms late: slot deadlines skip it after 20 ms
    and the others go on. It then catches up, sending DATA for slots that closed without
    it. Before, any of that DATA (a deadline after the skip) made the job wait for it
    again while it was still more than a deadline behind: the next slots waited a whole
    deadline for it, it was skipped again, re-admitted again: 40 ms a call, two
    deadlines. Now only DATA that came before its slot's deadline re-admits it."""
    base, late = _lab_call_times(engine, 0.060, 0.020)
    assert late - base <= 0.020 + 0.001, (base, late)
