"""The core's input FIFO: every accepted beat with its datagram's time, popped one beat a
cycle, and rewindable (a popped beat stays until its packet's decision is final)."""

from amaranth.hdl import *
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out

from .layout import in_layout

__all__ = ["entry_layout", "InputFifo"]


def entry_layout(lanes: int) -> data.StructLayout:
    """One FIFO entry: an input beat (``n`` dropped) with ``first`` made explicit (a beat
    after a ``last`` is a first beat) and ``ts``, its datagram's time (the cycle its
    first beat was accepted)."""
    return data.StructLayout({"data": data.ArrayLayout(32, lanes), "first": 1, "last": 1,
                              "length": 16, "src_ip": 32, "src_port": 16, "src_mac": 48,
                              "ts": 32})


class InputFifo(wiring.Component):
    """16 beats in distributed RAM, with a rewindable pop pointer.

    i           the core's input stream; ``ready`` is a register: the FIFO had room for
                two more beats a cycle earlier (so one beat always fits) and ``hold``
                was low
    now         the cycle counter (a datagram's time)
    hold        take no input (a job is being initialized)
    head        the beat at the pop pointer (asynchronous read; an old beat when empty)
    avail       a beat is there to pop (registered, from the next cycle's pointers)
    pop         take ``head``
    pop_ptr     the pop pointer (one wrap bit): where a rewind may return to
    rewind_n    low: the pop pointer returns to ``rewind_to``, and the commit pointer
                with it

    The commit pointer, which frees entries, trails the pop pointer by ``commit_delay``
    cycles (the header pipeline's decision latency), so a packet whose decision sends it
    back can be popped again from ``rewind_to``.
    """

    DEPTH = 16

    def __init__(self, lanes: int, *, commit_delay: int):
        self.lanes, self.commit_delay = lanes, commit_delay
        super().__init__({
            "i": In(stream.Signature(in_layout(lanes))),
            "now": In(32),
            "hold": In(1),
            "head": Out(entry_layout(lanes)),
            "avail": Out(1),
            "pop": In(1),
            "pop_ptr": Out(5),
            "rewind_n": In(1, init=1),
            "rewind_to": In(5),
        })

    def elaborate(self, platform):
        m = Module()
        FD = self.DEPTH
        i, ip = self.i, self.i.payload
        now, pop = self.now, self.pop
        m.submodules.mem = mem = memory.Memory(shape=entry_layout(self.lanes), depth=FD,
                                               init=[])
        f_w = mem.write_port()
        f_r = mem.read_port(domain="comb")
        wp, rp = Signal(5, name="fifo_wp"), Signal(5, name="fifo_rp")   # one wrap bit
        rp_d = [Signal(5, name=f"rp_d{k}") for k in range(self.commit_delay)]  # [-1]: commit
        in_pkt_in = Signal()
        ts_in = Signal(32)
        in_first = ip.first | ~in_pkt_in
        # room for a beat, registered one cycle late with one entry to spare (the FIFO
        # fills by at most one beat per cycle; the commit pointer never moves back)
        in_room = Signal(init=1)
        # (and no hold: also a cycle late, harmless, as pops wait for it)
        m.d.sync += in_room.eq(((wp - rp_d[-1])[:5] < FD - 1) & ~self.hold)
        m.d.comb += i.ready.eq(in_room)
        m.d.comb += [f_w.addr.eq(wp[:4]), f_w.en.eq(i.valid & i.ready),
                     f_w.data.data.eq(ip.data), f_w.data.first.eq(in_first),
                     f_w.data.last.eq(ip.last), f_w.data.length.eq(ip.length),
                     f_w.data.src_ip.eq(ip.src_ip), f_w.data.src_port.eq(ip.src_port),
                     f_w.data.src_mac.eq(ip.src_mac),
                     f_w.data.ts.eq(Mux(in_first, now, ts_in))]
        wp1 = Signal(5, init=1, name="fifo_wp1")        # wp + 1
        wpm1 = Signal(5, init=31, name="fifo_wpm1")     # wp - 1
        with m.If(i.valid & i.ready):
            m.d.sync += [wp.eq(wp + 1), wp1.eq(wp1 + 1), wpm1.eq(wpm1 + 1),
                         in_pkt_in.eq(~ip.last)]
            with m.If(in_first):
                m.d.sync += ts_in.eq(now)

        m.d.comb += [f_r.addr.eq(rp[:4]), self.head.eq(f_r.data), self.pop_ptr.eq(rp)]
        # a beat to pop: ``rp != wp``, registered (worked out for the next cycle's
        # pointers from compares of this cycle's, wp + 1 and wp - 1 kept as registers, so
        # the pop decision starts from flip-flops)
        push = i.valid & i.ready
        rw_next = self.rewind_to
        # each pointer compare is kept as its own LUT tree, so ``push`` and ``pop`` only
        # enter the last level (without the split, synthesis chained the compares behind
        # ``push``: six LUTs from ``in_room``, the worst path of three seeds in four)
        ne = {}
        for k, (a, b) in {"rw_wp1": (rw_next, wp1), "rw_wp": (rw_next, wp),
                          "rp_wpm1": (rp, wpm1), "rp_wp1": (rp, wp1),
                          "rp_wp": (rp, wp)}.items():
            ne[k] = Signal(name=f"ne_{k}", attrs={"keep": 1})
            m.d.comb += ne[k].eq(a != b)
        m.d.sync += self.avail.eq(Mux(~self.rewind_n,
                                      Mux(push, ne["rw_wp1"], ne["rw_wp"]),
                                      Mux(pop, Mux(push, 1, ne["rp_wpm1"]),
                                          Mux(push, ne["rp_wp1"], ne["rp_wp"]))))
        with m.If(pop):
            m.d.sync += rp.eq(rp + 1)
        m.d.sync += ([rp_d[0].eq(rp)]
                     + [rp_d[k].eq(rp_d[k - 1]) for k in range(1, self.commit_delay)])
        with m.If(~self.rewind_n):
            m.d.sync += rp.eq(rw_next)
            m.d.sync += [r.eq(rw_next) for r in rp_d]
        return m
