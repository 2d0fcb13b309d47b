"""ina_fabric.hw.eth.cdc.AsyncFIFOLut on Amaranth's simulator: two unrelated clocks, random
enables on both sides; every word comes out once, in order, and never while not ready."""

import random

import pytest
from amaranth import ClockDomain, Module
from amaranth.sim import Simulator

from ina_fabric.hw.eth.cdc import AsyncFIFOLut


@pytest.mark.parametrize("w_ns,r_ns", [(8, 8.3), (8.3, 8), (8, 26.7), (26.7, 8)])
def test_async_fifo_lut_order_and_no_loss(w_ns, r_ns):
    m = Module()
    m.domains.write = ClockDomain()
    m.domains.read = ClockDomain()
    m.submodules.fifo = fifo = AsyncFIFOLut(width=16, depth=16)
    n = 400
    got = []

    async def writer(ctx):
        rng = random.Random(1)
        k = 0
        while k < n:
            ctx.set(fifo.w_en, rng.random() < 0.7)
            ctx.set(fifo.w_data, k)
            _, _, rdy, en = await ctx.tick("write").sample(fifo.w_rdy, fifo.w_en)
            if rdy and en:
                k += 1
        ctx.set(fifo.w_en, 0)

    async def reader(ctx):
        rng = random.Random(2)
        while len(got) < n:
            ctx.set(fifo.r_en, rng.random() < 0.6)
            _, _, rdy, en, data = await ctx.tick("read").sample(fifo.r_rdy, fifo.r_en,
                                                                fifo.r_data)
            if rdy and en:
                got.append(data)

    sim = Simulator(m)
    sim.add_clock(w_ns * 1e-9, domain="write")
    sim.add_clock(r_ns * 1e-9, domain="read")
    sim.add_testbench(writer)
    sim.add_testbench(reader)
    sim.run_until(n * 40 * max(w_ns, r_ns) * 1e-9)
    assert got == list(range(n))


def test_async_fifo_lut_depth_must_be_power_of_two():
    with pytest.raises(ValueError):
        AsyncFIFOLut(width=8, depth=24)


def test_skid_buffer_order_full_rate_and_registered_ready():
    """Random valid/ready: every beat once, in order; with both held high a beat per
    cycle; ``i.ready`` depends on no input in the same cycle (it is a flip-flop)."""
    from amaranth.lib import data
    from ina_fabric.hw.eth.words import SkidBuffer

    dut = SkidBuffer(data.StructLayout({"data": 8, "last": 1}))
    n = 300
    got, per_cycle = [], []

    async def producer(ctx):
        rng = random.Random(5)
        k = 0
        while k < n:
            ctx.set(dut.i.valid, k >= 200 or rng.random() < 0.7)
            ctx.set(dut.i.payload.data, k & 0xFF)
            ctx.set(dut.i.payload.last, k % 7 == 6)
            _, _, v, r = await ctx.tick().sample(dut.i.valid, dut.i.ready)
            k += bool(v and r)
        ctx.set(dut.i.valid, 0)

    async def consumer(ctx):
        rng = random.Random(6)
        cycle = 0
        while len(got) < n:
            ctx.set(dut.o.ready, len(got) >= 150 or rng.random() < 0.5)
            before = ctx.get(dut.i.ready)
            ctx.set(dut.o.ready, not ctx.get(dut.o.ready))    # flip: i.ready must not move
            assert ctx.get(dut.i.ready) == before
            ctx.set(dut.o.ready, not ctx.get(dut.o.ready))
            _, _, v, r, d, last = await ctx.tick().sample(dut.o.valid, dut.o.ready,
                                                          dut.o.payload.data, dut.o.payload.last)
            cycle += 1
            if v and r:
                got.append((d, last))
                per_cycle.append(cycle)

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run_until(n * 20 * 8e-9)
    assert got == [(k & 0xFF, int(k % 7 == 6)) for k in range(n)]
    tail = per_cycle[210:]   # both sides always ready by then: one beat per cycle
    assert all(b - a == 1 for a, b in zip(tail, tail[1:]))
