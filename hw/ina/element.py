"""The element path: adds a packet's elements into its slot record's accumulators (block
RAM), exactly, one beat per cycle, and keeps each record's overflow bit."""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory
from amaranth.lib.wiring import In, Out

from .lanes import LaneFormat, Width, lane_add, lane_pack, lane_unpack, lane_wrap
from .layout import AccMode, busy_layout
from .params import CoreParams
from .replicator import saturate32

__all__ = ["beat_layout", "packet_layout", "ElementPath"]


def _log2(n):
    return (n - 1).bit_length()


def beat_layout(lanes: int) -> data.StructLayout:
    """A popped beat on its way to the element path (the header pipeline's delay line).

    valid   a beat was popped
    elem    it is an element beat (not a header beat)
    first   it is a datagram's first beat
    e       its element beat index (saturating)
    """
    return data.StructLayout({"valid": 1, "elem": 1, "first": 1, "e": 16,
                              "data": data.ArrayLayout(32, lanes)})


def packet_layout(P: CoreParams) -> data.StructLayout:
    """What the element path needs of a decided packet: its record's first accumulator
    beat (``base``), the record, its element count and beats, and what to do (and, in a
    core with narrow widths, its element width)."""
    fields = {"base": range(P.records * P.elem_beats + 1),
              "rec": range(P.records), "nelem": 16, "nbeats": 16, "mode": AccMode}
    if P.narrow:
        fields["width"] = Width
    return data.StructLayout(fields)


