"""Bench of :class:`~ina_fabric.hw.eth.ingress.Ingress`: frames built by scapy (ARP
requests for the board and for others, ICMP echo requests and other ICMP, INA datagrams
with Ethernet padding, and frames each drop reason names), sent a byte at a time with
idle cycles, both outputs under backpressure. ARP and echo replies are parsed by scapy
(addresses, type, id, sequence, data, and both checksums as scapy computes them), INA
datagrams compared byte for byte with their UDP payload and source, and every counter
and drop reason against what was sent."""

import cocotb
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether

from ina_fabric.hw.eth.ingress import INA_RX, Drop
from ina_fabric.hw.eth.mac import BYTE
from ina_fabric.protocol.fields import INA_UDP_PORT
from ina_fabric.sim.bench import Bench, bench_params
from ina_fabric.sim.eth.util import ip2int, mac2int

MAC, IPA = "02:00:00:00:41:0a", "198.18.0.1"
PEER_MAC, PEER = "02:00:00:00:41:0b", "198.18.0.2"


def _frame(rng, kind):
    """(scapy packet, what the bench expects: ("arp"|"icmp"|"ina"|Drop))."""
    eth = Ether(dst=MAC, src=PEER_MAC)
    data = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40)))
    if kind == "arp":
        return Ether(dst="ff:ff:ff:ff:ff:ff", src=PEER_MAC) / ARP(
            op=1, hwsrc=PEER_MAC, psrc=PEER, pdst=IPA), "arp"
    if kind == "arp_other":
        return Ether(dst="ff:ff:ff:ff:ff:ff", src=PEER_MAC) / ARP(
            op=1, hwsrc=PEER_MAC, psrc=PEER, pdst="198.18.0.9"), Drop.ARP
    if kind == "icmp":
        return eth / IP(src=PEER, dst=IPA) / ICMP(type=8, id=rng.getrandbits(16),
                                                  seq=rng.getrandbits(16)) / data, "icmp"
    if kind == "icmp_other":
        return eth / IP(src=PEER, dst=IPA) / ICMP(type=13) / data, Drop.ICMP_TYPE
    if kind == "ina":
        return eth / IP(src=PEER, dst=IPA) / UDP(sport=rng.getrandbits(16),
                                                 dport=INA_UDP_PORT) / (data or b"x"), "ina"
    if kind == "udp_port":
        return eth / IP(src=PEER, dst=IPA) / UDP(dport=INA_UDP_PORT + 1) / data, Drop.UDP_PORT
    if kind == "l2":
        return Ether(dst="02:00:00:00:00:99", src=PEER_MAC) / IP(src=PEER, dst=IPA) / UDP(
            dport=INA_UDP_PORT) / data, Drop.L2_ADDR
    if kind == "ip_addr":
        return eth / IP(src=PEER, dst="198.18.0.7") / UDP(dport=INA_UDP_PORT) / data, Drop.IP_ADDR
    if kind == "checksum":
        return eth / IP(src=PEER, dst=IPA, chksum=0x1234) / UDP(dport=INA_UDP_PORT) / data, \
            Drop.IP_CHECKSUM
    if kind == "fragment":
        return eth / IP(src=PEER, dst=IPA, flags="MF") / UDP(dport=INA_UDP_PORT) / data, \
            Drop.IP_FRAGMENT
    if kind == "proto":
        return eth / IP(src=PEER, dst=IPA, proto=47) / data, Drop.IP_PROTO
    # (ends inside the IPv4 header: shorter than a MAC sends, which pads to 60 bytes)
    return Ether(dst=MAC, src=PEER_MAC, type=0x0800) / (b"\x45" + bytes(15)), Drop.SHORT


def _bytes(pkt):
    raw = bytes(pkt)
    return raw + b"\0" * max(0, 60 - len(raw))       # (the MAC pads to 60 bytes)


@cocotb.test()
async def test_ingress(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", BYTE, idle=p["idle"])
    rep = b.sink("reply", BYTE, backpressure=p["bp"])
    ina = b.sink("ina", INA_RX, backpressure=p["bp"])
    await b.reset(mac=mac2int(MAC), ip=ip2int(IPA))
    kinds = ["arp", "icmp", "ina", "ina", "arp_other", "icmp_other", "udp_port", "l2",
             "ip_addr", "checksum", "fragment", "proto", "short"]
    want_rep, want_ina, drops = [], [], {}
    for k in range(p["n"]):
        pkt, what = _frame(b.rng, kinds[k % len(kinds)] if k < len(kinds) else b.rng.choice(kinds))
        raw = _bytes(pkt) if what != Drop.SHORT else bytes(pkt)
        src.send([{"data": x, "last": int(j == len(raw) - 1)} for j, x in enumerate(raw)])
        if what in ("arp", "icmp"):
            want_rep.append((what, pkt))
        elif what == "ina":
            want_ina.append((bytes(pkt[UDP].payload), pkt[UDP].sport))
        else:
            drops[what] = drops.get(what, 0) + 1
    n_ina = sum(len(x) for x, _ in want_ina)
    await b.run_until(lambda: src.done and len(ina.got) == n_ina
                      and sum(x["last"] for x in rep.got) == len(want_rep), 200_000)
    await b.step(50)
    got, cur = [], bytearray()
    for x in rep.got:
        cur.append(x["data"])
        if x["last"]:
            got.append(Ether(bytes(cur)))
            cur = bytearray()
    assert len(got) == len(want_rep)
    for k, (g, (what, req)) in enumerate(zip(got, want_rep)):
        assert g.dst == PEER_MAC and g.src == MAC, f"reply {k}: MACs"
        if what == "arp":
            assert g[ARP].op == 2 and g[ARP].psrc == IPA and g[ARP].hwsrc == MAC \
                and g[ARP].pdst == PEER and g[ARP].hwdst == PEER_MAC, f"reply {k}: ARP"
        else:
            assert g[IP].src == IPA and g[IP].dst == PEER and g[ICMP].type == 0
            assert (g[ICMP].id, g[ICMP].seq) == (req[ICMP].id, req[ICMP].seq)
            assert bytes(g[ICMP].payload)[:len(req[ICMP].payload)] == bytes(req[ICMP].payload)
            ck_ip, ck_icmp = g[IP].chksum, g[ICMP].chksum
            g2 = Ether(bytes(g))
            del g2[IP].chksum, g2[ICMP].chksum
            g2 = Ether(bytes(g2))
            assert (g2[IP].chksum, g2[ICMP].chksum) == (ck_ip, ck_icmp), f"reply {k}: checksums"
    pos = 0
    for k, (body, sport) in enumerate(want_ina):
        xs = ina.got[pos:pos + len(body)]
        pos += len(body)
        assert bytes(x["data"] for x in xs) == body, f"INA datagram {k}"
        assert xs[-1]["last"] and not any(x["last"] for x in xs[:-1])
        assert all(x["length"] == len(body) and x["src_port"] == sport
                   and x["src_ip"] == ip2int(PEER) and x["src_mac"] == mac2int(PEER_MAC)
                   for x in xs), f"INA datagram {k}: fields"
    assert b.rd("arp_replies") == sum(w == "arp" for w, _ in want_rep)
    assert b.rd("icmp_replies") == sum(w == "icmp" for w, _ in want_rep)
    assert b.rd("ina_packets") == len(want_ina)
    d = b.rd("drops")
    for r in Drop:
        assert (d >> (32 * r.value)) & 0xFFFFFFFF == drops.get(r, 0), f"drops[{r.name}]"
