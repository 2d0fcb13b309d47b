"""The in-band control plane: CONTROL datagrams install, update and remove jobs, under the
rule ``ina_fabric.protocol.auth`` defines for every switch.

It watches the core's input stream beside the data path (it never holds it up): every
datagram whose header says version VERSION and type CONTROL or STATUS_REQ is its business (the
header pipeline drops those without a count). For each one it counts, in the reference
model's order and names:

* STATUS_REQ: ``status_requests``, and ``status_unpadded`` below the 1,200 bytes a
  request must have. The core does not answer STATUS (its counters are registers).
* CONTROL, with no key built in: ``drop_malformed`` (no control over the wire).
* CONTROL whose length cannot hold an entry and the trailer (``auth.control_length_ok``):
  ``drop_malformed``, before the tag is looked at.
* CONTROL while the previous one is still being processed: ``drop_control_busy`` (the
  core's only counter the model lacks besides ``stream_errors``: a sender retries).
* otherwise the datagram is copied into a buffer and checked: HMAC-SHA256 under the
  board's key (its two HMAC blocks are a block RAM's contents, so the netlist is the
  same for every key) over everything before the tag (:class:`~.sha256.Sha256`, four
  compressions plus one per 64 bytes); a tag that differs, or a nonce the replay store
  refuses (the ``REPLAY_SLOTS`` highest nonces taken, in a LUT RAM), is
  ``drop_unauthenticated``. Then the entry is parsed and checked as
  ``jobtable.parse_control`` does (``drop_malformed``), and applied: a removal disables
  the job's entry; an install writes the entry and its members through the register
  bus and enables the job, which resets its slots (``control``); a live update
  (``ENTRY_UPDATE``) of an installed job that changes only the deadline writes the
  deadline and keeps the slots (``control``). An update of a job that is not installed
  or that changes anything else, and an install that does not fit the core (window,
  elements, workers, deadline, or no free job-table entry), are ``control_refused``.

The wire's deadline is in microseconds; the core counts cycles: ``cycles_per_us`` (a
whole number, the core clock in MHz) converts it. An open slot keeps the deadline it
opened with; a live update applies to the slots that open after it.

Every CONTROL that passes the tag and the replay store, and every STATUS_REQ, is
answered with a sealed STATUS datagram, as the model's.

It is a sequencer joining five blocks, one protocol each (a block starts on a pulse and
says when it is done; all of them read the datagram buffer through one word reader,
:mod:`.reader`)::

    snoop ─► classify, buffer ─► HmacSha256 (hmac) ─► ReplayStore (replay)
                                 ─► EntryParser, EntryWriter (entry) ─► bus
                                 ─► StatusWriter (status) ─► HmacSha256 ─► o

Ports::

    snoop     In: the core's input beats as they are accepted (``valid``, ``payload``)
    jobs      In: the job table (to find an entry and compare an update)
    member    a synchronous read port on the member table (update compare)
    bus       Out: a register-bus master (``addr``, ``w_stb``, ``w_data``); ``bus_active``
              while it writes (the core gives it the bus then)
    src_ip    In: the IPv4 source register (the reply's checksum)
    counters  In: every counter (the STATUS page)
    o         Out: the replies, laid out as the core's output
    events    Out: counter events
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory, stream
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.auth import (MAX_CONTROL_BYTES, MIN_CONTROL_BYTES, TAG_BYTES,
                                      control_length_ok, STATUS_MIN_REQUEST,
                                      STATUS_MAX_REQUEST)
from ina_fabric.protocol.regs import COUNTER_NAMES
from ina_fabric.protocol.fields import MsgType, VERSION, MAX_WORKERS, HEADER_BYTES
from ina_fabric.protocol.jobtable import IDLE_RECLAIM_S

from .entry import EntryParser, EntryWriter, ENTRY_AT, MEMBERS_AT, MEMBER_WORDS
from .hmac import HmacSha256, hmac_blocks
from .layout import in_layout, out_layout
from .params import CoreParams, HEADER_WORDS
from .reader import READ_LATENCY
from .regfile import job_layout, member_layout
from .replay import ReplayStore
from .status import (StatusWriter, Reply, REPLY_WORDS, reply_templates,
                     status_reply_bound)

__all__ = ["ControlPlane", "CONTROL_EVENTS", "STATUS_MIN_REQUEST", "hmac_blocks",
           "ENTRY_AT", "MEMBERS_AT", "MEMBER_WORDS", "reply_templates",
           "status_reply_bound"]

#: the counter events the control plane raises (events per cycle): a malformed length
#: seen at the input and a malformed entry found by the parser may meet in one cycle
CONTROL_EVENTS = {"status_requests": 1, "status_unpadded": 1, "control": 1,
                  "control_refused": 1, "drop_unauthenticated": 1, "drop_malformed": 2,
                  "drop_control_busy": 1}


def _log2(n):
    return (n - 1).bit_length()


class ControlPlane(wiring.Component):
    """See the module docstring. ``key``: the control key (bytes), or None for a core
    that takes no control over the wire."""

    def __init__(self, params: CoreParams, *, key: bytes | None, cycles_per_us: int = 1,
                 idle_reclaim_s: float = IDLE_RECLAIM_S):
        self.params = P = params
        self.key = key
        self.cycles_per_us = int(cycles_per_us)
        #: a job held by one session is refused to another while it was active (installed,
        #: or DATA accepted) within this many cycles (the model's IDLE_RECLAIM_S)
        self.clock_hz = self.cycles_per_us * 10 ** 6
        self.reclaim_cycles = round(idle_reclaim_s * self.clock_hz)
        if self.cycles_per_us != cycles_per_us or self.cycles_per_us < 1:
            raise ValueError(f"cycles_per_us {cycles_per_us}: the core clock must be a "
                             "whole number of MHz for in-band control")
        ws = 1 << _log2(P.workers)
        super().__init__({
            "snoop": In(data.StructLayout({"valid": 1, "payload": in_layout(P.lanes)})),
            "jobs": In(data.ArrayLayout(job_layout(), P.jobs)),
            "accepted": In(P.jobs),
            "member": In(memory.ReadPort.Signature(
                addr_width=_log2(P.jobs * ws), shape=member_layout(mac=True))),
            "bus": Out(data.StructLayout({"addr": 16, "w_stb": 1, "w_data": 32})),
            "bus_active": Out(1),
            "src_ip": In(32),
            "counters": In(data.ArrayLayout(32, len(COUNTER_NAMES))),
            "o": Out(stream.Signature(out_layout(P.lanes))),
            "events": Out(data.StructLayout(CONTROL_EVENTS)),
        })

    def _classify(self, m):
        """A datagram's first beat: version and type (header word 0, lane 0); a beat
        after a ``last`` is a first beat, whether or not it says so."""
        sn, pl, ev = self.snoop, self.snoop.payload, self.events
        after_last = Signal(init=1)
        with m.If(sn.valid):
            m.d.sync += after_last.eq(pl.last)
        first = sn.valid & (pl.first | after_last)
        w0 = pl.data[0]
        ctl_type = (pl.length >= HEADER_BYTES) & (w0[24:32] == VERSION)
        is_ctl = first & ctl_type & (w0[16:24] == MsgType.CONTROL)
        is_sreq = first & ctl_type & (w0[16:24] == MsgType.STATUS_REQ)
        sreq_ok = ((pl.length >= STATUS_MIN_REQUEST) & (pl.length <= STATUS_MAX_REQUEST)
                   & (pl.length[:2] == 0))          # auth.status_length_ok
        m.d.comb += [ev.status_requests.eq(is_sreq),
                     ev.status_unpadded.eq(is_sreq & ~sreq_ok)]
        return is_ctl, is_sreq, sreq_ok

    def elaborate(self, platform):
        P = self.params
        L, H = P.lanes, P.header_beats
        LL = _log2(L)
        m = Module()
        ev = self.events
        sn = self.snoop
        pl = sn.payload
        is_ctl, is_sreq, sreq_ok = self._classify(m)
        if self.key is None:
            m.d.comb += ev.drop_malformed[0].eq(is_ctl)
            m.d.comb += self.member.en.eq(0)
            return m
        worst = status_reply_bound(P)
        if worst > STATUS_MIN_REQUEST:
            raise ValueError(f"a STATUS reply of {P.jobs} jobs may take {worst} bytes, more "
                             f"than the smallest request ({STATUS_MIN_REQUEST}): fewer jobs")

        # the lengths a sealed entry may have: one compare each, and the member count
        lengths = [n for n in range(MIN_CONTROL_BYTES, MAX_CONTROL_BYTES + 1)
                   if control_length_ok(n)]
        len_hit = Cat(pl.length == n for n in lengths)
        len_ok = len_hit.any()
        k_in = Signal(range(MAX_WORKERS + 1))
        for i in range(len(lengths)):
            with m.If(len_hit[i]):
                m.d.comb += k_in.eq(i)

        # ---------------------------------------------------------------- the buffer
        # the datagram's beats as they come (header beats, then element beats)
        max_words = max(MAX_CONTROL_BYTES, STATUS_MAX_REQUEST) // 4
        depth = H + -(-(max_words - HEADER_WORDS) // L)
        m.submodules.buf = buf = memory.Memory(shape=data.ArrayLayout(32, L), depth=depth,
                                               init=[])
        bw = buf.write_port()
        br = buf.read_port()

        busy = Signal()
        capturing = Signal()
        r_ip, r_port, r_mac = Signal(32), Signal(16), Signal(48)   # the request's source
        bidx = Signal(range(depth + 1))
        nbytes = Signal(16)
        kmem = Signal(range(MAX_WORKERS + 1))    # members the length says
        m.d.comb += [bw.addr.eq(bidx), bw.data.eq(pl.data)]
        m.d.comb += ev.drop_malformed[0].eq(is_ctl & ~len_ok)
        take = (is_ctl & len_ok) | (is_sreq & sreq_ok)
        is_stat = Signal()          # the datagram held is a STATUS_REQ
        with m.If(take & ~busy):
            m.d.sync += is_stat.eq(is_sreq)
            m.d.sync += [busy.eq(1), capturing.eq(~pl.last), bidx.eq(1), nbytes.eq(pl.length),
                         kmem.eq(k_in), r_ip.eq(pl.src_ip), r_port.eq(pl.src_port),
                         r_mac.eq(pl.src_mac)]
            m.d.comb += [bw.en.eq(1), bw.addr.eq(0)]
        with m.Elif(capturing & sn.valid):
            m.d.comb += bw.en.eq(1)
            m.d.sync += bidx.eq(bidx + 1)
            with m.If(pl.last):
                m.d.sync += capturing.eq(0)
        m.d.comb += ev.drop_control_busy.eq(take & busy)

        # ---------------------------------------------------------------- the blocks
        aw = range(max_words + 1)
        m.submodules.hmac = hm = HmacSha256(self.key, max_bytes=4 * REPLY_WORDS, addr_shape=aw)
        m.submodules.replay = rs = ReplayStore()
        m.submodules.parser = ep = EntryParser(cycles_per_us=self.cycles_per_us,
                                               max_words=max_words)
        m.submodules.writer = ew = EntryWriter(P, max_words=max_words,
                                               reclaim_cycles=self.reclaim_cycles)
        m.submodules.status = st = StatusWriter(P, clock_hz=self.clock_hz,
                                                reclaim_cycles=self.reclaim_cycles,
                                                max_words=max_words)

        # ---------------------------------------------------------------- word reads
        # word j of a buffer (the request's; the reply's while it is hashed and sent),
        # at the address of whichever block reads; header words fill beats 0..H-1, the
        # rest start at beat H. (Registered: the block RAMs' outputs reach no decision
        # in the cycle they come.)
        widx = Signal(aw)
        tag_rd_en, tag_rd_addr = Signal(), Signal(aw)     # the sequencer's own reads
        word = Signal(32)
        with m.If(tag_rd_en):
            m.d.sync += widx.eq(tag_rd_addr)
        for blk in (hm, ep, ew, st):
            with m.Elif(blk.rd.en):
                m.d.sync += widx.eq(blk.rd.addr)
        m.d.comb += [blk.rd.word.eq(word) for blk in (hm, ep, ew, st)]
        if L > 1:
            lane = Signal(range(L))
            is_h = widx < HEADER_WORDS
            wb = widx - HEADER_WORDS
            m.d.comb += br.addr.eq(Mux(is_h, widx >> LL, H + (wb >> LL)))
            m.d.sync += lane.eq(Mux(is_h, widx[:LL], wb[:LL]))
            req_word = Array(br.data[k] for k in range(L))[lane]
        else:
            m.d.comb += br.addr.eq(widx)
            req_word = br.data[0]
        src_reply = Signal()        # the hash and the output read the reply
        m.d.comb += st.buf_addr.eq(widx)
        m.d.sync += word.eq(Mux(src_reply, st.buf_data, req_word))

        # ---------------------------------------------------------------- joins
        jt = self.jobs
        mlen = Signal(16)       # the request's bytes before the tag
        nonce = Signal(64)
        tag = Signal(data.ArrayLayout(32, 4))
        tag_ok = Signal()
        m.d.sync += tag_ok.eq(Cat(hm.digest[k] == tag[k] for k in range(4)).all())
        m.d.comb += [
            rs.nonce.eq(nonce),
            ep.kmem.eq(kmem), ev.drop_malformed[1].eq(ep.malformed),
            ew.entry.eq(ep.entry), ew.cyc.eq(ep.cyc), ew.l2w.eq(ep.l2w),
            ew.remove.eq(ep.remove), ew.kmem.eq(kmem), ew.jobs.eq(jt),
            ew.accepted.eq(self.accepted),
            self.member.addr.eq(ew.member.addr), self.member.en.eq(ew.member.en),
            ew.member.data.eq(self.member.data),
            self.bus.eq(ew.bus), self.bus_active.eq(ew.bus.w_stb),
            ev.control.eq(ew.events.control), ev.control_refused.eq(ew.events.control_refused),
            st.job.eq(ep.entry.job), st.age.eq(ew.age), st.nonce.eq(nonce), st.jobs.eq(jt),
            st.counters.eq(self.counters), st.digest.eq(hm.digest), st.src_ip.eq(self.src_ip),
            st.dst.ip.eq(r_ip), st.dst.port.eq(r_port), st.dst.mac.eq(r_mac),
        ]
        wiring.connect(m, st.o, wiring.flipped(self.o))
        self._sequencer(m, busy=busy, capturing=capturing, nbytes=nbytes, mlen=mlen,
                        tag=tag, tag_ok=tag_ok, nonce=nonce, word=word, is_stat=is_stat,
                        src_reply=src_reply, rd=(tag_rd_en, tag_rd_addr),
                        blocks=(hm, rs, ep, ew, st))
        return m

    def _sequencer(self, m, *, busy, capturing, nbytes, mlen, tag, tag_ok, nonce, word,
                   is_stat, src_reply, rd, blocks):
        """The request's way through the blocks: its nonce and tag, the HMAC, the tag
        compare, the replay store, the entry, the reply (written, hashed, sent)."""
        hm, rs, ep, ew, st = blocks
        ev = self.events
        rd_en, rd_addr = rd
        cnt = Signal(range(8))
        dly = Signal(2)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(busy & ~capturing):
                    m.d.sync += [mlen.eq(nbytes - TAG_BYTES), cnt.eq(0), dly.eq(0),
                                 src_reply.eq(0)]
                    m.next = "TAG"
            with m.State("TAG"):
                # the datagram's nonce (2 words) and tag (4 words) into registers
                m.d.comb += [rd_en.eq(1), rd_addr.eq((mlen >> 2) - 2 + cnt)]
                with m.If(dly != READ_LATENCY):
                    m.d.sync += dly.eq(dly + 1)
                with m.Else():
                    m.d.sync += [dly.eq(0), cnt.eq(cnt + 1)]
                    with m.Switch(cnt):
                        with m.Case(0):
                            m.d.sync += nonce[32:].eq(word)
                        with m.Case(1):
                            m.d.sync += nonce[:32].eq(word)
                        for k in range(4):
                            with m.Case(2 + k):
                                m.d.sync += tag[k].eq(word)
                    with m.If(cnt == 5):
                        m.next = "HASH"
            with m.State("HASH"):
                # HMAC over everything before the tag
                m.d.comb += [hm.start.eq(1), hm.length.eq(mlen)]
                m.next = "HASHING"
            with m.State("HASHING"):
                with m.If(~hm.busy):
                    m.next = "CHECK"
            with m.State("CHECK"):
                # (the tag compare is registered: decided a cycle after the digest is)
                with m.If(tag_ok):
                    m.d.comb += rs.start.eq(1)
                    m.next = "REPLAY"
                with m.Else():
                    m.d.comb += ev.drop_unauthenticated.eq(1)
                    m.next = "DONE"
            with m.State("REPLAY"):
                with m.If(rs.done):
                    with m.If(~rs.fresh):
                        m.d.comb += ev.drop_unauthenticated.eq(1)
                        m.next = "DONE"
                    with m.Elif(is_stat):
                        m.d.comb += [st.start.eq(1), st.kind.eq(Reply.STATUS)]
                        m.next = "REPLY"
                    with m.Else():
                        m.d.comb += ep.start.eq(1)
                        m.next = "PARSE"
            with m.State("PARSE"):
                with m.If(ep.done):
                    with m.If(ep.malformed):
                        m.next = "DONE"
                    with m.Else():
                        m.d.comb += ew.start.eq(1)
                        m.next = "WRITE"
            with m.State("WRITE"):
                with m.If(ew.done):
                    m.d.comb += [st.start.eq(1), st.kind.eq(ew.reply)]
                    m.next = "REPLY"
            with m.State("REPLY"):
                # the reply written: its tag over everything so far, as for a request
                with m.If(st.rendered):
                    m.d.comb += [hm.start.eq(1), hm.length.eq(st.length)]
                    m.d.sync += src_reply.eq(1)
                    m.next = "SEAL"
            with m.State("SEAL"):
                with m.If(~hm.busy):
                    m.d.comb += st.seal.eq(1)
                    m.next = "SEND"
            with m.State("SEND"):
                with m.If(st.sent):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.sync += [busy.eq(0), src_reply.eq(0)]
                m.next = "IDLE"
