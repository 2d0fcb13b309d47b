"""Gigabit Ethernet MAC, GMII side (one byte per clock), no vendor primitives.

* :class:`MacRx` strips preamble/SFD and the FCS, checks the FCS with
  ``amaranth.lib.crc`` (CRC-32/Ethernet), and marks runts, giants and PHY errors. It runs
  in the receive clock domain and cannot be stalled: its output goes into an async FIFO.
* :class:`PacketBuffer` is a store-and-forward packet FIFO in one clock domain. A frame
  is committed only when its last byte says it is good; bad frames are rolled back and
  counted per reason, so nothing after the MAC ever sees a bad frame.
* :class:`MacTx` adds preamble/SFD, pads to 60 bytes, appends the FCS and keeps the
  12-byte inter-frame gap.
"""

from amaranth import *
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.crc.catalog import CRC32_ETHERNET
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

__all__ = ["BYTE", "RX_BYTE", "RxStatus", "MacRx", "MacTx", "PacketBuffer",
           "MIN_FRAME", "MAX_FRAME", "IFG"]

#: One byte of a packet; ``last`` marks the final byte.
BYTE = data.StructLayout({"data": 8, "last": 1})

MIN_FRAME = 64     # bytes, FCS included
MAX_FRAME = 1522   # bytes, FCS included (1518 + one 802.1Q tag)
IFG = 12           # bytes of idle between frames


class RxStatus(enum.Enum, shape=3):
    """Why a received frame is good or dropped; meaningful on the ``last`` byte."""
    OK = 0
    BAD_FCS = 1
    RUNT = 2
    GIANT = 3
    PHY_ERR = 4
    OVERFLOW = 5   # set by PacketBuffer when the frame does not fit


#: A received byte with the frame status on the last byte.
RX_BYTE = data.StructLayout({"data": 8, "last": 1, "status": RxStatus})


