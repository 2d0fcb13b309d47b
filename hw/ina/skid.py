"""A register slice for a stream: its payload, valid and ready all leave from flip-flops.

Used between the replicator and the core's output in a core built with the tree option
(``CoreParams.tree``): on the Versa the replicator's output handshake was the core
clock's longest path (its request register, through the output multiplexer and the
output CDC's storage, back through ``ready`` to its beat counter; docs/results/
gateware.md), and the tree options add multiplexers to the payload. The slice cuts both
directions; the stream's contents and order are unchanged, one cycle later, at full rate.
"""

from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

__all__ = ["Skid"]


class Skid(wiring.Component):
    """Two-entry register slice (a skid buffer).

    i   In: the stream (``i.ready`` is a register: low only while the second entry holds
        a beat the output did not take)
    o   Out: the same beats, from registers
    """

    def __init__(self, shape):
        self._shape = shape
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        skid = Signal(self._shape)
        skid_valid = Signal()
        m.d.comb += i.ready.eq(~skid_valid)
        with m.If(~o.valid | o.ready):
            with m.If(skid_valid):
                m.d.sync += [o.valid.eq(1), o.payload.eq(skid), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [o.valid.eq(i.valid), o.payload.eq(i.payload)]
        with m.Elif(i.valid & ~skid_valid):
            m.d.sync += [skid.eq(i.payload), skid_valid.eq(1)]
        return m
