"""Narrow elements in 32-bit lane words: int32, 2 x int16 or 4 x int8 per word.

A lane word on the wire is big-endian: its first element is in its high bits (int16:
``word >> 16`` then ``word & 0xFFFF``; int8: ``word >> 24`` first). The element path
keeps one accumulator word per lane word (:class:`LaneFormat`): ``nseg`` segments of
``seg`` bits (``nseg = 32 / narrowest width``), one gap bit between two segments. An
element of width ``w`` spans ``w / narrowest`` segments, enough for the exact sum of
``workers`` elements (``w + ceil(log2 workers)`` bits). One adder adds a whole word
(:func:`lane_add`): a gap bit of the stored operand is 1 where the carry must cross
into the next segment (inside an element) and 0 where it must stop (between two
elements), and the addend's gap bits are 0, so the carry chain is never cut and every
element's sum is exact. The stored gap bits are junk and never read.

:func:`lane_unpack` spreads a lane word's elements into that format (sign-extended,
the elements past the packet's end as 0); :func:`lane_pack` narrows an accumulator
word back to a lane word, each element saturated to its width, and says whether one was
clamped (the record's OVERFLOW). Each has a Python twin (``*_py``) for the benches.

``LaneFormat(workers, (32,))`` is one 32 + ceil(log2 workers)-bit segment: the int32-only
accumulator.

:class:`LaneCodec` joins the three for its block bench (sim/ina/tb_lane_codec.py).
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data, enum
from amaranth.lib.wiring import In, Out

__all__ = ["WIDTHS", "Width", "LaneFormat", "lane_unpack", "lane_add", "lane_pack", "lane_wrap",
           "elements_py", "word_py", "unpack_py", "add_py", "pack_py", "acc_values_py",
           "words_of", "width_byte", "width_checks", "width_checks_py", "nkey", "nkey_split", "words_hw",
           "LaneCodec"]

#: element widths a lane word can carry, in bits
WIDTHS = (8, 16, 32)


class Width(enum.Enum, shape=2):
    """An element width, as the gateware carries it (2 bits)."""
    I32 = 0
    I16 = 1
    I8 = 2

    @property
    def bits(self) -> int:
        return {0: 32, 1: 16, 2: 8}[self.value]

    @classmethod
    def of_bits(cls, bits: int) -> "Width":
        return {32: cls.I32, 16: cls.I16, 8: cls.I8}[bits]


def _clog2(n):
    return max(0, (n - 1).bit_length())


def words_of(nelem: int, bits: int) -> int:
    """32-bit words that ``nelem`` elements of ``bits`` bits fill (the last one padded)."""
    return -(-nelem * bits // 32)


class LaneFormat:
    """Where each element's accumulator sits in a lane's accumulator word.

    workers  most contributions a sum takes (the exact sums' headroom)
    widths   element widths the core takes (a subset of :data:`WIDTHS` with 32)
    """

    def __init__(self, workers: int, widths=(32,)):
        widths = tuple(sorted(set(widths)))
        if 32 not in widths or any(w not in WIDTHS for w in widths):
            raise ValueError(f"widths {widths} must be a subset of {WIDTHS} with 32")
        self.workers, self.widths = workers, widths
        self.head = _clog2(workers)
        self.wmin = widths[0]
        self.nseg = 32 // self.wmin
        #: data bits per segment: each width's exact sum over the segments it spans
        self.seg = max(-(-(w + self.head) * self.wmin // w) for w in widths)
        self.bits = self.nseg * self.seg + self.nseg - 1

    @property
    def narrow(self) -> bool:
        return self.widths != (32,)

    def per(self, w: int) -> int:
        """Elements of width ``w`` in one lane word."""
        return 32 // w

    def span(self, w: int, j: int) -> list[int]:
        """Bit positions (low first) of element ``j``'s accumulator, width ``w``."""
        g = w // self.wmin
        return [s * (self.seg + 1) + b for s in range(j * g, (j + 1) * g)
                for b in range(self.seg)]

    def gaps(self) -> list[int]:
        return [s * (self.seg + 1) + self.seg for s in range(self.nseg - 1)]

    def propagate(self, w: int) -> list[bool]:
        """For each gap: whether a carry crosses it (it lies inside an element)."""
        g = w // self.wmin
        return [(s + 1) % g != 0 for s in range(self.nseg - 1)]

    def __repr__(self):
        return f"LaneFormat(workers={self.workers}, widths={self.widths}): {self.bits} bits"


# -- Python twins ------------------------------------------------------------------------

def elements_py(word: int, w: int) -> list[int]:
    """The signed elements of a 32-bit lane word, first (high) first."""
    out = []
    for j in range(32 // w):
        v = (word >> (32 - (j + 1) * w)) & ((1 << w) - 1)
        out.append(v - (1 << w) if v >> (w - 1) else v)
    return out


def word_py(values, w: int) -> int:
    """The lane word of ``32 / w`` elements (each in range), first in the high bits."""
    out = 0
    for j, v in enumerate(values):
        out |= (v & ((1 << w) - 1)) << (32 - (j + 1) * w)
    return out


def _place(fmt, values, w, gapbits=0):
    out = 0
    for j, v in enumerate(values):
        pos = fmt.span(w, j)
        for i, p in enumerate(pos):
            out |= ((v >> i) & 1) << p       # (Python's >> sign-extends)
    for k, p in enumerate(fmt.gaps()):
        out |= ((gapbits >> k) & 1) << p
    return out


def acc_values_py(fmt: LaneFormat, acc: int, w: int) -> list[int]:
    """The signed element sums an accumulator word holds at width ``w``."""
    out = []
    for j in range(fmt.per(w)):
        pos = fmt.span(w, j)
        v = sum(((acc >> p) & 1) << i for i, p in enumerate(pos))
        out.append(v - (1 << len(pos)) if v >> (len(pos) - 1) else v)
    return out


def unpack_py(fmt: LaneFormat, word: int, w: int, ok) -> int:
    """:func:`lane_unpack`'s twin: ``ok[j]`` whether element ``j`` is the packet's."""
    vals = [v if ok[j] else 0 for j, v in enumerate(elements_py(word, w))]
    return _place(fmt, vals, w)


def add_py(fmt: LaneFormat, acc: int, addend: int, w: int) -> int:
    """:func:`lane_add`'s twin, bit for bit (gap bits included)."""
    prop = fmt.propagate(w)
    a = acc
    for k, p in enumerate(fmt.gaps()):
        a = (a & ~(1 << p)) | (int(prop[k]) << p)
    return (a + addend) & ((1 << fmt.bits) - 1)


def pack_py(fmt: LaneFormat, acc: int, w: int) -> tuple[int, bool]:
    """:func:`lane_pack`'s twin: the saturated lane word and whether one was clamped."""
    lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
    vals = acc_values_py(fmt, acc, w)
    return word_py([min(hi, max(lo, v)) for v in vals], w), any(not lo <= v <= hi for v in vals)


# -- gateware ----------------------------------------------------------------------------

def _per_width(fmt, width, build):
    """``build(w)`` for each width of ``fmt``, selected by ``width`` (a :class:`Width`)."""
    ws = fmt.widths
    if len(ws) == 1:
        return build(ws[0])
    out = build(32)
    for w in ws:
        if w != 32:
            out = Mux(width == Width.of_bits(w), build(w), out)
    return out


def lane_unpack(fmt: LaneFormat, word, width, ok):
    """Amaranth expression: the 32-bit lane ``word``'s elements at ``width``, placed in
    ``fmt`` (sign-extended, gap bits 0); element ``j`` is 0 where ``ok[j]`` is 0."""
    def build(w):
        bits = [None] * fmt.bits
        for j in range(fmt.per(w)):
            v = word[32 - (j + 1) * w: 32 - j * w].as_signed()
            pos = fmt.span(w, j)
            ext = Mux(ok[j], v, 0).as_signed()
            for i, p in enumerate(pos):
                bits[p] = ext[min(i, w - 1)]
        return Cat(*(b if b is not None else Const(0, 1) for b in bits))
    return _per_width(fmt, width, build)


def lane_add(fmt: LaneFormat, acc, addend, width):
    """Amaranth expression: ``acc + addend`` element by element at ``width`` (one adder;
    the gap bits of ``acc`` are replaced by the carry controls, ``addend``'s must be 0)."""
    if not fmt.narrow:
        return (acc.as_signed() + addend.as_signed())[:fmt.bits]
    gaps = fmt.gaps()
    props = {w: fmt.propagate(w) for w in fmt.widths}
    bits = [acc[i] for i in range(fmt.bits)]
    for k, p in enumerate(gaps):
        on = [w for w in fmt.widths if props[w][k]]
        bits[p] = Cat(*(width == Width.of_bits(w) for w in on)).any() if on else Const(0, 1)
    return (Cat(*bits) + addend)[:fmt.bits]


def lane_wrap(fmt: LaneFormat, acc, width):
    """Amaranth expression: each element of ``acc`` wrapped to its width (the planted
    bug ``wrapping_adder``: the sum kept modulo 2^width)."""
    def build(w):
        bits = [acc[i] for i in range(fmt.bits)]
        for j in range(fmt.per(w)):
            pos = fmt.span(w, j)
            for i, p in enumerate(pos):
                bits[p] = acc[pos[min(i, w - 1)]]
        return Cat(*bits)
    return _per_width(fmt, width, build)


def lane_pack(fmt: LaneFormat, acc, width):
    """Amaranth expressions: the lane word of ``acc``'s sums at ``width``, each saturated
    to the width; and whether one was clamped."""
    words, clamps = {}, {}
    for w in fmt.widths:
        ws, cs = [], []
        for j in range(fmt.per(w)):
            v = Cat(*(acc[p] for p in fmt.span(w, j))).as_signed()
            hi = v > (1 << (w - 1)) - 1
            lo = v < -(1 << (w - 1))
            ws.append(Mux(hi, Const((1 << (w - 1)) - 1, w),
                          Mux(lo, Const(1 << (w - 1), w), v[:w])))
            cs.append(hi | lo)
        words[w] = Cat(*reversed(ws))         # the first element in the high bits
        clamps[w] = Cat(*cs).any()
    return (_per_width(fmt, width, lambda w: words[w]),
            _per_width(fmt, width, lambda w: clamps[w]))


# -- the header's width byte (ina_fabric.protocol.fields: low nibble the elements' width
# code, high nibble the RESULT's; 0 int32, 1 int16, 2 int8) ------------------------------

def width_byte(hdr):
    """The header's width byte (the field that was ``reserved`` before issue 40)."""
    from .layout import HeaderLayout
    names = {name for name, _ in HeaderLayout}
    return hdr.width if "width" in names else hdr.reserved


def width_checks(widths, wb, nelem):
    """Amaranth expressions for a DATA's width byte ``wb`` and ``nelem``, in a core that
    sums ``widths``: the byte names no width the core takes (or elements narrower than
    the result: ``drop_malformed``, checked before the length), the bytes the elements
    take, the two nibbles differ (``drop_malformed``, checked after the job's checks: only
    a child switch sends elements wider than its result, and the core has no children),
    and the width code the pipeline carries."""
    if tuple(widths) == (32,):
        return wb != 0, nelem * 4, Const(0, 1), Const(0, 2)
    lo, hi = wb[0:4], wb[4:8]
    codes = [Width.of_bits(w).value for w in widths]
    lo_ok = Cat(*(lo == c for c in codes)).any()
    hi_ok = Cat(*(hi == c for c in codes)).any()
    nbytes = nelem * 4
    for w in widths:
        if w != 32:
            nbytes = Mux(lo == Width.of_bits(w).value, nelem * (w // 8), nbytes)
    return ~lo_ok | ~hi_ok | (lo > hi), nbytes, lo != hi, lo[:2]


def width_checks_py(widths, wb: int, nelem: int):
    """:func:`width_checks`' twin: ``(bad, nbytes, nibbles differ, code)``."""
    lo, hi = wb & 15, wb >> 4
    codes = {Width.of_bits(w).value: w for w in widths}
    bad = lo not in codes or hi not in codes or lo > hi
    nbytes = nelem * (codes[lo] // 8 if lo in codes else 4)
    return bad, nbytes, lo != hi and tuple(widths) != (32,), lo & 3 if tuple(widths) != (32,) else 0


def nkey(code, nelem):
    """In a core with narrow widths the header pipeline's ``nelem`` (the operation's, the
    slot record's and the requests') is this key: the width code in its low two bits,
    the element count above. A packet joins a record only with both equal (``nelem_ne``),
    and the element path and the replicator take the width from it."""
    return Cat(code, nelem)


def nkey_split(key):
    """``(width code, nelem)`` of a key (:func:`nkey`)."""
    return key[:2], key[2:]


def words_hw(fmt_widths, code, nelem):
    """Amaranth expression: the lane words ``nelem`` elements of width ``code`` fill."""
    out = nelem
    for w in fmt_widths:
        if w != 32:
            per = 32 // w
            out = Mux(code == Width.of_bits(w).value,
                      (nelem + (per - 1)) >> (per.bit_length() - 1), out)
    return out


class LaneCodec(wiring.Component):
    """The lane functions joined for their bench: ``addend`` is ``word`` unpacked at
    ``width`` (elements where ``ok`` is 0 as 0), ``sum`` is ``acc + addend``, ``packed``
    and ``clamped`` are ``sum`` narrowed back (combinational)."""

    def __init__(self, fmt: LaneFormat):
        self.fmt = fmt
        super().__init__({
            "word": In(32), "width": In(Width), "ok": In(fmt.nseg),
            "acc": In(fmt.bits),
            "addend": Out(fmt.bits), "sum": Out(fmt.bits),
            "packed": Out(32), "clamped": Out(1),
        })

    def elaborate(self, platform):
        fmt = self.fmt
        m = Module()
        word, clamped = lane_pack(fmt, self.sum, self.width)
        m.d.comb += [self.addend.eq(lane_unpack(fmt, self.word, self.width, self.ok)),
                     self.sum.eq(lane_add(fmt, self.acc, self.addend, self.width)),
                     self.packed.eq(word), self.clamped.eq(clamped)]
        return m
