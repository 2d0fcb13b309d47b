"""cocotb tests of the INA core against the reference model (see scoreboard.py).

Selected by pytest (tests/test_sim_ina_core.py) with environment variables:
INA_PARAMS (CoreParams as JSON), INA_SEED, INA_NSEQ, INA_DEADLINE.
"""

import os

import cocotb
from cocotb.triggers import ClockCycles

from .harness import CoreTB, params_from_env
from .scoreboard import Scoreboard
from .traffic import generate, make_jobs, Mix
from . import directed
from ina_fabric.hw.ina.params import HEADER_WORDS


def _env(name, default):
    return int(os.environ.get(name, default))


async def _setup(dut, jobs):
    tb = CoreTB(dut)
    await tb.reset()
    await tb.configure(jobs)
    return tb


async def _settle(dut, tb, sb, t):
    """The end of a model-scored run: the model's clock to ``t``, the accumulator's
    collision check first (a used colliding read would explain a mismatch), then every
    datagram and every counter against the model; returns the scoreboard's summary."""
    sb.tick(t)
    tb.acc.check()
    hw = await tb.counters()
    dut._log.info(f"core counters {hw}; model counters {dict(sb.model.counters)}")
    summary = sb.check()
    sb.check_counters(hw)
    return summary


@cocotb.test()
async def test_random(dut):
    """Seeded random traffic with every impairment; >= INA_NSEQ seqs per job."""
    jobs = make_jobs(window=min(4, _env("INA_WINDOW", 4)), elements=_env("INA_E", 8),
                     deadline_cycles=_env("INA_DEADLINE", 400))
    tb = await _setup(dut, jobs)
    # (a core built with narrow widths gets DATA of every width it takes, random per seq)
    sb = Scoreboard(jobs, widths=tb.P.widths if tb.P.narrow else None)
    traffic = generate(jobs, _env("INA_NSEQ", 100), _env("INA_SEED", 1), widths=tb.P.widths)
    assert len(traffic) >= _env("INA_MIN_PACKETS", 0), f"only {len(traffic)} datagrams"
    if _env("INA_MAX_PACKETS", 0):
        traffic = traffic[:_env("INA_MAX_PACKETS", 0)]
    deadline = _env("INA_DEADLINE", 400)
    _, last = await tb.run(traffic, sb, seed=_env("INA_SEED", 1), gap=0.02,
                           backpressure=0.05, drain=deadline + 4 * tb.P.records + 200)
    summary = await _settle(dut, tb, sb, last + deadline + 1)
    dut._log.info(f"random: {len(traffic)} datagrams in, {summary}, "
                  f"model counters {dict(sb.model.counters)}")


@cocotb.test()
async def test_tree_spine(dut):
    """The core as the spine of a two-level tree (sim/ina/tree.py): the leaves are models
    fed with random worker traffic, with loss both ways, re-sends, duplicates, bad counts
    and a non-member child; idle cycles and backpressure; the scoreboard is a model spine."""
    from .tree import generate_tree
    deadline = _env("INA_DEADLINE", 300)
    P = params_from_env()
    jobs, traffic = generate_tree(_env("INA_NSEQ", 60), _env("INA_SEED", 1),
                                  window=min(4, P.window), elements=_env("INA_E", 4),
                                  deadline_cycles=deadline)
    tb = await _setup(dut, jobs)
    sb = Scoreboard(jobs)
    _, last = await tb.run(traffic, sb, seed=_env("INA_SEED", 1), gap=0.05,
                           backpressure=0.1, drain=deadline + 4 * tb.P.records + 200)
    summary = await _settle(dut, tb, sb, last + deadline + 1)
    c = sb.model.counters
    assert c["results"] and c["partials"] and c["resent"] and c["drop_malformed"], dict(c)
    dut._log.info(f"tree spine: {len(traffic)} datagrams in, {summary}")


