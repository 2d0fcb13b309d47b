"""One Ethernet port of the board, GMII on one side and the core's word streams on the other.

Receive: :class:`~hw.eth.mac.MacRx` (receive clock) -> async FIFO -> store-and-forward
:class:`~hw.eth.mac.PacketBuffer` (bad frames dropped and counted) ->
:class:`~hw.eth.ingress.Ingress` (ARP, ICMP echo, INA datagrams) -> a register slice ->
words -> a packet FIFO that releases whole datagrams to the core.

Transmit: ARP/ICMP replies and RESULT frames (:class:`~hw.eth.egress.UdpTx`) are merged
a frame at a time -> :class:`~hw.eth.mac.PacketBuffer` (so a frame never underruns) ->
async FIFO -> :class:`~hw.eth.mac.MacTx` (transmit clock).
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from .cdc import AsyncFIFOLut
from .egress import CORE_OUT, UdpTx
from .ingress import INA_RX, N_DROPS, Drop, Ingress
from .mac import BYTE, RX_BYTE, MacRx, MacTx, PacketBuffer, RxStatus
from .words import CORE_IN, BytesToWords, PacketArbiter, PacketFIFO, SkidBuffer

__all__ = ["EthPort", "PORT_COUNTERS"]

#: Names of the counters a port exposes, in the order of its ``counters`` array.
PORT_COUNTERS = (
    ("rx_frames", "rx_bad_fcs", "rx_runt", "rx_giant", "rx_phy_err", "rx_overflow",
     "arp_replies", "icmp_replies", "ina_packets", "ina_truncated")
    + tuple(f"drop_{d.name.lower()}" for d in Drop)
    + ("tx_frames",)
)


class EthPort(wiring.Component):
    """GMII receive (in ``rx_domain``) and transmit (in ``tx_domain``) to ``ina``
    (core input beats) and from ``result`` (core output beats routed to this port).
    ``mac``/``ip`` are the board's addresses; ``counters`` follows :data:`PORT_COUNTERS`;
    ``rx_activity``/``tx_activity``/``error`` are one-cycle pulses for LEDs (core domain).
    """

    def __init__(self, *, rx_domain, tx_domain, counter_width=32, result_depth=512):
        self.rx_domain = rx_domain
        self.tx_domain = tx_domain
        self.cw = counter_width
        self.result_depth = result_depth
        super().__init__({
            "rx_dv": In(1), "rx_er": In(1), "rxd": In(8),
            "tx_en": Out(1), "tx_er": Out(1), "txd": Out(8),
            "ina": Out(stream.Signature(CORE_IN)),
            "result": In(stream.Signature(CORE_OUT)),
            "mac": In(48), "ip": In(32),
            "counters": Out(data.ArrayLayout(counter_width, len(PORT_COUNTERS))),
            "rx_activity": Out(1), "tx_activity": Out(1), "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        rxd, txd = self.rx_domain, self.tx_domain
        cnt = {name: self.counters[i] for i, name in enumerate(PORT_COUNTERS)}

        # -- receive ------------------------------------------------------------------
        m.submodules.mac_rx = mac_rx = DomainRenamer(rxd)(MacRx())
        m.d.comb += [mac_rx.rx_dv.eq(self.rx_dv), mac_rx.rx_er.eq(self.rx_er),
                     mac_rx.rxd.eq(self.rxd)]
        rx_width = Shape.cast(RX_BYTE).width
        # LUT RAM FIFO: its read data is a RAM lookup, registered just below.
        m.submodules.rx_cdc = rx_cdc = AsyncFIFOLut(width=rx_width, depth=64,
                                                    w_domain=rxd, r_domain="sync")
        m.d.comb += [rx_cdc.w_en.eq(mac_rx.o.valid), rx_cdc.w_data.eq(mac_rx.o.payload)]

        # A register between the async FIFO and the receive buffer (timing: the FIFO's
        # empty flag and read data are not one path with the buffer's commit logic). The
        # buffer is always ready, so the FIFO is read whenever it has a byte.
        m.submodules.rx_buf = rx_buf = PacketBuffer(depth=4096, counter_width=self.cw)
        m.d.comb += rx_cdc.r_en.eq(1)
        m.d.sync += [rx_buf.i.valid.eq(rx_cdc.r_rdy), rx_buf.i.payload.eq(rx_cdc.r_data)]

        m.submodules.ingress = ingress = Ingress(counter_width=self.cw)
        wiring.connect(m, rx_buf.o, ingress.i)
        m.d.comb += [ingress.mac.eq(self.mac), ingress.ip.eq(self.ip)]

        # A register slice between the ingress and the word packer: the ingress's INA
        # beat (valid and ``last`` decided from its byte count) was the front end's
        # longest path, into the packer's output enable (every bit of a word).
        m.submodules.ina_rx_skid = ina_rx_skid = SkidBuffer(INA_RX)
        wiring.connect(m, ingress.ina, ina_rx_skid.i)
        m.submodules.to_words = to_words = BytesToWords()
        wiring.connect(m, ina_rx_skid.o, to_words.i)
        m.submodules.ina_fifo = ina_fifo = PacketFIFO(CORE_IN, depth=512)
        wiring.connect(m, to_words.o, ina_fifo.i)
        # The packet FIFO's read data comes straight out of block RAM; registered here
        # before it goes on (into the core's async FIFO, itself block RAM).
        m.submodules.ina_skid = ina_skid = SkidBuffer(CORE_IN)
        wiring.connect(m, ina_fifo.o, ina_skid.i)
        wiring.connect(m, ina_skid.o, wiring.flipped(self.ina))

        # -- transmit -----------------------------------------------------------------
        m.submodules.result_fifo = result_fifo = SyncFIFOBuffered(
            width=Shape.cast(CORE_OUT).width, depth=self.result_depth)
        # Registered ready (as in PacketFIFO): the async FIFO's read enable does not wait
        # on this FIFO's level compare. Two entries stay unused.
        result_room = Signal()
        m.d.sync += result_room.eq(result_fifo.level <= self.result_depth - 3)
        m.d.comb += [result_fifo.w_data.eq(self.result.payload),
                     result_fifo.w_en.eq(self.result.valid & result_room),
                     self.result.ready.eq(result_room)]
        # The FIFO's read data comes straight out of block RAM: a skid buffer registers it
        # (and the ready back) before UdpTx's header and state logic.
        m.submodules.result_skid = result_skid = SkidBuffer(CORE_OUT)
        m.d.comb += [result_skid.i.payload.eq(result_fifo.r_data),
                     result_skid.i.valid.eq(result_fifo.r_rdy),
                     result_fifo.r_en.eq(result_skid.i.ready)]
        m.submodules.udp_tx = udp_tx = UdpTx()
        wiring.connect(m, result_skid.o, udp_tx.i)
        m.d.comb += [udp_tx.mac.eq(self.mac), udp_tx.ip.eq(self.ip)]

        m.submodules.tx_arb = tx_arb = PacketArbiter(BYTE, 2)
        wiring.connect(m, ingress.reply, tx_arb.i0)
        wiring.connect(m, udp_tx.o, tx_arb.i1)

        # A register between the merge and the transmit buffer (timing: the merge's
        # select and the buffer's commit logic are not one path). The buffer is always
        # ready, so the register needs no back-pressure.
        m.submodules.tx_buf = tx_buf = PacketBuffer(depth=4096, counter_width=self.cw)
        m.d.comb += [tx_arb.o.ready.eq(1), tx_buf.i.payload.status.eq(RxStatus.OK)]
        m.d.sync += [tx_buf.i.valid.eq(tx_arb.o.valid),
                     tx_buf.i.payload.data.eq(tx_arb.o.payload.data),
                     tx_buf.i.payload.last.eq(tx_arb.o.payload.last)]

        # LUT RAM FIFO into a skid buffer (transmit domain): the FIFO's read pointer, its
        # RAM lookup and the MAC's ready are three short paths, not one.
        m.submodules.tx_cdc = tx_cdc = AsyncFIFOLut(width=9, depth=64,
                                                    w_domain="sync", r_domain=txd)
        m.d.comb += [tx_cdc.w_data.eq(tx_buf.o.payload), tx_cdc.w_en.eq(tx_buf.o.valid),
                     tx_buf.o.ready.eq(tx_cdc.w_rdy)]
        m.submodules.tx_skid = tx_skid = DomainRenamer(txd)(SkidBuffer(BYTE))
        m.d.comb += [tx_skid.i.payload.eq(tx_cdc.r_data), tx_skid.i.valid.eq(tx_cdc.r_rdy),
                     tx_cdc.r_en.eq(tx_skid.i.ready)]

        m.submodules.mac_tx = mac_tx = DomainRenamer(txd)(MacTx())
        wiring.connect(m, tx_skid.o, mac_tx.i)
        m.d.comb += [self.tx_en.eq(mac_tx.tx_en), self.tx_er.eq(mac_tx.tx_er),
                     self.txd.eq(mac_tx.txd)]

        # -- counters -----------------------------------------------------------------
        m.d.comb += [
            cnt["rx_frames"].eq(rx_buf.frames),
            cnt["rx_bad_fcs"].eq(rx_buf.drops[RxStatus.BAD_FCS.value]),
            cnt["rx_runt"].eq(rx_buf.drops[RxStatus.RUNT.value]),
            cnt["rx_giant"].eq(rx_buf.drops[RxStatus.GIANT.value]),
            cnt["rx_phy_err"].eq(rx_buf.drops[RxStatus.PHY_ERR.value]),
            cnt["rx_overflow"].eq(rx_buf.drops[RxStatus.OVERFLOW.value]),
            cnt["arp_replies"].eq(ingress.arp_replies),
            cnt["icmp_replies"].eq(ingress.icmp_replies),
            cnt["ina_packets"].eq(ingress.ina_packets),
            cnt["ina_truncated"].eq(ingress.truncated),
            cnt["tx_frames"].eq(tx_buf.frames),
        ]
        for i in range(N_DROPS):
            name = PORT_COUNTERS[10 + i]
            m.d.comb += cnt[name].eq(ingress.drops[i])
        # -- LED pulses (one cycle per frame) --------------------------------------------
        rx_end = rx_buf.i.valid & rx_buf.i.payload.last
        m.d.comb += [self.rx_activity.eq(rx_end & (rx_buf.i.payload.status == RxStatus.OK)),
                     self.error.eq(rx_end & (rx_buf.i.payload.status != RxStatus.OK)),
                     self.tx_activity.eq(tx_buf.o.valid & tx_buf.o.ready &
                                         tx_buf.o.payload.last)]
        # Exposed for the benches: transmit underruns (counted in the transmit domain).
        self.mac_tx = mac_tx
        return m
