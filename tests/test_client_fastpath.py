"""The compiled worker call (``host/transport/_client.c``) against its Python definitions:
the window (``window.SendWindow``) event for event, the element kernels
(``quantize._exponents``, ``_pack``, ``_dequant``) bit for bit on both the AVX2 and the
portable path, and whole allreduce calls through a real switch (the same bits as the
Python loop, the same errors)."""

import time

import numpy as np
import pytest

from conftest import run_threads
from ina_fabric.host.transport import fastcall, quantize as Q
from ina_fabric.host.transport.window import SendWindow, WindowConfig, RttEstimator

needs_c = pytest.mark.skipif(not fastcall.available(), reason=fastcall.WHY_NOT or "")


def _state(win):
    return (win.remaining, win.inflight, win.next_wakeup(), win.rto(), win.timeout(),
            win.limit(), win.coalesce())


@needs_c
@pytest.mark.parametrize("seed", range(40))
def test_c_window_takes_the_same_actions_as_send_window(seed):
    """Random event sequences (results in any order, duplicates, results for packets not
    sent yet, timers early and late, long stalls, sends the host's queue refused) to
    both windows; every action list
    and the timers after every event must be equal, and so must the congestion window
    (``RttEstimator``'s fields, ``limit()``), in every congestion mode (aimd, delay,
    off by turns)."""
    rng = np.random.default_rng(seed)
    mode = "bounded" if seed % 2 else "reliable"
    cfg = WindowConfig(mode, rto=0.02, min_rto=0.01, deadline=float(rng.choice([0.002, 0.01])),
                       connect_timeout=0.5, stall_timeout=float(rng.choice([0.3, 2.0])),
                       start_wait=float(rng.choice([0.0, 0.05])),
                       congestion=("aimd", "delay", "off")[seed % 3])
    r1, r2 = RttEstimator(), RttEstimator()
    now = 0.0
    for call in range(3):
        P, W = int(rng.integers(1, 100)), int(2 ** rng.integers(0, 7))
        py, c = SendWindow(P, W, cfg, r1), fastcall.CSendWindow(P, W, cfg, r2)
        a = py.start(now)
        assert a == c.start(now)
        sent = {x.p for x in a}
        # some packets' results are lost for good (re-sends back off to the limit)
        lost = set(rng.choice(P, size=int(rng.integers(0, 3)), replace=False).tolist())
        for step in range(400):
            if py.done:
                break
            now += float(rng.choice([0.0, 1e-4, 2e-3, 0.02, 0.3], p=[.2, .4, .25, .1, .05]))
            if rng.random() < 0.7:
                pool = sorted(sent - lost) if sent - lost and rng.random() < 0.9 \
                    else range(P)
                p = int(rng.choice(list(pool)))
                cg = bool(rng.random() < 0.15)        # the switch's CONGESTED flag
                a, b = py.on_result(p, now, cg), c.on_result(p, now, cg)
            elif rng.random() < 0.8:
                a, b = py.on_timer(now), c.on_timer(now)
            else:                        # this host's own queue refused a send
                a, b = py.on_local_congestion(now), c.on_local_congestion(now)
            assert a == b, (seed, call, step)
            sent |= {x.p for x in a if type(x).__name__ == "Send"}
            assert _state(py) == _state(c), (seed, call, step)
            assert vars(r1) == vars(r2)
            if any(type(x).__name__ == "Fail" for x in a):
                break


