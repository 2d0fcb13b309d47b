"""Ethernet/IPv4/UDP receive front end: ARP responder, ICMP echo, INA datagrams.

:class:`Ingress` takes good frames (FCS already checked and stripped) one byte per cycle.
It keeps the first 42 bytes (Ethernet 14 + IPv4 20 + UDP/ICMP 8, or Ethernet + ARP 28) in
a shift register, checks the IPv4 header checksum as the bytes pass, and then:

* ARP request for the board's IP: a 42-byte ARP reply on ``reply`` (the MAC pads it);
* ICMP echo request to the board's IP: the echo reply on ``reply`` (addresses swapped,
  type 0, ICMP checksum updated incrementally per RFC 1624, data copied through);
* UDP to the board's IP and the INA port: the UDP payload on ``ina`` (exactly the UDP
  length, Ethernet padding removed), with the source address in the payload;
* anything else: dropped, and ``drops[reason]`` goes up (see :class:`Drop`).

The UDP checksum is not checked on receive (optional in IPv4); the FCS already covers
the frame on the link.
"""

from amaranth import *
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.fields import INA_UDP_PORT

from .mac import BYTE

__all__ = ["Ingress", "Drop", "INA_RX", "HDR_BYTES"]

HDR_BYTES = 42

#: A byte of an INA datagram (UDP payload) with where it came from.
INA_RX = data.StructLayout({
    "data": 8, "last": 1, "length": 16, "src_mac": 48, "src_ip": 32, "src_port": 16,
})


class Drop(enum.Enum, shape=4):
    """Reasons a good frame is not answered or forwarded."""
    L2_ADDR = 0       # destination MAC is neither ours nor broadcast
    ETHERTYPE = 1     # neither IPv4 nor ARP
    SHORT = 2         # frame ends inside the headers
    ARP = 3           # ARP that is not a request for our IP
    IP_VERSION = 4    # IPv4 EtherType but version != 4
    IP_OPTIONS = 5    # IHL != 5
    IP_CHECKSUM = 6   # bad IPv4 header checksum
    IP_FRAGMENT = 7   # MF set or fragment offset != 0
    IP_ADDR = 8       # IPv4 destination is not our IP
    IP_PROTO = 9      # neither ICMP nor UDP
    ICMP_TYPE = 10    # ICMP other than echo request
    UDP_PORT = 11     # UDP to a port other than the INA port
    UDP_LENGTH = 12   # UDP length < 8 or beyond the IPv4 total length, or empty


N_DROPS = len(Drop)


