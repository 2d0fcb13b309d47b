"""Helpers shared by the Ethernet benches: flat stream payloads <-> dicts, frame builders,
and a ``TB`` that starts the clocks and hangs cocotbext-eth GMII models on each port."""

import ipaddress
import logging

from amaranth.lib import data
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge, Timer
from cocotbext.eth import GmiiFrame, GmiiSink, GmiiSource

__all__ = ["unpack", "pack", "ip2int", "mac2int", "TB", "frame_bytes", "CORE_PERIOD_NS"]

#: core, transmit and receive clocks: 125 MHz (8 ns)
CORE_PERIOD_NS = 8
#: the board top's ``core`` domain (INA core behind AsyncFIFOs): 14 ns = 71.4 MHz, a
#: little slower than the FPGA's 75 MHz (constraints/versa_ecp5.toml), so the line-rate
#: bench is conservative.
INA_CORE_PERIOD_NS = 14


def _fields(layout):
    for name, field in data.Layout.cast(layout):
        yield name, field.offset, data.Layout.cast(field.shape).size \
            if isinstance(field.shape, data.Layout) else field.width


def unpack(layout, value: int) -> dict:
    """A flat payload integer to ``{field: int}``."""
    return {name: (value >> off) & ((1 << width) - 1) for name, off, width in _fields(layout)}


def pack(layout, **values) -> int:
    out = 0
    for name, off, width in _fields(layout):
        out |= (int(values.get(name, 0)) & ((1 << width) - 1)) << off
    return out


def ip2int(ip: str) -> int:
    return int(ipaddress.IPv4Address(ip))


def mac2int(mac: str) -> int:
    return int(mac.replace(":", ""), 16)


def frame_bytes(pkt) -> GmiiFrame:
    """A scapy packet as a GMII frame with preamble, padding and a correct FCS."""
    return GmiiFrame.from_payload(bytes(pkt))


class TB:
    """Clocks and GMII models. ``ports`` maps a port number to the signal-name prefix of
    its GMII pins on the top (``""`` for a single-port top, ``"p0_"`` for the board)."""

    def __init__(self, dut, ports):
        self.dut = dut
        self.sources = {}
        self.sinks = {}
        for p, prefix in ports.items():
            for name in ("rxd", "rx_er", "rx_dv"):
                getattr(dut, f"{prefix}{name}").value = 0
        Clock(dut.clk, CORE_PERIOD_NS, unit="ns").start()
        # The board top's INA core runs in its own slower ``core`` domain.
        self.core_domain = hasattr(dut, "core_clk")
        if self.core_domain:
            Clock(dut.core_clk, INA_CORE_PERIOD_NS, unit="ns").start()
        for p, prefix in ports.items():
            rx_clk = getattr(dut, f"eth_rx{p}_clk")
            tx_clk = getattr(dut, f"eth_tx{p}_clk")
            Clock(rx_clk, CORE_PERIOD_NS, unit="ns").start()
            Clock(tx_clk, CORE_PERIOD_NS, unit="ns").start()
            self.sources[p] = GmiiSource(getattr(dut, f"{prefix}rxd"),
                                         getattr(dut, f"{prefix}rx_er"),
                                         getattr(dut, f"{prefix}rx_dv"),
                                         rx_clk, getattr(dut, f"eth_rx{p}_rst"))
            self.sinks[p] = GmiiSink(getattr(dut, f"{prefix}txd"),
                                     getattr(dut, f"{prefix}tx_er"),
                                     getattr(dut, f"{prefix}tx_en"),
                                     tx_clk, getattr(dut, f"eth_tx{p}_rst"))
        self.ports = ports
        for model in (*self.sources.values(), *self.sinks.values()):
            model.log.setLevel(logging.WARNING)

    async def reset(self):
        rsts = [self.dut.rst] + ([self.dut.core_rst] if self.core_domain else []) + [getattr(self.dut, f"eth_{d}{p}_rst")
                                 for p in self.ports for d in ("rx", "tx")]
        for r in rsts:
            r.value = 1
        for _ in range(5):
            await RisingEdge(self.dut.clk)
        if self.core_domain:
            for _ in range(3):
                await RisingEdge(self.dut.core_clk)
        for r in rsts:
            r.value = 0
        for _ in range(5):
            await RisingEdge(self.dut.clk)

    async def cycles(self, n):
        for _ in range(n):
            await RisingEdge(self.dut.clk)

    def counters(self, names, value=None, prefix="", width=32):
        """Read a flat counter array port as ``{name: value}``."""
        v = int(getattr(self.dut, f"{prefix}counters").value) if value is None else value
        return {n: (v >> (width * i)) & ((1 << width) - 1) for i, n in enumerate(names)}

