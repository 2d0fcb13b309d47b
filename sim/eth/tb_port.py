"""One Ethernet port (hw/eth/port.py) from GMII to the core's word streams.

Frames are built with scapy and sent by cocotbext-eth's GmiiSource (preamble, padding
and FCS by cocotbext-eth, not by us); replies are received by GmiiSink and checked with
scapy's own checksums and zlib's CRC.
"""

import os

import cocotb
from cocotb.triggers import RisingEdge, with_timeout
from scapy.layers.inet import ICMP, IP, UDP, IPOption_NOP, IPOption_Router_Alert
from scapy.layers.l2 import ARP, Ether

from ina_fabric.protocol.fields import INA_UDP_PORT
from ina_fabric.hw.eth.egress import CORE_OUT
from ina_fabric.hw.eth.port import PORT_COUNTERS
from ina_fabric.hw.eth.words import CORE_IN
from ina_fabric.sim.eth.util import TB, frame_bytes, ip2int, mac2int, pack, unpack

BOARD_MAC = "02:00:00:00:00:01"
BOARD_IP = "10.0.0.2"
HOST_MAC = "02:00:00:00:00:10"
HOST_IP = "10.0.0.10"


class PortTB(TB):
    def __init__(self, dut):
        super().__init__(dut, {0: ""})
        dut.mac.value = mac2int(BOARD_MAC)
        dut.ip.value = ip2int(BOARD_IP)
        dut.ina__ready.value = 1
        dut.result__valid.value = 0
        self.beats = []
        cocotb.start_soon(self._monitor())

    async def _monitor(self):
        dut = self.dut
        while True:
            await RisingEdge(dut.clk)
            if int(dut.ina__valid.value) and int(dut.ina__ready.value):
                self.beats.append(unpack(CORE_IN, int(dut.ina__payload.value)))

    def datagrams(self):
        """Complete datagrams seen on ``ina``: [(bytes, first-beat fields)]."""
        out, cur, head = [], b"", None
        for b in self.beats:
            if b["first"]:
                cur, head = b"", b
            cur += b["data"].to_bytes(4, "big")
            if b["last"]:
                out.append((cur[:head["length"]], head))
        return out

    async def send_result(self, payload: bytes, dst_mac, dst_ip, dst_port, ip_checksum):
        dut = self.dut
        words = [payload[i:i + 4].ljust(4, b"\0") for i in range(0, len(payload), 4)]
        for k, w in enumerate(words):
            dut.result__payload.value = pack(
                CORE_OUT, data=int.from_bytes(w, "big"), n=1, first=k == 0,
                last=k == len(words) - 1, length=len(payload), dst_mac=mac2int(dst_mac),
                dst_ip=ip2int(dst_ip), dst_port=dst_port, ip_checksum=ip_checksum)
            dut.result__valid.value = 1
            while True:
                await RisingEdge(dut.clk)
                if int(dut.result__ready.value):
                    break
        dut.result__valid.value = 0

    async def recv(self, timeout_us=100):
        frame = await with_timeout(self.sinks[0].recv(), timeout_us, "us")
        assert frame.check_fcs(), "bad FCS on a transmitted frame"
        assert frame.error is None or not any(frame.error), "tx_er during a frame"
        # GmiiSink starts a frame on the first byte with TX_EN and does not store that
        # byte, so our 7 x 0x55 + SFD shows up as 6 x 0x55 + SFD.
        assert bytes(frame.get_preamble()) == b"\x55" * 6 + b"\xd5"
        return Ether(bytes(frame.get_payload()))


def checksums_ok(pkt):
    """Recompute IPv4/ICMP/UDP checksums with scapy and compare to what we got."""
    ip = pkt[IP]
    again = IP(bytes(ip))
    del again.chksum
    again = IP(bytes(again))
    assert ip.chksum == again.chksum, f"IPv4 checksum {ip.chksum:#x} != {again.chksum:#x}"
    if ICMP in pkt:
        c = pkt[ICMP].copy()
        del c.chksum
        assert pkt[ICMP].chksum == ICMP(bytes(c)).chksum


