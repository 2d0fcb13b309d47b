"""The whole board datapath (hw/boards/datapath.py: two ports, the INA core, the config
ROM) driven with Ethernet frames on both GMII ports, checked against the reference model.

Environment: ``BOARD_TEST_JOB`` (JSON of the job the top was built with),
``LINE_RATE_SEQS`` (seqs in the line-rate test), ``PCAP`` (where to write the capture).
"""

import json
import os
import random

import cocotb
import numpy as np
from cocotb.triggers import RisingEdge, with_timeout
from scapy.layers.inet import ICMP, IP, UDP, IPOption_NOP
from scapy.layers.l2 import ARP, Ether
from scapy.utils import wrpcap
from cocotbext.eth import GmiiFrame

from ina_fabric.host.switch.model import SwitchModel
from ina_fabric.protocol.jobtable import GATEWARE_MODES
from ina_fabric.protocol.fields import INA_UDP_PORT
from ina_fabric.protocol.jobtable import JobConfig
from ina_fabric.protocol.numpy_view import pack
from ina_fabric.hw.eth.port import PORT_COUNTERS
from ina_fabric.hw.ina.regs import COUNTER_NAMES, counter_addr
from ina_fabric.sim.eth.util import TB, frame_bytes

BOARD_MAC = os.environ.get("BOARD_MAC", "02:1a:00:00:00:01")
BOARD_IP = os.environ.get("BOARD_IP", "10.0.0.2")


def job_from_env() -> JobConfig:
    d = json.loads(os.environ["BOARD_TEST_JOB"])
    return JobConfig(d["job"], tuple(d["members"]), window=d["window"],
                     elements=d["elements"], mode="reliable", session=d["session"])


def port_of(ip: str) -> int:
    """The board's routing rule for the test configuration (worker_net 10.0.0.0/24)."""
    return 0 if ip.startswith("10.0.0.") else 1