@needs_c
@pytest.mark.parametrize("seed", range(8))
def test_c_window_waits_for_a_batch_as_send_window_does(seed):
    """A long call whose RESULTs stream back in order, tens of microseconds apart, with a
    queue that builds and drains (the round trips a window standing in a fast link's
    queue gives), some lost: ``coalesce()`` of both windows after every event is equal,
    and it is above 0 at times (the differential test above seldom has 16 in flight
    with results that close together)."""
    rng = np.random.default_rng(100 + seed)
    cfg = WindowConfig("reliable", rto=0.02, min_rto=0.01, connect_timeout=0.5,
                       stall_timeout=2.0, start_wait=0.0,
                       congestion=("aimd", "delay", "off")[seed % 3])
    r1, r2 = RttEstimator(), RttEstimator()
    P, W = 600, 64
    py, c = SendWindow(P, W, cfg, r1), fastcall.CSendWindow(P, W, cfg, r2)
    assert py.start(0.0) == c.start(0.0)
    now, nxt, waits = 0.0, 0, 0
    while not py.done and nxt < P:
        if nxt < 150:                     # an empty queue first: the base round trip
            now += float(rng.choice([1e-5, 2e-5]))
        else:                             # then a queue that builds and drains
            now += float(rng.choice([1e-5, 6e-5, 3e-4, 2e-3], p=[.3, .5, .15, .05]))
        if rng.random() < 0.97:
            p, nxt = nxt, nxt + 1
            if rng.random() < 0.01:
                continue                  # lost: the timer or FAST_RESEND sends it again
            a, b = py.on_result(p, now), c.on_result(p, now)
        else:
            a, b = py.on_timer(now), c.on_timer(now)
        assert a == b
        assert _state(py) == _state(c) and vars(r1) == vars(r2)
        waits += py.coalesce() > 0
    assert waits > 0