@cocotb.test()
async def arp_reply(dut):
    tb = PortTB(dut)
    await tb.reset()
    req = Ether(dst="ff:ff:ff:ff:ff:ff", src=HOST_MAC) / ARP(
        op=1, hwsrc=HOST_MAC, psrc=HOST_IP, hwdst="00:00:00:00:00:00", pdst=BOARD_IP)
    await tb.sources[0].send(frame_bytes(req))
    rep = await tb.recv()
    assert rep.dst == HOST_MAC and rep.src == BOARD_MAC and rep.type == 0x0806
    a = rep[ARP]
    assert (a.op, a.hwsrc, a.psrc, a.hwdst, a.pdst) == (2, BOARD_MAC, BOARD_IP, HOST_MAC, HOST_IP)
    assert a.hwtype == 1 and a.ptype == 0x0800 and a.hwlen == 6 and a.plen == 4
    # An ARP request for another address gets no answer and is counted.
    other = req.copy()
    other[ARP].pdst = "10.0.0.99"
    await tb.sources[0].send(frame_bytes(other))
    await tb.cycles(300)
    assert tb.sinks[0].empty()
    c = tb.counters(PORT_COUNTERS)
    assert c["arp_replies"] == 1 and c["drop_arp"] == 1 and c["tx_frames"] == 1


@cocotb.test()
async def ping_reply(dut):
    tb = PortTB(dut)
    await tb.reset()
    for n, size in enumerate((0, 56, 1400)):
        payload = bytes((i * 7 + n) & 0xFF for i in range(size))
        req = Ether(dst=BOARD_MAC, src=HOST_MAC) / IP(src=HOST_IP, dst=BOARD_IP, ttl=64) / \
            ICMP(type=8, id=0x1234, seq=n) / payload
        await tb.sources[0].send(frame_bytes(req))
        rep = await tb.recv()
        assert rep.dst == HOST_MAC and rep.src == BOARD_MAC
        assert rep[IP].src == BOARD_IP and rep[IP].dst == HOST_IP
        assert rep[ICMP].type == 0 and rep[ICMP].code == 0
        assert rep[ICMP].id == 0x1234 and rep[ICMP].seq == n
        assert bytes(rep[ICMP].payload)[:size] == payload
        checksums_ok(rep)
    assert tb.counters(PORT_COUNTERS)["icmp_replies"] == 3


@cocotb.test()
async def ina_rx_and_result_tx(dut):
    tb = PortTB(dut)
    await tb.reset()
    sent = []
    for n, size in enumerate((20, 24, 37, 300, 1472)):
        body = bytes((i * 13 + n) & 0xFF for i in range(size))
        pkt = Ether(dst=BOARD_MAC, src=HOST_MAC) / IP(src=HOST_IP, dst=BOARD_IP) / \
            UDP(sport=40000 + n, dport=INA_UDP_PORT) / body
        sent.append((body, 40000 + n))
        await tb.sources[0].send(frame_bytes(pkt))
    await tb.sources[0].wait()
    await tb.cycles(2000)  # store-and-forward: the last frame leaves after its last byte
    got = tb.datagrams()
    assert len(got) == len(sent)
    for (body, sport), (data, head) in zip(sent, got):
        assert data == body
        assert head["length"] == len(body) and head["src_port"] == sport
        assert head["src_ip"] == ip2int(HOST_IP)
    # A RESULT copy from the core becomes a frame with valid IPv4 checksum and FCS.
    payload = bytes(range(20)) + bytes(64)
    hdr = IP(src=BOARD_IP, dst=HOST_IP, ttl=64, flags="DF", id=0, proto=17,
             len=len(payload) + 28)
    csum = IP(bytes(hdr)).chksum
    await tb.send_result(payload, HOST_MAC, HOST_IP, 5555, csum)
    rep = await tb.recv()
    assert rep.dst == HOST_MAC and rep.src == BOARD_MAC
    assert rep[IP].src == BOARD_IP and rep[IP].dst == HOST_IP and rep[IP].ttl == 64
    assert rep[UDP].sport == INA_UDP_PORT and rep[UDP].dport == 5555
    assert rep[UDP].len == len(payload) + 8
    assert bytes(rep[UDP].payload)[:len(payload)] == payload
    checksums_ok(rep)