class ElementPath(wiring.Component):
    """Reads, adds and writes back the accumulators of a record, one beat per cycle.

    beat          popped beats, one cycle after their packet's decision
    start, packet a packet was decided (``start``; its element beats follow)
    acc_rd        a synchronous read port on the accumulators (the replicator's)
    ovf_rd        a synchronous read port on the records' overflow bits
    busy          the records whose accumulators are still being written
    stream_errors events: an element beat past the packet's length; a first beat while
                  a packet's beats are still expected

    S0 reads the accumulator beat; S1 registers the block RAM's output (its
    clock-to-output is long on ECP5); E1 adds (``32 + log2 N`` bits, exact), with the
    two writes that the read missed forwarded; E2 writes the sum back and folds the
    beat's out-of-int32-range lanes into the record's overflow bit.

    With narrow widths (``params.widths``), each lane word holds 1, 2 or 4 elements (the
    packet's ``width``): S1 registers them unpacked into :class:`~.lanes.LaneFormat`
    (which element is the packet's: a compare of the beat index with a per-element
    threshold registered at the start, as the int32 lane compare), E1 adds a whole
    word with one adder (:func:`~.lanes.lane_add`), E2 writes the sum back and, beside
    it, the sums saturated to the width and packed into a lane word
    (:func:`~.lanes.lane_pack`) in a result memory; ``acc_rd`` reads that memory, so the
    replicator sends its words as they are, and a clamped element sets the record's
    overflow bit. With ``widths=(32,)`` the element path is the int32 one, unchanged.

    ``wrapping_adder=True`` plants a bug for the tests: the sum wraps at 32 bits (at the
    element's width, with narrow widths).
    """

    def __init__(self, params: CoreParams, *, wrapping_adder: bool = False):
        self.params = P = params
        self.wrapping_adder = wrapping_adder
        self.fmt = LaneFormat(P.workers, P.widths)
        if P.narrow:
            self._acc_layout = data.ArrayLayout(self.fmt.bits, P.lanes)
            rd_layout = data.ArrayLayout(32, P.lanes)
        else:
            self._acc_layout = rd_layout = data.ArrayLayout(signed(P.acc_bits), P.lanes)
        super().__init__({
            "beat": In(beat_layout(P.lanes)),
            "start": In(1),
            "packet": In(packet_layout(P)),
            "acc_rd": Out(memory.ReadPort.Signature(
                addr_width=_log2(P.records * P.elem_beats), shape=rd_layout)),
            "ovf_rd": Out(memory.ReadPort.Signature(addr_width=_log2(P.records), shape=1)),
            "busy": Out(busy_layout(P)),
            "stream_errors": Out(2),
        })

    def elaborate(self, platform):
        P = self.params
        L, EB, R = P.lanes, P.elem_beats, P.records
        AccL = self._acc_layout
        m = Module()
        narrow = P.narrow
        fmt = self.fmt
        m.submodules.acc = acc = memory.Memory(shape=AccL, depth=R * EB, init=[])
        m.submodules.ovf = ovf = memory.Memory(shape=1, depth=R, init=[])
        acc_w = acc.write_port()
        acc_r = acc.read_port()
        if narrow:      # the saturated, packed sums, for the replicator
            m.submodules.res = res = memory.Memory(shape=data.ArrayLayout(32, L),
                                                   depth=R * EB, init=[])
            res_w = res.write_port()
            acc_r2 = res.read_port()
        else:
            acc_r2 = acc.read_port()
        ovf_w = ovf.write_port()
        ovf_r = ovf.read_port()
        for port, mine in ((self.acc_rd, acc_r2), (self.ovf_rd, ovf_r)):
            m.d.comb += [mine.addr.eq(port.addr), mine.en.eq(port.en), port.data.eq(mine.data)]

        pkt = self.packet
        pkt_base = Signal(range(R * EB + 1))
        pkt_rec = Signal(range(R))
        pkt_nelem = Signal(16)
        pkt_nbeats = Signal(16)
        pkt_nbm1 = Signal(signed(17))   # nbeats - 1: the last beat's index
        pkt_mode = Signal(AccMode)
        pkt_inflight = Signal()
        with m.If(self.start):
            m.d.sync += [pkt_base.eq(pkt.base), pkt_rec.eq(pkt.rec),
                         pkt_nelem.eq(pkt.nelem), pkt_nbeats.eq(pkt.nbeats),
                         pkt_nbm1.eq(pkt.nbeats - 1),
                         pkt_mode.eq(pkt.mode)]
        if narrow:
            # element j of a lane word is the packet's while the word's index is below
            # thr[j] = ceil((nelem - j) / per) (per = elements per word at the width)
            pkt_width = Signal(Width)
            thr = [Signal(16, name=f"pkt_thr{j}") for j in range(fmt.nseg)]
            with m.If(self.start):
                m.d.sync += pkt_width.eq(pkt.width)
                for j, t in enumerate(thr):
                    v = pkt.nelem if j == 0 else Const(0, 16)
                    for w in fmt.widths:
                        per = 32 // w
                        if w != 32 and j < per:
                            lp = per.bit_length() - 1
                            v = Mux(pkt.width == Width.of_bits(w),
                                    (pkt.nelem + (per - 1 - j)) >> lp, v)
                    m.d.sync += t.eq(v)
        s0 = self.beat
        s0_lane = s0.data
        e = s0.e
        ebeat = s0.valid & s0.elem
        e_ok = ebeat & (e < pkt_nbeats) & (pkt_mode != AccMode.NONE)
        m.d.comb += self.stream_errors.eq(Cat(
            ebeat & (e >= pkt_nbeats) & (pkt_mode != AccMode.NONE),
            s0.valid & s0.first & pkt_inflight))
        with m.If((ebeat & (e >= pkt_nbm1)) | (s0.valid & s0.first)):
            m.d.sync += pkt_inflight.eq(0)
        with m.If(self.start & (pkt.mode != AccMode.NONE) & (pkt.nelem != 0)):
            m.d.sync += pkt_inflight.eq(1)
        m.d.comb += [acc_r.addr.eq(pkt_base + e), acc_r.en.eq(1)]

        # S1: the block RAM's output is registered (its clock-to-output is long on ECP5)
        s1_valid, s1_mode, s1_first, s1_last = Signal(), Signal(AccMode), Signal(), Signal()
        s1_addr = Signal(range(R * EB))
        s1_rec = Signal(range(R))
        s1_data = Signal(AccL)
        m.d.sync += [s1_valid.eq(e_ok), s1_mode.eq(pkt_mode), s1_addr.eq(pkt_base + e),
                     s1_rec.eq(pkt_rec), s1_first.eq(e == 0), s1_last.eq(e == pkt_nbm1)]
        if narrow:
            s1_width = Signal(Width)
            m.d.sync += s1_width.eq(pkt_width)
            for k in range(L):
                ok = Cat(*((e * L + k) < t for t in thr))
                m.d.sync += s1_data[k].eq(lane_unpack(fmt, s0_lane[k], pkt_width, ok))
        else:
            for k in range(L):
                lane_ok = (e * L + k) < pkt_nelem
                m.d.sync += s1_data[k].eq(Mux(lane_ok, s0_lane[k].as_signed(), 0))
        e1_valid, e1_mode, e1_first, e1_last = Signal(), Signal(AccMode), Signal(), Signal()
        e1_addr = Signal(range(R * EB))
        e1_rec = Signal(range(R))
        e1_data = Signal(AccL)
        e1_ram = Signal(AccL)
        m.d.sync += [e1_valid.eq(s1_valid), e1_mode.eq(s1_mode), e1_addr.eq(s1_addr),
                     e1_rec.eq(s1_rec), e1_first.eq(s1_first), e1_last.eq(s1_last),
                     e1_data.eq(s1_data), e1_ram.eq(acc_r.data)]

        # forwarding: a read issued in cycle r misses the writes of cycles r and r+1;
        # they are the two most recent writes when the beat reaches E1 (cycle r+2)
        e2_valid, e2_first, e2_last = Signal(), Signal(), Signal()
        e2_addr = Signal(range(R * EB))
        fw_valid, fw_addr, fw_data = Signal(), Signal(range(R * EB)), Signal(AccL)
        fw2_valid, fw2_addr, fw2_data = Signal(), Signal(range(R * EB)), Signal(AccL)
        # which write to forward is decided one stage early, in S1, from the writes that
        # will be fw and fw2 when the beat reaches E1 (E2's and fw's now)
        e1_f1, e1_f2 = Signal(), Signal()
        m.d.sync += [e1_f1.eq(e2_valid & (e2_addr == s1_addr)),
                     e1_f2.eq(fw_valid & (fw_addr == s1_addr))]
        old = Mux(e1_f1, fw_data, Mux(e1_f2, fw2_data, e1_ram))
        e2_rec = Signal(range(R))
        e2_sum = Signal(AccL)
        m.d.sync += [e2_valid.eq(e1_valid), e2_addr.eq(e1_addr), e2_rec.eq(e1_rec),
                     e2_first.eq(e1_first), e2_last.eq(e1_last)]
        if narrow:
            e1_width, e2_width = Signal(Width), Signal(Width)
            m.d.sync += [e1_width.eq(s1_width), e2_width.eq(e1_width)]
        for k in range(L):
            a = Mux(e1_mode == AccMode.ADD, data.View(AccL, old)[k], 0)
            if narrow:
                s = lane_add(fmt, Value.cast(a), Value.cast(e1_data[k]), e1_width)
                if self.wrapping_adder:
                    s = lane_wrap(fmt, s, e1_width)
            else:
                s = a + e1_data[k]
                if self.wrapping_adder:
                    s = s[:32].as_signed()
            m.d.sync += e2_sum[k].eq(s)
        m.d.comb += [acc_w.addr.eq(e2_addr), acc_w.data.eq(e2_sum), acc_w.en.eq(e2_valid)]
        if narrow:
            packed = [lane_pack(fmt, Value.cast(e2_sum[k]), e2_width) for k in range(L)]
            m.d.comb += [res_w.addr.eq(e2_addr), res_w.en.eq(e2_valid),
                         res_w.data.eq(Cat(*(w for w, _ in packed)))]
            beat_ovf = Cat(*(c for _, c in packed)).any()
        else:
            beat_ovf = Cat(saturate32(e2_sum[k])[1] for k in range(L)).any()
        m.d.sync += [fw_valid.eq(e2_valid), fw_addr.eq(e2_addr), fw_data.eq(e2_sum),
                     fw2_valid.eq(fw_valid), fw2_addr.eq(fw_addr), fw2_data.eq(fw_data)]
        ovf_run = Signal()
        ovf_now = Mux(e2_first, beat_ovf, ovf_run | beat_ovf)
        with m.If(e2_valid):
            m.d.sync += ovf_run.eq(ovf_now)
        m.d.comb += [ovf_w.addr.eq(e2_rec), ovf_w.data.eq(ovf_now),
                     ovf_w.en.eq(e2_valid & e2_last)]

        for k, (valid, rec) in enumerate(((pkt_inflight, pkt_rec), (s1_valid, s1_rec),
                                          (e1_valid, e1_rec), (e2_valid, e2_rec))):
            m.d.comb += [self.busy[k].valid.eq(valid), self.busy[k].rec.eq(rec)]
        return m
