"""The aggregator pipeline and its glue to the replicator (built by ``InaCore``).

Header path (one operation per cycle on the slot metadata, read-modify-write):

* P0: the beat that completes the header (or ends a short datagram) is decoded: the
  checks that need only the header and the UDP length (truncated, version, type, body
  length, unknown job, worker out of range), the job lookup, the slot record
  ``job*2Wmax + set*Wmax + seq%W``. In a cycle with no header, the deadline scanner
  or the job initializer issues its own operation on one record.
* P1: source check against the member table, then the model's slot rules on the record
  (metadata and member table are read asynchronously from P1's registered address, so
  back-to-back operations on one record see each other): expiry at the packet's time, reuse at tag+2W, stale, out of window,
  re-send, duplicate, nelem mismatch, accept. Up to two output requests (an expired
  PARTIAL, then a completion or a re-send) enter the request queue.

Element path (one beat per cycle): S0 reads the accumulator beat; S1 registers the RAM
output; E1 adds (37-bit, exact) with the last two writes forwarded when they hit the
same address; E2 writes it back and folds the beat's out-of-int32-range lanes into the
record's overflow bit.

Time: ``now`` counts cycles. A packet's time is the cycle its first beat is accepted; a
slot whose ``opened + deadline <= time`` (kept as ``due``) is expired for every operation, so the scanner
only has to catch slots that no packet touches (the model's ``tick``).
"""

from amaranth.hdl import *
from amaranth.lib import data, memory

from .layout import HeaderLayout
from .params import HEADER_WORDS
from .queue import RequestQueue
from .regs import (GLOBAL_REGS, JOB_REGS, MEMBER_REGS, COUNTER_NAMES, COUNTER_BASE,
                   JOB_BASE, JOB_STRIDE, MEMBER_BASE, ID_VALUE)
from .replicator import ip_checksum_hw, mcast_mac, saturate32

__all__ = ["build_core", "meta_layout", "request_layout"]

# reasons decided in P0 (priority order of the model)
R_OK, R_TRUNC, R_BADVER, R_STATUS, R_MALF, R_UNKJOB, R_UNKSRC, R_BIGNELEM = range(8)
K_SCAN, K_PKT, K_INIT = range(3)
M_NONE, M_OPEN, M_ADD = range(3)


def _log2(n):
    return (n - 1).bit_length()


def meta_layout(P):
    return data.StructLayout({
        "tag": signed(34), "complete": 1, "bitmap": P.workers,
        "count": range(P.workers + 1), "exponent": signed(8), "due": 32,
        "nelem": range(P.elements + 1),
    })


def request_layout(P):
    return data.StructLayout({
        "rec": range(P.records), "job": range(max(2, P.jobs)), "unicast": 1,
        "worker": range(32), "seq": 32, "count": range(P.workers + 1),
        "bitmap": P.workers, "exponent": signed(8), "nelem": range(P.elements + 1),
        "partial": 1,
    })


