"""The replay store: the ``REPLAY_SLOTS`` highest nonces a switch has taken (the rule of
``ina_fabric.protocol.auth``): a nonce is fresh when the store has not seen it and it is
above the lowest one kept (or a slot is still empty); a fresh nonce replaces the lowest.

Ports::

    start     In: check ``nonce`` (a pulse)
    nonce     In: 64 bits, still until ``done``
    done      Out: a pulse, ``REPLAY_SLOTS + 2`` cycles after ``start``
    fresh     Out: with ``done``: the nonce was fresh, and is now kept

The nonces sit in a LUT RAM read one slot a cycle (a compare of every slot at once was
800 LUTs on the core clock's longest paths). The read is registered before its two
64-bit compares (the LUT RAM's read, then ``==`` and ``<`` in one cycle, behind the
control plane's state decoding ``start``, was the Versa's longest core path with the
narrow widths): a slot is read in one cycle and compared in the next.
"""

from amaranth.hdl import *
from amaranth.lib import wiring, memory
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.auth import REPLAY_SLOTS

__all__ = ["ReplayStore", "REPLAY_SLOTS"]


def _log2(n):
    return (n - 1).bit_length()


class ReplayStore(wiring.Component):
    """See the module docstring. ``slots``: how many nonces it keeps."""

    def __init__(self, slots: int = REPLAY_SLOTS):
        self.slots = slots
        super().__init__({"start": In(1), "nonce": In(64), "done": Out(1), "fresh": Out(1)})

    def elaborate(self, platform):
        m = Module()
        S = self.slots
        nonce = self.nonce
        m.submodules.kept = kept = memory.Memory(shape=64, depth=S, init=[])
        kept_r = kept.read_port(domain="comb")
        kept_w = kept.write_port()
        kvalid = Signal(S)
        run = Signal()
        rs_i = Signal(range(S + 2))     # the slot read (0..S-1); S + 1: the decision
        # the read, registered: slot p_i's nonce and whether it holds one
        p_valid, p_kv, p_vv = Signal(), Signal(64), Signal()
        p_i = Signal(range(S))
        rs_seen = Signal()
        rs_low = Signal(range(S))       # the slot to use (empty, else lowest)
        rs_lowv = Signal(64)
        rs_empty = Signal()
        # (the address does not depend on ``start``: it is the counter alone)
        if S > 1:
            m.d.comb += kept_r.addr.eq(rs_i[:_log2(S)])
        m.d.sync += [p_kv.eq(kept_r.data), p_vv.eq(kvalid.bit_select(rs_i, 1)),
                     p_i.eq(rs_i), p_valid.eq(run & (rs_i < S))]
        with m.If(self.start):
            m.d.sync += [run.eq(1), rs_i.eq(0), rs_seen.eq(0), rs_empty.eq(0),
                         rs_low.eq(0), rs_lowv.eq(C(-1, 64)), p_valid.eq(0)]
        with m.Elif(run):
            with m.If(rs_i == S + 1):
                refuse = rs_seen | (~rs_empty & (nonce <= rs_lowv))
                m.d.sync += run.eq(0)
                m.d.comb += [self.done.eq(1), self.fresh.eq(~refuse)]
                with m.If(~refuse):
                    m.d.comb += [kept_w.addr.eq(rs_low), kept_w.data.eq(nonce),
                                 kept_w.en.eq(1)]
                    for k in range(S):
                        with m.If(rs_low == k):
                            m.d.sync += kvalid[k].eq(1)
            with m.Else():
                m.d.sync += rs_i.eq(rs_i + 1)
            # one slot a cycle, a cycle after its read: seen? the slot to use: an empty
            # one, else the lowest
            with m.If(p_valid):
                with m.If(p_vv & (p_kv == nonce)):
                    m.d.sync += rs_seen.eq(1)
                with m.If(~rs_empty):
                    with m.If(~p_vv):
                        m.d.sync += [rs_empty.eq(1), rs_low.eq(p_i)]
                    with m.Elif(p_kv < rs_lowv):
                        m.d.sync += [rs_low.eq(p_i), rs_lowv.eq(p_kv)]
        return m