@cocotb.test()
async def test_tree_leaf(dut):
    """The core as a leaf of a two-level tree (sim/ina/tree_leaf.py): a model spine is
    its parent, the loop is closed while it runs (loss and duplicates both ways, bad
    RESULTs, workers' re-sends on timeout), with idle cycles and backpressure; the
    scoreboard is a model leaf with the same jobs and parent."""
    from .tree_leaf import LeafLoop, generate_leaf, PARENT_MAC
    deadline = _env("INA_DEADLINE", 300)
    P = params_from_env()
    leaves, spines, workers = generate_leaf(_env("INA_NSEQ", 40), _env("INA_SEED", 1),
                                            window=min(4, P.window),
                                            elements=_env("INA_E", 4),
                                            deadline_cycles=deadline,
                                            workers=tuple(int(x) for x in os.environ.get(
                                                "INA_LEAF_WORKERS", "4,3").split(",")))
    tb = CoreTB(dut)
    await tb.reset()
    await tb.configure(leaves, parent_mac=PARENT_MAC)
    traffic = []    # what the core is sent: the workers' window releases it (LeafLoop)
    sb = LeafLoop(leaves, spines, workers, traffic, _env("INA_SEED", 1))
    _, last = await tb.run(traffic, sb, seed=_env("INA_SEED", 1), gap=0.05,
                           backpressure=0.1, drain=2 * sb.timeout + 200)
    assert not sb.pending and not sb.delayed, \
        f"{len(sb.pending) + len(sb.delayed)} worker datagrams never sent"
    summary = await _settle(dut, tb, sb, last + deadline + 1)
    c = sb.model.counters
    dut._log.info(f"tree leaf: {len(traffic)} datagrams in, {summary}, up {sb.n_up}, "
                  f"RESULTs down {sb.n_down}, worker re-sends {sb.n_resent}, relayed "
                  f"without this leaf {sb.n_not_mine}, model "
                  f"counters {dict(c)}")
    # what the bench must have exercised (the model's tree counters: the gateware keeps
    # none of them, its datagrams were compared)
    for name in ("up", "up_resent", "relayed", "drop_result", "partials", "resent",
                 "late", "duplicates", "drop_malformed", "drop_unknown_source",
                 "drop_bad_session"):
        assert c[name] > 0, f"the run did not exercise {name}: {dict(c)}"
    assert sb.n_not_mine, "no spine RESULT without this leaf was relayed"


@cocotb.test()
async def test_directed(dut):
    """Each row of the semantics table (DESIGN.md), one scenario each."""
    tb = CoreTB(dut)
    only = os.environ.get("INA_SCENARIO")
    for name, scenario in directed.SCENARIOS.items():
        if only and name != only:
            continue
        jobs, traffic, gaps, expect, *pre = scenario()
        await tb.reset()
        await tb.configure(jobs)
        sb = Scoreboard(jobs)
        for k, tags in (pre[0] if pre else {}).items():   # {job index: {(set, i): tag}}
            await tb.preload_tags(k, tags)
            sb.preload_tags(jobs[k].job, tags)
        dl = max((round(j.deadline) for j in jobs if j.mode == "bounded"), default=0)
        _, last = await tb.run(traffic, sb, gaps=gaps, drain=dl + 4 * tb.P.records + 100)
        if dl:
            sb.tick(last + dl + 1)
        tb.acc.check()
        sb.check()
        sb.check_counters(await tb.counters())
        c = sb.model.counters
        for k, v in expect.items():
            assert c[k] == v, f"{name}: model counter {k} = {c[k]}, scenario expects {v}"
        dut._log.info(f"directed {name}: ok {dict((k, c[k]) for k in expect)}")


