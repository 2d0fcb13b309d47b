"""Multicast replicator: turns a RESULT request into output datagrams.

A request names a slot record (its accumulators stay in the element path's block RAM) and
a snapshot of the record's header fields. A group request becomes one copy per member
(unicast: destination MAC/IP/port rewritten, IPv4 header checksum recomputed), or one
copy to the job's IP multicast group (MAC 01:00:5e + low 23 bits of the group address),
as the job table says. A re-send request becomes one unicast copy to the asking worker,
with the RETRANSMIT flag and the worker field set to that worker. The 37-bit
accumulators are saturated to int32 on the way out.

The L2/L3 headers are built by the front end (hw/eth) from the output beat's sideband:
``dst_mac``, ``dst_ip``, ``dst_port``, ``length`` and ``ip_checksum`` (of the template
in :func:`ipv4_header`).
"""

import struct

from amaranth.hdl import *
from amaranth.lib import wiring, stream, data, memory
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.fields import GROUP_WORKER, HEADER_BYTES, VERSION, MsgType

from .lanes import nkey_split, width_byte, words_hw
from .leaf import ReqKind
from .layout import HeaderLayout, header_words, out_layout, request_layout, busy_layout
from .params import CoreParams, HEADER_WORDS
from .regfile import job_layout, member_layout, jobs_at

__all__ = ["ipv4_header", "ipv4_checksum", "ip_checksum_hw", "ip_checksum_pre",
           "ip_checksum_fold", "mcast_mac", "saturate32",
           "Replicator"]

IP_FLAGS_DF = 0x4000
IP_TTL_PROTO = (64 << 8) | 17


def ipv4_header(src_ip: int, dst_ip: int, udp_payload_len: int) -> bytes:
    """The IPv4 header the front end must emit for a RESULT copy (checksum filled)."""
    total = 20 + 8 + udp_payload_len
    hdr = struct.pack(">BBHHHBBHII", 0x45, 0, total, 0, IP_FLAGS_DF, 64, 17, 0, src_ip, dst_ip)
    csum = ipv4_checksum(hdr)
    return hdr[:10] + struct.pack(">H", csum) + hdr[12:]