def build_core(core, platform):
    P = core.params
    bug = core.planted_bug
    L, H, EB, AW = P.lanes, P.header_beats, P.elem_beats, P.acc_bits
    NJ, WM, R = P.jobs, P.window, P.records
    LWM = _log2(WM)
    WS = 1 << _log2(P.workers)          # member table stride per job
    LWS = _log2(P.workers)
    LL = _log2(L)
    m = Module()

    now = Signal(32)
    m.d.sync += now.eq(now + 1)
    m.d.comb += core.now.eq(now)

    # ---------------------------------------------------------------- registers
    jobs = [{r.name: Signal(r.width, name=f"job{j}_{r.name}") for r in JOB_REGS}
            for j in range(NJ)]

    def jf(name, idx):
        return Array(jobs[j][name] for j in range(NJ))[idx]

    src_ip = Signal(32)
    counters = {n: Signal(32, name=f"cnt_{n}") for n in COUNTER_NAMES}
    inc = {n: [] for n in COUNTER_NAMES}

    MetaL = meta_layout(P)
    ReqL = request_layout(P)
    init_meta = [{"complete": 1, "exponent": -128} for _ in range(R)]
    m.submodules.meta = meta = memory.Memory(shape=MetaL, depth=R, init=init_meta)
    AccL = data.ArrayLayout(signed(AW), L)
    m.submodules.acc = acc = memory.Memory(shape=AccL, depth=R * EB, init=[])
    m.submodules.ovf = ovf = memory.Memory(shape=1, depth=R, init=[])
    m.submodules.mip = mip = memory.Memory(shape=32, depth=NJ * WS, init=[])
    m.submodules.mport = mport = memory.Memory(shape=16, depth=NJ * WS, init=[])
    m.submodules.mmac = mmac = memory.Memory(shape=48, depth=NJ * WS, init=[])

    meta_w = meta.write_port()
    # slot metadata and member table: asynchronous reads at P1 from P1's registered
    # address (distributed RAM on ECP5), so P1 sees every earlier write and starts from
    # a short path instead of a block RAM's clock-to-output
    meta_r = meta.read_port(domain="comb")
    acc_w = acc.write_port()
    acc_r = acc.read_port()
    acc_r2 = acc.read_port()
    ovf_w = ovf.write_port()
    ovf_r = ovf.read_port()
    mip_w, mport_w, mmac_w = mip.write_port(), mport.write_port(), mmac.write_port()
    mip_r, mport_r = mip.read_port(domain="comb"), mport.read_port(domain="comb")
    mip_r2, mport_r2, mmac_r2 = mip.read_port(), mport.read_port(), mmac.read_port()

    # register bus: writes
    bus = core.cfg
    init_busy = Signal()
    init_job = Signal(range(max(2, NJ)))
    init_ptr = Signal(range(2 * WM))
    mac_hi = Signal(16)
    madr = bus.addr - MEMBER_BASE
    m_in = (bus.addr >= MEMBER_BASE) & (bus.addr < MEMBER_BASE + NJ * 32 * 4)
    m_job, m_w, m_k = madr[7:7 + _log2(max(2, NJ))], madr[2:7], madr[0:2]
    m_ok = bus.w_stb & m_in & (m_w < P.workers)
    m_idx = m_job * WS + m_w[:max(1, LWS)] if WS > 1 else m_job
    m.d.comb += [
        mip_w.addr.eq(m_idx), mport_w.addr.eq(m_idx), mmac_w.addr.eq(m_idx),
        mip_w.data.eq(bus.w_data), mport_w.data.eq(bus.w_data),
        mmac_w.data.eq(Cat(bus.w_data, mac_hi)),
        mip_w.en.eq(m_ok & (m_k == 0)), mport_w.en.eq(m_ok & (m_k == 1)),
        mmac_w.en.eq(m_ok & (m_k == 3)),
    ]
    with m.If(m_ok & (m_k == 2)):
        m.d.sync += mac_hi.eq(bus.w_data)
    with m.If(bus.w_stb):
        with m.If(bus.addr == next(r.offset for r in GLOBAL_REGS if r.name == "src_ip")):
            m.d.sync += src_ip.eq(bus.w_data)
        for j in range(NJ):
            for r in JOB_REGS:
                with m.If(bus.addr == JOB_BASE + JOB_STRIDE * j + r.offset):
                    if r.name == "enable":
                        m.d.sync += jobs[j]["enable"].eq(0)
                        with m.If(bus.w_data[0]):
                            m.d.sync += [init_busy.eq(1), init_job.eq(j), init_ptr.eq(0)]
                    else:
                        m.d.sync += jobs[j][r.name].eq(bus.w_data)
    # register bus: reads (one cycle later)
    rd = Signal(32)
    with m.Switch(bus.addr):
        with m.Case(0):
            m.d.comb += rd.eq(ID_VALUE)
        with m.Case(1):
            m.d.comb += rd.eq(L | (NJ << 8) | (P.workers << 16) | (LWM << 24))
        with m.Case(2):
            m.d.comb += rd.eq(src_ip)
        with m.Case(3):
            m.d.comb += rd.eq(now)
        for k, n in enumerate(COUNTER_NAMES):
            with m.Case(COUNTER_BASE + k):
                m.d.comb += rd.eq(counters[n])
        for j in range(NJ):
            for r in JOB_REGS:
                with m.Case(JOB_BASE + JOB_STRIDE * j + r.offset):
                    m.d.comb += rd.eq(jobs[j][r.name])
    m.d.sync += bus.r_data.eq(rd)

    # ---------------------------------------------------------------- request queue
    m.submodules.queue = q = RequestQueue(ReqL, P.queue, range(R))
    q_tight = q.level > P.queue - 4

    # ---------------------------------------------------------------- input, P0
    i, ip = core.i, core.i.payload
    in_pkt = Signal()
    pos_reg = Signal(16)
    hdr_regs = [Signal(32, name=f"hdr_w{k}") for k in range(HEADER_WORDS)]
    ts_reg, len_reg = Signal(32), Signal(16)
    sip_reg, sport_reg = Signal(32), Signal(16)
    collecting = Signal()

    first = ip.first | ~in_pkt
    cur_pos = Mux(first, 0, pos_reg)
    cur_ts = Mux(first, now, ts_reg)
    cur_len = Mux(first, ip.length, len_reg)
    cur_sip = Mux(first, ip.src_ip, sip_reg)
    cur_sport = Mux(first, ip.src_port, sport_reg)
    hw_comb = [Mux(cur_pos == k // L, ip.data[k % L], hdr_regs[k]) for k in range(HEADER_WORDS)]
    hdr = data.View(HeaderLayout, Cat(*reversed(hw_comb)))

    in_hdr = cur_pos < H
    short = cur_pos < H - 1

    hits = [jobs[j]["enable"] & (jobs[j]["job_id"] == hdr.job) for j in range(NJ)]
    jidx = Signal(range(max(2, NJ)))
    for j in reversed(range(NJ)):
        with m.If(hits[j]):
            m.d.comb += jidx.eq(j)
    unkjob = ~Cat(hits).any()
    j_log2w = jf("log2_window", jidx)
    # the record of each job in parallel (window masks decoded from the static
    # configuration), then the one of the matching job
    recs = []
    for j in range(NJ):
        lw = jobs[j]["log2_window"]
        mask = Signal(32, name=f"job{j}_mask")
        m.d.comb += mask.eq((Const(1, 33) << lw) - 1)
        wset_j = (hdr.seq & (Const(1, 33) << lw)[:32]).any()
        widx_j = (hdr.seq & mask)[:max(1, LWM)]
        recs.append(Cat(widx_j[:LWM], wset_j, Const(j, range(max(2, NJ)))) if LWM
                    else Cat(wset_j, Const(j, range(max(2, NJ)))))
    rec = Signal(range(R))
    m.d.comb += rec.eq(Array(recs)[jidx])
    seqm = Signal(signed(34))     # seq - 2W: the tag a reusable record must have
    m.d.comb += seqm.eq(hdr.seq - (Const(2, 34) << j_log2w))

    body = Signal(signed(18))
    m.d.comb += body.eq(cur_len - 20)
    nelem4 = hdr.nelem * 4
    reason = Signal(3)
    with m.If(short | (cur_len < 20)):
        m.d.comb += reason.eq(R_TRUNC)
    with m.Elif(hdr.version != 1):
        m.d.comb += reason.eq(R_BADVER)
    with m.Elif(hdr.type == 3):
        m.d.comb += reason.eq(R_STATUS)
    with m.Elif(hdr.type != 1):
        m.d.comb += reason.eq(R_MALF)
    with m.Elif(body < nelem4):
        m.d.comb += reason.eq(R_TRUNC)
    with m.Elif(body != nelem4):
        m.d.comb += reason.eq(R_MALF)
    with m.Elif(unkjob):
        m.d.comb += reason.eq(R_UNKJOB)
    with m.Elif(hdr.worker >= jf("nworkers", jidx)):
        m.d.comb += reason.eq(R_UNKSRC)
    with m.Elif(hdr.nelem > jf("elements", jidx)):
        m.d.comb += reason.eq(R_BIGNELEM)
    with m.Else():
        m.d.comb += reason.eq(R_OK)

    # P1 registers
    p1_valid, p1_kind, p1_reason = Signal(), Signal(2), Signal(3)
    p1_rec = Signal(range(R))
    p1_seq, p1_ts = Signal(32), Signal(32)
    p1_seqm = Signal(signed(34))
    p1_worker, p1_exp = Signal(8), Signal(signed(8))
    p1_nelem = Signal(16)
    p1_sip, p1_sport = Signal(32), Signal(16)

    # A packet that would reuse (overwrite) a record whose result is still queued, or
    # that expires it right now, is deferred by P1: P1 fires the PARTIAL if any, keeps
    # the packet (and its first element beat, if that came in the same cycle), stops
    # the input, and re-runs the packet when the record's result has been sent.
    # ``i.ready`` depends on registers only.
    retry, defer, p1_keep = Signal(), Signal(), Signal()
    m.d.comb += q.probe.eq(p1_rec)
    m.d.comb += i.ready.eq(~init_busy & ~q_tight & ~retry)
    acc_beat = i.valid & i.ready
    dec = acc_beat & in_hdr & ((cur_pos == H - 1) | ip.last)

    with m.If(acc_beat):
        m.d.sync += [pos_reg.eq(Mux(cur_pos == 0xFFFF, cur_pos, cur_pos + 1)),
                     in_pkt.eq(~ip.last)]
        for k in range(HEADER_WORDS):
            with m.If(cur_pos == k // L):
                m.d.sync += hdr_regs[k].eq(ip.data[k % L])
        with m.If(first):
            m.d.sync += [ts_reg.eq(now), len_reg.eq(ip.length), sip_reg.eq(ip.src_ip),
                         sport_reg.eq(ip.src_port)]
        m.d.sync += collecting.eq(~dec & ~ip.last)
    horizon = Mux(collecting, ts_reg, now)

    # scanner and initializer
    scan_ptr = Signal(range(R))
    if LWM:
        init_rec = Cat(init_ptr[:LWM], init_ptr[LWM], init_job)
    else:
        init_rec = Cat(init_ptr[0], init_job)
    m.d.sync += p1_valid.eq(0)
    with m.If(p1_keep):
        m.d.sync += p1_valid.eq(1)
    with m.Elif(dec):
        m.d.sync += p1_valid.eq(1)
        m.d.sync += [p1_kind.eq(K_PKT), p1_reason.eq(reason), p1_rec.eq(rec),
                     p1_seq.eq(hdr.seq), p1_seqm.eq(seqm), p1_ts.eq(cur_ts), p1_worker.eq(hdr.worker),
                     p1_exp.eq(hdr.exponent), p1_nelem.eq(hdr.nelem),
                     p1_sip.eq(cur_sip), p1_sport.eq(cur_sport)]
    with m.Elif(init_busy):
        m.d.sync += [p1_valid.eq(1), p1_kind.eq(K_INIT), p1_rec.eq(init_rec), init_ptr.eq(init_ptr + 1)]
        with m.If(init_ptr == 2 * WM - 1):
            m.d.sync += init_busy.eq(0)
            for j in range(NJ):
                with m.If(init_job == j):
                    m.d.sync += jobs[j]["enable"].eq(1)
    with m.Elif(~q_tight):
        m.d.sync += [p1_valid.eq(1), p1_kind.eq(K_SCAN), p1_rec.eq(scan_ptr),
                     p1_ts.eq(horizon),
                     scan_ptr.eq(Mux(scan_ptr == R - 1, 0, scan_ptr + 1))]
    m.d.comb += meta_r.addr.eq(p1_rec)

    # ---------------------------------------------------------------- P1
    p1_job = Signal(range(max(2, NJ)))
    m.d.comb += p1_job.eq(p1_rec >> (LWM + 1))
    n = jf("nworkers", p1_job)
    log2w = jf("log2_window", p1_job)
    bounded = jf("bounded", p1_job)
    deadline = jf("deadline", p1_job)
    enabled = jf("enable", p1_job)
    md = meta_r.data
    p1_midx = p1_job * WS + p1_worker[:max(1, LWS)] if WS > 1 else p1_job
    m.d.comb += [mip_r.addr.eq(p1_midx), mport_r.addr.eq(p1_midx)]
    waiting = retry & q.probe_hit
    is_pkt = p1_valid & (p1_kind == K_PKT) & ~waiting
    is_scan = p1_valid & (p1_kind == K_SCAN) & enabled
    is_init = p1_valid & (p1_kind == K_INIT)
    src_ok = (mip_r.data == p1_sip) & (mport_r.data == p1_sport)
    early_ok = (p1_reason == R_OK) | (p1_reason == R_BIGNELEM)
    unksrc = is_pkt & ((p1_reason == R_UNKSRC) | (early_ok & ~src_ok))
    bignelem = is_pkt & (p1_reason == R_BIGNELEM) & src_ok
    pkt_ok = is_pkt & (p1_reason == R_OK) & src_ok

    seqs = Signal(signed(34))
    m.d.comb += seqs.eq(p1_seq)
    w2 = Signal(signed(34))
    m.d.comb += w2.eq(Const(2, 34) << log2w)
    late_by = Signal(32)          # time - due, modulo 2^32: expired when not negative
    m.d.comb += late_by.eq(p1_ts - md.due)
    expired = (pkt_ok | is_scan) & bounded & ~md.complete & ~late_by[31]
    complete1 = md.complete | expired
    reuse_raw = pkt_ok & complete1 & (md.tag == p1_seqm)
    m.d.comb += [defer.eq(reuse_raw & (p1_nelem != 0) & (expired | q.probe_hit)),
                 p1_keep.eq(defer | waiting)]
    m.d.sync += retry.eq(defer | waiting)
    reuse = reuse_raw & ~defer
    join = pkt_ok & ~defer & (reuse | (seqs == md.tag))
    stale = pkt_ok & ~join & (seqs < md.tag)
    oow = pkt_ok & ~join & ~(seqs < md.tag) & ~defer
    cur_bitmap = Mux(reuse, 0, md.bitmap)
    cur_count = Mux(reuse, 0, md.count)
    cur_exp = Mux(reuse, -128, md.exponent)
    cur_nelem = Mux(reuse, p1_nelem, md.nelem)
    cur_complete = complete1 & ~reuse
    cur_tag = Mux(reuse, seqs, md.tag)
    cur_due = Mux(reuse, p1_ts + deadline, md.due)
    bit = Signal(P.workers)
    m.d.comb += bit.eq(1 << p1_worker[:5])
    isdup = (cur_bitmap & bit).any()
    if bug == "no_duplicate_check":
        isdup_acc = C(0)
    else:
        isdup_acc = isdup
    resend = join & cur_complete
    dup_only = join & ~cur_complete & isdup_acc
    malf3 = join & ~cur_complete & ~isdup_acc & (p1_nelem != cur_nelem)
    accept = join & ~cur_complete & ~isdup_acc & (p1_nelem == cur_nelem)
    new_count = cur_count + 1
    completes = accept & (new_count == n)
    new_exp = Mux(p1_exp > cur_exp, p1_exp, cur_exp)
    mode = Mux(accept, Mux(cur_count == 0, M_OPEN, M_ADD), M_NONE)

    # metadata write
    init_idx = p1_rec[:LWM] if LWM else C(0, 1)
    init_set = p1_rec[LWM]
    w1 = Signal(signed(34))
    m.d.comb += w1.eq(Const(1, 34) << log2w)
    with m.If(is_init):
        m.d.comb += [meta_w.en.eq(1), meta_w.addr.eq(p1_rec),
                     meta_w.data.tag.eq(init_idx + Mux(init_set, w1, 0) - w2),
                     meta_w.data.complete.eq(1), meta_w.data.exponent.eq(-128)]
    with m.Else():
        m.d.comb += [
            meta_w.en.eq(expired | reuse | accept), meta_w.addr.eq(p1_rec),
            meta_w.data.tag.eq(cur_tag),
            meta_w.data.complete.eq(cur_complete | completes),
            meta_w.data.bitmap.eq(cur_bitmap | Mux(accept, bit, 0)),
            meta_w.data.count.eq(Mux(accept, new_count, cur_count)),
            meta_w.data.exponent.eq(Mux(accept, new_exp, cur_exp)),
            meta_w.data.due.eq(cur_due),
            meta_w.data.nelem.eq(cur_nelem),
        ]

    # requests: a = expired PARTIAL (old contents), b = completion or re-send
    m.d.comb += [
        q.push_a.eq(expired),
        q.a.rec.eq(p1_rec), q.a.job.eq(p1_job), q.a.unicast.eq(0),
        q.a.seq.eq(md.tag), q.a.count.eq(md.count), q.a.bitmap.eq(md.bitmap),
        q.a.exponent.eq(md.exponent), q.a.nelem.eq(md.nelem), q.a.partial.eq(1),
        q.push_b.eq(resend | completes),
        q.b.rec.eq(p1_rec), q.b.job.eq(p1_job), q.b.unicast.eq(resend),
        q.b.worker.eq(p1_worker),
        q.b.seq.eq(cur_tag),
        q.b.count.eq(Mux(completes, new_count, cur_count)),
        q.b.bitmap.eq(Mux(completes, cur_bitmap | bit, cur_bitmap)),
        q.b.exponent.eq(Mux(completes, new_exp, cur_exp)),
        q.b.nelem.eq(cur_nelem),
        q.b.partial.eq(Mux(completes, 0, cur_count < n)),
    ]

    inc["rx"].append(is_pkt & ~defer)
    inc["rx_data"].append(pkt_ok & ~defer)
    inc["drop_truncated"].append(is_pkt & (p1_reason == R_TRUNC))
    inc["drop_bad_version"].append(is_pkt & (p1_reason == R_BADVER))
    inc["status_requests"].append(is_pkt & (p1_reason == R_STATUS))
    inc["drop_malformed"] += [is_pkt & (p1_reason == R_MALF), bignelem, malf3]
    inc["drop_unknown_job"].append(is_pkt & (p1_reason == R_UNKJOB))
    inc["drop_unknown_source"].append(unksrc)
    inc["drop_stale"].append(stale)
    inc["drop_out_of_window"].append(oow)
    inc["duplicates"] += [resend & isdup, dup_only]
    inc["late"].append(resend & ~isdup)
    inc["resent"].append(resend)
    inc["accepted"].append(accept)
    inc["results"] += [expired, completes]
    inc["partials"].append(expired)

    # ---------------------------------------------------------------- element path
    pkt_base = Signal(range(R * EB + 1))
    pkt_rec = Signal(range(R))
    pkt_nelem = Signal(16)
    pkt_nbeats = Signal(16)
    pkt_mode = Signal(2)
    pkt_inflight = Signal()
    with m.If(dec):
        m.d.sync += [pkt_base.eq(rec * EB), pkt_rec.eq(rec), pkt_nelem.eq(hdr.nelem),
                     pkt_nbeats.eq((hdr.nelem + (L - 1)) >> LL)]
    mode_now = Mux(is_pkt, mode, pkt_mode)
    with m.If(is_pkt):
        m.d.sync += pkt_mode.eq(mode)
    held_valid = Signal()
    held_data = Signal(data.ArrayLayout(32, L))
    replay = retry & ~waiting & held_valid
    with m.If(defer & acc_beat & ~in_hdr & ~first):
        m.d.sync += [held_valid.eq(1), held_data.eq(ip.data)]
    with m.If(retry & ~waiting):
        m.d.sync += held_valid.eq(0)
    s0_data = Mux(replay, held_data.as_value(), ip.data.as_value())
    s0_lane = data.View(data.ArrayLayout(32, L), s0_data)
    e = Signal(16)
    m.d.comb += e.eq(Mux(replay, 0, cur_pos - H))
    ebeat = (acc_beat & ~in_hdr & ~first) | replay
    e_ok = ebeat & (e < pkt_nbeats) & (mode_now != M_NONE)
    inc["stream_errors"].append(ebeat & (e >= pkt_nbeats) & (mode_now != M_NONE) & ~defer)
    inc["stream_errors"].append(acc_beat & first & pkt_inflight)
    with m.If(is_pkt & (mode != M_NONE) & (p1_nelem != 0)):
        m.d.sync += pkt_inflight.eq(1)
    with m.If((ebeat & (e + 1 >= pkt_nbeats)) | (acc_beat & first)):
        m.d.sync += pkt_inflight.eq(0)
    m.d.comb += [acc_r.addr.eq(pkt_base + e), acc_r.en.eq(1)]

    # S1: the block RAM's output is registered (its clock-to-output is long on ECP5)
    s1_valid, s1_mode, s1_first, s1_last = Signal(), Signal(2), Signal(), Signal()
    s1_addr = Signal(range(R * EB))
    s1_rec = Signal(range(R))
    s1_data = Signal(AccL)
    m.d.sync += [s1_valid.eq(e_ok), s1_mode.eq(mode_now), s1_addr.eq(pkt_base + e),
                 s1_rec.eq(pkt_rec), s1_first.eq(e == 0), s1_last.eq(e + 1 == pkt_nbeats)]
    for k in range(L):
        lane_ok = (e * L + k) < pkt_nelem
        m.d.sync += s1_data[k].eq(Mux(lane_ok, s0_lane[k].as_signed(), 0))
    e1_valid, e1_mode, e1_first, e1_last = Signal(), Signal(2), Signal(), Signal()
    e1_addr = Signal(range(R * EB))
    e1_rec = Signal(range(R))
    e1_data = Signal(AccL)
    e1_ram = Signal(AccL)
    m.d.sync += [e1_valid.eq(s1_valid), e1_mode.eq(s1_mode), e1_addr.eq(s1_addr),
                 e1_rec.eq(s1_rec), e1_first.eq(s1_first), e1_last.eq(s1_last),
                 e1_data.eq(s1_data), e1_ram.eq(acc_r.data)]

    # forwarding: a read issued in cycle r misses the writes of cycles r and r+1; they
    # are the two most recent writes when the beat reaches E1 (cycle r+2)
    fw_valid, fw_addr, fw_data = Signal(), Signal(range(R * EB)), Signal(AccL)
    fw2_valid, fw2_addr, fw2_data = Signal(), Signal(range(R * EB)), Signal(AccL)
    old = Mux(fw_valid & (fw_addr == e1_addr), fw_data,
              Mux(fw2_valid & (fw2_addr == e1_addr), fw2_data, e1_ram))
    e2_valid, e2_first, e2_last = Signal(), Signal(), Signal()
    e2_addr = Signal(range(R * EB))
    e2_rec = Signal(range(R))
    e2_sum = Signal(AccL)
    m.d.sync += [e2_valid.eq(e1_valid), e2_addr.eq(e1_addr), e2_rec.eq(e1_rec),
                 e2_first.eq(e1_first), e2_last.eq(e1_last)]
    for k in range(L):
        a = Mux(e1_mode == M_ADD, data.View(AccL, old)[k], 0)
        s = a + e1_data[k]
        if bug == "wrapping_adder":
            s = s[:32].as_signed()
        m.d.sync += e2_sum[k].eq(s)
    m.d.comb += [acc_w.addr.eq(e2_addr), acc_w.data.eq(e2_sum), acc_w.en.eq(e2_valid)]
    m.d.sync += [fw_valid.eq(e2_valid), fw_addr.eq(e2_addr), fw_data.eq(e2_sum),
                 fw2_valid.eq(fw_valid), fw2_addr.eq(fw_addr), fw2_data.eq(fw_data)]
    beat_ovf = Cat(saturate32(e2_sum[k])[1] for k in range(L)).any()
    ovf_run = Signal()
    ovf_now = Mux(e2_first, beat_ovf, ovf_run | beat_ovf)
    with m.If(e2_valid):
        m.d.sync += ovf_run.eq(ovf_now)
    m.d.comb += [ovf_w.addr.eq(e2_rec), ovf_w.data.eq(ovf_now), ovf_w.en.eq(e2_valid & e2_last)]

    # ---------------------------------------------------------------- replicator
    head = q.head
    busy = ((pkt_inflight & (pkt_rec == head.rec)) | (s1_valid & (s1_rec == head.rec))
            | (e1_valid & (e1_rec == head.rec))
            | (e2_valid & (e2_rec == head.rec)))
    o = core.o
    run = Signal()
    cur = Signal(ReqL)
    copy = Signal(range(33))
    beat = Signal(16)
    ncopies = Signal(range(33))
    nbeats_out = Signal(16)
    started = Signal()
    o_valid = Signal()
    o_beat = Signal(16)
    o_copy_last = Signal()
    adv = ~o_valid | o.ready
    start = ~run & q.head_valid & ~busy & adv   # (cur feeds the beat on display)
    m.d.comb += [ovf_r.addr.eq(head.rec), ovf_r.en.eq(start)]
    m.d.sync += started.eq(start)
    cur_mcast = jf("mcast_en", cur.job)
    with m.If(start):
        m.d.sync += [run.eq(1), cur.eq(head), copy.eq(0), beat.eq(0),
                     ncopies.eq(Mux(head.unicast | jf("mcast_en", head.job), 1,
                                    jf("nworkers", head.job))),
                     nbeats_out.eq(H + ((head.nelem + (L - 1)) >> LL))]
    ovf_flag = ovf_r.data & (cur.nelem != 0)
    inc["overflows"].append(started & ~cur.unicast & ovf_flag)
    issue = run & adv
    m.d.comb += [acc_r2.addr.eq(cur.rec * EB + beat - H), acc_r2.en.eq(adv)]
    member = Mux(cur.unicast, cur.worker, copy)
    maddr = cur.job * WS + member[:max(1, LWS)] if WS > 1 else cur.job
    m.d.comb += [mip_r2.addr.eq(maddr), mport_r2.addr.eq(maddr), mmac_r2.addr.eq(maddr)]
    for port in (mip_r2, mport_r2, mmac_r2):
        m.d.comb += port.en.eq(issue & (beat == 0))
    m.d.comb += q.pop.eq(0)
    with m.If(adv):
        m.d.sync += [o_valid.eq(issue), o_beat.eq(beat)]
    with m.If(issue):
        with m.If(beat == nbeats_out - 1):
            m.d.sync += [beat.eq(0), copy.eq(copy + 1)]
            with m.If(copy == ncopies - 1):
                m.d.sync += run.eq(0)
                m.d.comb += q.pop.eq(1)
        with m.Else():
            m.d.sync += beat.eq(beat + 1)

    # output payload
    oh = Signal(HeaderLayout)
    m.d.comb += [
        oh.version.eq(1), oh.type.eq(2),
        oh.flags.eq(Cat(cur.partial, ovf_flag, cur.unicast)),
        oh.exponent.eq(cur.exponent), oh.job.eq(jf("job_id", cur.job)),
        oh.worker.eq(Mux(cur.unicast, cur.worker, 255)), oh.count.eq(cur.count),
        oh.seq.eq(cur.seq), oh.nelem.eq(cur.nelem), oh.bitmap.eq(cur.bitmap),
    ]
    ohv = oh.as_value()
    owords = [ohv[32 * (HEADER_WORDS - 1 - k):32 * (HEADER_WORDS - k)] for k in range(HEADER_WORDS)]
    op = o.payload
    ob_e = Signal(16)
    m.d.comb += ob_e.eq(o_beat - H)
    length = 20 + cur.nelem * 4
    use_mcast = ~cur.unicast & cur_mcast
    dst_ip = Mux(use_mcast, jf("mcast_ip", cur.job), mip_r2.data)
    m.d.comb += [
        o.valid.eq(o_valid),
        op.first.eq(o_beat == 0), op.last.eq(o_beat == nbeats_out - 1),
        op.length.eq(length), op.mcast.eq(use_mcast), op.dst_ip.eq(dst_ip),
        op.dst_port.eq(Mux(use_mcast, jf("mcast_port", cur.job), mport_r2.data)),
        op.dst_mac.eq(Mux(use_mcast, mcast_mac(dst_ip), mmac_r2.data)),
        op.ip_checksum.eq(ip_checksum_hw(src_ip, dst_ip, length + 28)),
    ]
    with m.If(o_beat < H):
        for b in range(H):
            with m.If(o_beat == b):
                m.d.comb += op.n.eq(min(L, HEADER_WORDS - b * L))
                for k in range(L):
                    w = b * L + k
                    m.d.comb += op.data[k].eq(owords[w] if w < HEADER_WORDS else 0)
    with m.Else():
        rem = cur.nelem - ob_e * L
        m.d.comb += op.n.eq(Mux(rem >= L, L, rem))
        for k in range(L):
            m.d.comb += op.data[k].eq(saturate32(acc_r2.data[k])[0])

    # ---------------------------------------------------------------- counters
    for name, sig in counters.items():
        if inc[name]:
            step = Signal(2, name=f"inc_{name}")   # registered: counters lag one cycle
            m.d.sync += step.eq(sum(x.as_unsigned() if hasattr(x, "as_unsigned") else x
                                    for x in inc[name]))
            m.d.sync += sig.eq(sig + step)
    return m