@needs_c
@pytest.mark.parametrize("avx2", [True, False])
def test_c_kernels_are_bit_identical_to_quantize(avx2):
    from ina_fabric.host.transport import _client
    was = _client.set_avx2(avx2)
    try:
        rng = np.random.default_rng(1)
        x = (rng.standard_normal(100_003) * rng.choice([1e-3, 1.0, 1e3], 100_003)) \
            .astype(np.float32)
        x[::997] = 0.0
        x[5:9] = [1e-40, -1e-44, 3e38, -3e38]         # subnormals, huge
        for E in (1, 7, 256, 16368):
            k = -(-x.size // E)
            a, b = np.empty(k, np.int8), np.empty(k, np.int8)
            assert Q._exponents(x.view(np.uint32), E, a) == \
                _client.exponents(x, E, b, Q.NO_EXPONENT) == -1
            assert (a == b).all()
        y = x.copy()
        y[50_000] = np.inf
        y[70_000] = np.nan
        a, b = np.zeros(391, np.int8), np.zeros(391, np.int8)
        assert Q._exponents(y.view(np.uint32), 256, a) == \
            _client.exponents(y, 256, b, Q.NO_EXPONENT) == 50_000 // 256
        assert (a == b).all() and a[50_000 // 256] == Q.NONFINITE
        for e, sbits in ((0, 28), (5, 30), (-20, 27), (Q.NO_EXPONENT, 28), (-140, 28),
                         (Q.NONFINITE, 28)):
            for start, count in ((0, 100_003), (3, 1000), (17, 5)):
                o1 = _packs_agree(x, start, count, e, sbits)
                f1 = np.full(count + 3, np.nan, np.float32)
                f2 = f1.copy()
                fac = 2.0 ** (e - sbits) if e not in (Q.NO_EXPONENT, Q.NONFINITE) else 1.0
                Q._dequant(o1, 20, count, fac, f1, 2)
                _client.dequant(o1, 20, count, fac, f2, 2)
                assert np.array_equal(f1, f2, equal_nan=True)
    finally:
        _client.set_avx2(was)


def _packs_agree(x, start, count, e, sbits, what=()):
    """Pack ``x[start:start+count]`` at exponent ``e`` with quantize's definition and
    with the C kernel: the same bytes and the same clipped count. The packed bytes."""
    from ina_fabric.host.transport import _client
    o1 = np.zeros(4 * count + 40, np.uint8)
    o2 = o1.copy()
    c1 = Q._pack(x, start, count, np.int64(e), sbits, o1, 20)
    c2 = _client.pack(x, start, count, e, sbits, o2, 20, Q.NO_EXPONENT, Q.NONFINITE)
    assert c1 == c2 and (o1 == o2).all(), (*what, e, sbits, start, count)
    return o1


@needs_c
@pytest.mark.parametrize("avx2", [True, False])
def test_c_kernels_float32_steps_keep_the_float64_bits(avx2):
    """The AVX2 kernels take float32 steps where float32 gives float64's bits (a scale
    or factor 2^k with k in range, nothing at or past 2^31): at and past the edges of
    those ranges, at the clamp, at rounding ties and with NaN, the bits and the clipped
    counts are quantize's (the float64 definition)."""
    from ina_fabric.host.transport import _client
    was = _client.set_avx2(avx2)
    try:
        rng = np.random.default_rng(7)
        sbits = 28
        for k in (-128, -127, -126, -125, -60, 0, 3, 60, 126, 127, 128, 150):
            e = sbits - k                     # scale 2^k: most values land near 2^26
            top = np.float32(2.0 ** (31 - k)) if -149 <= 31 - k <= 127 else np.float32(1)
            mag = 2.0 ** np.clip(sbits - 2 - k + rng.integers(-40, 1, 4099), -149, 125)
            x = (rng.standard_normal(4099) * mag).astype(np.float32)
            if -100 < k < 100:                # ties: odd multiples of one half
                x[::7] = (rng.integers(-2 ** 20, 2 ** 20, x[::7].size) + 0.5) * 2.0 ** -k
            x[::11] = np.float32(1e-45) * rng.choice([-1, 1], x[::11].size)
            for case in ("inside", "edge", "huge"):
                y = x.copy()
                if case == "edge":              # at and just below 2^31 after scaling
                    y[100:104] = [top, -top, np.nextafter(top, np.float32(0)),
                                  -np.nextafter(top, np.float32(0))]
                elif case == "huge":
                    y[4000] = np.float32(3e38)
                for start, count in ((0, 4099), (1, 8), (97, 13), (9, 4090)):
                    _packs_agree(y, start, count, e, sbits, (k, case))
        if avx2:    # NaN (outside quantize's contract): the AVX2 float64 form's answer,
            y = x.copy()                        # which clamps it as it does -3e38
            y[3] = np.nan
            z = y.copy()
            z[3] = np.float32(-3e38)
            o1, o2 = np.zeros(4 * 4099, np.uint8), np.zeros(4 * 4099, np.uint8)
            assert Q._pack(z, 0, 4099, np.int64(10), sbits, o1, 0) == \
                _client.pack(y, 0, 4099, 10, sbits, o2, 0, Q.NO_EXPONENT, Q.NONFINITE)
            assert (o1 == o2).all()
        q = rng.integers(-2 ** 31, 2 ** 31, 4099, dtype=np.int64)
        q[:12] = [0, 1, -1, 2 ** 31 - 1, -2 ** 31, 2 ** 24 + 1, -(2 ** 24 + 3),
                  2 ** 25 + 2, 2 ** 30 + 64, -(2 ** 30 + 192), 16777217, 3]
        buf = q.astype(">i4").view(np.uint8)
        for fac in [2.0 ** k for k in (-150, -127, -126, -125, -30, 0, 60, 96, 97, 120)] + \
                [4 / 3 * 2.0 ** -20, 0.75 * 2.0 ** -126, 3.0]:
            for start, count in ((0, 4099), (3, 8), (4, 13)):
                f1 = np.full(count + 2, np.nan, np.float32)
                f2 = f1.copy()
                Q._dequant(buf, 4 * start, count, fac, f1, 1)
                _client.dequant(buf, 4 * start, count, fac, f2, 1)
                assert np.array_equal(f1, f2, equal_nan=True), (fac, start, count)
    finally:
        _client.set_avx2(was)

def _inputs(n):
    return lambda w, k: np.random.default_rng(100 * w + k).standard_normal(n) \
        .astype(np.float32)


def _against_switch(job, fn, ranks, **server_kw):
    """A compiled switch holding ``job`` in a thread; ``fn(address, w)`` for each w in
    ``ranks`` in threads (the C loop releases the GIL); the switch is stopped after.
    Returns the switch's address and its counters at the end (the model's, and the
    engine's own: ``pace_held``, ``tx_batches``, ...)."""
    import threading
    from ina_fabric.host.switch import SwitchServer
    server = SwitchServer([job], "127.0.0.1", 0, **{"engine": "fast", **server_kw})
    t = threading.Thread(target=server.serve_forever, args=(False,), daemon=True)
    t.start()
    errors = run_threads(lambda w: fn(server.address, w), ranks)
    server.stop()
    t.join(2)
    counters = {**getattr(server.model, "engine_counters", dict)(),
                **dict(server.model.counters)}
    server.close()
    assert not errors, errors
    return server.address, counters


def _run(engine, inputs, workers=4, calls=2, elements=1000):
    """``calls`` allreduces of ``inputs(w, k)`` on ``workers`` clients in threads (the C
    loop releases the GIL) against a compiled switch; every worker's outputs."""
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.protocol.jobtable import JobConfig
    from ina_fabric.host.cluster import free_udp_ports
    ports = free_udp_ports(workers)
    job = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=16,
                    elements=elements)
    outs = [[] for _ in range(workers)]
    errors = []

    def worker(address, w):
        try:
            with SwitchClient(address, 1, w, workers, 16, elements,
                              bind=("127.0.0.1", ports[w]), engine=engine,
                              session=job.session) as c:
                assert c._use_c == (engine == "c")
                for k in range(calls):
                    outs[w].append(c.allreduce(inputs(w, k))[0])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    _against_switch(job, worker, range(workers), key=None)
    assert not errors, errors
    return outs


@needs_c
def test_c_call_gives_the_python_loops_bits():
    c, py = _run("c", _inputs(12_345)), _run("python", _inputs(12_345))
    for w in range(4):
        for k in range(2):
            assert np.array_equal(c[w][k], py[w][k]), (w, k)
            assert np.array_equal(c[w][k], c[0][k])


@needs_c
def test_c_call_errors_as_the_python_loop():
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.host.transport.switch_client import SwitchUnavailable
    from ina_fabric.host.cluster import free_udp_ports
    dead = ("127.0.0.1", free_udp_ports(1)[0])
    with SwitchClient(dead, 1, 0, 2, 4, 64, connect_timeout=0.3, engine="c", session=1) as c:
        with pytest.raises(SwitchUnavailable, match="no answer from switch"):
            c.allreduce(np.ones(1000, np.float32))


def test_without_the_extension_the_client_says_why_once():
    import subprocess
    import sys
    code = ("import sys, warnings; sys.modules['ina_fabric.host.transport._client'] = None\n"
            "from ina_fabric.host.transport import SwitchClient, fastcall\n"
            "assert not fastcall.available() and 'gcc' in fastcall.WHY_NOT\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    a = SwitchClient(('127.0.0.1', 9), 1, 0, 2)\n"
            "    b = SwitchClient(('127.0.0.1', 9), 1, 1, 2)\n"
            "assert not a._use_c and len(w) == 1, w\n"
            "print(w[0].message)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Python loop" in r.stdout and "not built" in r.stdout


@needs_c
@pytest.mark.parametrize("engine", ["c", "python"])
def test_inf_or_nan_on_one_rank_reaches_every_rank_as_nan(engine):
    """Issue 17: a non-finite value on one rank used to raise on that rank only (the
    others stalled or summed without it). Its chunk's exponent proposal (NONFINITE, the
    largest int8) wins the switch's max, so every rank's result for that chunk is NaN,
    the other chunks stay exact, and nobody raises: AMP's GradScaler sees the overflow
    on every rank and skips the step everywhere."""
    xs = [np.random.default_rng(w).standard_normal(1000).astype(np.float32) for w in range(3)]
    xs[1][250] = np.inf                 # chunk 2 of rank 1
    xs[2][731] = np.nan                 # chunk 7 of rank 2
    outs = _run(engine, lambda w, k: xs[w] if k == 0 else xs[0] * (w + 1), workers=3,
                elements=100)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for w in range(3):
        y = outs[w][0]
        assert np.isnan(y[200:300]).all() and np.isnan(y[700:800]).all()
        finite = np.r_[0:200, 300:700, 800:1000]
        assert np.allclose(y[finite], exact[finite], atol=1e-5)
        assert np.array_equal(y, outs[0][0], equal_nan=True)
        # the next call is unaffected
        assert np.allclose(outs[w][1], xs[0] * 6, atol=1e-5)


@needs_c
@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_stall_names_the_missing_worker(engine, monkeypatch):
    """Issue 17: a reliable call stalls when a rank is gone. Every waiting rank raises
    within stall_timeout and says which worker the switch is waiting for (from its
    STATUS: the oldest open slot's missing contributors); with the switch gone, that it
    does not answer."""
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.host.transport.switch_client import AllreduceTimeout
    from ina_fabric.protocol.jobtable import JobConfig
    from ina_fabric.host.cluster import free_udp_ports
    monkeypatch.setenv("INA_SWITCH_KEY", "11" * 32)
    ports = free_udp_ports(3)
    job = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=8, elements=100)
    errors = {}

    def worker(address, w):          # worker 2 never calls
        with SwitchClient(address, 1, w, 3, 8, 100, bind=("127.0.0.1", ports[w]),
                          stall_timeout=1.0, engine=engine, session=job.session) as c:
            try:
                c.allreduce(np.ones(1000, np.float32))
            except AllreduceTimeout as e:
                errors[w] = str(e)

    address, _ = _against_switch(job, worker, (0, 1))
    assert sorted(errors) == [0, 1], errors
    for msg in errors.values():
        assert msg.endswith("waiting for worker(s) 2 (the switch's oldest open slot lacks "
                            "them)"), msg
    # the switch is gone now: the stall says so
    with SwitchClient(address, 1, 0, 3, 8, 100, bind=("127.0.0.1", ports[0]),
                      stall_timeout=0.5, connect_timeout=0.3, engine=engine,
                      session=job.session) as c:
        c._rtt.answered = True          # as after earlier calls: a stall, not "unavailable"
        with pytest.raises(AllreduceTimeout, match="did not answer a STATUS request"):
            c.allreduce(np.ones(1000, np.float32))


@needs_c
@pytest.mark.parametrize("engine", ["c", "python"])
def test_a_lost_result_is_counted_refetched(engine):
    """The loss-aware slot deadline's signal (``slot_deadline.choose_deadline``), in the
    C loop and the Python loop alike: the switch drops 10% of what it sends, so some
    RESULTs never reach a worker; its re-send of that packet is answered with the stored
    RESULT (unicast, RETRANSMIT, its own bit in the bitmap) and counted in
    ``refetched``, never more often than the switch dropped something. (That a late
    contribution's re-served RESULT is not counted: ``test_bounded_slot_deadline``.)"""
    from ina_fabric.host.transport import SwitchClient, Impairment
    from ina_fabric.host.transport.switch_client import AllreduceStats
    from ina_fabric.protocol.jobtable import JobConfig
    from ina_fabric.host.cluster import free_udp_ports
    stats = {}
    ports = free_udp_ports(3)
    job = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=8, elements=100)

    def reliable(address, w):
        with SwitchClient(address, 1, w, 3, 8, 100, bind=("127.0.0.1", ports[w]),
                          engine=engine, session=job.session, rto=0.02) as c:
            stats[w] = AllreduceStats()
            for k in range(4):
                stats[w].add(c.allreduce(np.full(2000, w + k, np.float32))[1])

    imp = Impairment(loss=0.1, seed=5)
    _against_switch(job, reliable, range(3), key=None, impairment=imp, engine="model")
    refetched = sum(stats[w].refetched for w in range(3))
    assert 0 < refetched <= imp.counts["dropped"], (refetched, imp.counts)