class MacRx(wiring.Component):
    """GMII receiver.

    Ports: ``rx_dv``, ``rx_er``, ``rxd`` (GMII, sampled on this domain's clock); ``o``,
    an :data:`RX_BYTE` stream without back-pressure (the FCS is removed; ``status`` on
    the last byte). A frame longer than ``max_frame`` ends early with ``GIANT``.
    """
    rx_dv: In(1)
    rx_er: In(1)
    rxd: In(8)
    o: Out(stream.Signature(RX_BYTE, always_ready=True))

    def __init__(self, *, max_frame=MAX_FRAME, min_frame=MIN_FRAME):
        self.max_frame = max_frame
        self.min_frame = min_frame
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = CRC32_ETHERNET(8).create()

        dv = Signal()
        er = Signal()
        d = Signal(8)
        m.d.sync += [dv.eq(self.rx_dv), er.eq(self.rx_er), d.eq(self.rxd)]

        # Five-byte delay line: when the frame ends, the oldest byte is the last data
        # byte and the other four are the FCS.
        sr = Signal(40)
        count = Signal(range(self.max_frame + 2))
        err = Signal()

        m.d.comb += crc.data.eq(d)
        m.d.sync += self.o.valid.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(dv & ~er & (d == 0xD5)):
                    m.d.comb += crc.start.eq(1)
                    m.d.sync += [count.eq(0), err.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(dv):
                    m.d.comb += crc.valid.eq(1)
                    m.d.sync += [sr.eq(Cat(d, sr[:32])), count.eq(count + 1)]
                    with m.If(er):
                        m.d.sync += err.eq(1)
                    with m.If(count >= 5):
                        m.d.sync += [self.o.valid.eq(1), self.o.payload.data.eq(sr[32:]),
                                     self.o.payload.last.eq(0)]
                    with m.If(count == self.max_frame):
                        # This byte makes the frame a giant: end it here.
                        m.d.sync += [self.o.valid.eq(1), self.o.payload.data.eq(sr[32:]),
                                     self.o.payload.last.eq(1),
                                     self.o.payload.status.eq(RxStatus.GIANT)]
                        m.next = "DISCARD"
                with m.Else():
                    m.d.sync += [self.o.valid.eq(1), self.o.payload.data.eq(sr[32:]),
                                 self.o.payload.last.eq(1)]
                    with m.If(err):
                        m.d.sync += self.o.payload.status.eq(RxStatus.PHY_ERR)
                    with m.Elif(count < self.min_frame):
                        m.d.sync += self.o.payload.status.eq(RxStatus.RUNT)
                    with m.Elif(~crc.match_detected):
                        m.d.sync += self.o.payload.status.eq(RxStatus.BAD_FCS)
                    with m.Else():
                        m.d.sync += self.o.payload.status.eq(RxStatus.OK)
                    m.next = "IDLE"
            with m.State("DISCARD"):
                with m.If(~dv):
                    m.next = "IDLE"
        return m


class PacketBuffer(wiring.Component):
    """Store-and-forward packet FIFO with commit/rollback, in one clock domain.

    ``i`` takes :data:`RX_BYTE` and is always ready. A frame whose last byte has status
    ``OK`` is committed and comes out of ``o`` (:data:`BYTE`); any other frame, or one that
    does not fit in the free space (an empty buffer always takes ``depth - 1`` bytes), is rolled
    back. ``frames`` counts committed frames and
    ``drops`` counts dropped frames per :class:`RxStatus` reason (index = status value).
    """

    def __init__(self, depth=4096, counter_width=32):
        assert depth & (depth - 1) == 0
        self.depth = depth
        self.counter_width = counter_width
        super().__init__({
            "i": In(stream.Signature(RX_BYTE)),
            "o": Out(stream.Signature(BYTE)),
            "frames": Out(counter_width),
            "drops": Out(data.ArrayLayout(counter_width, 6)),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self.depth.bit_length() - 1
        m.submodules.mem = mem = Memory(shape=9, depth=self.depth, init=[])
        wp = mem.write_port()
        rp = mem.read_port(transparent_for=())

        wr = Signal(aw + 1)      # write pointer of the frame being written
        commit = Signal(aw + 1)  # end of the last committed frame
        rd = Signal(aw + 1)      # next address to read
        dropping = Signal()

        # ``full`` is registered, from the previous cycle's pointers: the buffer held at
        # least depth - 1 bytes then. Since at most one byte is written per cycle (and
        # reads and rollbacks only make room), a write is safe whenever ``full`` is low;
        # the buffer holds up to depth - 1 bytes. Registering it keeps the pointer
        # arithmetic off the write-enable path (timing at 125 MHz). Since ``wr - rd``
        # never exceeds depth (a write needs ``full`` low one cycle earlier), "at least
        # depth - 1" is "equal to depth - 1 or depth": two equality compares against
        # copies of ``rd`` kept that far ahead, instead of a subtraction and a compare.
        full = Signal()
        rd_lo = Signal(aw + 1, init=self.depth - 1)    # rd + depth - 1
        rd_hi = Signal(aw + 1, init=self.depth)        # rd + depth
        m.d.sync += full.eq((wr == rd_lo) | (wr == rd_hi))
        m.d.comb += self.i.ready.eq(1)
        p = self.i.payload

        def count_drop(reason):
            m.d.sync += self.drops[reason.value].eq(self.drops[reason.value] + 1)

        with m.If(self.i.valid):
            with m.If(~dropping & ~full):
                m.d.comb += [wp.en.eq(1), wp.addr.eq(wr[:aw]), wp.data.eq(Cat(p.data, p.last))]
            with m.If(p.last):
                with m.If(dropping | full):
                    m.d.sync += [wr.eq(commit), dropping.eq(0)]
                    count_drop(RxStatus.OVERFLOW)
                with m.Elif(p.status == RxStatus.OK):
                    m.d.sync += [wr.eq(wr + 1), commit.eq(wr + 1),
                                 self.frames.eq(self.frames + 1)]
                with m.Else():
                    m.d.sync += wr.eq(commit)
                    with m.Switch(p.status):
                        for reason in (RxStatus.BAD_FCS, RxStatus.RUNT, RxStatus.GIANT,
                                       RxStatus.PHY_ERR, RxStatus.OVERFLOW):
                            with m.Case(reason):
                                count_drop(reason)
            with m.Elif(full):
                m.d.sync += dropping.eq(1)
            with m.Elif(~dropping):
                m.d.sync += wr.eq(wr + 1)

        # Read side, two stages: the block RAM's synchronous read data (``rp.data``,
        # valid while ``ram_valid``), then an output register (``o``), so that nothing
        # downstream sees the RAM's clock-to-output delay (ECP5 DP16KD: ~4 ns of the 8 ns
        # at 125 MHz). The RAM holds its data while ``rp.en`` is low, so the stage
        # stalls without a skid buffer; a byte per cycle still flows.
        ram_valid = Signal()
        load = ram_valid & (~self.o.valid | self.o.ready)
        fetch = (~ram_valid | load) & (rd != commit)
        m.d.comb += [rp.en.eq(fetch), rp.addr.eq(rd[:aw])]
        with m.If(fetch):
            m.d.sync += [rd.eq(rd + 1), rd_lo.eq(rd_lo + 1), rd_hi.eq(rd_hi + 1),
                         ram_valid.eq(1)]
        with m.Elif(load):
            m.d.sync += ram_valid.eq(0)
        with m.If(load):
            m.d.sync += [self.o.valid.eq(1), self.o.payload.data.eq(rp.data[:8]),
                         self.o.payload.last.eq(rp.data[8])]
        with m.Elif(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        return m


class MacTx(wiring.Component):
    """GMII transmitter.

    ``i`` is a :data:`BYTE` stream of frames without FCS (destination MAC first). A frame
    must arrive without gaps once started (feed it from a :class:`PacketBuffer`); a gap
    is an underrun: the frame is sent with ``tx_er`` and ``underruns`` counts it.
    """
    i: In(stream.Signature(BYTE))
    tx_en: Out(1)
    tx_er: Out(1)
    txd: Out(8)
    underruns: Out(16)

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = CRC32_ETHERNET(8).create()
        count = Signal(range(max(IFG, 60) + 1))
        bad = Signal()

        def send(byte, er=0):
            m.d.sync += [self.tx_en.eq(1), self.txd.eq(byte), self.tx_er.eq(er)]

        m.d.sync += [self.tx_en.eq(0), self.tx_er.eq(0), self.txd.eq(0)]
        m.d.comb += crc.data.eq(self.i.payload.data)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.i.valid):
                    m.d.sync += [count.eq(0), bad.eq(0)]
                    m.next = "PREAMBLE"
            with m.State("PREAMBLE"):
                with m.If(count == 7):
                    send(0xD5)
                    m.d.comb += crc.start.eq(1)
                    m.d.sync += count.eq(0)
                    m.next = "DATA"
                with m.Else():
                    send(0x55)
                    m.d.sync += count.eq(count + 1)
            with m.State("DATA"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.comb += crc.valid.eq(1)
                    send(self.i.payload.data, bad)
                    with m.If(count < 60):
                        m.d.sync += count.eq(count + 1)
                    with m.If(self.i.payload.last):
                        with m.If(count < 59):
                            m.next = "PAD"
                        with m.Else():
                            m.d.sync += count.eq(0)
                            m.next = "FCS"
                with m.Else():
                    # Underrun: keep the frame going with an error until its end.
                    send(0, 1)
                    with m.If(~bad):
                        m.d.sync += [bad.eq(1), self.underruns.eq(self.underruns + 1)]
            with m.State("PAD"):
                m.d.comb += [crc.data.eq(0), crc.valid.eq(1)]
                send(0, bad)
                m.d.sync += count.eq(count + 1)
                with m.If(count == 59):
                    m.d.sync += count.eq(0)
                    m.next = "FCS"
            with m.State("FCS"):
                send(crc.crc.word_select(count[:2], 8), bad)
                m.d.sync += count.eq(count + 1)
                with m.If(count == 3):
                    m.d.sync += count.eq(0)
                    m.next = "GAP"
            with m.State("GAP"):
                m.d.sync += count.eq(count + 1)
                with m.If(count == IFG - 2):
                    m.next = "IDLE"
        return m