@cocotb.test()
async def test_back_to_back(dut):
    """Back-to-back full packets, all workers to the same slot in a row: the core must
    take one beat every cycle (cycles per packet == ceil(E/L) + header beats)."""
    tb = CoreTB(dut)
    jobs = directed.b2b_jobs(tb.P, mcast=bool(_env("INA_B2B_MCAST", 1)))
    await tb.reset()
    await tb.configure(jobs)
    sb = Scoreboard(jobs)
    traffic = directed.b2b_traffic(jobs, _env("INA_NSEQ_B2B", 32))
    first, last = await tb.run(traffic, sb, drain=300)
    tb.acc.check()
    sb.check()
    sb.check_counters(await tb.counters())
    P = tb.P
    beats = sum(-(-(len(d) // 4 - HEADER_WORDS) // P.lanes) + P.header_beats
                for d, _ in traffic)
    cycles = last - first + 1
    dut._log.info(f"back-to-back: {len(traffic)} packets, {cycles} cycles, "
                  f"{beats} beats (ideal), {cycles / len(traffic):.3f} cycles/packet")
    with open(os.environ.get("INA_B2B_OUT", "/dev/null"), "w") as fh:
        fh.write(f"{len(traffic)} {cycles} {beats}\n")
    if _env("INA_B2B_STRICT", 1):
        assert cycles == beats, f"{cycles - beats} bubbles in {beats} beats"


@cocotb.test()
async def test_coverage(dut):
    """Coverage-driven random traffic, then the directed sweeps across each timing
    compare, for INA_SIM_SEEDS seeds (the bounded job at table index seed % jobs, the
    jobs after the first start near the 2^32 wrap); every bin must be hit, every result
    in time (sim/ina/coverage.py). Writes the table to INA_COV_OUT (JSON) if set."""
    from .coverage import (Coverage, CovScoreboard, CoverageMonitor, RULE_COUNTERS,
                           cov_jobs, cov_traffic, deadline_sweep, reuse_sweep, expire_all,
                           overflow_beats, PIPE_BOUND)
    from cocotb.triggers import ClockCycles
    tb = CoreTB(dut)
    P = tb.P
    cov = Coverage()
    cov.need(*(f"model: {n}" for n in RULE_COUNTERS))
    cov.need("reuse at tag + 2W", "reuse across the 2^32 wrap",
             "stale within 2W of the 2^31 boundary",
             "out of window within 2W of the 2^31 boundary",
             "packet exactly at its slot's deadline",
             "packet one cycle before its slot's deadline", "PARTIAL result re-sent",
             "a packet fires its expired record",
             "reuse deferred (result queued or being sent)",
             "back-pressure in the middle of a result")
    cov.need(*(f"overflow in element beat {b}" for b in range(P.elem_beats)))
    cov.need(*(f"scanner fires record {r}" for r in range(2 * P.window)))
    seeds = _env("INA_SIM_SEEDS", P.jobs)
    cov.need(*(f"bounded job at table index {k}" for k in range(min(seeds, P.jobs))))
    mon = CoverageMonitor(dut, P, cov)
    cocotb.start_soon(mon.run())
    n_seq = _env("INA_COV_NSEQ", 40)
    scan_lag = 2 * P.records + P.ideal_beats + 16
    worst = {"packet": 0, "deadline": 0}
    n_in = n_out = 0

    async def phase(jobs, traffic, *, seed, gaps=None, gap=0.0, bp=0.0, preload=None,
                    bidx=None):
        nonlocal n_in, n_out
        await tb.reset()
        await tb.configure(jobs)
        sb = CovScoreboard(jobs, cov, P)
        for j, tags in (preload or {}).items():
            await tb.preload_tags(j, tags)
            sb.preload_tags(jobs[j].job, tags)
        mon.bounded = (bidx, None) if bidx is not None else None
        D = max((int(j.deadline) for j in jobs if j.mode == "bounded"), default=0)
        _, last = await tb.run(traffic, sb, seed=seed, gap=gap, backpressure=bp,
                               gaps=gaps, drain=D + 4 * P.records + 200)
        if D:
            sb.tick(last + D + 1)
        tb.acc.check()
        hw = await tb.counters()
        try:
            summary = sb.check()
        except AssertionError:
            dut._log.info(f"counters (hw, model): " + str({n: (hw[n], sb.model.counters[n]) for n in hw if n in sb.model.counters and hw[n] != sb.model.counters[n]}))
            raise
        sb.check_counters(hw)
        sb.check_model_only()
        w = sb.check_timing(scan_lag)
        for k in worst:
            worst[k] = max(worst[k], w[k])
        if sb.offsets:
            dut._log.info(f"packets near their deadline (time - due): {sb.offsets}")
        n_in += summary["in"]
        n_out += summary["out"]
        return sb

    for s in range(seeds):
        seed = _env("INA_SEED", 1) * 1000 + s
        bidx = s % P.jobs
        cov.hit(f"bounded job at table index {bidx}")
        # deadline: about half a window of traffic, so late packets still find their slot
        per_seq = sum(3.5 * P.ideal_beats for _ in range(P.jobs))
        D = max(40, int(per_seq * P.window * 0.5))
        jobs = cov_jobs(P, bidx, D, seed)
        bases, preload = [], {}
        for j, cfg in enumerate(jobs):
            if j == 0:
                bases.append(0)
            else:   # starts 2W·k before 2^32: crosses the wrap in the middle of the run
                k = max(1, n_seq // (4 * cfg.window))
                base = (2**32 - 2 * cfg.window * k) & 0xFFFFFFFF
                bases.append(base)
                preload[j] = directed.wrap_preload(cfg, base)
        traffic = cov_traffic(jobs, P, n_seq, seed, bases)
        await phase(jobs, traffic, seed=seed, gap=0.02, bp=0.08, preload=preload, bidx=bidx)
        # directed: a gap sweep across the deadline of the bounded job, cycle by cycle
        b = jobs[bidx]
        # (from a whole packet before it: the packet is still being received at the deadline)
        # and, repeated with the scanner at other points, the cycles in which the packet
        # is decided after the deadline it arrived before
        near = list(range(-(P.header_beats + 6), 1)) * (P.records // 2)
        t, gaps, nxt = deadline_sweep(b, P, 0, list(range(-(P.ideal_beats + 8), 4)) + near)
        t2, g2 = expire_all(b, P, nxt)
        await phase(jobs, t + t2, seed=seed, gaps=gaps + [D + 4 * P.records] + g2[1:],
                    bidx=bidx)
        # directed: reuse while the record's result is being sent, cycle by cycle
        r = jobs[(bidx + 1) % P.jobs]
        send = r.n * (P.header_beats + P.elem_beats)
        t, gaps = reuse_sweep(r, P, range(0, send + 12))
        # then a saturating sum in each element beat (seqs after the sweep's, by job)
        W2 = 2 * r.window
        tags = {g % W2: 2 * W2 * (g // W2) + g % W2 + W2 for g in range(0, send + 12)}
        t3 = overflow_beats(r, P, tags)
        await phase(jobs, t + t3, seed=seed, gaps=gaps + [0] * len(t3), bidx=bidx, bp=0.0)
    mon.active = False
    print(cov.table(f"coverage (L={P.lanes} E={P.elements} W={P.window} "
                            f"jobs={P.jobs}, {seeds} seeds, {n_in} datagrams in, "
                            f"{n_out} out)"), flush=True)
    dut._log.info(f"timing: worst idle output cycles before a result: {worst} "
                  f"(bounds: packet {PIPE_BOUND}, deadline {PIPE_BOUND + scan_lag})")
    out = os.environ.get("INA_COV_OUT")
    if out:
        cov.dump(out)
    assert not cov.missing(), f"coverage bins not hit: {cov.missing()}"


@cocotb.test()
async def test_control(dut):
    """In-band CONTROL (the core built with control_scenario.KEY, 1 cycle per us)
    against the model with the same key: every output and counter the same."""
    from .control_scenario import KEY, scenario
    tb = CoreTB(dut)
    await tb.reset()
    await tb.configure([])
    sb = Scoreboard([], key=KEY, time_scale=1e-6, max_jobs=tb.P.jobs)
    traffic, gaps, expect = scenario(tb.P.jobs)
    # one datagram at a time, the control counters compared after each (the first
    # disagreement names its datagram)
    names = ("rx", "control", "control_refused", "drop_unauthenticated", "drop_malformed",
             "status_requests", "status_unpadded", "drop_unknown_job")
    last = 0
    if os.environ.get("INA_DEBUG"):
        async def fsm_log():
            from cocotb.triggers import RisingEdge
            ctl = dut.control
            prev = None
            while True:
                await RisingEdge(dut.clk)
                st = int(ctl.fsm_state.value)
                if st != prev:
                    dut._log.info(f"control fsm state {st} at cycle {int(dut.now.value)}")
                    prev = st
        cocotb.start_soon(fsm_log())
    for k, (dg, src) in enumerate(traffic):
        # (the drain is the idle time after it, with the outputs collected)
        nxt = gaps[k + 1] if k + 1 < len(traffic) else 2000
        _, last = await tb.run([(dg, src)], sb, gaps=[0], drain=max(nxt, 40))
        if len(dg) < 2 or dg[1] == 1:       # (DATA: checked with the next control step)
            continue
        hw = await tb.counters()
        bad = {n: (hw[n], sb.model.counters[n]) for n in names
               if hw[n] != sb.model.counters[n]}
        assert not bad, f"datagram {k} ({dg[:24].hex()}...): counters (hw, model) {bad}"
    sb.tick(last + 2000)
    hw = await tb.counters()
    dut._log.info(f"core counters {hw}; model counters {dict(sb.model.counters)}")
    sb.check()
    sb.check_counters(hw)
    c = sb.model.counters
    for k, v in expect.items():
        assert c[k] == v, f"control: model counter {k} = {c[k]}, scenario expects {v}"
    # a CONTROL while the previous one is processed is dropped, and counted
    from .control_scenario import busy_pair, CONTROL_GAP
    await tb.run(busy_pair(), Scoreboard([], key=KEY), gaps=[0, 0],
                 drain=CONTROL_GAP)
    hw2 = await tb.counters()
    assert (hw2["control"] - hw["control"], hw2["drop_control_busy"]) == (1, 1), hw2


def _errors(sb):
    """The model's ERRORs, as (reason, figure) in order."""
    import numpy as np
    from ina_fabric.protocol.numpy_view import HEADER_DTYPE
    from .scoreboard import ERRORS
    out = []
    for _, e in sb.expected.get(ERRORS, []):
        h = np.frombuffer(e, HEADER_DTYPE, count=1)[0]
        out.append((int(h["count"]), int(h["bitmap"])))
    return out


@cocotb.test()
async def test_refusals(dut):
    """Each reason the switch answers (issue 43), and the per-source rate limit: the
    core's ERRORs byte for byte as the model's (sim/ina/refusals.py)."""
    from .refusals import SCENARIOS
    tb = CoreTB(dut)
    only = os.environ.get("INA_SCENARIO")
    for name, scenario in SCENARIOS.items():
        if only and name != only:
            continue
        jobs, traffic, gaps, expect, reasons = scenario()
        await tb.reset()
        await tb.configure(jobs)
        sb = Scoreboard(jobs)
        await tb.run(traffic, sb, gaps=gaps, drain=4 * tb.P.records + 100)
        hw = await tb.counters()
        dut._log.info(f"{name}: core counters {hw}")
        sb.check()
        sb.check_counters(hw)
        c = sb.model.counters
        for k, v in expect.items():
            assert c[k] == v, f"{name}: model counter {k} = {c[k]}, scenario expects {v}"
        got = _errors(sb)
        assert got == [(int(r), f) for r, f in reasons], f"{name}: model ERRORs {got}"
        dut._log.info(f"refusals {name}: ok {got}")


@cocotb.test()
async def test_refusal_flood(dut):
    """Wrong DATA back to back from six sources, with the output stalled at random: the
    ERRORs byte for byte as the model's, each no larger than its DATA, the bytes out no
    more than the bytes in, at most one answer per source bucket per interval."""
    from .refusals import flood
    from .scoreboard import ERRORS
    from cocotb.triggers import RisingEdge
    tb = CoreTB(dut)
    jobs, traffic, gaps = flood(_env("INA_FLOOD_N", 240))
    await tb.reset()
    await tb.configure(jobs)
    sb = Scoreboard(jobs)
    stopped = 0

    async def watch():         # cycles the answer path holds the header pipeline
        nonlocal stopped
        while True:
            await RisingEdge(dut.clk)
            stopped += int(dut.answer.stop.value)
    watcher = cocotb.start_soon(watch())
    first, last = await tb.run(traffic, sb, gaps=gaps, backpressure=0.3, seed=3, drain=200)
    watcher.cancel()
    sb.check()
    hw = await tb.counters()
    sb.check_counters(hw)
    bytes_in = sum(len(d) for d, _ in traffic)
    outs = [o for lst in sb.got.values() for _, o in lst]
    bytes_out = sum(len(o) for o in outs)
    errors = sb.got.get(ERRORS, [])
    interval = sb.model.error_interval
    buckets = 6
    bound = buckets * (1 + (last - first) // interval + 1)
    dut._log.info(f"flood: {len(traffic)} DATA, {bytes_in} B in; {len(outs)} datagrams, "
                  f"{bytes_out} B out; {len(errors)} ERRORs (bound {bound}), counters "
                  f"errors_sent {hw['errors_sent']} errors_limited {hw['errors_limited']}; "
                  f"the answer path held the pipeline {stopped} cycles")
    if _env("INA_FLOOD_STOP", 0):
        assert stopped > 0, "the answer queue never filled: the stop path is untested"
    assert bytes_out <= bytes_in, f"{bytes_out} B out > {bytes_in} B in"
    assert all(len(o) == 28 for _, o in errors)
    assert 0 < len(errors) <= bound
    assert hw["errors_sent"] == len(errors)
    assert hw["errors_sent"] + hw["errors_limited"] == len(traffic)