@pytest.mark.parametrize("engine", ["c", "python"] if fastcall.available() else ["python"])
def test_data_carries_a_sound_ack(engine):
    """Every DATA's ``count`` is the worker's ack (docs/pool.md): every seq up to
    ``seq - count`` had its RESULT sent to that worker before the DATA was sent (so a
    switch with a pool may free it), and the ack keeps up (a slot pool frees as it
    goes, not W behind)."""
    import socket
    import threading
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.host.switch.model import SwitchModel
    from ina_fabric.protocol import unpack, MsgType
    from ina_fabric.protocol.jobtable import JobConfig
    from ina_fabric.host.cluster import free_udp_ports
    ports = free_udp_ports(2)
    W = 8
    job = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=W, elements=64)
    model = SwitchModel([job])
    sw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sw.bind(("127.0.0.1", 0))
    sw.settimeout(0.2)
    results = {0: set(), 1: set()}      # worker -> seqs whose RESULT went to it
    acks, bad, stop = [], [], threading.Event()

    def switch():
        while not stop.is_set():
            try:
                d, src = sw.recvfrom(65536)
            except socket.timeout:
                continue
            h, _ = unpack(d)
            if int(h["type"]) == MsgType.DATA:
                w, seq, a = int(h["worker"]), int(h["seq"]), int(h["count"])
                acks.append(a)
                if not a or any(s not in results[w] for s in range(seq - a + 1)):
                    bad.append((w, seq, a))
            for dest, out in model.process(d, src, 0.0):
                r, _ = unpack(out)
                for w, p in enumerate(ports):
                    if tuple(dest) == ("127.0.0.1", p):
                        results[w].add(int(r["seq"]))
                sw.sendto(out, tuple(dest))

    t = threading.Thread(target=switch, daemon=True)
    t.start()

    def worker(w):
        with SwitchClient(sw.getsockname(), 1, w, 2, W, 64, bind=("127.0.0.1", ports[w]),
                          engine=engine, session=job.session) as c:
            for k in range(3):
                c.allreduce(np.full(64 * 40, k + w, np.float32))

    errors = run_threads(worker, range(2))
    stop.set()
    t.join(2)
    sw.close()
    assert not errors, errors
    assert not bad, bad[:5]
    # 3 calls of 40 + W packets each; a packet goes once the result W before it is in,
    # so the ack trails its DATA by about the window, not 2W
    assert len(acks) >= 2 * 3 * (40 + W)
    assert sorted(acks)[len(acks) // 2] <= W


@pytest.mark.parametrize("engine", ["python", pytest.param("c", marks=needs_c)])
def test_ctrl_c_ends_a_waiting_call_at_once(engine):
    """Before: the compiled loop retried ``ppoll`` on EINTR with the GIL released, so
    Python's SIGINT handler ran only when the call ended: Ctrl-C on a call waiting for a
    switch that does not answer took its whole 30 s timeout. Now the loop runs the
    handlers when a signal wakes it, and the call raises KeyboardInterrupt at once."""
    import signal
    import socket
    import threading
    from ina_fabric.host.transport import SwitchClient
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))            # a "switch" that never answers
    main = threading.main_thread().ident
    timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
    # Ctrl-C as at a terminal, even in a suite started in the background (a shell's `&`
    # starts it with SIGINT ignored, and then no handler would run at all)
    was = signal.signal(signal.SIGINT, signal.default_int_handler)
    with SwitchClient(silent.getsockname(), 1, 0, 2, 16, 256, engine=engine,
                      session=0x5EED) as c:
        c.connect_timeout = c.stall_timeout = 30.0
        assert c._use_c == (engine == "c")
        t0 = time.monotonic()
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                c.allreduce(np.ones(100_000, np.float32))
        finally:
            timer.cancel()
            silent.close()
            signal.signal(signal.SIGINT, was)
    assert time.monotonic() - t0 < 5.0


