"""Transmit side of the front end: route RESULT copies to a port, add Ethernet/IPv4/UDP.

* :class:`Router` sends each RESULT copy from the core to port 0 when its destination
  is in the worker subnet (``net``/``mask``) or is an IP multicast group, and to port 1
  (the uplink) otherwise.
* :class:`UdpTx` turns one copy (``hw.ina.layout.out_layout(1)`` beats, destination
  and IPv4 header checksum in the payload) into an Ethernet frame, one byte per cycle:
  source MAC/IP are the board's, source port the INA port, UDP checksum 0 (allowed in
  IPv4), TTL 64, DF set, as ``hw/ina/replicator.py``'s checksum assumes.
"""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.fields import INA_UDP_PORT
from ina_fabric.hw.ina.layout import out_layout

from .ingress import HDR_BYTES
from .mac import BYTE

__all__ = ["Router", "UdpTx", "CORE_OUT"]

CORE_OUT = out_layout(1)


class Router(wiring.Component):
    """Splits the core's output into ``o0`` (workers) and ``o1`` (uplink), per packet."""
    i: In(stream.Signature(CORE_OUT))
    o0: Out(stream.Signature(CORE_OUT))
    o1: Out(stream.Signature(CORE_OUT))
    net: In(32)
    mask: In(32)

    def elaborate(self, platform):
        m = Module()
        p = self.i.payload
        held = Signal()
        to1 = Signal()
        decide = ~((p.dst_ip & self.mask) == (self.net & self.mask)) & ~p.mcast
        port1 = Mux(held, to1, decide)
        m.d.comb += [
            self.o0.payload.eq(p), self.o1.payload.eq(p),
            self.o0.valid.eq(self.i.valid & ~port1), self.o1.valid.eq(self.i.valid & port1),
            self.i.ready.eq(Mux(port1, self.o1.ready, self.o0.ready)),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(~p.last), to1.eq(port1)]
        return m


class UdpTx(wiring.Component):
    """One RESULT copy (word beats) to an Ethernet frame (bytes, no FCS)."""
    i: In(stream.Signature(CORE_OUT))
    o: Out(stream.Signature(BYTE))
    mac: In(48)
    ip: In(32)

    def __init__(self, udp_port=INA_UDP_PORT):
        self.udp_port = udp_port
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        p = self.i.payload
        sr = Signal(8 * HDR_BYTES)
        n = Signal(range(HDR_BYTES))
        remaining = Signal(16)
        rem1 = Signal()          # remaining == 1, kept as a flip-flop (timing: the ready path)
        j = Signal(2)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.i.valid):
                    m.d.sync += [
                        sr.eq(Cat(
                            C(0, 16), (p.length + 8)[:16], p.dst_port, C(self.udp_port, 16),
                            p.dst_ip, self.ip, p.ip_checksum,
                            C(0x4011, 16), C(0x4000, 16), C(0, 16), (p.length + 28)[:16],
                            C(0x4500, 16), C(0x0800, 16), self.mac, p.dst_mac)),
                        n.eq(0), remaining.eq(p.length), rem1.eq(p.length == 1), j.eq(0),
                    ]
                    m.next = "HDR"
            with m.State("HDR"):
                m.d.comb += [self.o.valid.eq(1), self.o.payload.data.eq(sr[-8:])]
                with m.If(self.o.ready):
                    m.d.sync += [sr.eq(sr << 8), n.eq(n + 1)]
                    with m.If(n == HDR_BYTES - 1):
                        m.next = "BODY"
            with m.State("BODY"):
                word = p.data[0]
                end_of_word = (j == 3) | rem1
                m.d.comb += [
                    self.o.valid.eq(self.i.valid),
                    self.o.payload.data.eq(word.word_select(~j, 8)),
                    self.o.payload.last.eq(rem1),
                    self.i.ready.eq(self.o.ready & end_of_word),
                ]
                with m.If(self.i.valid & self.o.ready):
                    m.d.sync += [j.eq(j + 1), remaining.eq(remaining - 1),
                                 rem1.eq(remaining == 2)]
                    with m.If(rem1):
                        with m.If(p.last):
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "DISCARD"
            with m.State("DISCARD"):
                # More beats than the length said (the core never does this).
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid & p.last):
                    m.next = "IDLE"
        return m
