"""Bench of :class:`~ina_fabric.hw.ina.counters.Counters`: random event bits (and idle
cycles with none), every counter against a sum kept by the bench, one cycle of lag per
the registered step."""

import cocotb
from amaranth.lib import data

from ina_fabric.hw.ina.counters import COUNTER_EVENTS
from ina_fabric.hw.ina.regs import COUNTER_NAMES
from ina_fabric.sim.bench import Bench, bench_params, pack

INC = data.StructLayout(COUNTER_EVENTS)


@cocotb.test()
async def test_counters(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    await b.reset(inc=0)
    want = dict.fromkeys(COUNTER_NAMES, 0)
    pending = [dict.fromkeys(COUNTER_NAMES, 0)] * 2      # the events of the last two cycles
    for cyc in range(p["n"]):
        ev = {}
        if b.rng.random() >= p.get("idle", 0.3):
            ev = {n: b.rng.getrandbits(w) for n, w in COUNTER_EVENTS.items()
                  if b.rng.random() < p.get("density", 0.5)}
        b.wr("inc", pack(INC, ev))
        await b.step()
        got = [(b.rd("values") >> (32 * k)) & 0xFFFFFFFF for k in range(len(COUNTER_NAMES))]
        # ``values`` shows the events of two cycles ago (step register, then the counter)
        for n in COUNTER_NAMES:
            want[n] += bin(pending[0].get(n, 0)).count("1")
        pending = [pending[1], ev]
        assert got == [want[n] for n in COUNTER_NAMES], f"cycle {cyc}: {got} != {want}"
