"""Fast unit tests of the MAC blocks on Amaranth's simulator: MacTx framing against
cocotbext-eth's reference framing (zlib CRC), MacRx + PacketBuffer drop/commit."""

import random
import struct
import zlib

from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from ina_fabric.hw.eth.mac import MacRx, MacTx, PacketBuffer, RxStatus


def _reference_wire(payload: bytes) -> bytes:
    padded = payload.ljust(60, b"\0")
    return b"\x55" * 7 + b"\xd5" + padded + struct.pack("<L", zlib.crc32(padded))


def test_mac_tx_matches_reference_framing():
    rng = random.Random(3)
    payloads = [bytes(rng.getrandbits(8) for _ in range(n)) for n in (1, 14, 59, 60, 61, 200)]
    dut = MacTx()
    frames, gaps = [], []

    async def bench(ctx):
        for p in payloads:
            for k, b in enumerate(p):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload.data, b)
                ctx.set(dut.i.payload.last, k == len(p) - 1)
                await ctx.tick().until(dut.i.ready)
            ctx.set(dut.i.valid, 0)
        await ctx.tick().repeat(120)

    async def monitor(ctx):
        cur, idle = bytearray(), 0
        async for _clk, _rst, en, d, er in ctx.tick().sample(dut.tx_en, dut.txd, dut.tx_er):
            assert not er
            if en:
                if not cur and frames:
                    gaps.append(idle)
                cur.append(d)
                idle = 0
            else:
                if cur:
                    frames.append(bytes(cur))
                    cur = bytearray()
                idle += 1

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.add_testbench(monitor, background=True)
    sim.run()
    assert frames == [_reference_wire(p) for p in payloads]
    assert min(gaps) >= 12   # inter-frame gap, back to back


def test_mac_rx_packet_buffer_commits_good_and_counts_bad():
    m = Module()
    m.submodules.rx = rx = MacRx()
    m.submodules.buf = buf = PacketBuffer(depth=256)
    m.d.comb += [buf.i.valid.eq(rx.o.valid), buf.i.payload.eq(rx.o.payload)]
    good = bytes(range(60))
    bad_fcs = bytearray(_reference_wire(good))
    bad_fcs[-1] ^= 1
    runt = b"\x55" * 7 + b"\xd5" + good[:30] + struct.pack("<L", zlib.crc32(good[:30]))
    big = bytes(300)   # does not fit 256 bytes: overflow
    wires = [_reference_wire(good), bytes(bad_fcs), runt, _reference_wire(big),
             _reference_wire(good[::-1])]
    out = []

    async def bench(ctx):
        for w in wires:
            for b in w:
                ctx.set(rx.rx_dv, 1)
                ctx.set(rx.rxd, b)
                await ctx.tick()
            ctx.set(rx.rx_dv, 0)
            await ctx.tick().repeat(12)
        ctx.set(buf.o.ready, 1)
        cur = bytearray()
        for _ in range(400):
            if ctx.get(buf.o.valid):   # transferred at the next edge (ready is high)
                cur.append(ctx.get(buf.o.payload.data))
                if ctx.get(buf.o.payload.last):
                    out.append(bytes(cur))
                    cur = bytearray()
            await ctx.tick()
        assert ctx.get(buf.frames) == 2
        drops = {s: ctx.get(buf.drops[s.value]) for s in RxStatus if s is not RxStatus.OK}
        assert drops == {RxStatus.BAD_FCS: 1, RxStatus.RUNT: 1, RxStatus.GIANT: 0,
                         RxStatus.PHY_ERR: 0, RxStatus.OVERFLOW: 1}

    sim = Simulator(m)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
    assert out == [good, good[::-1]]


def test_packet_buffer_holds_exactly_depth_minus_one_bytes_across_wraps():
    """With the output stalled, a frame of depth - 1 bytes fits; once the read stages have
    taken two bytes out, a 2-byte frame fits and one byte more does not; a frame of
    depth + 1 bytes never fits (``full`` is registered, so the byte that reaches depth
    - 1 still goes in, and the RAM is never overrun). Also after the pointers
    have wrapped several times (``full`` from copies of the read pointer)."""
    D = 16
    dut = PacketBuffer(depth=D)
    out = []

    async def bench(ctx):
        async def send(n, tag):
            for k in range(n):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": (tag + k) & 0xFF, "last": k == n - 1,
                                        "status": RxStatus.OK})
                await ctx.tick()
            ctx.set(dut.i.valid, 0)
            await ctx.tick().repeat(2)

        async def drain():
            ctx.set(dut.o.ready, 1)
            cur = bytearray()
            for _ in range(3 * D):
                if ctx.get(dut.o.valid):
                    cur.append(ctx.get(dut.o.payload.data))
                    if ctx.get(dut.o.payload.last):
                        out.append(bytes(cur))
                        cur = bytearray()
                await ctx.tick()
            ctx.set(dut.o.ready, 0)

        expect = []
        for rnd in range(5):                       # 5 x (15 + 2 + 3) bytes: 3 wraps
            await send(D - 1, 20 * rnd)            # fills the RAM
            expect.append(bytes((20 * rnd + k) & 0xFF for k in range(D - 1)))
            await send(2, 150)                     # the two bytes the read stages freed
            expect.append(bytes([150, 151]))
            await send(1, 200)                     # no room left: dropped
            await drain()
            await send(3, 100 + rnd)               # room again
            expect.append(bytes((100 + rnd + k) & 0xFF for k in range(3)))
            await drain()
        await send(D + 1, 50)                      # never fits
        await drain()
        assert out == expect
        assert ctx.get(dut.frames) == 15
        assert ctx.get(dut.drops[RxStatus.OVERFLOW.value]) == 6

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    sim.add_testbench(bench)
    sim.run()
