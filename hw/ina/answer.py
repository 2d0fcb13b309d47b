"""The answer to refused DATA (issue 43): one ERROR for each DATA the header pipeline
drops for a reason its sender can fix, rate-limited per source as the reference model
does (``host/switch/model.py``, ``SwitchModel._refuse``; ``fields.Refusal``).

The ERROR is the DATA's header with type ERROR, ``count`` the reason, ``bitmap`` a
figure, no flags, exponent, reserved or elements (28 bytes: never larger than the DATA
it answers), sent to the DATA's source (IP, port and the frame's MAC). At most one per
``interval`` cycles per source bucket (``fields.error_bucket``: the top 8 bits of a
multiplicative hash of IP and port); the drop is counted either way (``errors_sent``,
``errors_limited``).

Where it sits (everything registered; the only join with the header pipeline is two
ports, and with the output one packet stream)::

    P0 ──cap──► capture memory (16 x the DATA's job, worker, seq, session, time and
                source, at the FIFO position after its header: ``rewind``)
    P2 ──refusal──► A ─► B (reads the capture at the position; the job's position) ─►
         C (reason, figure) ─► D (hash products, 64-bit time, the IPv4 checksum) ─►
         E (bucket: the table's read) ─► F (the read, registered) ─► G (compared,
         forwarded) ─► H (limited? the table's write) ─► queue (32 ERRORs, block RAM) ─►
         o (one beat a cycle) ─► merged with the control plane's replies (``o``: see
         :class:`SideMerge`)

The capture memory is indexed by the FIFO position that follows a packet's last header
beat: the header pipeline keeps that position with every operation (it rewinds there),
packets in flight hold distinct positions, and a re-decoded packet writes the same
words again. A decision reaches P2 once per datagram, in arrival order, so the
answers leave in the model's order.

The job's *position* (the figure of a STALE answer, the model's ``head``: the seq after
the newest slot it opened) is a register per job: a slot the pipeline opens (``opened``,
with the packet's seq) moves it forward in serial-number arithmetic; a write of the
job's ``enable`` (an install, a removal) resets it to 0, as the model's ``add_job``
does.

Time. The rate limit compares the DATA's time (its first beat's cycle, as the model's
``now``) with the time its bucket may next be answered, both 64-bit (the 32-bit packet
time extended with a wrap count: 2^64 cycles never wrap), so the rule is the model's
exactly, with no scrubber: a bucket stores ``last answer + interval`` in block RAM, and
whether it was ever answered in a 256-bit register (a reset clears it at once: a fresh
switch, as a fresh model).

Backpressure. The queue holds 32 answers; while it holds more than
``32 - STOP_SLACK`` (room for every refusal that can still come after the header
pipeline is told to stop), ``stop`` asks the header pipeline to stop popping (the core
shows it a full request queue).
"""

from amaranth.hdl import *
from amaranth.lib import wiring, stream, data, memory, enum
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.fields import (HEADER_BYTES, VERSION, MsgType, Refusal,
                                        ERROR_SOURCES, ERROR_INTERVAL)

from .layout import HeaderLayout, header_words, out_layout
from .params import CoreParams, HEADER_WORDS
from .regfile import job_layout, jobs_at
from .replicator import ip_checksum_pre
from .queue import BlockFifo

__all__ = ["Kind", "capture_layout", "refusal_layout", "ErrorAnswer", "SideMerge",
           "interval_cycles", "QUEUE_DEPTH", "STOP_SLACK", "HASH"]

#: the multiplier of ``fields.error_bucket``
HASH = 0x9E3779B1
assert ERROR_SOURCES == 256       # the bucket is the hash's top 8 bits
#: answers the queue holds
QUEUE_DEPTH = 32
#: refusals that may still arrive once ``stop`` is set: the answer pipeline's stages
#: (A..H), the operations the header pipeline can still add (QUEUE_SLACK) and the
#: registers on the way (stop, queue level)
STOP_SLACK = 8 + 7 + 4


def _lt64(a, b):
    """Amaranth expression: ``a < b`` for 64-bit values, as two 32-bit compares side by
    side (half the carry chain each) joined by one LUT."""
    return (a[32:] < b[32:]) | ((a[32:] == b[32:]) & (a[:32] < b[:32]))


