"""The board's datapath: two Ethernet ports around one INA core, with its configuration
loaded from ROM at reset.

Port 0 faces the workers, port 1 the uplink. INA datagrams from both ports are merged a
packet at a time into the core; RESULT copies are routed to port 0 when the destination
is in the worker subnet (or is a multicast group) and to port 1 otherwise. ARP and ping
are answered on the port they came in on.

Everything here is GMII-side: it simulates on Icarus as it is (sim/eth/tb_board.py), and
the FPGA tops (hw/boards/ecp5_rgmii.py) add RGMII, the PLL and LEDs around it.
"""

from dataclasses import dataclass, field
import ipaddress

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ina_fabric.hw.eth.cdc import AsyncFIFOLut
from ina_fabric.hw.eth.egress import Router
from ina_fabric.hw.eth.port import PORT_COUNTERS, EthPort
from ina_fabric.hw.eth.words import CORE_IN, PacketArbiter
from ina_fabric.hw.ina.core import InaCore
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regs import GLOBAL_REGS, config_writes

__all__ = ["BoardConfig", "InaDatapath", "ConfigLoader"]


@dataclass(frozen=True)
class BoardConfig:
    """What the board is, from configuration (``constraints/<board>.toml``).

    mac, ip        the board's addresses, shared by both ports
    worker_net     the subnet behind port 0 (CIDR); other destinations go to port 1
    clock_hz       clock of the ``core`` domain (deadlines are counted in its cycles)
    jobs           ina_fabric.protocol.jobtable.JobConfig entries loaded at reset
    control_key    the key CONTROL datagrams must be sealed with (``protocol.auth``),
                   built into the bitstream; None: jobs come from the ROM only
    """
    mac: str = "02:1a:00:00:00:01"
    ip: str = "10.0.0.2"
    worker_net: str = "10.0.0.0/24"
    clock_hz: float = 125e6
    jobs: tuple = ()
    params: CoreParams = field(default_factory=CoreParams)
    control_key: bytes | None = field(default=None, repr=False)

    @property
    def mac_int(self) -> int:
        return int(self.mac.replace(":", ""), 16)

    @property
    def ip_int(self) -> int:
        return int(ipaddress.IPv4Address(self.ip))

    def writes(self) -> list[tuple[int, int]]:
        """Register writes that configure the core: source IP, then every job."""
        src = next(r for r in GLOBAL_REGS if r.name == "src_ip").offset
        out = [(src, self.ip_int)]
        if len(self.jobs) > self.params.jobs:
            raise ValueError(f"{len(self.jobs)} jobs, the core has {self.params.jobs} entries")
        for k, job in enumerate(self.jobs):
            out += config_writes(job, k, clock_hz=self.clock_hz,
                                 window_max=self.params.window,
                                 elements_max=self.params.elements,
                                 workers_max=self.params.workers, tree=self.params.tree)
        return out


