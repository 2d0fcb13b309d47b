"""Bench of :class:`~ina_fabric.hw.eth.rgmii.RgmiiPhy`: GMII <-> RGMII both ways, on the
ECP5 primitives the board build uses, with and without the ``DELAYG`` taps.

Why behavioural models: ``RgmiiPhy`` is the one block that needs the FPGA. Its DDR
inputs and outputs are ECP5 primitives (``IDDRX1F``, ``ODDRX1F``, ``DELAYG``, and the
``IB``/``OBZ`` pads and ``FD1S3AX``/``OFS1P3DX`` enable flip-flops that amaranth's
Lattice platform puts around ``io.DDRBuffer``), for which yosys ships only black boxes
and Icarus has no model. So the block is elaborated with amaranth's own ECP5 buffer
classes (``LatticePlatform.get_io_buffer`` on a bench platform of family ``ecp5``: the
same instances the bitstream gets) and simulated against the small Verilog models in
:data:`PRIMITIVES`, written from Lattice's descriptions (TN1265): ``IDDRX1F`` samples D on
the rising (Q0) and the following falling (Q1) edge of SCLK and presents the pair at the
next rising edge; ``ODDRX1F`` takes D0/D1 at a rising edge and drives D0 for the high and
D1 for the low half of the next cycle. ``DELAYG`` is a wire here: with no clock
insertion delay in simulation, its 25 ps taps are a timing matter for the board (the
bench checks that the taps are wired, not their picoseconds). The models are used by
this bench only.

The bench is the PHY on the other side. Receive: center-aligned DDR nibbles (rising edge
``rxd[3:0]`` and RX_DV, falling edge ``rxd[7:4]`` and RX_DV xor RX_ER, changing a
quarter period after each edge), frames of random bytes with errors and carrier
extension between idle gaps; ``rx_dv``, ``rx_er``, ``rxd`` must show the same sequence in
the receive domain (after a fixed latency; ``rxd`` compared where DV or ER). Transmit: a
random GMII sequence on ``tx_en``, ``tx_er``, ``txd`` in the transmit domain; the bench
samples the pins a quarter period after each edge of the forwarded ``tx_clk`` (the PHY's
2 ns) and decodes the same sequence. The active-low PHY reset pin follows ``rst``.
"""

import pathlib

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge, Timer

from ina_fabric.sim.bench import bench_params

#: behavioural models of the ECP5 primitives the block instantiates (bench only)
PRIMITIVES = r"""
`timescale 1ns/1ps
module IB(input I, output O);
  assign O = I;
endmodule
module OBZ(input I, input T, output O);
  assign O = T ? 1'bz : I;
endmodule
module DELAYG(input A, output Z);
  parameter DEL_MODE = "USER_DEFINED";
  parameter DEL_VALUE = 0;
  assign Z = A;
endmodule
module FD1S3AX(input CK, input D, output reg Q);
  parameter GSR = "ENABLED";
  always @(posedge CK) Q <= D;
endmodule
module OFS1P3DX(input SCLK, input SP, input CD, input D, output reg Q);
  parameter GSR = "ENABLED";
  always @(posedge SCLK or posedge CD)
    if (CD) Q <= 1'b0; else if (SP) Q <= D;
endmodule
module IDDRX1F(input D, input SCLK, input RST, output reg Q0, output reg Q1);
  parameter GSR = "ENABLED";
  reg rise, fall;
  always @(posedge SCLK) rise <= D;
  always @(negedge SCLK) fall <= D;
  always @(posedge SCLK) begin Q0 <= rise; Q1 <= fall; end
endmodule
module ODDRX1F(input SCLK, input RST, input D0, input D1, output reg Q);
  parameter GSR = "ENABLED";
  reg d0, d1, hold;
  always @(posedge SCLK) begin d0 <= D0; d1 <= D1; Q <= d0; hold <= d1; end
  always @(negedge SCLK) Q <= hold;
endmodule
"""


class Pins:
    """An ``eth_rgmii`` resource's pins as top-level ports (the reset active-low, as
    the boards' resources have it)."""

    def __init__(self):
        from amaranth.hdl import IOPort
        from amaranth.lib import io
        for name, width in (("rx_clk", 1), ("rx_ctl", 1), ("rx_data", 4), ("tx_clk", 1),
                            ("tx_ctl", 1), ("tx_data", 4)):
            setattr(self, name, io.SingleEndedPort(IOPort(width, name=f"rgmii_{name}")))
        self.rst = io.SingleEndedPort(IOPort(1, name="rgmii_rst_n"), invert=True)


class Ecp5BenchPlatform:
    """Only what elaboration asks of a platform: amaranth's ECP5 I/O buffers."""
    family = "ecp5"

    def get_io_buffer(self, buffer):
        from amaranth.vendor import LatticePlatform
        return LatticePlatform.get_io_buffer(self, buffer)


def sources(component, toplevel: str, build_dir: pathlib.Path) -> list:
    """The block's Verilog (elaborated on :class:`Ecp5BenchPlatform`) and the models."""
    from amaranth.back import verilog
    from ina_fabric.sim.common import kick_comb
    build_dir.mkdir(parents=True, exist_ok=True)
    top = build_dir / f"{toplevel}.v"
    top.write_text(kick_comb(verilog.convert(component, name=toplevel, emit_src=False,
                                              platform=Ecp5BenchPlatform())))
    prims = build_dir / "ecp5_primitives.v"
    prims.write_text(PRIMITIVES)
    return [prims, top]