@cocotb.test()
async def drops_counted(dut):
    tb = PortTB(dut)
    await tb.reset()
    eth = Ether(dst=BOARD_MAC, src=HOST_MAC)
    ip = IP(src=HOST_IP, dst=BOARD_IP)
    good = eth / ip / UDP(sport=1, dport=INA_UDP_PORT) / bytes(24)
    cases = []
    f = frame_bytes(good)
    f.data[-1] ^= 0xFF
    cases.append(("rx_bad_fcs", f))
    from cocotbext.eth import GmiiFrame
    cases.append(("rx_runt", GmiiFrame.from_payload(bytes(good)[:40], min_len=0)))
    cases.append(("rx_giant", frame_bytes(eth / ip / UDP(dport=INA_UDP_PORT) / bytes(1500))))
    cases.append(("drop_ethertype", frame_bytes(Ether(dst=BOARD_MAC, src=HOST_MAC, type=0x86DD)
                                                / bytes(60))))
    cases.append(("drop_ip_options", frame_bytes(
        eth / IP(src=HOST_IP, dst=BOARD_IP, options=[IPOption_Router_Alert(), IPOption_NOP()])
        / UDP(dport=INA_UDP_PORT) / bytes(24))))
    cases.append(("drop_ip_checksum", frame_bytes(
        eth / IP(src=HOST_IP, dst=BOARD_IP, chksum=0x1234) / UDP(dport=INA_UDP_PORT) / bytes(24))))
    cases.append(("drop_l2_addr", frame_bytes(Ether(dst="02:00:00:00:00:99", src=HOST_MAC)
                                              / ip / UDP(dport=INA_UDP_PORT) / bytes(24))))
    cases.append(("drop_ip_addr", frame_bytes(eth / IP(src=HOST_IP, dst="10.0.0.3")
                                              / UDP(dport=INA_UDP_PORT) / bytes(24))))
    cases.append(("drop_udp_port", frame_bytes(eth / ip / UDP(dport=53) / bytes(24))))
    cases.append(("drop_ip_fragment", frame_bytes(eth / IP(src=HOST_IP, dst=BOARD_IP, flags="MF")
                                                  / UDP(dport=INA_UDP_PORT) / bytes(24))))
    cases.append(("drop_ip_proto", frame_bytes(eth / IP(src=HOST_IP, dst=BOARD_IP, proto=6)
                                               / bytes(40))))
    cases.append(("drop_icmp_type", frame_bytes(eth / ip / ICMP(type=13) / bytes(20))))
    # UDP length one byte beyond the IPv4 payload (the good frame's 32 is exactly it).
    cases.append(("drop_udp_length", frame_bytes(eth / ip / UDP(sport=1, dport=INA_UDP_PORT,
                                                               len=33) / bytes(24))))
    for _, frame in cases:
        await tb.sources[0].send(frame)
    await tb.sources[0].send(frame_bytes(good))
    await tb.sources[0].wait()
    await tb.cycles(300)
    c = tb.counters(PORT_COUNTERS)
    for name, _ in cases:
        assert c[name] == 1, f"{name}: {c[name]} (counters {c})"
    assert c["ina_packets"] == 1 and c["rx_frames"] == len(cases) - 3 + 1
    assert len(tb.datagrams()) == 1 and tb.datagrams()[0][0] == bytes(24)
    assert tb.sinks[0].empty()