def test_python_loop_sends_again_what_the_host_queue_refused():
    """The Python loop's half of local congestion (the C loop's runs on a real full tbf
    queue in test_lab_bench): a send refused with ENOBUFS goes again a moment later,
    counted in ``local_retries``, and is not lost (no re-send, exact sums)."""
    import errno
    from ina_fabric.host.transport import SwitchClient
    from ina_fabric.protocol.jobtable import JobConfig
    from ina_fabric.host.cluster import free_udp_ports
    ports = free_udp_ports(2)
    job = JobConfig(1, tuple(f"127.0.0.1:{p}" for p in ports), window=16, elements=100)
    xs = [np.arange(1000, dtype=np.float32) * (w + 1) for w in range(2)]
    got = {}

    class FullQueue:                  # every third send refused once, as a full qdisc
        def __init__(self, sock):
            self.sock, self.n = sock, 0

        def sendto(self, data, to):
            self.n += 1
            if self.n % 3 == 0:
                raise OSError(errno.ENOBUFS, "No buffer space available")
            return self.sock.sendto(data, to)

        def __getattr__(self, name):
            return getattr(self.sock, name)

    def worker(address, w):
        with SwitchClient(address, 1, w, 2, 16, 100, bind=("127.0.0.1", ports[w]),
                          engine="python", session=job.session) as c:
            c.sock = FullQueue(c.sock)
            got[w] = c.allreduce(xs[w])

    _against_switch(job, worker, range(2), key=None)
    for w in range(2):
        y, st = got[w]
        assert np.array_equal(y, xs[0] * 3)
        assert st.local_retries > 0 and st.retransmits == 0, st
