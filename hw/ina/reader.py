"""The word reader: how the control plane's blocks read its datagram buffers.

A block that reads sets ``en`` and ``addr`` (a 32-bit word index) in a cycle; the
control plane registers the address of whichever block reads (``widx``), the buffer's
block RAM answers a cycle later and the word is registered once more, so ``word`` holds
the word ``READ_LATENCY`` cycles after the cycle that set the address. A block keeps
``addr`` still (or counts ``READ_LATENCY`` cycles) before it looks at ``word``.
"""

from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["READ_LATENCY", "reader_signature", "word_reads"]

#: cycles from setting ``addr`` to ``word`` holding that word
READ_LATENCY = 3


def reader_signature(addr_shape) -> wiring.Signature:
    """A reader's port (the reader's side): ``en`` and ``addr`` out, ``word`` in."""
    return wiring.Signature({"en": Out(1), "addr": Out(addr_shape), "word": In(32)})


def word_reads(m, rd, dly):
    """``read(addr)`` for an FSM state: reads word ``addr`` through ``rd`` (``dly``, a
    2-bit register, counts the cycles); True in the cycle ``rd.word`` holds it."""
    def read(addr):
        m.d.comb += [rd.en.eq(1), rd.addr.eq(addr)]
        with m.If(dly != READ_LATENCY):
            m.d.sync += dly.eq(dly + 1)
        with m.Else():
            m.d.sync += dly.eq(0)
        return dly == READ_LATENCY
    return read