class BoardTB(TB):
    def __init__(self, dut):
        super().__init__(dut, {0: "p0_", 1: "p1_"})
        dut.cfg_addr.value = 0
        self.job = job_from_env()
        self.model = SwitchModel([self.job], modes=GATEWARE_MODES)
        self.received = {0: [], 1: []}     # Ether frames (bytes) per port, in order
        self.capture = []                  # (time_ns, frame bytes) both directions
        for p in (0, 1):
            cocotb.start_soon(self._collect(p))

    async def _collect(self, p):
        while True:
            frame = await self.sinks[p].recv()
            assert frame.check_fcs(), f"port {p}: bad FCS on a transmitted frame"
            assert frame.error is None or not any(frame.error), f"port {p}: tx_er"
            data = bytes(frame.get_payload())
            self.received[p].append(data)
            self.capture.append((cocotb.utils.get_sim_time("ns"), data))

    async def send(self, p, pkt_or_frame, wait=True):
        frame = pkt_or_frame if isinstance(pkt_or_frame, GmiiFrame) else frame_bytes(pkt_or_frame)
        self.capture.append((cocotb.utils.get_sim_time("ns"), bytes(frame.get_payload())))
        if wait:
            await self.sources[p].send(frame)
        else:
            self.sources[p].send_nowait(frame)

    async def start(self):
        await self.reset()
        while not int(self.dut.cfg_done.value):
            await RisingEdge(self.dut.clk)
        await self.cycles(10)

    async def core_counters(self):
        out = {}
        for n in COUNTER_NAMES:
            self.dut.cfg_addr.value = counter_addr(n)
            # cfg_addr crosses into the core domain and cfg_data back (FFSynchronizers):
            # 2 core + 1 read + 2 sync cycles; wait with margin.
            await self.cycles(24)
            out[n] = int(self.dut.cfg_data.value)
        return out

    def port_counters(self, p):
        return self.counters(PORT_COUNTERS, prefix=f"p{p}_")

    def data_frame(self, w, seq, elems, exponent=0):
        m = self.job.members[w]
        dgram = pack(elems, job=self.job.job, session=self.job.session, seq=seq, worker=w, exponent=exponent)
        pkt = Ether(dst=BOARD_MAC, src=m.mac) / IP(src=m.ip, dst=BOARD_IP) / \
            UDP(sport=m.port, dport=INA_UDP_PORT) / dgram
        return dgram, (m.ip, m.port), pkt

    def expect(self, dgram, source):
        """Model outputs for one accepted datagram: {port: [(dest, bytes)]}."""
        out = {0: [], 1: []}
        for dest, payload in self.model.process(dgram, source, 0.0):
            out[port_of(dest[0])].append((dest, payload))
        return out

    async def drain(self, expected, timeout_cycles=20000):
        """Wait until every port has at least as many frames as expected."""
        for _ in range(timeout_cycles // 100):
            if all(len(self.received[p]) >= len(expected[p]) for p in (0, 1)):
                return
            await self.cycles(100)

    def check_results(self, expected):
        """Every RESULT frame equals the model's datagram, in order, per port."""
        for p in (0, 1):
            got = self.received[p]
            assert len(got) == len(expected[p]), \
                f"port {p}: {len(got)} frames, model expects {len(expected[p])}"
            for k, (data, (dest, payload)) in enumerate(zip(got, expected[p])):
                pkt = Ether(data)
                member = next(m for m in self.job.members if m.addr == dest)
                assert pkt.dst == member.mac and pkt.src == BOARD_MAC, f"port {p} #{k}: MACs"
                ip = pkt[IP]
                assert (ip.src, ip.dst, ip.ttl, ip.proto) == (BOARD_IP, dest[0], 64, 17)
                again = IP(bytes(ip))
                del again.chksum
                assert IP(bytes(again)).chksum == ip.chksum, f"port {p} #{k}: IPv4 checksum"
                u = pkt[UDP]
                assert (u.sport, u.dport, u.len) == (INA_UDP_PORT, dest[1], len(payload) + 8)
                body = bytes(u.payload)[:len(payload)]
                assert body == payload, f"port {p} #{k}: payload differs from the model's"

    def write_pcap(self):
        path = os.environ.get("PCAP")
        if path:
            wrpcap(path, [Ether(d) for _, d in sorted(self.capture, key=lambda x: x[0])])


@cocotb.test()
async def arp_and_ping_both_ports(dut):
    tb = BoardTB(dut)
    await tb.start()
    for p, (mac, ip) in enumerate((("02:00:00:00:00:10", "10.0.0.10"),
                                   ("02:00:00:00:00:20", "10.1.0.20"))):
        await tb.send(p, Ether(dst="ff:ff:ff:ff:ff:ff", src=mac) /
                      ARP(op=1, hwsrc=mac, psrc=ip, pdst=BOARD_IP))
        await tb.send(p, Ether(dst=BOARD_MAC, src=mac) / IP(src=ip, dst=BOARD_IP) /
                      ICMP(type=8, id=7, seq=p) / b"ping through the board")
    await tb.cycles(1500)
    for p, (mac, ip) in enumerate((("02:00:00:00:00:10", "10.0.0.10"),
                                   ("02:00:00:00:00:20", "10.1.0.20"))):
        assert len(tb.received[p]) == 2, f"port {p}: {len(tb.received[p])} replies"
        arp = Ether(tb.received[p][0])[ARP]
        assert (arp.op, arp.hwsrc, arp.psrc, arp.hwdst, arp.pdst) == \
            (2, BOARD_MAC, BOARD_IP, mac, ip)
        echo = Ether(tb.received[p][1])
        assert echo[ICMP].type == 0 and echo[IP].dst == ip and echo[ICMP].seq == p
        assert bytes(echo[ICMP].payload).startswith(b"ping through the board")


@cocotb.test()
async def results_match_model_and_bad_frames_are_dropped(dut):
    """INA DATA from every worker on both ports gives RESULTs equal to the model's. Bad
    frames carrying valid-looking DATA are interleaved: each is dropped and counted at the
    right layer, and the aggregation (core counters, results) never sees them."""
    tb = BoardTB(dut)
    await tb.start()
    rng = np.random.default_rng(1)
    job = tb.job
    expected = {0: [], 1: []}
    bad_kinds = ["rx_bad_fcs", "rx_runt", "rx_giant", "drop_ethertype", "drop_ip_options"]
    bad_sent = {0: {}, 1: {}}
    for seq in range(2 * job.window + 3):
        order = list(range(job.n))
        random.Random(seq).shuffle(order)
        for w in order:
            elems = rng.integers(-2**31, 2**31, job.elements, dtype=np.int64)
            if seq == 3:   # saturating sums
                elems[:] = 2**31 - 1
            dgram, src, pkt = tb.data_frame(w, seq, elems.astype(np.int32))
            p = port_of(src[0])
            for port, outs in tb.expect(dgram, src).items():
                expected[port] += outs
            await tb.send(p, pkt)
            if seq % 4 == 1:
                # A corrupted copy of a packet of the *next* seq, from the same worker.
                kind = bad_kinds[(seq // 4 + w) % len(bad_kinds)]
                _, _, nxt = tb.data_frame(w, seq + 1, elems.astype(np.int32) + 1)
                raw = bytes(nxt)
                if kind == "rx_bad_fcs":
                    f = frame_bytes(nxt)
                    f.data[-1] ^= 0x5A
                elif kind == "rx_runt":
                    f = GmiiFrame.from_payload(raw[:40], min_len=0)
                elif kind == "rx_giant":
                    f = frame_bytes(raw + bytes(1600 - len(raw)))
                elif kind == "drop_ethertype":
                    f = frame_bytes(raw[:12] + b"\x88\xb5" + raw[14:])
                else:
                    opt = nxt.copy()
                    opt[IP].options = [IPOption_NOP()] * 4
                    del opt[IP].ihl, opt[IP].len, opt[IP].chksum, opt[UDP].len
                    f = frame_bytes(opt)
                bad_sent[p][kind] = bad_sent[p].get(kind, 0) + 1
                await tb.send(p, f)
    # refused DATA (issue 43): another job's id from worker 0 (port 0), another session
    # from worker 2 (port 1): each answered with the model's ERROR, to the sender's MAC
    for w, kw in ((0, {"job": job.job + 1000, "session": job.session}),
                  (2, {"job": job.job, "session": job.session ^ 1})):
        m = job.members[w]
        dgram = pack(np.zeros(job.elements, np.int32), seq=0, worker=w, **kw)
        pkt = Ether(dst=BOARD_MAC, src=m.mac) / IP(src=m.ip, dst=BOARD_IP) / \
            UDP(sport=m.port, dport=INA_UDP_PORT) / dgram
        for port, outs in tb.expect(dgram, (m.ip, m.port)).items():
            expected[port] += outs
        await tb.send(port_of(m.ip), pkt)
    assert tb.model.counters["errors_sent"] == 2
    for p in (0, 1):
        await tb.sources[p].wait()
    await tb.drain(expected)
    await tb.cycles(500)
    tb.check_results(expected)
    hw = await tb.core_counters()
    for name in ("rx", "rx_data", "accepted", "results", "overflows", "duplicates",
                 "drop_unknown_job", "drop_bad_session", "errors_sent"):
        assert hw[name] == tb.model.counters[name], f"core {name}: {hw[name]} != model"
    assert hw["drop_truncated"] == hw["drop_malformed"] == 0
    for p in (0, 1):
        c = tb.port_counters(p)
        for kind, n in bad_sent[p].items():
            assert c[kind] == n, f"port {p} {kind}: {c[kind]} != {n}"
        assert c["rx_overflow"] == 0
    tb.write_pcap()


@cocotb.test()
async def line_rate_both_ports(dut):
    """Back-to-back DATA frames at the minimum inter-frame gap on both ports at once;
    every worker's packets for each seq, RESULT copies go back out at the same rate.
    Zero drops, every result equal to the model's."""
    tb = BoardTB(dut)
    await tb.start()
    job = tb.job
    seqs = int(os.environ.get("LINE_RATE_SEQS", "1250"))
    rng = np.random.default_rng(2)
    expected = {0: [], 1: []}
    per_port = {0: [], 1: []}
    for seq in range(seqs):
        for w in range(job.n):
            # One element per packet: the shortest INA frames (66 bytes + FCS), so the
            # most frames per simulated cycle.
            elems = rng.integers(-2**20, 2**20, 1).astype(np.int32)
            dgram, src, pkt = tb.data_frame(w, seq, elems)
            for port, outs in tb.expect(dgram, src).items():
                expected[port] += outs
            per_port[port_of(src[0])].append(frame_bytes(pkt))
    for p in (0, 1):
        for f in per_port[p]:
            tb.sources[p].send_nowait(f)   # queued: sent back to back, 12-byte gap
    start = cocotb.utils.get_sim_time("ns")
    for p in (0, 1):
        await tb.sources[p].wait()
    sent_ns = cocotb.utils.get_sim_time("ns") - start
    await tb.drain(expected, timeout_cycles=200000)
    await tb.cycles(200)
    tb.check_results(expected)
    nframes = sum(len(v) for v in per_port.values())
    wire_bytes = max(sum(len(f.data) + 12 for f in per_port[p]) for p in (0, 1))
    # The sources ran at line rate: the busiest port took exactly its wire time.
    assert sent_ns <= wire_bytes * 8 + 1000, (sent_ns, wire_bytes * 8)
    for p in (0, 1):
        c = tb.port_counters(p)
        assert c["rx_overflow"] == c["rx_bad_fcs"] == 0
        assert c["ina_packets"] == len(per_port[p])
        assert c["tx_frames"] == len(expected[p])
    hw = await tb.core_counters()
    assert hw["accepted"] == nframes and hw["results"] == seqs
    assert sum(v for k, v in hw.items() if k.startswith("drop_")) == 0
    dut._log.info("line rate: %d DATA frames in, %d RESULT frames out, %d ns",
                  nframes, sum(len(v) for v in expected.values()), sent_ns)
