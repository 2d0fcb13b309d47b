"""Output request queue: a small register FIFO that takes up to two requests per cycle
and can tell whether a slot record has a request waiting (a one-port CAM)."""

from amaranth.hdl import *
from amaranth.lib import wiring, data
from amaranth.lib.wiring import In, Out

__all__ = ["RequestQueue"]


class RequestQueue(wiring.Component):
    """Depth-``depth`` FIFO of ``layout`` records.

    push_a, push_b   two writes in one cycle (a before b); either may be alone
    a, b             the records to write
    pop              drop the head (when ``head_valid``)
    head, head_valid the oldest record
    level            number of records held
    probe, probe_hit whether a held record has ``rec == probe``
    """

    def __init__(self, layout: data.StructLayout, depth: int, rec_shape):
        assert depth >= 4
        self.layout, self.depth = layout, depth
        super().__init__({
            "push_a": In(1), "a": In(layout),
            "push_b": In(1), "b": In(layout),
            "pop": In(1),
            "head": Out(layout), "head_valid": Out(1),
            "level": Out(range(depth + 1)),
            "probe": In(rec_shape), "probe_hit": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D = self.depth
        ents = [Signal(self.layout, name=f"ent{k}") for k in range(D)]
        rp = Signal(range(D))
        level = self.level
        do_pop = self.pop & (level != 0)

        def wrap(x):
            return Mux(x >= D, x - D, x)

        # one-hot write pointer: entry k takes a at wsel[k], and b at wsel[k] (alone) or
        # at wsel[k-1] (after a), so each entry's write enable is one LUT
        wsel = Signal(D, init=1)
        wr = []
        for k in range(D):
            at_a = self.push_a & wsel[k]
            at_b = self.push_b & Mux(self.push_a, wsel[(k - 1) % D], wsel[k])
            wr.append(at_a | at_b)
            with m.If(at_a):
                m.d.sync += ents[k].eq(self.a)
            with m.Elif(at_b):
                m.d.sync += ents[k].eq(self.b)
        with m.Switch(Cat(self.push_a, self.push_b)):
            with m.Case(0b01, 0b10):
                m.d.sync += wsel.eq(wsel.rotate_left(1))
            with m.Case(0b11):
                m.d.sync += wsel.eq(wsel.rotate_left(2))
        m.d.sync += [
            level.eq(level + self.push_a + self.push_b - do_pop),
        ]
        with m.If(do_pop):
            m.d.sync += rp.eq(wrap(rp + 1))
        m.d.comb += [
            self.head.eq(Array(ents)[rp]),
            self.head_valid.eq(level != 0),
        ]
        # one valid bit per entry, so the probe is a plain match (no pointer arithmetic)
        valid = Signal(D)
        for k in range(D):
            with m.If(do_pop & (rp == k)):
                m.d.sync += valid[k].eq(0)
            with m.If(wr[k]):
                m.d.sync += valid[k].eq(1)
        hits = [valid[k] & (ents[k].rec == self.probe) for k in range(D)]
        m.d.comb += self.probe_hit.eq(Cat(hits).any())
        return m