def interval_cycles(cycles_per_us: int) -> int:
    """``fields.ERROR_INTERVAL`` in core cycles."""
    return round(ERROR_INTERVAL * 1e6 * cycles_per_us)


class Kind(enum.Enum, shape=3):
    """Why P2 drops a DATA that is answered (the model's ``_refuse`` calls, in order)."""
    NONE = 0
    UNKNOWN_JOB = 1         # Refusal.UNKNOWN_JOB, figure 0
    NOT_MEMBER = 2          # Refusal.NOT_MEMBER, figure: the job's members
    BIG_NELEM = 3           # Refusal.BAD_LENGTH, figure: the job's elements per packet
    BAD_SESSION = 4         # Refusal.BAD_SESSION, figure 0
    STALE = 5               # Refusal.STALE, figure: the job's position
    SLOT_NELEM = 6          # Refusal.BAD_LENGTH, figure: the open slot's elements


REASON = {Kind.UNKNOWN_JOB: Refusal.UNKNOWN_JOB, Kind.NOT_MEMBER: Refusal.NOT_MEMBER,
           Kind.BIG_NELEM: Refusal.BAD_LENGTH, Kind.BAD_SESSION: Refusal.BAD_SESSION,
           Kind.STALE: Refusal.STALE, Kind.SLOT_NELEM: Refusal.BAD_LENGTH}


def capture_layout() -> data.StructLayout:
    """What P0 hands over for each decoded packet: where (``pos``, the FIFO position
    after its header) and what an ERROR needs of it (``seq1``: seq + 1, the job's
    position should the packet open a slot)."""
    return data.StructLayout({"valid": 1, "pos": 4, "job": 16, "worker": 8, "seq": 32,
                              "seq1": 32, "session": 64, "ts": 32, "sip": 32, "sport": 16,
                              "smac": 48})


def refusal_layout(P: CoreParams) -> data.StructLayout:
    """What P2 hands over for each operation: a refusal's kind (or NONE), whether it
    opened a slot, its FIFO position, its job (table index) and its record's elements."""
    return data.StructLayout({"kind": Kind, "opened": 1, "pos": 4,
                              "job": range(max(2, P.jobs)),
                              "slot_nelem": range(P.elements + 1)})


def _entry_layout():
    """One queued answer."""
    return data.StructLayout({"job": 16, "worker": 8, "seq": 32, "session": 64,
                              "reason": 3, "figure": 32, "ip": 32, "port": 16, "mac": 48,
                              "csum": 16})


