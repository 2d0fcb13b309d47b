"""Output request queue: a small register FIFO that takes up to two requests per cycle,
and per-record counts of the requests not yet sent (what a packet that would reuse a
slot record must wait for)."""

from amaranth.hdl import *
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

__all__ = ["RequestQueue", "PendingCounts"]


class RequestQueue(wiring.Component):
    """Depth-``depth`` FIFO of ``layout`` records.

    push_a, push_b   two writes in one cycle (a before b); either may be alone
    a, b             the records to write
    pop              drop the head (when ``head_valid``)
    head, head_valid the oldest record
    level            number of records held
    """

    def __init__(self, layout: data.StructLayout, depth: int):
        assert depth >= 4
        self.layout, self.depth = layout, depth
        super().__init__({
            "push_a": In(1), "a": In(layout),
            "push_b": In(1), "b": In(layout),
            "pop": In(1),
            "head": Out(layout), "head_valid": Out(1),
            "level": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.depth
        ents = [Signal(self.layout, name=f"ent{k}") for k in range(D)]
        rp = Signal(range(D))
        level = self.level
        do_pop = self.pop & (level != 0)
        # one-hot write pointer: entry k takes a at wsel[k], and b at wsel[k] (alone) or
        # at wsel[k-1] (after a), so each entry's write enable is one LUT
        wsel = Signal(D, init=1)
        for k in range(D):
            at_a = self.push_a & wsel[k]
            at_b = self.push_b & Mux(self.push_a, wsel[(k - 1) % D], wsel[k])
            with m.If(at_a):
                m.d.sync += ents[k].eq(self.a)
            with m.Elif(at_b):
                m.d.sync += ents[k].eq(self.b)
        with m.Switch(Cat(self.push_a, self.push_b)):
            with m.Case(0b01, 0b10):
                m.d.sync += wsel.eq(wsel.rotate_left(1))
            with m.Case(0b11):
                m.d.sync += wsel.eq(wsel.rotate_left(2))
        m.d.sync += level.eq(level + self.push_a + self.push_b - do_pop)
        with m.If(do_pop):
            m.d.sync += rp.eq(Mux(rp == D - 1, 0, rp + 1))
        m.d.comb += [self.head.eq(Array(ents)[rp]), self.head_valid.eq(level != 0)]
        return m


class PendingCounts(wiring.Component):
    """For each of ``records`` slot records, how many of its requests are not yet sent.

    add, add_rec     ``add`` (0, 1 or 2) requests of record ``add_rec`` enter the queue
    done, done_rec   the last beat of one request of ``done_rec`` has been issued
    nonzero          bit r: record r has requests waiting or being sent (registered:
                     it shows this cycle's add and done from the next cycle on)

    A record's count only needs ``nonzero``, so that is kept as its own register: a
    reader selects one bit instead of comparing a selected count.
    """

    def __init__(self, records: int, max_pending: int):
        self.records, self.max_pending = records, max_pending
        super().__init__({
            "add": In(2), "add_rec": In(range(records)),
            "done": In(1), "done_rec": In(range(records)),
            "nonzero": Out(records),
        })

    def elaborate(self, platform):
        m = Module()
        for r in range(self.records):
            cnt = Signal(range(self.max_pending + 1), name=f"pending{r}")
            up = Mux(self.add_rec == r, self.add, 0)
            down = self.done & (self.done_rec == r)
            m.d.sync += cnt.eq(cnt + up - down)
            # a request finishes only after it was added (count >= 1 when ``down``)
            m.d.sync += self.nonzero[r].eq((up != 0) | Mux(down, cnt != 1, cnt != 0))
        return m