def ipv4_checksum(header: bytes) -> int:
    s = sum(struct.unpack(f">{len(header) // 2}H", header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ip_checksum_pre(src_ip, total_len):
    """Amaranth expression: the part of :func:`ip_checksum_hw`'s sum that does not
    depend on the destination (a register can hold it before the destination is read)."""
    const = 0x4500 + IP_FLAGS_DF + IP_TTL_PROTO
    return Const(const, 20) + total_len + src_ip[16:32] + src_ip[0:16]


def ip_checksum_fold(pre, dst_ip):
    """Amaranth expression: the checksum from :func:`ip_checksum_pre`'s sum and the
    destination."""
    s = (pre + dst_ip[16:32] + dst_ip[0:16])[0:20]
    s1 = s[0:16] + s[16:]
    s2 = s1[0:16] + s1[16:]
    return ~s2[0:16]


def ip_checksum_hw(src_ip, dst_ip, total_len):
    """Amaranth expression: checksum of the :func:`ipv4_header` template."""
    return ip_checksum_fold(ip_checksum_pre(src_ip, total_len), dst_ip)


def mcast_mac(ip):
    """Amaranth expression: the 01:00:5e multicast MAC of an IPv4 group address."""
    return Cat(ip[0:23], Const(0, 1), Const(0x01005E, 24))


def saturate32(v):
    """Amaranth expression: signed ``v`` clamped to int32, as 32 bits; and whether it
    was clamped."""
    hi = v >= (1 << 31)
    lo = v < -(1 << 31)
    out = Mux(hi, Const(0x7FFFFFFF, 32), Mux(lo, Const(0x80000000, 32), v[0:32]))
    return out, hi | lo


def _log2(n):
    return (n - 1).bit_length()


class Replicator(wiring.Component):
    """Sends the RESULT copies of each request, one beat per cycle.

    req          requests (:func:`~.layout.request_layout`), from the request queue
    jobs         the job table (group size, multicast group, job id)
    src_ip       the ``src_ip`` register (for the IPv4 header checksum)
    member       a synchronous read port on the member table
    acc, ovf     synchronous read ports on the accumulators and the overflow bits
    busy         the records the element path still writes: a request waits while its
                 record's last packet is being accumulated
    done_hot     the last beat of the last copy of a request of record r was issued
                 (bit r, one-hot or 0; registered)
    overflow     a group result with its overflow bit went out (the ``overflows`` event)
    o            the RESULT copies (:func:`~.layout.out_layout`)

    With narrow widths (``params.widths``) the accumulator port reads lane words the
    element path already saturated and packed, sent as they are; a request's ``nelem`` is
    the record's key (``lanes.nkey``), whose width sets the RESULT's width byte, length
    and beats.

    The queue's head moves into a register (``nxt0``), then into ``nxt`` with what the
    start needs worked out (copies, beats per copy), so the start decision and the
    counters it loads work from registers; a request is prefetched while the one before
    it is sent, so back-to-back copies leave no gap.
    """

    def __init__(self, params: CoreParams):
        self.params = P = params
        self._ws = 1 << _log2(P.workers)
        super().__init__({
            "req": In(stream.Signature(request_layout(P))),
            "jobs": In(data.ArrayLayout(job_layout(), P.jobs)),
            "src_ip": In(32),
            "member": In(memory.ReadPort.Signature(addr_width=_log2(P.jobs * self._ws),
                                                   shape=member_layout(mac=True))),
            "acc": In(memory.ReadPort.Signature(
                addr_width=_log2(P.records * P.elem_beats),
                shape=data.ArrayLayout(32 if P.narrow else signed(P.acc_bits), P.lanes))),
            "ovf": In(memory.ReadPort.Signature(addr_width=_log2(P.records), shape=1)),
            "busy": In(busy_layout(P)),
            "done_hot": Out(P.records),
            "overflow": Out(1),
            "o": Out(stream.Signature(out_layout(P.lanes))),
            # a leaf (hw/ina/leaf.py): the parent switch, where UP requests go
            **({"parent": In(data.StructLayout({"ip": 32, "port": 16, "mac": 48}))}
               if P.leaf else {}),
        })

    def elaborate(self, platform):
        P = self.params
        L, H, EB, R, NJ = P.lanes, P.header_beats, P.elem_beats, P.records, P.jobs
        WS, LWS, LL = self._ws, _log2(P.workers), _log2(P.lanes)
        ReqL = request_layout(P)
        jobs = self.jobs

        def jf(name, idx):
            return jobs_at(jobs, name, idx)
        m = Module()

        def split(key):     # (width code, element count) of a request's nelem
            return nkey_split(key) if P.narrow else (Const(0, 2), key)

        def words(key):     # the lane words of a request's elements
            code, n = split(key)
            return words_hw(P.widths, code, n) if P.narrow else n

        def nbytes(key):
            code, n = split(key)
            return n * 4 if not P.narrow else Mux(code == 1, n * 2, Mux(code == 2, n, n * 4))
        nxt, nxt_valid = Signal(ReqL), Signal()     # the prefetched request
        run, cur = Signal(), Signal(ReqL)            # the request being sent
        nxt0, nxt0_valid = Signal(ReqL), Signal()
        m.d.comb += self.req.ready.eq(~nxt0_valid)
        take = self.req.valid & self.req.ready
        with m.If(take):
            m.d.sync += [nxt0.eq(self.req.payload), nxt0_valid.eq(1)]
        move = nxt0_valid & ~nxt_valid
        nxt_nb = Signal(16)             # beats per copy
        nxt_copies_m1 = Signal(range(33))
        AB = _log2(R * EB) + 2
        nxt_base = Signal(signed(AB))    # the record's first accumulator beat, minus H
        cur_base, r2_ptr = Signal(signed(AB)), Signal(signed(AB))
        one0 = nxt0.unicast | jf("mcast_en", nxt0.job)
        if P.leaf:          # (the partial sum goes to the parent alone)
            one0 = one0 | (nxt0.kind == ReqKind.UP)
        with m.If(move):
            m.d.sync += [nxt.eq(nxt0), nxt_valid.eq(1), nxt0_valid.eq(0),
                         nxt_nb.eq(H + ((words(nxt0.nelem) + (L - 1)) >> LL)),
                         nxt_copies_m1.eq(Mux(one0, 0, jf("nworkers", nxt0.job) - 1)),
                         nxt_base.eq(nxt0.rec * EB - H)]

        def busy(rec):      # the element path still writes the record's accumulator
            b = self.busy
            return (((b[0].valid) & (b[0].rec == rec)) | (b[1].valid & (b[1].rec == rec))
                    | (b[2].valid & (b[2].rec == rec)) | (b[3].valid & (b[3].rec == rec)))
        # registered: once a record's request is queued no new beat for it starts, so a
        # cleared busy stays clear
        busy_r = Signal()
        m.d.sync += busy_r.eq(Mux(move, busy(nxt0.rec), busy(nxt.rec)))
        o = self.o
        beat = Signal(16)
        beat0 = Signal()            # registered: ``beat == 0``
        maddr = Signal(range(NJ * WS))
        left = Signal(16)           # beats of this copy after ``beat``
        beat_last, copy_last = Signal(), Signal()   # registered: ``left == 0``, last copy
        copies_left = Signal(range(33))
        nbeats_out = Signal(16)
        started = Signal()
        o_valid, o_first, o_last = Signal(), Signal(), Signal()
        o_beat = Signal(16)
        adv = ~o_valid | o.ready
        start = ~run & nxt_valid & ~busy_r & adv   # (cur feeds the beat on display)
        m.d.comb += [self.ovf.addr.eq(nxt.rec), self.ovf.en.eq(start)]
        with m.If(start):
            m.d.sync += nxt_valid.eq(0)
        m.d.sync += started.eq(start)
        cur_mcast = jf("mcast_en", cur.job)
        # the IPv4 checksum's sum without the destination, from the request (the
        # destination, a member-table read, comes with the first beat: only it and the
        # folds are left in that cycle)
        ck_pre = Signal(20)
        with m.If(start):
            m.d.sync += ck_pre.eq(ip_checksum_pre(self.src_ip, HEADER_BYTES + nbytes(nxt.nelem) + 28))
            member0 = Mux(nxt.unicast, nxt.worker, 0)[:max(1, LWS)]
            m.d.sync += [run.eq(1), cur.eq(nxt), beat.eq(0), beat0.eq(1),
                         maddr.eq(nxt.job * WS + member0 if WS > 1 else nxt.job),
                         cur_base.eq(nxt_base), r2_ptr.eq(nxt_base),
                         copies_left.eq(nxt_copies_m1), copy_last.eq(nxt_copies_m1 == 0),
                         nbeats_out.eq(nxt_nb), left.eq(nxt_nb - 1),
                         beat_last.eq(nxt_nb == 1)]
        cur_code, cur_nelem = split(cur.nelem)
        ovf_flag = self.ovf.data & (cur_nelem != 0)
        # (a leaf: a relayed RESULT's OVERFLOW is the parent's; its own sum's, sent up,
        # counts here as a RESULT's does)
        is_up = (cur.kind == ReqKind.UP) if P.leaf else C(0, 1)
        is_rel = (cur.kind == ReqKind.REL) if P.leaf else C(0, 1)
        m.d.comb += self.overflow.eq(started & ~cur.unicast & ovf_flag & ~is_rel)
        issue = run & adv
        # the accumulator beat to read for ``beat`` (rec * EB + beat - H), as a counter
        m.d.comb += [self.acc.addr.eq(r2_ptr[:len(self.acc.addr)]), self.acc.en.eq(adv)]
        # the member-table entry of this copy (the worker for a re-send), as a counter
        m.d.comb += [self.member.addr.eq(maddr), self.member.en.eq(issue & beat0)]
        with m.If(adv):
            m.d.sync += [o_valid.eq(issue), o_beat.eq(beat), o_first.eq(beat == 0),
                         o_last.eq(beat_last)]
        # the request's last beat is issued: its record no longer waits for it
        # (registered: the record counts as waiting one cycle longer)
        m.d.sync += self.done_hot.eq(Mux(issue & beat_last & copy_last, 1 << cur.rec, 0))
        with m.If(issue):
            with m.If(beat_last):
                m.d.sync += [beat.eq(0), beat0.eq(1), maddr.eq(maddr + 1),
                             left.eq(nbeats_out - 1),
                             r2_ptr.eq(cur_base),
                             beat_last.eq(nbeats_out == 1),
                             copies_left.eq(copies_left - 1),
                             copy_last.eq(copies_left == 1)]
                with m.If(copy_last):
                    m.d.sync += run.eq(0)
            with m.Else():
                m.d.sync += [beat.eq(beat + 1), beat0.eq(0), left.eq(left - 1),
                             beat_last.eq(left == 1),
                             r2_ptr.eq(r2_ptr + 1)]

        # output payload
        oh = Signal(HeaderLayout)
        flags = Cat(cur.partial, ovf_flag | (cur.ovf if P.tree else 0), cur.unicast)
        if P.leaf:          # a relayed RESULT: the parent's flags, RETRANSMIT re-sent
            flags = Mux(is_rel, cur.pfl | Cat(C(0, 2), cur.unicast), flags)
        m.d.comb += [
            oh.version.eq(VERSION), oh.type.eq(Mux(is_up, MsgType.DATA, MsgType.RESULT)),
            oh.flags.eq(flags),
            oh.exponent.eq(cur.exponent), oh.job.eq(jf("job_id", cur.job)),
            oh.worker.eq(Mux(is_up, jf("up_index", cur.job),
                             Mux(cur.unicast, cur.worker, GROUP_WORKER))),
            oh.count.eq(cur.count),
            oh.seq.eq(cur.seq), oh.nelem.eq(cur_nelem), oh.bitmap.eq(cur.bitmap),
            oh.session.eq(Cat(jf("session_lo", cur.job), jf("session_hi", cur.job))),
        ]
        if P.narrow:        # the RESULT's width byte: the slot's width in both nibbles
            m.d.comb += width_byte(oh).eq(Cat(cur_code, C(0, 2), cur_code, C(0, 2)))
        owords = header_words(oh)
        op = o.payload
        ob_e = Signal(16)
        m.d.comb += ob_e.eq(o_beat - H)
        length = HEADER_BYTES + nbytes(cur.nelem)
        use_mcast = ~cur.unicast & cur_mcast & ~is_up
        md = self.member.data
        m_ip, m_port, m_mac = md.ip, md.port, md.mac
        if P.leaf:          # the partial sum: to the parent
            par = self.parent
            m_ip, m_port, m_mac = (Mux(is_up, par.ip, m_ip), Mux(is_up, par.port, m_port),
                                   Mux(is_up, par.mac, m_mac))
        dst_ip = Mux(use_mcast, jf("mcast_ip", cur.job), m_ip)
        m.d.comb += [
            o.valid.eq(o_valid),
            op.first.eq(o_first), op.last.eq(o_last),
            op.length.eq(length), op.mcast.eq(use_mcast), op.dst_ip.eq(dst_ip),
            op.dst_port.eq(Mux(use_mcast, jf("mcast_port", cur.job), m_port)),
            op.dst_mac.eq(Mux(use_mcast, mcast_mac(dst_ip), m_mac)),
            op.ip_checksum.eq(ip_checksum_fold(ck_pre, dst_ip)),
        ]
        with m.If(o_beat < H):
            for b in range(H):
                with m.If(o_beat == b):
                    m.d.comb += op.n.eq(min(L, HEADER_WORDS - b * L))
                    for k in range(L):
                        w = b * L + k
                        m.d.comb += op.data[k].eq(owords[w] if w < HEADER_WORDS else 0)
        with m.Else():
            rem = words(cur.nelem) - ob_e * L
            m.d.comb += op.n.eq(Mux(rem >= L, L, rem))
            for k in range(L):
                m.d.comb += op.data[k].eq(self.acc.data[k] if P.narrow
                                          else saturate32(self.acc.data[k])[0])
        return m