class ErrorAnswer(wiring.Component):
    """See the module docstring.

    cap       In: a packet decoded in P0 (:func:`capture_layout`)
    refusal   In: P2's operation (:func:`refusal_layout`)
    jobs      In: the job table (members, elements)
    reset_pos In: per job, its ``enable`` was written (its position returns to 0)
    now       In: the cycle counter
    src_ip    In: the ``src_ip`` register (the IPv4 checksum)
    stop      Out: the header pipeline must stop popping (registered)
    o         Out: the ERRORs (:func:`~.layout.out_layout`)
    sent, limited
              Out: counter events (``errors_sent``, ``errors_limited``)
    """

    def __init__(self, params: CoreParams, *, interval: int):
        if not 1 <= interval < 1 << 62:
            raise ValueError(f"error interval {interval} cycles out of range")
        self.params = P = params
        self.interval = interval
        super().__init__({
            "cap": In(capture_layout()),
            "refusal": In(refusal_layout(P)),
            "jobs": In(data.ArrayLayout(job_layout(), P.jobs)),
            "reset_pos": In(P.jobs),
            "now": In(32),
            "src_ip": In(32),
            "stop": Out(1),
            "o": Out(stream.Signature(out_layout(P.lanes))),
            "sent": Out(1),
            "limited": Out(1),
        })

    def elaborate(self, platform):
        P = self.params
        L, H, NJ = P.lanes, P.header_beats, P.jobs
        m = Module()
        cap, ref = self.cap, self.refusal

        def jf(name, idx):
            return jobs_at(self.jobs, name, idx)

        # ---------------------------------------------------------------- capture
        CapL = data.StructLayout({k: f.shape for k, f in capture_layout()
                                  if k not in ("valid", "pos")})
        m.submodules.capmem = capmem = memory.Memory(shape=CapL, depth=16, init=[])
        cw = capmem.write_port()
        cr = capmem.read_port(domain="comb")
        m.d.comb += [cw.addr.eq(cap.pos), cw.en.eq(cap.valid)]
        for k, _ in CapL:
            m.d.comb += getattr(cw.data, k).eq(getattr(cap, k))

        # ---------------------------------------------------------------- A: P2, registered
        a = Signal(refusal_layout(P))
        m.d.sync += a.eq(ref)
        a_valid = (a.kind != Kind.NONE)

        # ---------------------------------------------------------------- B: the capture
        m.d.comb += cr.addr.eq(a.pos)
        b = Signal(refusal_layout(P))
        b_cap = Signal(CapL)
        m.d.sync += [b.eq(a), b_cap.eq(cr.data)]
        b_valid = Signal()
        m.d.comb += b_valid.eq(b.kind != Kind.NONE)
        # the job's position (the model's head): moved by B's opened slot, read by B's
        # STALE (decisions pass B in order, so each sees the packets before it)
        pos = [Signal(32, name=f"position{j}") for j in range(NJ)]
        b_pos = Signal(32)
        m.d.comb += b_pos.eq(Array(pos)[b.job])
        nxt = b_cap.seq1                    # seq + 1 (added at the capture)
        ahead = ~(nxt - b_pos)[31]          # (seq + 1 - head) mod 2^32 < 2^31
        for j in range(NJ):
            with m.If(self.reset_pos[j]):
                m.d.sync += pos[j].eq(0)
            with m.Elif(b.opened & (b.job == j) & ahead):
                m.d.sync += pos[j].eq(nxt)

        # ---------------------------------------------------------------- C: reason, figure
        EntryL = _entry_layout()
        c_valid, c = Signal(), Signal(EntryL)
        c_ts, c_x = Signal(32), Signal(32)
        figure = Signal(32)
        reason = Signal(3)
        with m.Switch(b.kind):
            for kind, r in REASON.items():
                with m.Case(kind):
                    m.d.comb += reason.eq(int(r))
        with m.Switch(b.kind):
            with m.Case(Kind.NOT_MEMBER):
                m.d.comb += figure.eq(jf("nworkers", b.job))
            with m.Case(Kind.BIG_NELEM):
                m.d.comb += figure.eq(jf("elements", b.job))
            with m.Case(Kind.STALE):
                m.d.comb += figure.eq(b_pos)
            with m.Case(Kind.SLOT_NELEM):
                m.d.comb += figure.eq(b.slot_nelem)
        m.d.sync += [c_valid.eq(b_valid), c.job.eq(b_cap.job), c.worker.eq(b_cap.worker),
                     c.seq.eq(b_cap.seq), c.session.eq(b_cap.session), c.reason.eq(reason),
                     c.figure.eq(figure), c.ip.eq(b_cap.sip), c.port.eq(b_cap.sport),
                     c.mac.eq(b_cap.smac), c_ts.eq(b_cap.ts),
                     c_x.eq(b_cap.sip ^ Cat(b_cap.sport, b_cap.sport))]
        # 64-bit time: the cycle counter's wraps, kept here
        now_hi = Signal(32)
        with m.If(self.now == 0xFFFFFFFF):
            m.d.sync += now_hi.eq(now_hi + 1)
        c_now = Signal(64)
        m.d.comb += [c_now.eq(Cat(self.now, now_hi))]

        # ---------------------------------------------------------------- D: products, time
        d_valid, d = Signal(), Signal(EntryL)
        d_p0, d_p1, d_p2 = Signal(32), Signal(16), Signal(16)
        d_now, d_age = Signal(64), Signal(32)
        Kl, Kh = HASH & 0xFFFF, HASH >> 16
        # (the ERROR's IPv4 header checksum, kept with the answer: the sum of the
        # template's fixed words and ``src_ip`` in a register, its destination's two
        # halves added in D, the carries folded in E; at the output, between the answer
        # read and the beat's register, the whole of it was the block's longest path)
        csum_pre = Signal(20)
        d_csum = Signal(20)
        m.d.sync += [csum_pre.eq(ip_checksum_pre(self.src_ip, HEADER_BYTES + 28)),
                     d_csum.eq((csum_pre + c.ip[16:] + c.ip[:16])[:20])]
        m.d.sync += [d_valid.eq(c_valid), d.eq(c),
                     d_p0.eq(c_x[:16] * Kl), d_p1.eq((c_x[16:] * Kl)[:16]),
                     d_p2.eq((c_x[:16] * Kh)[:16]),
                     d_now.eq(c_now), d_age.eq(self.now - c_ts)]

        # ---------------------------------------------------------------- E: bucket, read
        e_valid, e = Signal(), Signal(EntryL)
        e_bucket = Signal(8)
        e_ts = Signal(64)
        s1 = d_csum[:16] + d_csum[16:]
        m.d.sync += [e_valid.eq(d_valid), e.eq(d),
                     e.csum.eq(~(s1[:16] + s1[16:])[:16]),
                     e_bucket.eq((d_p0 + Cat(C(0, 16), d_p1 + d_p2))[24:32]),
                     e_ts.eq(d_now - d_age)]
        m.submodules.table = table = memory.Memory(shape=64, depth=ERROR_SOURCES, init=[])
        tw = table.write_port()
        tr = table.read_port(domain="sync")
        seen = Signal(ERROR_SOURCES)       # the bucket was answered since the reset
        m.d.comb += [tr.addr.eq(e_bucket), tr.en.eq(1)]

        # ---------------------------------------------------------------- F: the read
        # (the block RAM's output, in F, goes into a register: its 5.8 ns clock-to-
        # output, and the LUT behind it that picks a colliding write, end there)
        f_valid, f = Signal(), Signal(EntryL)
        f_bucket, f_ts, f_next = Signal(8), Signal(64), Signal(64)
        m.d.sync += [f_valid.eq(e_valid), f.eq(e), f_bucket.eq(e_bucket), f_ts.eq(e_ts),
                     f_next.eq(e_ts + self.interval)]

        # ---------------------------------------------------------------- G: the compare
        g_valid, g = Signal(), Signal(EntryL)
        g_bucket, g_ts, g_next, g_rd = Signal(8), Signal(64), Signal(64), Signal(64)
        m.d.sync += [g_valid.eq(f_valid), g.eq(f), g_bucket.eq(f_bucket), g_ts.eq(f_ts),
                     g_next.eq(f_next), g_rd.eq(tr.data)]
        h_valid, h = Signal(), Signal(EntryL)
        h_bucket, h_next = Signal(8), Signal(64)
        h_seen, h_lt = Signal(), Signal()
        # writes the read (issued in E, two cycles before G) missed: H's now, H's of the
        # cycle before (``w1``) and of the one before that (``w2``)
        w1_en, w1_addr, w1_data = Signal(), Signal(8), Signal(64)
        w2_en, w2_addr, w2_data = Signal(), Signal(8), Signal(64)
        h_limited = Signal()
        h_we = Signal()
        m.d.comb += [h_limited.eq(h_valid & h_seen & h_lt), h_we.eq(h_valid & ~h_limited)]
        m.d.sync += [w1_en.eq(h_we), w1_addr.eq(h_bucket), w1_data.eq(h_next),
                     w2_en.eq(w1_en), w2_addr.eq(w1_addr), w2_data.eq(w1_data)]
        fw0 = h_we & (h_bucket == g_bucket)
        fw1 = w1_en & (w1_addr == g_bucket)
        fw2 = w2_en & (w2_addr == g_bucket)
        # G's time against each candidate for its bucket's entry (the read, the three
        # writes it missed), side by side, each 64-bit compare as two 32-bit halves;
        # the forwarding select (newest first) picks one after them
        lt = Mux(fw0, _lt64(g_ts, h_next),
                 Mux(fw1, _lt64(g_ts, w1_data),
                     Mux(fw2, _lt64(g_ts, w2_data), _lt64(g_ts, g_rd))))
        m.d.sync += [h_valid.eq(g_valid), h.eq(g), h_bucket.eq(g_bucket),
                     h_next.eq(g_next), h_lt.eq(lt),
                     h_seen.eq(fw0 | fw1 | fw2 | seen.bit_select(g_bucket, 1))]

        # ---------------------------------------------------------------- H: the decision
        m.d.comb += [tw.addr.eq(h_bucket), tw.data.eq(h_next), tw.en.eq(h_we)]
        with m.If(h_we):
            m.d.sync += seen.bit_select(h_bucket, 1).eq(1)
        m.d.comb += [self.sent.eq(h_we), self.limited.eq(h_limited)]

        # ---------------------------------------------------------------- the queue
        # (in block RAM: 32 answers of 267 bits were ~750 LUTs as LUT RAM)
        m.submodules.queue = q = BlockFifo(width=EntryL.size, depth=QUEUE_DEPTH)
        m.d.comb += [q.w_data.eq(h), q.w_en.eq(h_we)]
        m.d.sync += self.stop.eq(q.level > QUEUE_DEPTH - STOP_SLACK)

        # ---------------------------------------------------------------- the output
        cur = Signal(EntryL)
        busy = Signal()
        beat = Signal(range(H + 1))
        o = self.o
        adv = ~o.valid | o.ready
        with m.If(~busy & q.r_rdy):
            m.d.comb += q.r_en.eq(1)
            m.d.sync += [cur.eq(q.r_data), busy.eq(1), beat.eq(0)]
        oh = Signal(HeaderLayout)
        m.d.comb += [oh.version.eq(VERSION), oh.type.eq(MsgType.ERROR), oh.job.eq(cur.job),
                     oh.worker.eq(cur.worker), oh.seq.eq(cur.seq), oh.count.eq(cur.reason),
                     oh.bitmap.eq(cur.figure), oh.session.eq(cur.session)]
        words = header_words(oh)
        op = o.payload
        with m.If(adv):
            m.d.sync += o.valid.eq(busy)
            with m.If(busy):
                m.d.sync += [op.first.eq(beat == 0), op.last.eq(beat == H - 1),
                             op.length.eq(HEADER_BYTES), op.dst_ip.eq(cur.ip),
                             op.dst_port.eq(cur.port), op.dst_mac.eq(cur.mac),
                             op.mcast.eq(0),
                             op.ip_checksum.eq(cur.csum)]
                with m.Switch(beat):
                    for bb in range(H):
                        with m.Case(bb):
                            m.d.sync += op.n.eq(min(L, HEADER_WORDS - bb * L))
                            for k in range(L):
                                w = bb * L + k
                                m.d.sync += op.data[k].eq(words[w] if w < HEADER_WORDS else 0)
                m.d.sync += beat.eq(beat + 1)
                with m.If(beat == H - 1):
                    m.d.sync += busy.eq(0)
        return m


