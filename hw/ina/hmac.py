"""HMAC-SHA256 over a message in the control plane's buffers, under a key held as data.

Ports::

    start     In: hash the first ``length`` bytes of the buffer (a pulse)
    length    In: the message's length in bytes (read on ``start``)
    rd        the word reader (:mod:`.reader`): the message's words, read in order
    busy      Out: from the cycle after ``start`` until ``digest`` is the tag
    digest    Out: the HMAC's eight words (the tag is the first four)

The key's two blocks (``K ^ ipad``, ``K ^ opad``) are a block RAM's contents, so the
netlist is the same for every key: as constants in LUTs each key gave yosys another
netlist and nextpnr another placement, and a seed that met timing with one key need
not with the next. A key word takes a cycle to read. The message is padded as SHA-256
pads (``0x80``, zeros, the bit length after the 64-byte key block) while it is fed;
the bytes after the message in its last word must be zero (a reply's last word is
flushed so; a request's message is whole words).
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory
from amaranth.lib.wiring import In, Out

from .reader import READ_LATENCY, reader_signature
from .sha256 import Sha256

__all__ = ["HmacSha256", "hmac_blocks"]


def hmac_blocks(key: bytes):
    """The two 16-word key blocks of HMAC-SHA256: ``K ^ ipad`` and ``K ^ opad``."""
    import hashlib
    if len(key) > 64:
        key = hashlib.sha256(key).digest()
    key = key.ljust(64, b"\0")
    ipad = bytes(b ^ 0x36 for b in key)
    opad = bytes(b ^ 0x5C for b in key)
    words = lambda b: [int.from_bytes(b[k:k + 4], "big") for k in range(0, 64, 4)]
    return words(ipad), words(opad)


class HmacSha256(wiring.Component):
    """See the module docstring. ``key``: bytes; ``max_bytes``: the longest message;
    ``addr_shape``: the reader's address."""

    def __init__(self, key: bytes, *, max_bytes: int, addr_shape):
        self.key = key
        self.max_bytes = max_bytes
        super().__init__({
            "start": In(1),
            "length": In(range(max_bytes + 1)),
            "rd": Out(reader_signature(addr_shape)),
            "busy": Out(1),
            "digest": Out(data.ArrayLayout(32, 8)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.sha = sha = Sha256()
        ipad, opad = hmac_blocks(self.key)
        m.submodules.keymem = keymem = memory.Memory(shape=32, depth=32,
                                                     init=list(ipad) + list(opad),
                                                     attrs={"rom_style": "block"})
        kport = keymem.read_port(domain="sync")
        kop = Signal()      # 1: the opad block
        kdly = Signal()     # the word at ``cnt`` is on ``kport.data``
        cnt = Signal(range(2048))               # word counter within a phase
        mlen = Signal(range(self.max_bytes + 1))    # bytes hashed
        nblk16 = Signal(range(2048))            # words of the padded message (16 per block)
        inner = Signal(data.ArrayLayout(32, 8))
        dly = Signal(2)
        word = self.rd.word
        RD = READ_LATENCY
        m.d.comb += [kport.addr.eq(Cat(cnt[:4], kop)), self.digest.eq(sha.digest)]

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [mlen.eq(self.length), cnt.eq(0), kdly.eq(0)]
                    m.d.comb += sha.restart.eq(1)
                    m.next = "IPAD"
            with m.State("IPAD"):
                m.d.sync += kdly.eq(1)
                with m.If(kdly):
                    m.d.comb += [sha.i.valid.eq(1), sha.i.payload.eq(kport.data)]
                with m.If(kdly & sha.i.ready):
                    m.d.sync += [cnt.eq(cnt + 1), kdly.eq(0)]
                    with m.If(cnt == 15):
                        m.d.sync += [cnt.eq(0), dly.eq(0)]
                        m.d.comb += [self.rd.en.eq(1), self.rd.addr.eq(0)]
                        # padded blocks of the message after the key block: (m + 9 + 63) // 64
                        m.d.sync += nblk16.eq(((mlen + 9 + 63) >> 6) << 4)
                        m.next = "MSG"
            with m.State("MSG"):
                # word cnt of the padded message, read ``RD`` cycles after its address
                m.d.comb += [self.rd.en.eq(1), self.rd.addr.eq(cnt)]
                bits = (64 + mlen) << 3
                mfull, mrem = mlen >> 2, mlen[:2]
                pad = Mux(mrem == 0, 0x80000000, Mux(mrem == 1, 0x00800000,
                          Mux(mrem == 2, 0x00008000, 0x00000080)))
                val = Mux(cnt < mfull, word,
                          Mux(cnt == mfull, Mux(mrem == 0, 0, word) | pad,
                              Mux(cnt == nblk16 - 1, bits, 0)))
                with m.If(dly != RD):
                    m.d.sync += dly.eq(dly + 1)
                with m.Else():
                    m.d.comb += [sha.i.valid.eq(1), sha.i.payload.eq(val)]
                    with m.If(sha.i.ready):
                        m.d.sync += [cnt.eq(cnt + 1), dly.eq(0)]
                        with m.If(cnt == nblk16 - 1):
                            m.d.sync += cnt.eq(0)
                            m.next = "INNER"
            with m.State("INNER"):
                with m.If(~sha.busy):
                    m.d.sync += [inner.eq(sha.digest), kdly.eq(0)]
                    m.d.comb += sha.restart.eq(1)
                    m.next = "OPAD"
            with m.State("OPAD"):
                m.d.comb += kop.eq(1)
                m.d.sync += kdly.eq(1)
                with m.If(kdly):
                    m.d.comb += [sha.i.valid.eq(1), sha.i.payload.eq(kport.data)]
                with m.If(kdly & sha.i.ready):
                    m.d.sync += [cnt.eq(cnt + 1), kdly.eq(0)]
                    with m.If(cnt == 15):
                        m.d.sync += cnt.eq(0)
                        m.next = "OUTER"
            with m.State("OUTER"):
                val = Mux(cnt < 8, Array(inner[k] for k in range(8))[cnt[:3]],
                          Mux(cnt == 8, 0x80000000, Mux(cnt == 15, (64 + 32) * 8, 0)))
                m.d.comb += [sha.i.valid.eq(1), sha.i.payload.eq(val)]
                with m.If(sha.i.ready):
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(cnt == 15):
                        m.d.sync += cnt.eq(0)
                        m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | sha.busy)
        return m
