"""Output request queue: a FIFO in distributed RAM that takes up to two requests per
cycle, and per-record counts of the requests not yet sent (what a packet that would reuse a
slot record must wait for)."""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory, fifo
from amaranth.lib.wiring import In, Out

__all__ = ["RequestQueue", "PendingCounts", "BlockFifo"]


class RequestQueue(wiring.Component):
    """FIFO of the requests of up to ``depth`` operations, in distributed RAM. An
    operation pushes up to two requests in one cycle (a before b) into one entry; the
    reader takes them one at a time, oldest first.

    push_a, push_b   the operation's requests (either may be alone)
    a, b             the records to write
    pop              take ``head`` (when ``head_valid``)
    head, head_valid the oldest request
    level            requests held (at least the entries in use: an entry holds one or
                     two), so ``level <= depth`` keeps the FIFO from overflowing
    """

    def __init__(self, layout: data.StructLayout, depth: int):
        assert depth >= 4 and depth & (depth - 1) == 0, "depth: a power of two >= 4"
        self.layout, self.depth = layout, depth
        super().__init__({
            "push_a": In(1), "a": In(layout),
            "push_b": In(1), "b": In(layout),
            "pop": In(1),
            "head": Out(layout), "head_valid": Out(1),
            "level": Out(range(2 * depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.depth
        EntL = data.StructLayout({"a": self.layout, "b": self.layout, "va": 1, "vb": 1})
        m.submodules.mem = mem = memory.Memory(shape=EntL, depth=D, init=[],
                                               attrs={"ram_style": "distributed"})
        w, r = mem.write_port(), mem.read_port(domain="comb")
        wp, rp = Signal(range(D)), Signal(range(D))
        half = Signal()     # the head entry's a has been taken
        push = self.push_a | self.push_b
        m.d.comb += [w.addr.eq(wp), w.en.eq(push), w.data.a.eq(self.a), w.data.b.eq(self.b),
                     w.data.va.eq(self.push_a), w.data.vb.eq(self.push_b), r.addr.eq(rp)]
        ent = r.data
        take_a = ent.va & ~half
        m.d.comb += [self.head.eq(Mux(take_a, ent.a, ent.b)),
                     self.head_valid.eq(self.level != 0)]
        done = self.pop & (self.level != 0) & ~(take_a & ent.vb)   # the entry is used up
        with m.If(self.pop & (self.level != 0)):
            m.d.sync += half.eq(take_a & ent.vb)
        with m.If(push):
            m.d.sync += wp.eq(wp + 1)
        with m.If(done):
            m.d.sync += rp.eq(rp + 1)
        m.d.sync += self.level.eq(self.level + self.push_a + self.push_b
                                  - (self.pop & (self.level != 0)))
        return m


class PendingCounts(wiring.Component):
    """For each of ``records`` slot records, how many of its requests are not yet sent.

    add, add_hot     ``add`` (0, 1 or 2) requests of the record whose bit is set in
                     ``add_hot`` (one-hot) enter the queue
    done_hot         the last beat of one request of the record whose bit is set has
                     been issued (one-hot, or 0)
    nonzero          bit r: record r has requests waiting or being sent (registered:
                     it shows this cycle's add and done from the next cycle on)

    A record's count only needs ``nonzero``, so that is kept as its own register: a
    reader selects one bit instead of comparing a selected count.
    """

    def __init__(self, records: int, max_pending: int):
        self.records, self.max_pending = records, max_pending
        super().__init__({
            "add": In(2), "add_hot": In(records), "done_hot": In(records),
            "nonzero": Out(records),
        })

    def elaborate(self, platform):
        m = Module()
        for r in range(self.records):
            cnt = Signal(range(self.max_pending + 1), name=f"pending{r}")
            up = Mux(self.add_hot[r], self.add, 0)
            down = self.done_hot[r]
            m.d.sync += cnt.eq(cnt + up - down)
            # a request finishes only after it was added (count >= 1 when ``down``)
            m.d.sync += self.nonzero[r].eq((up != 0) | Mux(down, cnt != 1, cnt != 0))
        return m


class BlockFifo(fifo.SyncFIFOBuffered):
    """``amaranth.lib.fifo.SyncFIFOBuffered`` (the same ports, the same behaviour, cycle
    for cycle) whose storage is marked for block RAM (``ram_style``): yosys maps a
    shallow, wide FIFO to LUT RAM otherwise, which on a full 45F costs the LUTs the
    placement needs (the answer path's queue, 32 x 267 bits)."""

    def elaborate(self, platform):
        m = Module()
        D = self.depth - 1          # the memory; the output register holds one more
        assert D >= 1
        level = Signal(range(D + 1))
        m.d.comb += [self.w_rdy.eq(level != D), self.w_level.eq(self.level),
                     self.r_level.eq(self.level)]
        do_write = self.w_rdy & self.w_en
        do_read = (level != 0) & (~self.r_rdy | self.r_en)
        m.submodules.storage = mem = memory.Memory(shape=self.width, depth=D, init=[],
                                                   attrs={"ram_style": "block"})
        wp = mem.write_port()
        rp = mem.read_port(domain="sync")
        produce, consume = Signal(range(D)), Signal(range(D))

        def incr(v):
            return Mux(v == D - 1, 0, v + 1)

        m.d.comb += [wp.addr.eq(produce), wp.data.eq(self.w_data), wp.en.eq(do_write),
                     rp.addr.eq(consume), rp.en.eq(do_read), self.r_data.eq(rp.data)]
        with m.If(do_write):
            m.d.sync += produce.eq(incr(produce))
        with m.If(do_read):
            m.d.sync += consume.eq(incr(consume))
        with m.If(do_write & ~do_read):
            m.d.sync += level.eq(level + 1)
        with m.If(do_read & ~do_write):
            m.d.sync += level.eq(level - 1)
        with m.If(do_read):
            m.d.sync += self.r_rdy.eq(1)
        with m.Elif(self.r_en):
            m.d.sync += self.r_rdy.eq(0)
        m.d.comb += self.level.eq(level + self.r_rdy)
        return m