class Ingress(wiring.Component):
    """Receive front end for one port; see the module docstring.

    Ports: ``i`` (:data:`~hw.eth.mac.BYTE`, good frames), ``reply``
    (:data:`~hw.eth.mac.BYTE`, ARP/ICMP frames to send back on this port), ``ina``
    (:data:`INA_RX`), ``mac``/``ip`` (the board's addresses, as big-endian integers),
    counters ``arp_replies``, ``icmp_replies``, ``ina_packets``, ``truncated`` (INA
    datagrams whose frame ended before the UDP length) and ``drops`` (per :class:`Drop`).
    """

    def __init__(self, counter_width=32, udp_port=INA_UDP_PORT):
        self.udp_port = udp_port
        cw = counter_width
        super().__init__({
            "i": In(stream.Signature(BYTE)),
            "reply": Out(stream.Signature(BYTE)),
            "ina": Out(stream.Signature(INA_RX)),
            "mac": In(48),
            "ip": In(32),
            "arp_replies": Out(cw),
            "icmp_replies": Out(cw),
            "ina_packets": Out(cw),
            "truncated": Out(cw),
            "drops": Out(data.ArrayLayout(cw, N_DROPS)),
        })

    def elaborate(self, platform):
        m = Module()
        hdr = Signal(8 * HDR_BYTES)
        idx = Signal(range(HDR_BYTES + 1))

        def f(offset, nbytes):
            """Bytes ``offset .. offset+nbytes-1`` of the header, big-endian."""
            lo = 8 * (HDR_BYTES - offset - nbytes)
            return hdr[lo:lo + 8 * nbytes]

        inp = self.i.payload

        # IPv4 header checksum over bytes 14..33, summed as the bytes pass, then folded.
        acc = Signal(21)
        fold1 = Signal(17)
        fold2 = Signal(16)
        m.d.sync += [fold1.eq(acc[:16] + acc[16:]), fold2.eq(fold1[:16] + fold1[16])]

        # Checks, registered one cycle before the decision.
        l2_ok = Signal()
        is_arp = Signal()
        is_ip = Signal()
        arp_ok = Signal()
        ip_version_ok = Signal()
        ihl_ok = Signal()
        csum_ok = Signal()
        frag = Signal()
        ip_addr_ok = Signal()
        is_icmp = Signal()
        is_udp = Signal()
        echo = Signal()
        port_ok = Signal()
        udp_len_ok = Signal()
        icmp_csum = Signal(16)   # the echo reply's ICMP checksum (RFC 1624 update)
        udp_len = f(38, 2)
        ip_room = Signal(17)     # IPv4 total length - 20 (wraps like the subtraction)

        out_sr = Signal(8 * HDR_BYTES)
        out_n = Signal(range(HDR_BYTES))
        kind_icmp = Signal()
        remaining = Signal(16)

        # Counters go up one cycle after their event: the decision logic below sets a
        # one-cycle pulse (a flip-flop), and the pulse enables the 32-bit increment. This
        # keeps the adders and their enables off the decision path (timing at 125 MHz).
        counted = [self.arp_replies, self.icmp_replies, self.ina_packets, self.truncated]
        counted += [self.drops[k] for k in range(N_DROPS)]
        event = Signal(len(counted))
        event_r = Signal(len(counted))
        m.d.sync += event_r.eq(event)
        for k, sig in enumerate(counted):
            with m.If(event_r[k]):
                m.d.sync += sig.eq(sig + 1)

        def count(sig):
            m.d.comb += event[next(k for k, c in enumerate(counted) if c is sig)].eq(1)

        def drop(reason):
            m.d.comb += event[4 + reason.value].eq(1)

        ina = self.ina.payload
        meta = Signal(INA_RX)
        m.d.comb += [ina.length.eq(meta.length), ina.src_mac.eq(meta.src_mac),
                     ina.src_ip.eq(meta.src_ip), ina.src_port.eq(meta.src_port)]

        with m.FSM():
            with m.State("HDR"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.sync += [hdr.eq(Cat(inp.data, hdr[:-8])), idx.eq(idx + 1)]
                    with m.If(idx == 0):
                        m.d.sync += acc.eq(0)
                    with m.Elif((idx >= 14) & (idx < 34)):
                        m.d.sync += acc.eq(acc + Mux(idx[0], inp.data, inp.data << 8))
                    with m.If(idx == 18):
                        # Bytes 16..17 (IPv4 total length) are the last two in: the room
                        # for UDP, subtracted here so CHECK only compares (timing).
                        m.d.sync += ip_room.eq(hdr[:16] - 20)
                    with m.If(inp.last):
                        m.d.sync += idx.eq(0)
                        drop(Drop.SHORT)
                    with m.Elif(idx == HDR_BYTES - 1):
                        m.d.sync += idx.eq(0)
                        m.next = "CHECK"
            with m.State("CHECK"):
                ethertype = f(12, 2)
                icmp_sum = f(36, 2) + 0x0800
                m.d.sync += [
                    icmp_csum.eq(Mux(icmp_sum[16], icmp_sum[:16] + 1, icmp_sum[:16])),
                    l2_ok.eq((f(0, 6) == self.mac) | (f(0, 6) == 0xFFFF_FFFF_FFFF)),
                    is_arp.eq(ethertype == 0x0806),
                    is_ip.eq(ethertype == 0x0800),
                    arp_ok.eq((f(14, 2) == 1) & (f(16, 2) == 0x0800) & (f(18, 1) == 6) &
                              (f(19, 1) == 4) & (f(20, 2) == 1) & (f(38, 4) == self.ip)),
                    ip_version_ok.eq(f(14, 1)[4:] == 4),
                    ihl_ok.eq(f(14, 1)[:4] == 5),
                    csum_ok.eq(fold2 == 0xFFFF),
                    frag.eq(f(20, 2)[:14] != 0),
                    ip_addr_ok.eq(f(30, 4) == self.ip),
                    is_icmp.eq(f(23, 1) == 1),
                    is_udp.eq(f(23, 1) == 17),
                    echo.eq((f(34, 1) == 8) & (f(35, 1) == 0)),
                    port_ok.eq(f(36, 2) == self.udp_port),
                    udp_len_ok.eq((udp_len > 8) & (udp_len <= ip_room)),
                ]
                m.next = "DECIDE"
            with m.State("DECIDE"):
                arp_reply = Cat(
                    f(28, 4), f(22, 6),                 # target: the asker
                    self.ip, self.mac,                  # sender: us
                    C(0x0800_0604_0002, 48),            # ptype, hlen, plen, oper=reply
                    C(0x0001, 16), C(0x0806, 16),       # htype, EtherType
                    self.mac, f(6, 6))                  # Ethernet src, dst
                icmp_reply = Cat(
                    f(38, 4), icmp_csum, C(0, 16),      # id/seq, checksum, type 0 code 0
                    f(26, 4), f(30, 4),                 # IPv4 dst = asker, src = us
                    f(14, 12),                          # IPv4 header up to the checksum
                    C(0x0800, 16), self.mac, f(6, 6))
                # The reply and the INA metadata are loaded whatever the decision (they
                # are used only in REPLY and INA), so the decision chain below drives the
                # state and a few pulses, not hundreds of register enables.
                m.d.sync += [
                    out_sr.eq(Mux(is_arp, arp_reply, icmp_reply)), kind_icmp.eq(~is_arp),
                    out_n.eq(0),
                    remaining.eq(udp_len - 8),
                    meta.length.eq(udp_len - 8),
                    meta.src_mac.eq(f(6, 6)),
                    meta.src_ip.eq(f(26, 4)),
                    meta.src_port.eq(f(34, 2)),
                ]
                with m.If(~l2_ok):
                    drop(Drop.L2_ADDR)
                    m.next = "DRAIN"
                with m.Elif(is_arp):
                    with m.If(arp_ok):
                        count(self.arp_replies)
                        m.next = "REPLY"
                    with m.Else():
                        drop(Drop.ARP)
                        m.next = "DRAIN"
                with m.Elif(~is_ip):
                    drop(Drop.ETHERTYPE)
                    m.next = "DRAIN"
                with m.Elif(~ip_version_ok):
                    drop(Drop.IP_VERSION)
                    m.next = "DRAIN"
                with m.Elif(~ihl_ok):
                    drop(Drop.IP_OPTIONS)
                    m.next = "DRAIN"
                with m.Elif(~csum_ok):
                    drop(Drop.IP_CHECKSUM)
                    m.next = "DRAIN"
                with m.Elif(frag):
                    drop(Drop.IP_FRAGMENT)
                    m.next = "DRAIN"
                with m.Elif(~ip_addr_ok):
                    drop(Drop.IP_ADDR)
                    m.next = "DRAIN"
                with m.Elif(is_icmp):
                    with m.If(echo):
                        count(self.icmp_replies)
                        m.next = "REPLY"
                    with m.Else():
                        drop(Drop.ICMP_TYPE)
                        m.next = "DRAIN"
                with m.Elif(~is_udp):
                    drop(Drop.IP_PROTO)
                    m.next = "DRAIN"
                with m.Elif(~port_ok):
                    drop(Drop.UDP_PORT)
                    m.next = "DRAIN"
                with m.Elif(~udp_len_ok):
                    drop(Drop.UDP_LENGTH)
                    m.next = "DRAIN"
                with m.Else():
                    count(self.ina_packets)
                    m.next = "INA"
            with m.State("REPLY"):
                m.d.comb += [self.reply.valid.eq(1),
                             self.reply.payload.data.eq(out_sr[-8:]),
                             self.reply.payload.last.eq((out_n == HDR_BYTES - 1) & ~kind_icmp)]
                with m.If(self.reply.ready):
                    m.d.sync += [out_sr.eq(out_sr << 8), out_n.eq(out_n + 1)]
                    with m.If(out_n == HDR_BYTES - 1):
                        # ARP: done, drain the padding. ICMP: copy the echo data.
                        with m.If(kind_icmp):
                            m.next = "PASS"
                        with m.Else():
                            m.next = "DRAIN"
            with m.State("PASS"):
                m.d.comb += [self.reply.valid.eq(self.i.valid),
                             self.reply.payload.eq(self.i.payload),
                             self.i.ready.eq(self.reply.ready)]
                with m.If(self.i.valid & self.reply.ready & inp.last):
                    m.next = "HDR"
            with m.State("INA"):
                m.d.comb += [self.ina.valid.eq(self.i.valid),
                             ina.data.eq(inp.data),
                             ina.last.eq(inp.last | (remaining == 1)),
                             self.i.ready.eq(self.ina.ready)]
                with m.If(self.i.valid & self.ina.ready):
                    m.d.sync += remaining.eq(remaining - 1)
                    with m.If(inp.last):
                        with m.If(remaining != 1):
                            count(self.truncated)
                        m.next = "HDR"
                    with m.Elif(remaining == 1):
                        m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid & inp.last):
                    m.next = "HDR"
        return m
