"""Glue between the byte-wide Ethernet side and the word-wide INA core (one lane).

* :class:`BytesToWords`: INA datagram bytes (:data:`~hw.eth.ingress.INA_RX`) to the core's
  input beats (``hw.ina.layout.in_layout(1)``): big-endian 32-bit words.
* :class:`PacketFIFO`: a synchronous FIFO that shows a packet only once all of it is
  inside, so a packet leaves it at one beat per cycle, without bubbles.
* :class:`PacketArbiter`: round-robin, packet-granular merge of several streams.
* :class:`SkidBuffer`: a two-entry stream register that cuts both the data/valid and the
  ready path (timing), at one beat per cycle.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ina_fabric.hw.ina.layout import in_layout

from .ingress import INA_RX

__all__ = ["BytesToWords", "PacketFIFO", "PacketArbiter", "SkidBuffer", "CORE_IN"]

CORE_IN = in_layout(1)


class BytesToWords(wiring.Component):
    """Packs INA datagram bytes into big-endian words (a short last word is padded with
    zeros at the end); ``first``/``last``/``length``/``src_*`` go along."""
    i: In(stream.Signature(INA_RX))
    o: Out(stream.Signature(CORE_IN))

    def elaborate(self, platform):
        m = Module()
        shift = Signal(24)
        k = Signal(2)
        first = Signal(init=1)
        p = self.i.payload
        word = Cat(p.data, shift)
        take = ~self.o.valid | self.o.ready
        m.d.comb += self.i.ready.eq(take)
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.valid & take):
            m.d.sync += [shift.eq(word[:24]), k.eq(k + 1)]
            with m.If((k == 3) | p.last):
                o = self.o.payload
                m.d.sync += [
                    self.o.valid.eq(1),
                    o.data[0].eq(word << Cat(C(0, 3), ~k)),
                    o.n.eq(1), o.first.eq(first), o.last.eq(p.last),
                    o.length.eq(p.length), o.src_ip.eq(p.src_ip), o.src_port.eq(p.src_port),
                    o.src_mac.eq(p.src_mac),
                    first.eq(p.last), k.eq(0),
                ]
        return m


class PacketFIFO(wiring.Component):
    """FIFO of ``layout`` beats (a StructLayout with a ``last`` field) that releases a
    packet only when its last beat is in. ``depth - 2`` must hold the largest packet:
    ``i.ready`` is registered (from the previous cycle's fill level, so the writer's
    ready path is one flip-flop), which leaves two entries unused."""

    def __init__(self, layout, depth):
        self.layout = layout
        self.depth = depth
        super().__init__({"i": In(stream.Signature(layout)), "o": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        width = Shape.cast(self.layout).width
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=width, depth=self.depth)
        packets = Signal(range(self.depth + 1))
        w_last = self.i.valid & self.i.ready & self.i.payload.last
        o_view = data.View(self.layout, fifo.r_data)
        r_last = self.o.valid & self.o.ready & o_view.last
        # At most one beat goes in per cycle, so a level <= depth - 3 one cycle ago means
        # the FIFO (depth - 1 in its memory, one in its output register) has room now.
        room = Signal()
        m.d.sync += room.eq(fifo.level <= self.depth - 3)
        # ``r_data`` comes straight out of block RAM (~4 ns clock-to-output on an ECP5), so
        # a packet leaving is counted one cycle later (``r_last_q``); meanwhile
        # ``packets - r_last_q`` is the number of whole packets still inside.
        r_last_q = Signal()
        m.d.sync += r_last_q.eq(r_last)
        # (the two compares of the count, registered with it: from the count's flip-flops
        # through the compares to the read enable and the reader's enables was the
        # Versa's longest front end path with the narrow widths)
        packets_next = Signal.like(packets)
        some, more = Signal(), Signal()         # packets != 0, packets > 1
        m.d.comb += packets_next.eq(packets + w_last - r_last_q)
        m.d.sync += [packets.eq(packets_next), some.eq(packets_next != 0),
                     more.eq(packets_next > 1)]
        avail = Mux(r_last_q, more, some)
        m.d.comb += [
            fifo.w_data.eq(self.i.payload), fifo.w_en.eq(self.i.valid & room),
            self.i.ready.eq(room),
            self.o.payload.eq(fifo.r_data),
            self.o.valid.eq(fifo.r_rdy & avail),
            fifo.r_en.eq(self.o.ready & avail),
        ]
        return m


class PacketArbiter(wiring.Component):
    """Merges ``n`` streams of ``layout`` (with a ``last`` field), a whole packet at a
    time, round robin. The output is combinational from the chosen input."""

    def __init__(self, layout, n):
        self.n = n
        super().__init__({
            **{f"i{k}": In(stream.Signature(layout)) for k in range(n)},
            "o": Out(stream.Signature(layout)),
        })

    def elaborate(self, platform):
        m = Module()
        ins = [getattr(self, f"i{k}") for k in range(self.n)]
        sel = Signal(range(self.n))
        busy = Signal()
        with m.Switch(sel):
            for k, s in enumerate(ins):
                with m.Case(k):
                    m.d.comb += [self.o.payload.eq(s.payload), self.o.valid.eq(s.valid & busy),
                                 s.ready.eq(self.o.ready & busy)]
        with m.If(busy):
            with m.If(self.o.valid & self.o.ready & self.o.payload.last):
                m.d.sync += busy.eq(0)
        with m.Else():
            # Grant the next requester after the current one, round robin.
            for off in reversed(range(1, self.n + 1)):
                k = Signal(range(self.n), name=f"cand{off}")
                m.d.comb += k.eq((sel + off) % self.n)
                with m.If(Array(s.valid for s in ins)[k]):
                    m.d.sync += [sel.eq(k), busy.eq(1)]
        return m


class SkidBuffer(wiring.Component):
    """Stream register for ``layout``: ``o.valid``/``o.payload`` and ``i.ready`` all come
    from flip-flops. A second (skid) register takes the beat that arrives in the cycle
    ``o`` stalls, so a beat per cycle flows while ``o.ready`` stays high."""

    def __init__(self, layout):
        self.layout = layout
        super().__init__({"i": In(stream.Signature(layout)), "o": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        skid_valid = Signal()
        skid = Signal(self.layout)
        m.d.comb += self.i.ready.eq(~skid_valid)
        with m.If(~self.o.valid | self.o.ready):
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & ~skid_valid):
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m
