"""The INA core: aggregator + replicator behind two packet streams and a register bus.

Instantiate::

    from ina_fabric.hw.ina.core import InaCore
    from ina_fabric.hw.ina.params import CoreParams
    core = InaCore(CoreParams(workers=32, window=8, elements=64, lanes=1, jobs=2))
    # core.i   : In(stream.Signature(in_layout(L)))   INA datagrams (UDP payloads) from workers
    # core.o   : Out(stream.Signature(out_layout(L))) RESULT datagrams, one per destination;
    #            ERRORs answering refused DATA (hw/ina/answer.py); the control plane's replies
    # core.cfg : In(RegBus)                            job table, member table, counters
    # core.now : Out(32)                               the cycle counter (time of deadlines)

Stream payload (hw/ina/layout.py). Each beat carries ``L`` big-endian 32-bit words of the
UDP payload in ``data`` (lane 0 first on the wire) and ``n``, the number of valid words in
the beat. ``first``/``last`` mark the datagram's first and last beat. The 7 header words
fill the first ``ceil(7/L)`` beats and the elements begin on a new beat (header beats
after word 6 are padding: ``n`` tells how many words are real). Input beats also carry
``length`` (UDP payload bytes), ``src_ip`` and ``src_port``, read on ``first``; the input
must carry exactly ``ceil(length/4)`` words. Output beats carry the destination
(``dst_mac``, ``dst_ip``, ``dst_port``), ``length`` and the IPv4 header ``ip_checksum``
of the RESULT copy, constant over the datagram, for the L2/L3 deparser in front.

The core accepts one beat per cycle with no bubbles. ``i.ready`` falls only while a job
is being (re)initialized or while its 16-beat input FIFO is full; the FIFO stops
draining while the output queue is nearly full, or while a packet that would reuse a
slot whose previous result is still queued or being sent waits to run again.

Inside (one component per file)::

    i ─► InputFifo ─► HeaderPipeline ─┬─ requests ─► RequestQueue ─► Replicator ─► o
         (input_fifo)  (header)        │              (queue)         (replicator)  ▲
                                       ├─ beats ────► ElementPath ──┘ accumulators  │
                                       │              (element)       (read port)   │
                                       └─ refusals ─► ErrorAnswer ─► SideMerge ─────┘
                                                      (answer)       (+ ControlPlane)
    cfg ◄─► RegisterFile (regfile): job table, member tables (read ports), counters
            (Counters, counters.py); PendingCounts (queue.py): requests not yet sent
"""

from amaranth.hdl import *
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from .answer import ErrorAnswer, SideMerge, interval_cycles
from .control import ControlPlane, CONTROL_EVENTS
from .counters import Counters, COUNTER_EVENTS
from .element import ElementPath
from .header import DEC_LAT, HEADER_EVENTS, HeaderPipeline
from .input_fifo import InputFifo
from .layout import in_layout, out_layout, request_layout
from .params import CoreParams
from .queue import RequestQueue, PendingCounts
from .regfile import RegisterFile
from .regs import RegBus
from .replicator import Replicator
from ..eth.words import SkidBuffer

__all__ = ["InaCore", "PLANTED_BUGS"]

#: bugs the tests plant to show the scoreboard catches them, and the component each
#: one breaks (``InaCore(planted_bug=...)`` passes it down as that component's option)
PLANTED_BUGS = {
    "wrapping_adder": "ElementPath(wrapping_adder=True): the sum wraps at 32 bits",
    "no_duplicate_check": "HeaderPipeline(duplicate_check=False): duplicates are added",
    "child_counts_one": "HeaderPipeline(child_counts=False): a spine (tree=True) counts a "
                        "child switch's DATA as one worker",
    "relay_ignores_parent_bitmap": "HeaderPipeline(relay_mine=False): a leaf (leaf=True) "
                                   "relays its members' bitmap also when the parent's RESULT "
                                   "lacks the leaf's bit (its members are not in the sum)",
}


