"""An asynchronous FIFO whose read data comes straight out of LUT RAM.

:class:`AsyncFIFOLut` is ``amaranth.lib.fifo.AsyncFIFO`` (Cummings' style #2 Gray-code
FIFO, the same pointers, synchronizers and write-domain reset handling; the code follows
Amaranth's, BSD-2-Clause) with one change on the read side: Amaranth's FIFO reads its
memory synchronously at the *next* read pointer, so its read-enable, empty flag, pointer
increment and memory address form one path into the read-data register (8.6 ns on an
ECP5 at 125 MHz, the critical path of the Ethernet front end). Here the memory is read
combinationally at the registered read pointer, so ``r_data`` is a LUT RAM lookup
(pointer flip-flop -> RAM -> ``r_data``) and the pointer update is a separate short path.

``r_data`` is combinational: the reader should register it (or use it in a short path).
The memory must be LUT RAM (asynchronous read), so keep ``depth * width`` small.
"""

from amaranth import *
from amaranth.lib.cdc import AsyncFFSynchronizer, FFSynchronizer
from amaranth.lib.fifo import FIFOInterface
from amaranth.lib.memory import Memory
from amaranth.utils import ceil_log2

__all__ = ["AsyncFIFOLut"]


def _gray_encode(val):
    return val ^ val[1:]


def _gray_decode(val):
    rhs = Const(0)
    out = [None] * len(val)
    for i in reversed(range(len(val))):
        rhs = rhs ^ val[i]
        out[i] = rhs
    return Cat(*out)


class AsyncFIFOLut(Elaboratable, FIFOInterface):
    """Asynchronous FWFT FIFO, ``depth`` a power of 2; interface of
    ``amaranth.lib.fifo.AsyncFIFO`` (``w_*`` in ``w_domain``, ``r_*`` in ``r_domain``,
    ``r_data`` valid while ``r_rdy``), with ``r_data`` read combinationally from LUT RAM."""

    def __init__(self, *, width, depth, r_domain="read", w_domain="write"):
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"AsyncFIFOLut depth must be a power of 2 >= 2, not {depth}")
        super().__init__(width=width, depth=depth)
        self.r_rst = Signal()
        self._r_domain = r_domain
        self._w_domain = w_domain
        self._ctr_bits = ceil_log2(depth) + 1

    def elaborate(self, platform):
        m = Module()
        rd, wd = self._r_domain, self._w_domain
        do_write = self.w_rdy & self.w_en
        do_read = self.r_rdy & self.r_en

        produce_w_bin = Signal(self._ctr_bits)
        produce_w_nxt = Signal(self._ctr_bits)
        m.d.comb += produce_w_nxt.eq(produce_w_bin + do_write)
        m.d[wd] += produce_w_bin.eq(produce_w_nxt)

        # Both read-domain counters are reset_less: the write domain's reset resets them
        # (below), as in Amaranth's AsyncFIFO.
        consume_r_bin = Signal(self._ctr_bits, reset_less=True)
        consume_r_nxt = Signal(self._ctr_bits)
        m.d.comb += consume_r_nxt.eq(consume_r_bin + do_read)
        m.d[rd] += consume_r_bin.eq(consume_r_nxt)

        produce_w_gry = Signal(self._ctr_bits)
        produce_r_gry = Signal(self._ctr_bits)
        m.submodules.produce_cdc = FFSynchronizer(produce_w_gry, produce_r_gry, o_domain=rd)
        m.d[wd] += produce_w_gry.eq(_gray_encode(produce_w_nxt))

        consume_r_gry = Signal(self._ctr_bits, reset_less=True)
        consume_w_gry = Signal(self._ctr_bits)
        m.submodules.consume_cdc = FFSynchronizer(consume_r_gry, consume_w_gry, o_domain=wd)
        m.d[rd] += consume_r_gry.eq(_gray_encode(consume_r_nxt))

        consume_w_bin = Signal(self._ctr_bits)
        m.d[wd] += consume_w_bin.eq(_gray_decode(consume_w_gry))
        produce_r_bin = Signal(self._ctr_bits)
        m.d.comb += produce_r_bin.eq(_gray_decode(produce_r_gry))

        w_full = Signal()
        r_empty = Signal()
        m.d.comb += [
            w_full.eq((produce_w_gry[-1] != consume_w_gry[-1]) &
                      (produce_w_gry[-2] != consume_w_gry[-2]) &
                      (produce_w_gry[:-2] == consume_w_gry[:-2])),
            r_empty.eq(consume_r_gry == produce_r_gry),
        ]
        m.d[wd] += self.w_level.eq(produce_w_bin - consume_w_bin)
        m.d.comb += self.r_level.eq(produce_r_bin - consume_r_bin)

        # A word written at produce_w_bin is visible to the reader only after its pointer
        # has crossed (two read-domain flip-flops), so the combinational read at the
        # current read pointer sees it settled.
        storage = m.submodules.storage = Memory(shape=self.width, depth=self.depth, init=[])
        w_port = storage.write_port(domain=wd)
        r_port = storage.read_port(domain="comb")
        m.d.comb += [
            w_port.addr.eq(produce_w_bin[:-1]), w_port.data.eq(self.w_data),
            w_port.en.eq(do_write), self.w_rdy.eq(~w_full),
            r_port.addr.eq(consume_r_bin[:-1]), self.r_data.eq(r_port.data),
            self.r_rdy.eq(~r_empty),
        ]

        # Write-domain reset empties the FIFO (async-set, sync-release into the read domain).
        w_rst = ResetSignal(domain=wd, allow_reset_less=True)
        r_rst = Signal()
        m.submodules.rst_cdc = AsyncFFSynchronizer(w_rst, r_rst, o_domain=rd)
        with m.If(r_rst):
            m.d.comb += r_empty.eq(1)
            m.d[rd] += [consume_r_gry.eq(produce_r_gry),
                        consume_r_bin.eq(_gray_decode(produce_r_gry)),
                        self.r_rst.eq(1)]
        with m.Else():
            m.d[rd] += self.r_rst.eq(0)
        return m