class SideMerge(wiring.Component):
    """Two packet streams into one, a packet at a time, through a register stage: the
    control plane's replies and the ERRORs (both rare), so the core's output keeps one
    2:1 multiplexer on the replicator's path.

    a, b      In: packet streams (:func:`~.layout.out_layout`); ``a`` first when both wait
    o         Out: the merged stream (registered)
    """

    def __init__(self, lanes: int):
        super().__init__({
            "a": In(stream.Signature(out_layout(lanes))),
            "b": In(stream.Signature(out_layout(lanes))),
            "o": Out(stream.Signature(out_layout(lanes))),
        })

    def elaborate(self, platform):
        m = Module()
        o = self.o
        sel_b = Signal()            # the source of the packet in progress or next
        in_pkt = Signal()
        src_valid = Mux(sel_b, self.b.valid, self.a.valid)
        src_payload = Signal.like(self.a.payload)
        m.d.comb += src_payload.eq(Mux(sel_b, self.b.payload, self.a.payload))
        adv = ~o.valid | o.ready
        take = adv & src_valid
        m.d.comb += [self.a.ready.eq(adv & ~sel_b), self.b.ready.eq(adv & sel_b)]
        with m.If(adv):
            m.d.sync += [o.valid.eq(src_valid), o.payload.eq(src_payload)]
        with m.If(take):
            m.d.sync += in_pkt.eq(~src_payload.last)
        # between packets, switch to the other source when this one has nothing
        with m.If(~in_pkt & ~take):
            with m.If(sel_b & ~self.b.valid & self.a.valid):
                m.d.sync += sel_b.eq(0)
            with m.Elif(~sel_b & ~self.a.valid & self.b.valid):
                m.d.sync += sel_b.eq(1)
        with m.If(take & src_payload.last):
            # after a packet, the other source goes next if it waits
            m.d.sync += sel_b.eq(~sel_b)
        return m