class InaCore(wiring.Component):
    """Aggregator + replicator. See the module docstring for ports and payloads."""

    def __init__(self, params: CoreParams = CoreParams(), *, planted_bug: str | None = None,
                 control_key: bytes | None = None, cycles_per_us: int = 1,
                 error_interval: int | None = None):
        """``control_key``: the key CONTROL datagrams must be sealed with
        (``ina_fabric.protocol.auth``); None: no control over the wire (CONTROL is
        malformed). ``cycles_per_us``: core cycles per microsecond (a CONTROL entry's
        deadline is in microseconds). ``error_interval``: cycles between two ERRORs to
        one source bucket (``hw/ina/answer.py``; default ``fields.ERROR_INTERVAL`` at
        ``cycles_per_us``)."""
        if planted_bug is not None and planted_bug not in PLANTED_BUGS:
            raise ValueError(f"planted_bug {planted_bug!r} not in {sorted(PLANTED_BUGS)}")
        self.params = params
        #: for tests that show a planted bug is caught: None or a key of PLANTED_BUGS
        self.planted_bug = planted_bug
        self.control_key = control_key
        self.cycles_per_us = cycles_per_us
        #: cycles between two ERRORs to one source bucket
        self.error_interval = (interval_cycles(cycles_per_us) if error_interval is None
                               else error_interval)
        super().__init__({
            "i": In(stream.Signature(in_layout(params.lanes))),
            "o": Out(stream.Signature(out_layout(params.lanes))),
            "cfg": In(RegBus),
            "now": Out(32),
        })

    def elaborate(self, platform):
        P = self.params
        bug = self.planted_bug
        m = Module()

        now = Signal(32)
        m.d.sync += now.eq(now + 1)
        m.d.comb += self.now.eq(now)

        m.submodules.counters = ctr = Counters()
        m.submodules.regs = rf = RegisterFile(P)
        m.submodules.header = hp = HeaderPipeline(
            P, duplicate_check=(bug != "no_duplicate_check"),
            child_counts=(bug != "child_counts_one"),
            relay_mine=(bug != "relay_ignores_parent_bitmap"))
        m.submodules.queue = q = RequestQueue(request_layout(P), P.queue)
        m.submodules.pending = pend = PendingCounts(P.records, 2 * P.queue + 2)
        m.submodules.ififo = fifo = InputFifo(P.lanes, commit_delay=DEC_LAT)
        m.submodules.elem = ep = ElementPath(P, wrapping_adder=(bug == "wrapping_adder"))
        m.submodules.replicator = rep = Replicator(P)
        m.submodules.control = ctl = ControlPlane(P, key=self.control_key,
                                                  cycles_per_us=self.cycles_per_us)
        if P.answers:
            m.submodules.answer = ans = ErrorAnswer(P, interval=self.error_interval)
            m.submodules.side = side = SideMerge(P.lanes)

        # register file: the bus, or the control plane in the cycles it writes (the
        # bus's reads show garbage meanwhile; the board reads counters only)
        # (the control plane watches the accepted input beats a cycle late: registered, so
        # its classification does not sit behind the input's block RAM on the board)
        m.d.sync += [ctl.snoop.valid.eq(self.i.valid & self.i.ready),
                     ctl.snoop.payload.eq(self.i.payload)]
        m.d.sync += ctl.accepted.eq(hp.accepted)
        m.d.comb += [ctl.src_ip.eq(rf.src_ip),
                     ctl.counters.eq(ctr.values),
                     ctl.jobs.eq(rf.jobs),
                     self.cfg.r_data.eq(rf.bus.r_data)]
        wiring.connect(m, rf.member_ctl, ctl.member)
        with m.If(ctl.bus_active):
            m.d.comb += [rf.bus.addr.eq(ctl.bus.addr), rf.bus.w_stb.eq(1),
                         rf.bus.w_data.eq(ctl.bus.w_data)]
        with m.Else():
            m.d.comb += [rf.bus.addr.eq(self.cfg.addr), rf.bus.w_stb.eq(self.cfg.w_stb),
                         rf.bus.w_data.eq(self.cfg.w_data)]
        m.d.comb += [rf.now.eq(now), rf.counters.eq(ctr.values)]
        m.d.comb += [hp.jobs.eq(rf.jobs), hp.enable_stb.eq(rf.enable_stb),
                     hp.enable_value.eq(rf.enable_value), rf.enable_set.eq(hp.enable_set)]
        for j in range(P.jobs):
            wiring.connect(m, rf.member_p0[j], hp.member[j])

        # input FIFO -> header pipeline
        wiring.connect(m, wiring.flipped(self.i), fifo.i)
        m.d.comb += [fifo.now.eq(now), fifo.hold.eq(hp.hold),
                     hp.now.eq(now), hp.head.eq(fifo.head), hp.avail.eq(fifo.avail),
                     fifo.pop.eq(hp.pop), hp.pop_ptr.eq(fifo.pop_ptr),
                     fifo.rewind_n.eq(hp.rewind_n), fifo.rewind_to.eq(hp.rewind_to)]

        # header pipeline -> request queue, pending counts; -> element path
        # (the answer path's stop shows the header pipeline a full queue)
        m.d.comb += [q.push_a.eq(hp.push_a), q.a.eq(hp.a), q.push_b.eq(hp.push_b),
                     q.b.eq(hp.b),
                     hp.queue_level.eq(Mux(ans.stop, 2 * P.queue, q.level) if P.answers
                                       else q.level),
                     pend.add.eq(hp.push_a + hp.push_b), pend.add_hot.eq(hp.push_hot),
                     hp.pending.eq(pend.nonzero)]
        m.d.comb += [ep.beat.eq(hp.elem), ep.start.eq(hp.elem_start),
                     ep.packet.eq(hp.elem_packet)]

        # request queue -> replicator -> o
        m.d.comb += [rep.req.valid.eq(q.head_valid), rep.req.payload.eq(q.head),
                     q.pop.eq(rep.req.valid & rep.req.ready),
                     rep.jobs.eq(rf.jobs), rep.src_ip.eq(rf.src_ip),
                     rep.busy.eq(ep.busy), pend.done_hot.eq(rep.done_hot)]
        wiring.connect(m, rf.member_rd, rep.member)
        if P.leaf:      # a leaf: its parent switch (hw/ina/leaf.py)
            m.d.comb += [hp.parent.ip.eq(rf.parent.ip), hp.parent.port.eq(rf.parent.port),
                         rep.parent.eq(rf.parent)]
        wiring.connect(m, ep.acc_rd, rep.acc)
        wiring.connect(m, ep.ovf_rd, rep.ovf)
        # refused DATA: the answer path (hw/ina/answer.py)
        if P.answers:
            m.d.comb += [ans.cap.eq(hp.cap), ans.refusal.eq(hp.refusal),
                         ans.jobs.eq(rf.jobs), ans.reset_pos.eq(rf.enable_stb),
                         ans.now.eq(now), ans.src_ip.eq(rf.src_ip)]
        # the output: RESULT copies, and between them the control plane's replies and
        # the ERRORs, merged through a register stage (a packet at a time; the select is
        # a register, so the replicator's path to ``o`` gains one 2:1 multiplexer)
        if P.answers:
            wiring.connect(m, ctl.o, side.a)
            wiring.connect(m, ans.o, side.b)
            ctl_o = side.o
        else:                   # the control plane's replies only
            ctl_o = ctl.o
        # (the replicator's output through a register slice, payload, valid and ready
        # from flip-flops, the stream unchanged a cycle later: its handshake, through the
        # output CDC's storage and back to the replicator's beat counter, was the Versa's
        # longest core path with the tree option and with the narrow widths)
        m.submodules.rep_skid = skid = SkidBuffer(out_layout(P.lanes))
        wiring.connect(m, rep.o, skid.i)
        rep_o = skid.o
        sel_ctl = Signal()
        in_pkt = Signal()
        with m.If(sel_ctl):
            m.d.comb += [self.o.valid.eq(ctl_o.valid), self.o.payload.eq(ctl_o.payload),
                         ctl_o.ready.eq(self.o.ready)]
        with m.Else():
            m.d.comb += [self.o.valid.eq(rep_o.valid), self.o.payload.eq(rep_o.payload),
                         rep_o.ready.eq(self.o.ready)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += in_pkt.eq(~self.o.payload.last)
        with m.If(~in_pkt & ~(self.o.valid & self.o.ready)):
            with m.If(sel_ctl & ~ctl_o.valid):
                m.d.sync += sel_ctl.eq(0)
            with m.Elif(~sel_ctl & ~rep_o.valid & ctl_o.valid):
                m.d.sync += sel_ctl.eq(1)
        with m.If(self.o.valid & self.o.ready & self.o.payload.last & sel_ctl):
            m.d.sync += sel_ctl.eq(0)

        # counters: each one's events from every block that raises it
        parts = {name: [] for name in COUNTER_EVENTS}
        for name in HEADER_EVENTS:
            parts[name].append(getattr(hp.events, name))
        for name in CONTROL_EVENTS:
            parts[name].append(getattr(ctl.events, name))
        parts["overflows"].append(rep.overflow)
        parts["stream_errors"].append(ep.stream_errors)
        if P.answers:
            parts["errors_sent"].append(ans.sent)
            parts["errors_limited"].append(ans.limited)
        else:                   # nothing answered, nothing limited: constant 0
            parts["errors_sent"].append(Const(0, 1))
            parts["errors_limited"].append(Const(0, 1))
        for name, bits in parts.items():
            v = Cat(*bits)
            assert len(v) == COUNTER_EVENTS[name], name
            m.d.comb += getattr(ctr.inc, name).eq(v)
        return m