class ConfigLoader(wiring.Component):
    """Replays ``writes`` (address, value) onto the core's register bus after reset, one
    every ``gap`` cycles (a job enable resets the job's slots, 2W cycles), then hands the
    bus to ``addr``/``r_data`` for status reads; ``done`` goes high."""

    def __init__(self, writes, gap=64):
        self.writes = list(writes) or [(0, 0)]
        self.gap = gap
        super().__init__({
            "bus": Out(wiring.Signature({"addr": Out(16), "w_stb": Out(1),
                                         "w_data": Out(32), "r_data": In(32)})),
            "addr": In(16),
            "r_data": Out(32),
            "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n = len(self.writes)
        m.submodules.rom = rom = Memory(shape=48, depth=n,
                                        init=[(a << 32) | (v & 0xFFFFFFFF)
                                              for a, v in self.writes])
        rp = rom.read_port()
        idx = Signal(range(n + 1))
        wait = Signal(range(self.gap + 1), init=self.gap)
        m.d.comb += [rp.addr.eq(idx), self.r_data.eq(self.bus.r_data)]
        with m.If(~self.done):
            # rp.data holds entry idx (the address has been stable for `gap` cycles).
            m.d.comb += [self.bus.addr.eq(rp.data[32:]), self.bus.w_data.eq(rp.data[:32])]
            with m.If(wait != 0):
                m.d.sync += wait.eq(wait - 1)
            with m.Elif(idx == n):
                m.d.sync += self.done.eq(1)
            with m.Else():
                m.d.comb += self.bus.w_stb.eq(1)
                m.d.sync += [idx.eq(idx + 1), wait.eq(self.gap)]
        with m.Else():
            m.d.comb += self.bus.addr.eq(self.addr)
        return m


class InaDatapath(wiring.Component):
    """Two GMII ports (``p0_*``, ``p1_*``; domains ``eth_rx0/1``, ``eth_tx0/1``; front end
    in ``sync``) around the INA core (domain ``core``, behind AsyncFIFOs). ``p0_counters``/``p1_counters`` follow ``hw.eth.port.PORT_COUNTERS``;
    ``cfg_addr``/``cfg_data`` read the core's registers once ``cfg_done`` is high."""

    def __init__(self, board: BoardConfig = BoardConfig(), *, counter_width=32, fifo_depth=64,
                 out_fifo_depth=16):
        self.board = board
        self.fifo_depth = fifo_depth            # datagram words, sync -> core
        self.out_fifo_depth = out_fifo_depth    # RESULT words, core -> sync (LUT RAM)
        members = {}
        for p in (0, 1):
            members.update({
                f"p{p}_rx_dv": In(1), f"p{p}_rx_er": In(1), f"p{p}_rxd": In(8),
                f"p{p}_tx_en": Out(1), f"p{p}_tx_er": Out(1), f"p{p}_txd": Out(8),
                f"p{p}_counters": Out(data.ArrayLayout(counter_width, len(PORT_COUNTERS))),
                f"p{p}_rx_activity": Out(1), f"p{p}_tx_activity": Out(1),
                f"p{p}_error": Out(1),
            })
        members.update({"cfg_addr": In(16), "cfg_data": Out(32), "cfg_done": Out(1)})
        self.counter_width = counter_width
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        b = self.board
        net = ipaddress.IPv4Network(b.worker_net, strict=False)

        # The INA core, its config loader, the merge and the router run in the slower
        # ``core`` domain; the ports in ``sync``. Streams cross through AsyncFIFOs; the config ROM is
        # replayed inside ``core`` (only its reset crosses, synchronised by the top); the
        # quasi-static status read port (cfg_addr/cfg_data) and cfg_done cross through
        # FFSynchronizers (hold cfg_addr >= 2 core + 3 sync cycles before reading).
        core_dom = DomainRenamer("core")
        m.submodules.core = core = core_dom(InaCore(
            b.params, control_key=b.control_key,
            cycles_per_us=round(b.clock_hz / 1e6) if b.control_key else 1))
        m.submodules.cfg = cfg = core_dom(ConfigLoader(b.writes(), gap=2 * b.params.window + 8))
        wiring.connect(m, cfg.bus, core.cfg)
        m.submodules.addr_sync = FFSynchronizer(self.cfg_addr, cfg.addr, o_domain="core")
        m.submodules.data_sync = FFSynchronizer(cfg.r_data, self.cfg_data, o_domain="sync")
        m.submodules.done_sync = FFSynchronizer(cfg.done, self.cfg_done, o_domain="sync")

        # Merge and router run with the core (they move core words, at core rate).
        m.submodules.merge = merge = core_dom(PacketArbiter(CORE_IN, 2))
        m.submodules.router = router = core_dom(Router())
        m.d.comb += [router.net.eq(int(net.network_address)), router.mask.eq(int(net.netmask))]
        wiring.connect(m, merge.o, core.i)
        wiring.connect(m, core.o, router.i)
        # Per port: datagram words sync -> core, RESULT words core -> sync.
        cdc_in, cdc_out = {}, {}
        for p in (0, 1):
            src = getattr(merge, f"i{p}")
            dst = getattr(router, f"o{p}")
            cdc_in[p] = fin = AsyncFIFO(width=len(src.payload.as_value()),
                                        depth=self.fifo_depth, w_domain="sync", r_domain="core")
            # Read in ``sync``: a LUT RAM FIFO, so the read pointer logic and the read
            # data are separate short paths at 125 MHz (hw/eth/cdc.py). 16 deep: one LUT
            # RAM per 4 bits with no read multiplexer, and its read pointer drives a quarter
            # of the RAMs 64 would need (that net's routing was the critical path). The
            # reader (125 MHz) drains faster than the core (75 MHz) fills it.
            cdc_out[p] = fout = AsyncFIFOLut(width=len(dst.payload.as_value()),
                                             depth=self.out_fifo_depth, w_domain="core",
                                             r_domain="sync")
            m.submodules[f"in_cdc{p}"] = fin
            m.submodules[f"out_cdc{p}"] = fout
            m.d.comb += [src.payload.eq(fin.r_data), src.valid.eq(fin.r_rdy),
                         fin.r_en.eq(src.ready),
                         fout.w_data.eq(dst.payload), fout.w_en.eq(dst.valid),
                         dst.ready.eq(fout.w_rdy)]

        for p in (0, 1):
            port = EthPort(rx_domain=f"eth_rx{p}", tx_domain=f"eth_tx{p}",
                           counter_width=self.counter_width)
            m.submodules[f"port{p}"] = port
            m.d.comb += [
                port.rx_dv.eq(getattr(self, f"p{p}_rx_dv")),
                port.rx_er.eq(getattr(self, f"p{p}_rx_er")),
                port.rxd.eq(getattr(self, f"p{p}_rxd")),
                getattr(self, f"p{p}_tx_en").eq(port.tx_en),
                getattr(self, f"p{p}_tx_er").eq(port.tx_er),
                getattr(self, f"p{p}_txd").eq(port.txd),
                getattr(self, f"p{p}_counters").eq(port.counters),
                getattr(self, f"p{p}_rx_activity").eq(port.rx_activity),
                getattr(self, f"p{p}_tx_activity").eq(port.tx_activity),
                getattr(self, f"p{p}_error").eq(port.error),
                port.mac.eq(b.mac_int), port.ip.eq(b.ip_int),
            ]
            fin, fout = cdc_in[p], cdc_out[p]
            # Registered ready into the core's FIFO: from its (registered) write level one
            # cycle ago, at most one word behind, so two entries stay unused; the port's
            # packet FIFO read logic then does not wait on the Gray-code full compare.
            room = Signal(name=f"in_cdc_room{p}")
            m.d.sync += room.eq(fin.w_level <= self.fifo_depth - 3)
            m.d.comb += [fin.w_data.eq(port.ina.payload), fin.w_en.eq(port.ina.valid & room),
                         port.ina.ready.eq(room),
                         port.result.payload.eq(fout.r_data), port.result.valid.eq(fout.r_rdy),
                         fout.r_en.eq(port.result.ready)]
        return m