def _rand_stream(rng, n, idle):
    """``n`` GMII cycles ``(dv, er, byte)``: frames (some bytes with an error) and gaps
    (idle, and carrier extension: DV 0, ER 1)."""
    out = []
    while len(out) < n:
        for _ in range(rng.randint(1, 8) if rng.random() < idle else 1):
            out.append((0, int(rng.random() < 0.2), rng.getrandbits(8)))
        for _ in range(rng.randint(1, 24)):
            out.append((1, int(rng.random() < 0.05), rng.getrandbits(8)))
    return out[:n]


def _aligned(got, want, what):
    """``got`` holds ``want`` after some fixed latency (bytes compared where DV or ER)."""
    def same(g, w):
        return g[:2] == w[:2] and (not (w[0] or w[1]) or g[2] == w[2])
    for lat in range(8):
        if len(got) >= lat + len(want) and all(same(g, w) for g, w in zip(got[lat:], want)):
            return lat
    first_bad = next((k for k, (g, w) in enumerate(zip(got, want)) if not same(g, w)), None)
    raise AssertionError(f"{what}: the sequence does not come through at any latency "
                         f"0..7 (unaligned, first difference at {first_bad}: got "
                         f"{got[first_bad:first_bad + 4] if first_bad is not None else None}"
                         f", want {want[first_bad:first_bad + 4] if first_bad is not None else None})")


def _val(sig):
    v = sig.value
    return int(v) if v.is_resolvable else None


@cocotb.test()
async def test_rgmii_phy(dut):
    import random
    p = bench_params()
    rng = random.Random(p["seed"])
    n = p["n"]
    tx_ns, rx_ns = p.get("tx_period_ns", 8), p.get("rx_period_ns", 8)
    cocotb.start_soon(Clock(dut.tx_clk, tx_ns, unit="ns").start())
    dut.rgmii_rx_clk.value = 0
    dut.rgmii_rx_ctl.value = 0
    dut.rgmii_rx_data.value = 0
    dut.tx_en.value = 0
    dut.tx_er.value = 0
    dut.txd.value = 0
    dut.rst.value = 1
    dut.tx_rst.value = 1
    await Timer(3, unit="ns")                   # the receive clock out of phase
    cocotb.start_soon(Clock(dut.rgmii_rx_clk, rx_ns, unit="ns").start())
    for _ in range(4):
        await RisingEdge(dut.tx_clk)
    assert _val(dut.rgmii_rst_n) == 0, "the PHY's reset pin is not low in reset"
    dut.rst.value = 0
    dut.tx_rst.value = 0
    for _ in range(4):
        await RisingEdge(dut.tx_clk)
    assert _val(dut.rgmii_rst_n) == 1, "the PHY's reset pin is not high out of reset"

    # receive: the bench drives center-aligned nibbles, and reads GMII in the rx domain
    rx_want = [(0, 0, 0)] * 4 + _rand_stream(rng, n, p.get("idle", 0.5)) + [(0, 0, 0)] * 8
    rx_got = []

    async def rx_drive():
        q = rx_ns / 4
        for dv, er, byte in rx_want:
            await FallingEdge(dut.rgmii_rx_clk)         # the rising edge's half
            await Timer(q, unit="ns")
            dut.rgmii_rx_data.value = byte & 15
            dut.rgmii_rx_ctl.value = dv
            await RisingEdge(dut.rgmii_rx_clk)          # the falling edge's half
            await Timer(q, unit="ns")
            dut.rgmii_rx_data.value = byte >> 4
            dut.rgmii_rx_ctl.value = dv ^ er

    async def rx_watch():
        while True:
            await RisingEdge(dut.rgmii_rx_clk)
            rx_got.append((_val(dut.rx_dv), _val(dut.rx_er), _val(dut.rxd)))

    # transmit: the bench drives GMII in the tx domain, and reads the pins as the PHY
    tx_want = [(0, 0, 0)] * 4 + _rand_stream(rng, n, p.get("idle", 0.5)) + [(0, 0, 0)] * 8
    tx_got = []

    async def tx_drive():
        for en, er, byte in tx_want:
            await RisingEdge(dut.tx_clk)
            dut.tx_en.value, dut.tx_er.value, dut.txd.value = en, er, byte

    async def tx_watch():
        q = tx_ns / 4
        while True:
            await RisingEdge(dut.rgmii_tx_clk)
            await Timer(q, unit="ns")
            lo, c0 = _val(dut.rgmii_tx_data), _val(dut.rgmii_tx_ctl)
            await FallingEdge(dut.rgmii_tx_clk)
            await Timer(q, unit="ns")
            hi, c1 = _val(dut.rgmii_tx_data), _val(dut.rgmii_tx_ctl)
            if None in (lo, c0, hi, c1):
                tx_got.append((None, None, None))
            else:
                tx_got.append((c0, c0 ^ c1, lo | (hi << 4)))

    cocotb.start_soon(rx_watch())
    cocotb.start_soon(tx_watch())
    rx = cocotb.start_soon(rx_drive())
    tx = cocotb.start_soon(tx_drive())
    await rx
    await tx
    for _ in range(10):
        await RisingEdge(dut.tx_clk)
    # the watchers started before the drivers: drop what they saw before the first cycle
    rx_lat = _aligned(rx_got, rx_want, "receive (RGMII -> GMII)")
    tx_lat = _aligned(tx_got, tx_want, "transmit (GMII -> RGMII)")
    frames = sum(1 for a, b in zip(rx_want, rx_want[1:]) if b[0] and not a[0])
    assert frames >= 2, f"the receive stream has {frames} frames"
    dut._log.info(f"latencies (cycles from the watchers' start): rx {rx_lat}, tx {tx_lat}; "
                  f"{len(rx_want)} rx and {len(tx_want)} tx cycles, {frames} rx frames")
