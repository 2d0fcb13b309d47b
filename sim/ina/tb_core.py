"""cocotb tests of the INA core against the reference model (see scoreboard.py).

Selected by pytest (tests/test_sim_ina_core.py) with environment variables:
INA_PARAMS (CoreParams as JSON), INA_SEED, INA_NSEQ, INA_DEADLINE.
"""

import os

import cocotb
from cocotb.triggers import ClockCycles

from .harness import CoreTB
from .scoreboard import Scoreboard
from .traffic import generate, make_jobs, Mix
from . import directed


def _env(name, default):
    return int(os.environ.get(name, default))


async def _setup(dut, jobs):
    tb = CoreTB(dut)
    await tb.reset()
    await tb.configure(jobs)
    return tb


@cocotb.test()
async def test_random(dut):
    """Seeded random traffic with every impairment; >= INA_NSEQ seqs per job."""
    jobs = make_jobs(window=min(4, _env("INA_WINDOW", 4)), elements=_env("INA_E", 8),
                     deadline_cycles=_env("INA_DEADLINE", 400))
    tb = await _setup(dut, jobs)
    sb = Scoreboard(jobs)
    traffic = generate(jobs, _env("INA_NSEQ", 100), _env("INA_SEED", 1))
    assert len(traffic) >= _env("INA_MIN_PACKETS", 0), f"only {len(traffic)} datagrams"
    if _env("INA_MAX_PACKETS", 0):
        traffic = traffic[:_env("INA_MAX_PACKETS", 0)]
    deadline = _env("INA_DEADLINE", 400)
    _, last = await tb.run(traffic, sb, seed=_env("INA_SEED", 1), gap=0.02,
                           backpressure=0.05, drain=deadline + 4 * tb.P.records + 200)
    sb.tick(last + deadline + 1)
    tb.acc.check()      # first: a used colliding read would explain a mismatch
    hw = await tb.counters()
    dut._log.info(f"core counters {hw}; model counters {dict(sb.model.counters)}")
    summary = sb.check()
    sb.check_counters(hw)
    dut._log.info(f"random: {len(traffic)} datagrams in, {summary}, "
                  f"model counters {dict(sb.model.counters)}")


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
            tb.preload_tags(k, tags)
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
    beats = sum(-(-(len(d) // 4 - 5) // P.lanes) + P.header_beats for d, _ in traffic)
    cycles = last - first + 1
    dut._log.info(f"back-to-back: {len(traffic)} packets, {cycles} cycles, "
                  f"{beats} beats (ideal), {cycles / len(traffic):.3f} cycles/packet")
    with open(os.environ.get("INA_B2B_OUT", "/dev/null"), "w") as fh:
        fh.write(f"{len(traffic)} {cycles} {beats}\n")
    if _env("INA_B2B_STRICT", 1):
        assert cycles == beats, f"{cycles - beats} bubbles in {beats} beats"
