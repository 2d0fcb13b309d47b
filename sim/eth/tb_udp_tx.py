"""Bench of :class:`~ina_fabric.hw.eth.egress.UdpTx`: RESULT copies of every length
modulo 4 (word beats, idle cycles between them) to frames, taken a byte at a time with
backpressure; every frame against scapy's (Ethernet, IPv4 with DF and TTL 64, UDP with
checksum 0), the IPv4 checksum given the block being scapy's."""

import cocotb
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from ina_fabric.hw.eth.egress import CORE_OUT
from ina_fabric.hw.eth.mac import BYTE
from ina_fabric.protocol.fields import INA_UDP_PORT
from ina_fabric.sim.bench import Bench, bench_params


def _mac(v):
    return ":".join(f"{(v >> (8 * k)) & 255:02x}" for k in reversed(range(6)))


def _ip(v):
    return ".".join(str((v >> (8 * k)) & 255) for k in reversed(range(4)))


@cocotb.test()
async def test_udp_tx(dut):
    p = bench_params()
    b = Bench(dut, seed=p["seed"])
    src = b.source("i", CORE_OUT, idle=p["idle"])
    snk = b.sink("o", BYTE, backpressure=p["bp"])
    mac, ip = b.rng.getrandbits(48) & ~(1 << 40), b.rng.getrandbits(32)
    await b.reset(mac=mac, ip=ip)
    want = []
    for _ in range(p["n"]):
        n = b.rng.randint(1, 70)
        body = bytes(b.rng.getrandbits(8) for _ in range(n))
        dmac, dip, dport = b.rng.getrandbits(48), b.rng.getrandbits(32), b.rng.getrandbits(16)
        frame = (Ether(dst=_mac(dmac), src=_mac(mac), type=0x0800)
                 / IP(src=_ip(ip), dst=_ip(dip), flags="DF", ttl=64, id=0)
                 / UDP(sport=INA_UDP_PORT, dport=dport, chksum=0) / body)
        raw = bytes(frame)
        ck = int.from_bytes(raw[24:26], "big")      # scapy's IPv4 header checksum
        words = [int.from_bytes(body[j:j + 4].ljust(4, b"\0"), "big") for j in range(0, n, 4)]
        src.send([{"data": w, "n": 1, "first": int(j == 0), "last": int(j == len(words) - 1),
                   "length": n, "dst_mac": dmac, "dst_ip": dip, "dst_port": dport,
                   "ip_checksum": ck} for j, w in enumerate(words)])
        want.append(raw)
    total = sum(len(w) for w in want)
    await b.run_until(lambda: len(snk.got) == total, 30 * total + 200)
    got, cur = [], []
    for x in snk.got:
        cur.append(x["data"])
        if x["last"]:
            got.append(bytes(cur))
            cur = []
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"frame {k}: {g.hex()} != {w.hex()}"
