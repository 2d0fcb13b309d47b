"""What every block bench shares (one bench per ``wiring.Component``, tests/test_sim_blocks.py):
a clock and reset, ports read and written as dicts of their layout's fields, and streams
driven with random idle cycles and drained with random backpressure.

    b = Bench(dut, seed=1)
    src = b.source("i", layout, idle=0.3)      # a stream port the block takes
    snk = b.sink("o", layout, backpressure=0.3)
    await b.reset()
    src.send(payloads)
    await b.run_until(lambda: len(snk.got) == n)

Timing follows the core's benches: after ``await b.step()`` (a rising edge) a read shows
the values the edge sampled, and a write is seen at the next edge. A block parameter
set comes in the environment as JSON (``INA_BENCH``; :func:`bench_params`).
"""

import collections
import json
import os
import random

import cocotb
from amaranth.lib import data
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge

__all__ = ["Bench", "bench_params", "fields", "pack", "unpack"]


def bench_params() -> dict:
    """The bench's options (``INA_BENCH``, JSON), with ``seed`` and ``n`` defaulted."""
    p = json.loads(os.environ.get("INA_BENCH", "{}"))
    p.setdefault("seed", 1)
    p.setdefault("n", 200)
    return p


def fields(layout):
    """``(name, offset, width)`` of each field of a layout (nested layouts stay flat)."""
    for name, field in data.Layout.cast(layout):
        shape = field.shape
        width = (data.Layout.cast(shape).size if isinstance(shape, data.Layout)
                 else field.width)
        yield name, field.offset, width


def unpack(layout, value: int) -> dict:
    """A flat value to ``{field: int}`` (unsigned)."""
    return {n: (value >> off) & ((1 << w) - 1) for n, off, w in fields(layout)}


def pack(layout, values: dict | None = None, **kw) -> int:
    """``{field: int}`` to a flat value (missing fields 0; negative values wrap)."""
    values = {**(values or {}), **kw}
    out = 0
    for n, off, w in fields(layout):
        out |= (int(values.get(n, 0)) & ((1 << w) - 1)) << off
    return out


class _Source:
    """A stream the block takes: one payload per handshake, ``valid`` withheld for a
    random cycle with probability ``idle``."""

    def __init__(self, bench, prefix, layout, idle):
        self.b, self.prefix, self.layout, self.idle = bench, prefix, layout, idle
        self.q = collections.deque()
        self.sent = []
        self.driving = False

    def send(self, payloads):
        self.q.extend(payloads)

    def before(self):
        if not self.driving and self.q and self.b.rng.random() >= self.idle:
            v = self.q[0]
            self.b.wr(f"{self.prefix}__payload",
                      pack(self.layout, v) if isinstance(v, dict) else v)
            self.b.wr(f"{self.prefix}__valid", 1)
            self.driving = True

    def after(self):
        if self.driving and self.b.rd(f"{self.prefix}__ready"):
            self.sent.append(self.q.popleft())
            self.driving = False
            self.b.wr(f"{self.prefix}__valid", 0)

    @property
    def done(self):
        return not self.q and not self.driving


class _Sink:
    """A stream the block gives: ``ready`` low for a random cycle with probability
    ``backpressure``; every payload taken, unpacked, in ``got``."""

    def __init__(self, bench, prefix, layout, backpressure):
        self.b, self.prefix, self.layout, self.bp = bench, prefix, layout, backpressure
        self.got = []
        self.ready = 1

    def before(self):
        if self.bp is None:         # (an ``always_ready`` stream: no ready port)
            return
        self.ready = 0 if self.b.rng.random() < self.bp else 1
        self.b.wr(f"{self.prefix}__ready", self.ready)

    def after(self):
        if self.ready and self.b.rd(f"{self.prefix}__valid"):
            v = self.b.rd(f"{self.prefix}__payload")
            self.got.append(unpack(self.layout, v) if self.layout is not None else v)


class Bench:
    """A block's clock (``clk``), reset (``rst``), ports and streams (see the module
    docstring). ``seed`` seeds ``rng``, which every random choice uses."""

    def __init__(self, dut, *, seed=1, period_ns=8, clk="clk", rst="rst"):
        self.dut = dut
        self.rng = random.Random(seed)
        self.clk = getattr(dut, clk)
        self.rst_name = rst
        self.parts = []
        self.cycle = 0
        cocotb.start_soon(Clock(self.clk, period_ns, unit="ns").start())

    def h(self, name):
        return getattr(self.dut, name)

    def wr(self, name, value=0, layout=None, **kw):
        """Write port ``name``: an int, or a layout's fields (``value`` a dict, or ``kw``)."""
        if layout is not None:
            value = pack(layout, value if isinstance(value, dict) else None, **kw)
        self.h(name).value = int(value)

    def rd(self, name, layout=None):
        """Read port ``name`` (X or Z bits raise): an int, or a dict of ``layout``'s fields."""
        v = self.h(name).value
        if not v.is_resolvable:
            raise AssertionError(f"{name} has X/Z bits: {v}")
        v = int(v)
        return unpack(layout, v) if layout is not None else v

    def source(self, prefix, layout=None, *, idle=0.0):
        s = _Source(self, prefix, layout, idle)
        self.parts.append(s)
        return s

    def sink(self, prefix, layout=None, *, backpressure=0.0):
        """(``backpressure=None``: the stream is ``always_ready``, it has no ``ready``.)"""
        s = _Sink(self, prefix, layout, backpressure)
        self.parts.append(s)
        return s

    async def reset(self, cycles=3, **init):
        """Hold reset for ``cycles``, with ports ``init`` written (name: value) first:
        every input the block registers from must be in ``init`` (or a stream), or the
        edge after reset registers X from it."""
        for p in self.parts:
            if isinstance(p, _Source):
                self.wr(f"{p.prefix}__valid", 0)
                self.wr(f"{p.prefix}__payload", 0)
            elif p.bp is not None:
                self.wr(f"{p.prefix}__ready", 0)
        for k, v in init.items():
            self.wr(k, v)
        self.wr(self.rst_name, 1)
        for _ in range(cycles):
            await RisingEdge(self.clk)
        self.wr(self.rst_name, 0)
        await RisingEdge(self.clk)

    async def step(self, n=1):
        """``n`` cycles of every stream part (drive, edge, sample)."""
        for _ in range(n):
            for p in self.parts:
                p.before()
            await RisingEdge(self.clk)
            self.cycle += 1
            for p in self.parts:
                p.after()

    def run_in_background(self):
        """Step every stream part on every cycle from now on, beside the test (which
        then waits on the clock, e.g. for a cocotbext-eth model)."""
        async def loop():
            while True:
                await self.step()
        return cocotb.start_soon(loop())

    async def settle(self):
        """To the falling edge: reads show this cycle's settled values (registers after
        the last edge), and writes are still seen at the next edge."""
        await FallingEdge(self.clk)

    async def run_until(self, cond, timeout=100_000, what="the bench's end condition"):
        for _ in range(timeout):
            if cond():
                return
            await self.step()
        raise AssertionError(f"timeout after {timeout} cycles waiting for {what}")
