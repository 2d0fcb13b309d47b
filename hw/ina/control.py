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

Not done yet: the CONTROL reply (the model answers with a sealed STATUS datagram), and
STATUS replies.

Ports::

    snoop     In: the core's input beats as they are accepted (``valid``, ``payload``)
    jobs      In: the job table (to find an entry and compare an update)
    member    a synchronous read port on the member table (update compare)
    bus       Out: a register-bus master (``addr``, ``w_stb``, ``w_data``); ``bus_active``
              while it writes (the core gives it the bus then)
    events    Out: counter events
"""

import json

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory, stream
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.auth import (MAX_CONTROL_BYTES, MIN_CONTROL_BYTES, REPLAY_SLOTS,
                                      TAG_BYTES, TRAILER_BYTES, control_length_ok,
                                      STATUS_MIN_REQUEST, STATUS_MAX_REQUEST)
from ina_fabric.protocol.regs import COUNTER_NAMES
from ina_fabric.protocol.fields import MsgType, VERSION, MAX_WORKERS
from ina_fabric.protocol.jobtable import ENTRY_UPDATE, MAX_ELEMENTS, ENTRY_DTYPE, MEMBER_DTYPE
from ina_fabric.protocol.fields import HEADER_BYTES
from ina_fabric.protocol.jobtable import IDLE_RECLAIM_S
from ina_fabric.protocol.regs import JOB_BASE, JOB_STRIDE, JOB_REGS, MEMBER_BASE, MEMBER_REGS

from .layout import in_layout, out_layout
from .replicator import ip_checksum_hw
from .params import CoreParams, HEADER_WORDS
from .regfile import job_layout, member_layout, jobs_at
from .sha256 import Sha256

__all__ = ["ControlPlane", "CONTROL_EVENTS", "STATUS_MIN_REQUEST", "hmac_blocks",
           "ENTRY_AT", "MEMBERS_AT", "MEMBER_WORDS"]

#: where a CONTROL's entry and its members start (32-bit words into the datagram), all
#: from the generated header and the job-table dtypes
ENTRY_WORDS = ENTRY_DTYPE.itemsize // 4
MEMBER_WORDS = MEMBER_DTYPE.itemsize // 4
ENTRY_AT = HEADER_WORDS
MEMBERS_AT = HEADER_WORDS + ENTRY_WORDS
assert ENTRY_DTYPE.itemsize % 4 == 0 and MEMBER_DTYPE.itemsize % 4 == 0
assert 4 * HEADER_WORDS == HEADER_BYTES
# a member is read as three words: ip; port and the MAC's top 16 bits; the MAC's low 32
assert [MEMBER_DTYPE.fields[n][1] for n in ("ip", "port", "mac")] == [0, 4, 6]
assert MEMBER_WORDS == 3


def _entry_pieces(name):
    """Field ``name`` of the entry as pieces ``(word, word_lo, word_hi, field_lo)``: bits
    word_lo..word_hi of entry word ``word`` are the field's bits from field_lo on."""
    dt, off = ENTRY_DTYPE.fields[name][:2]
    size = dt.itemsize
    out = []
    b = off
    while b < off + size:
        w, e = b // 4, min(off + size, (b // 4 + 1) * 4)
        lo, hi = 32 - 8 * (e - 4 * w), 32 - 8 * (b - 4 * w)
        out.append((w, lo, hi, 8 * (off + size - e)))
        b = e
    return out

#: the counter events the control plane raises (events per cycle): a malformed length
#: seen at the input and a malformed entry found by the processor may meet in one cycle
CONTROL_EVENTS = {"status_requests": 1, "status_unpadded": 1, "control": 1,
                  "control_refused": 1, "drop_unauthenticated": 1, "drop_malformed": 2,
                  "drop_control_busy": 1}



def _log2(n):
    return (n - 1).bit_length()


def hmac_blocks(key: bytes):
    """The two 16-word key blocks of HMAC-SHA256: ``K ^ ipad`` and ``K ^ opad``."""
    import hashlib
    if len(key) > 64:
        key = hashlib.sha256(key).digest()
    key = key.ljust(64, b"\0")
    ipad = bytes(b ^ 0x36 for b in key)
    opad = bytes(b ^ 0x5C for b in key)
    words = lambda b: [int.from_bytes(b[k:k + 4], "big") for k in range(0, 64, 4)]
    return words(ipad), words(opad)


def reply_templates(P: CoreParams) -> dict:
    """The JSON of each reply the control plane sends (bytes; ``\\x01`` stands for the
    job id in decimal): the reference model's texts (``SwitchModel._control``), and the
    core's own refusal of a job it cannot hold."""
    def doc(d):
        return json.dumps(d, sort_keys=True).replace("\\u0001", "\x01").encode()
    j = "\x01"
    return {
        "install": f'{{"job": {j}, "ok": true, "op": "install"}}'.encode(),
        "update": f'{{"job": {j}, "ok": true, "op": "update"}}'.encode(),
        "remove": f'{{"job": {j}, "ok": true, "op": "remove"}}'.encode(),
        "not_installed": doc({"error": f"job {j}: live update of a job that is not "
                                      f"installed"}),
        "only_deadline": doc({"error": f"job {j}: a live update may change only the "
                                      f"deadline; install the job anew to change anything "
                                      f"else"}),
        # (``\\x05``: the seconds since the held job was active, as the model's ``.0f``)
        "taken": doc({"error": f"job {j} is taken by another run (active \x05 s ago); "
                               f"remove it first or use another job id"}).replace(
                                   b"\\u0005", b"\x05"),
        "other_session": doc({"error": f"job {j}: live update from another session"}),
        "not_removed": doc({"error": f"job {j}: held by another session; not removed"}),
        "table_full": doc({"error": f"job {j}: the switch holds {P.jobs} jobs, its limit"}),
        "no_fit": doc({"error": f"job {j}: does not fit the core (window <= {P.window}, "
                                f"elements <= {P.elements}, workers <= {P.workers}, "
                                f"deadline below 2^31 cycles)"}),
        # a STATUS page: every counter (``\\x02 k``: counter k of COUNTER_NAMES, in
        # decimal), then the enabled jobs (``\\x03``: one job entry each)
        "status": ('{"counters": {' + ", ".join(
            f'"{n}": \x02{chr(COUNTER_NAMES.index(n))}' for n in sorted(COUNTER_NAMES))
            + '}, "jobs": {\x03}, "next_job": null}').encode("latin-1"),
        # a job entry (``\\x04`` elements, ``\\x06`` window, ``\\x07`` workers,
        # ``\\x08`` the session in 16 hex digits): the model's keys that the core holds
        # as they are (no deadline_ms, open_slots, waiting_for)
        "job_reliable": (f'"{j}": {{"elements": \x04, "mode": "reliable", '
                         f'"session": "\x08", "window": \x06, "workers": \x07}}').encode(),
        "job_bounded": (f'"{j}": {{"elements": \x04, "mode": "bounded", '
                        f'"session": "\x08", "window": \x06, "workers": \x07}}').encode(),
    }


def status_reply_bound(P: CoreParams, replies=None) -> int:
    """The longest STATUS reply the core can send (header, JSON, trailer): every counter
    and job field at its widest, every job enabled."""
    t = replies or reply_templates(P)
    body = len(t["status"]) - 2 * len(COUNTER_NAMES) - 1 + 10 * len(COUNTER_NAMES)
    job = max(len(t["job_reliable"]), len(t["job_bounded"])) - 5 + 5 + 5 + 5 + 2 + 16
    return HEADER_BYTES + body + P.jobs * (job + 2) + TRAILER_BYTES


def _reg(name):
    return next(r for r in JOB_REGS if r.name == name).offset


def _mreg(name):
    return next(r for r in MEMBER_REGS if r.name == name).offset


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

    def elaborate(self, platform):
        P = self.params
        L, H = P.lanes, P.header_beats
        LL = _log2(L)
        NJ = P.jobs
        WS = 1 << _log2(P.workers)
        m = Module()
        ev = self.events
        sn = self.snoop
        pl = sn.payload

        # ---------------------------------------------------------------- classify
        # a datagram's first beat: version and type (header word 0, lane 0)
        # (a beat after a ``last`` is a first beat, whether or not it says so)
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
        if self.key is None:
            m.d.comb += ev.drop_malformed[0].eq(is_ctl)
            m.d.comb += self.member.en.eq(0)
            return m
        replies = reply_templates(P)
        worst = status_reply_bound(P, replies)
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

        # the datagram buffer: beats as they come (header beats, then element beats)
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
        mal = ev.drop_malformed[1]         # a malformed entry (the processor)
        c_busy = Signal()
        take = (is_ctl & len_ok) | (is_sreq & sreq_ok)
        is_stat = Signal()          # the datagram held is a STATUS_REQ
        m.d.comb += c_busy.eq(take & busy)
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
        m.d.comb += ev.drop_control_busy.eq(c_busy)

        # ---------------------------------------------------------------- word reads
        # word j of the datagram: header words fill beats 0..H-1, the rest start at beat H
        widx = Signal(range(max_words + 1))
        lane = Signal(range(L)) if L > 1 else None
        if L > 1:
            is_h = widx < HEADER_WORDS
            wb = widx - HEADER_WORDS
            m.d.comb += br.addr.eq(Mux(is_h, widx >> LL, H + (wb >> LL)))
            m.d.sync += lane.eq(Mux(is_h, widx[:LL], wb[:LL]))
            req_word = Array(br.data[k] for k in range(L))[lane]
        else:
            m.d.comb += br.addr.eq(widx)
            req_word = br.data[0]
        # the reply, assembled a byte at a time into words (header, JSON, nonce, tag)
        RW = 512
        m.submodules.rmem = rmem = memory.Memory(shape=32, depth=RW, init=[])
        rw, rr = rmem.write_port(), rmem.read_port()
        m.d.comb += rr.addr.eq(widx)
        src_reply = Signal()        # the hash reads the reply, not the request
        # (registered: the block RAMs' outputs reach no decision in the cycle they come)
        word = Signal(32)
        m.d.sync += word.eq(Mux(src_reply, rr.data, req_word))
        pos = Signal(range(4 * RW + 1))     # reply bytes written
        acc = Signal(32)                    # the word being filled
        # (a byte put by the FSM is written a cycle later, from registers: the FSM's
        # decisions do not reach the reply's word assembly in one cycle)
        pstb_c, pbyte_c, flush = Signal(), Signal(8), Signal()
        pstb, pbyte = Signal(), Signal(8)
        m.d.sync += [pstb.eq(pstb_c), pbyte.eq(pbyte_c)]
        lane_b = pos[:2]
        filled = Signal(32)
        m.d.comb += filled.eq(acc | (pbyte << Mux(lane_b == 0, 24, Mux(lane_b == 1, 16,
                                                  Mux(lane_b == 2, 8, 0)))))
        m.d.comb += [rw.addr.eq(pos >> 2), rw.data.eq(Mux(pstb, filled, acc)),
                     rw.en.eq((pstb & (lane_b == 3)) | flush)]
        with m.If(pstb):
            m.d.sync += [pos.eq(pos + 1), acc.eq(Mux(lane_b == 3, 0, filled))]

        def put(byte):
            m.d.comb += [pstb_c.eq(1), pbyte_c.eq(byte)]

        # ---------------------------------------------------------------- SHA-256
        m.submodules.sha = sha = Sha256()
        ipad, opad = hmac_blocks(self.key)
        # The key's two blocks in a block RAM (its contents, not its logic, are the key):
        # as constants in LUTs, each key gave yosys another netlist and nextpnr another
        # placement, so a seed that met timing with one key need not with the next. A
        # read takes a cycle (``kdly``).
        m.submodules.keymem = keymem = memory.Memory(shape=32, depth=32,
                                                     init=list(ipad) + list(opad),
                                                     attrs={"rom_style": "block"})
        kport = keymem.read_port(domain="sync")
        kop = Signal()      # 1: the opad block
        kdly = Signal()     # the word at ``cnt`` is on ``kport.data``
        cnt = Signal(range(2048))       # word counter within a phase
        mlen = Signal(range(4 * RW + 1))    # bytes hashed: all but the tag
        nblk16 = Signal(range(2048))    # words of the padded message (16 per block)
        inner = Signal(data.ArrayLayout(32, 8))
        tag = Signal(data.ArrayLayout(32, 4))
        nonce = Signal(64)
        dly = Signal(2)
        tag_ok = Signal()
        m.d.sync += tag_ok.eq(Cat(sha.digest[k] == tag[k] for k in range(4)).all())
        RD = 3      # cycles from setting ``widx`` to ``word`` holding that word

        # ---------------------------------------------------------------- entry fields
        e_job = Signal(16)
        e_n = Signal(8)
        e_mode = Signal(8)
        e_window = Signal(16)
        e_elements = Signal(16)
        e_deadline = Signal(32)
        e_mip = Signal(32)
        e_mport = Signal(16)
        e_flags = Signal(16)
        e_session = Signal(64)
        efield = {"job": e_job, "nworkers": e_n, "mode": e_mode, "window": e_window,
                  "elements": e_elements, "deadline_us": e_deadline, "mcast_ip": e_mip,
                  "mcast_port": e_mport, "flags": e_flags, "session": e_session}
        assert set(efield) == set(ENTRY_DTYPE.names)
        is_rm = Signal()            # the entry removes its job
        sess_same = Signal(max(2, NJ))   # per entry: holds the entry's session
        age = Signal(range(self.reclaim_cycles + 1))    # the found job's idle cycles
        # per job: cycles since it was last active (enabled, or DATA accepted), saturating
        # at the reclaim time; a job is held by its session while below it
        REC = self.reclaim_cycles
        idle = [Signal(range(REC + 1), name=f"idle{j}", init=REC) for j in range(NJ)]
        en_prev = Signal(NJ)
        young = Signal(max(2, NJ))
        for j in range(NJ):
            m.d.sync += en_prev[j].eq(self.jobs[j].enable)
            with m.If(self.accepted[j] | (self.jobs[j].enable & ~en_prev[j])):
                m.d.sync += idle[j].eq(0)
            with m.Elif(idle[j] != REC):
                m.d.sync += idle[j].eq(idle[j] + 1)
            m.d.comb += young[j].eq(idle[j] != REC)
        slot = Signal(range(max(2, NJ)))     # the job-table entry used
        found = Signal()
        free_ok = Signal()
        free = Signal(range(max(2, NJ)))
        # the replay store
        # (the nonces in a LUT RAM, read one slot a cycle as REPLAY scans them)
        m.submodules.kept = kept = memory.Memory(shape=64, depth=REPLAY_SLOTS, init=[])
        kept_r = kept.read_port(domain="comb")
        kept_w = kept.write_port()
        kvalid = Signal(REPLAY_SLOTS)
        rs_i = Signal(range(REPLAY_SLOTS + 1))
        rs_seen = Signal()
        rs_low = Signal(range(REPLAY_SLOTS))    # the slot to use (empty, else lowest)
        rs_lowv = Signal(64)
        rs_empty = Signal()
        # member loops
        ma = Signal(range(MAX_WORKERS + 1))
        mb = Signal(range(MAX_WORKERS + 1))
        # the buffer word addresses of members ma and mb (MEMBERS_AT + k + 3 ma, k = 0..2),
        # kept in step with ma and mb, so no multiply-and-add sits in front of ``widx``
        # (it was the core clock's longest path)
        ma_w = [Signal(range(max_words + 4), name=f"ma_w{k}") for k in range(MEMBER_WORDS)]
        mb_w = [Signal(range(max_words + 4), name=f"mb_w{k}") for k in range(2)]

        def set_ma(first=None):
            """ma := 0 (``first`` given) or ma + 1, with its addresses."""
            if first is not None:
                return [ma.eq(0)] + [ma_w[k].eq(MEMBERS_AT + k) for k in range(MEMBER_WORDS)]
            return [ma.eq(ma + 1)] + [ma_w[k].eq(ma_w[k] + MEMBER_WORDS)
                                      for k in range(MEMBER_WORDS)]

        def set_mb(src):
            """mb := 1, mb + 1 or ma + 1 (``src`` "one", "next", "ma"), with its addresses."""
            if src == "one":
                return [mb.eq(1)] + [mb_w[k].eq(MEMBERS_AT + MEMBER_WORDS + k) for k in range(2)]
            if src == "next":
                return [mb.eq(mb + 1)] + [mb_w[k].eq(mb_w[k] + MEMBER_WORDS) for k in range(2)]
            return [mb.eq(ma + 1)] + [mb_w[k].eq(ma_w[k] + MEMBER_WORDS) for k in range(2)]
        a_ip = Signal(32)
        a_pm = Signal(32)       # port << 16 | mac[47:32]
        cyc = Signal(48)        # deadline in cycles (wide: checked below 2^31)
        mm = Signal(member_layout(mac=True))    # a member-table entry (update compare)

        jt = self.jobs
        bus = self.bus

        def job_w(name, value, j=None):
            jj = slot if j is None else j
            return [bus.addr.eq(JOB_BASE + jj * JOB_STRIDE + _reg(name)), bus.w_data.eq(value),
                    bus.w_stb.eq(1)]

        def mem_w(name, w, value):
            return [bus.addr.eq(MEMBER_BASE + (slot << 7) + (w << 2) + _mreg(name)),
                    bus.w_data.eq(value), bus.w_stb.eq(1)]

        l2w = Signal(5)
        for b in range(16):
            with m.If(e_window[b]):
                m.d.comb += l2w.eq(b)

        # reply templates (reply_templates): one ROM, each ends in 0; 1 marks the job id
        rom, starts = [], {}
        for name, text in replies.items():
            starts[name] = len(rom)
            rom += list(text) + [0]
        m.submodules.tpl = tmem = memory.Memory(shape=8, depth=len(rom), init=rom)
        # (synchronous: its data is a register, off the paths behind it; every use
        # waits a cycle after the address settles, ``tpl_ok``)
        trd = tmem.read_port()
        tp = Signal(range(len(rom) + 1))
        tstart = Signal(range(len(rom) + 1))
        tpl_ok = Signal(2)      # cycles since ``tp`` moved: the byte is in ``tb`` at 2
        tb = Signal(8)
        m.d.sync += tb.eq(trd.data)
        pw = Signal(34)         # R_DIG: the power of ten (of seconds) for digit ``di``
        m.d.comb += trd.addr.eq(tp)
        NC = len(COUNTER_NAMES)
        dv = Signal(34)
        di = Signal(range(10))
        tret = Signal(range(len(rom) + 1))      # where the status template goes on
        in_job = Signal()                       # a job entry's template runs
        jent = Signal(range(NJ + 1))
        jfirst = Signal()
        dd = Signal(4)
        dstarted = Signal()
        dsec = Signal()         # R_DIG writes seconds: dv is cycles (+ half a second)
        hv = Signal(64)         # R_HEX: the session being written
        hx = Signal(4)
        SEC_PW = [min(10 ** (9 - k) * self.clock_hz, (1 << 34) - 1) for k in range(10)]
        assert self.reclaim_cycles + self.clock_hz // 2 < (1 << 34) - 1
        ob_data = [Signal(32, name=f"ob_data{k}") for k in range(L)]
        ob_n = Signal(range(L + 1))
        ob_first, ob_last, ob_valid = Signal(), Signal(), Signal()

        def reply(name):
            """Answer with template ``name`` (a sealed STATUS, as the model's)."""
            m.d.sync += [tstart.eq(starts[name]), cnt.eq(0), pos.eq(0), acc.eq(0),
                         tpl_ok.eq(0)]
            m.next = "R_HDR"

        m.d.comb += kport.addr.eq(Cat(cnt[:4], kop))
        with m.FSM():
            with m.State("IDLE"):
                with m.If(busy & ~capturing):
                    m.d.sync += [mlen.eq(nbytes - TAG_BYTES), cnt.eq(0), src_reply.eq(0),
                                 kdly.eq(0)]
                    m.d.comb += sha.restart.eq(1)
                    m.next = "IPAD"
            with m.State("IPAD"):
                m.d.sync += kdly.eq(1)
                with m.If(kdly):
                    m.d.comb += [sha.i.valid.eq(1), sha.i.payload.eq(kport.data)]
                with m.If(kdly & sha.i.ready):
                    m.d.sync += [cnt.eq(cnt + 1), kdly.eq(0)]
                    with m.If(cnt == 15):
                        m.d.sync += [cnt.eq(0), widx.eq(0), dly.eq(0)]
                        # padded blocks of the message after the key block: (m + 9 + 63) // 64
                        m.d.sync += nblk16.eq(((mlen + 9 + 63) >> 6) << 4)
                        m.next = "MSG"
            with m.State("MSG"):
                # word cnt of the padded message; buffer words are read two cycles ahead
                m.d.sync += widx.eq(cnt)
                bits = (64 + mlen) << 3
                mfull, mrem = mlen >> 2, mlen[:2]
                pad = Mux(mrem == 0, 0x80000000, Mux(mrem == 1, 0x00800000,
                          Mux(mrem == 2, 0x00008000, 0x00000080)))
                val = Mux(cnt < mfull, word,
                          Mux(cnt == mfull, Mux(mrem == 0, 0, word) | pad,
                              Mux(cnt == nblk16 - 1, bits, 0)))
                with m.If(dly != RD):
                    m.d.sync += dly.eq(dly + 1)
                with m.Else():
                    m.d.comb += [sha.i.valid.eq(1), sha.i.payload.eq(val)]
                    with m.If(sha.i.ready):
                        m.d.sync += [cnt.eq(cnt + 1), dly.eq(0)]
                        with m.If(cnt == nblk16 - 1):
                            m.d.sync += cnt.eq(0)
                            m.next = "INNER"
            with m.State("INNER"):
                with m.If(~sha.busy):
                    m.d.sync += [inner.eq(sha.digest), kdly.eq(0)]
                    m.d.comb += sha.restart.eq(1)
                    m.next = "OPAD"
            with m.State("OPAD"):
                m.d.comb += kop.eq(1)
                m.d.sync += kdly.eq(1)
                with m.If(kdly):
                    m.d.comb += [sha.i.valid.eq(1), sha.i.payload.eq(kport.data)]
                with m.If(kdly & sha.i.ready):
                    m.d.sync += [cnt.eq(cnt + 1), kdly.eq(0)]
                    with m.If(cnt == 15):
                        m.d.sync += cnt.eq(0)
                        m.next = "OUTER"
            with m.State("OUTER"):
                val = Mux(cnt < 8, Array(inner[k] for k in range(8))[cnt[:3]],
                          Mux(cnt == 8, 0x80000000, Mux(cnt == 15, (64 + 32) * 8, 0)))
                m.d.comb += [sha.i.valid.eq(1), sha.i.payload.eq(val)]
                with m.If(sha.i.ready):
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(cnt == 15):
                        m.d.sync += [cnt.eq(0), dly.eq(0)]
                        with m.If(src_reply):
                            m.next = "R_TAG"
                        with m.Else():
                            m.next = "TAG"
            with m.State("TAG"):
                # the datagram's tag (4 words) and nonce (2 words) into registers
                m.d.sync += widx.eq((mlen >> 2) - 2 + cnt)
                with m.If(dly != RD):
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
                        m.d.sync += cnt.eq(0)
                        m.next = "CHECK"
            with m.State("CHECK"):
                # (the tag compare is registered: decided a cycle after the digest is)
                with m.If(~sha.busy & (dly == 0)):
                    m.d.sync += dly.eq(1)
                with m.Elif(~sha.busy):
                    m.d.sync += dly.eq(0)
                    with m.If(tag_ok):
                        m.d.sync += [rs_i.eq(0), rs_seen.eq(0), rs_empty.eq(0),
                                     rs_low.eq(0), rs_lowv.eq(C(-1, 64))]
                        m.next = "REPLAY"
                    with m.Else():
                        m.d.comb += ev.drop_unauthenticated.eq(1)
                        m.next = "DONE"
            with m.State("REPLAY"):
                # one slot a cycle: seen? the slot to use: an empty one, else the lowest
                if REPLAY_SLOTS > 1:
                    m.d.comb += kept_r.addr.eq(rs_i[:_log2(REPLAY_SLOTS)])
                kv = kept_r.data
                vv = kvalid.bit_select(rs_i, 1)
                with m.If(rs_i == REPLAY_SLOTS):
                    refuse = rs_seen | (~rs_empty & (nonce <= rs_lowv))
                    with m.If(refuse):
                        m.d.comb += ev.drop_unauthenticated.eq(1)
                        m.next = "DONE"
                    with m.Else():
                        m.d.comb += [kept_w.addr.eq(rs_low), kept_w.data.eq(nonce),
                                     kept_w.en.eq(1)]
                        for k in range(REPLAY_SLOTS):
                            with m.If(rs_low == k):
                                m.d.sync += kvalid[k].eq(1)
                        with m.If(is_stat):
                            reply("status")
                        with m.Else():
                            m.d.sync += [widx.eq(ENTRY_AT), dly.eq(0), cnt.eq(0)]
                            m.next = "ENTRY"
                with m.Else():
                    m.d.sync += rs_i.eq(rs_i + 1)
                    with m.If(vv & (kv == nonce)):
                        m.d.sync += rs_seen.eq(1)
                    with m.If(~rs_empty):
                        with m.If(~vv):
                            m.d.sync += [rs_empty.eq(1), rs_low.eq(rs_i)]
                        with m.Elif(kv < rs_lowv):
                            m.d.sync += [rs_low.eq(rs_i), rs_lowv.eq(kv)]
            with m.State("ENTRY"):
                # the entry's words (ENTRY_DTYPE, after the header), field by field
                m.d.sync += widx.eq(ENTRY_AT + cnt)
                with m.If(dly != RD):
                    m.d.sync += dly.eq(dly + 1)
                with m.Else():
                    m.d.sync += [dly.eq(0), cnt.eq(cnt + 1)]
                    with m.Switch(cnt):
                        for k in range(ENTRY_WORDS):
                            with m.Case(k):
                                for name, sig in efield.items():
                                    for w, lo, hi, flo in _entry_pieces(name):
                                        if w == k:
                                            m.d.sync += sig[flo:flo + hi - lo].eq(word[lo:hi])
                    with m.If(cnt == ENTRY_WORDS - 1):
                        m.d.sync += [cnt.eq(0), *set_ma(0), *set_mb("one")]
                        m.next = "PARSE"
            with m.State("PARSE"):
                # jobtable.parse_control's checks, in its order
                pow2 = (e_window != 0) & ((e_window & (e_window - 1)) == 0)
                bad = ((e_flags & ~ENTRY_UPDATE) != 0)
                remove = (e_n == 0) & (kmem == 0)
                bad |= (e_n != kmem)
                bad |= (e_mode >= 2)
                bad |= ~pow2 | (e_elements == 0) | (e_elements > MAX_ELEMENTS)
                bad |= (e_deadline == 0) | (e_deadline >= 4294000000)
                bad |= (e_session == 0)
                with m.If((e_flags & ~ENTRY_UPDATE) != 0):
                    m.d.comb += mal.eq(1)
                    m.next = "DONE"
                with m.Elif(remove):
                    m.d.sync += [cnt.eq(0), is_rm.eq(1)]
                    m.next = "LOOKUP"
                with m.Elif(bad):
                    m.d.comb += mal.eq(1)
                    m.next = "DONE"
                with m.Else():
                    m.d.sync += [*set_ma(0), dly.eq(0), cnt.eq(0), cyc.eq(0), is_rm.eq(0)]
                    m.next = "MUL"
            with m.State("MUL"):
                # the deadline in cycles, by repeated addition (no multiplier on the path)
                m.d.sync += [cyc.eq(cyc + e_deadline), cnt.eq(cnt + 1)]
                with m.If(cnt == self.cycles_per_us - 1):
                    m.d.sync += cnt.eq(0)
                    m.next = "DUP_A"
            # duplicate member addresses (ip, port): every pair, read from the buffer
            def read(addr):
                """Read buffer word ``addr``: True in the cycle ``word`` holds it."""
                m.d.sync += widx.eq(addr)
                with m.If(dly != RD):
                    m.d.sync += dly.eq(dly + 1)
                with m.Else():
                    m.d.sync += dly.eq(0)
                return dly == RD

            def next_b():
                with m.If(mb + 1 >= kmem):
                    m.d.sync += set_ma()
                    m.next = "DUP_A"
                with m.Else():
                    m.d.sync += set_mb("next")
                    m.next = "DUP_B"
            with m.State("DUP_A"):
                with m.If(ma + 1 >= kmem):
                    m.next = "LOOKUP"
                with m.Else():
                    with m.If(read(ma_w[0])):
                        m.d.sync += a_ip.eq(word)
                        m.next = "DUP_A2"
            with m.State("DUP_A2"):
                with m.If(read(ma_w[1])):
                    m.d.sync += [a_pm.eq(word), *set_mb("ma")]
                    m.next = "DUP_B"
            with m.State("DUP_B"):
                with m.If(read(mb_w[0])):
                    with m.If(word != a_ip):
                        next_b()
                    with m.Else():
                        m.next = "DUP_B2"
            with m.State("DUP_B2"):
                with m.If(read(mb_w[1])):
                    with m.If(word[16:] == a_pm[16:]):
                        m.d.comb += mal.eq(1)
                        m.next = "DONE"
                    with m.Else():
                        next_b()
            with m.State("LOOKUP"):
                # the installed entry of this job, else the lowest free entry
                hit = [jt[j].enable & (jt[j].job_id == e_job) for j in range(NJ)]
                freej = [~jt[j].enable for j in range(NJ)]
                m.d.sync += [found.eq(Cat(hit).any()), free_ok.eq(Cat(freej).any())]
                m.d.sync += [sess_same[j].eq(Cat(jt[j].session_lo, jt[j].session_hi)
                                             == e_session) for j in range(NJ)]
                for j in range(NJ):
                    with m.If(hit[j]):
                        m.d.sync += age.eq(idle[j])
                for j in reversed(range(NJ)):
                    with m.If(freej[j]):
                        m.d.sync += free.eq(j)
                for j in reversed(range(NJ)):
                    with m.If(hit[j]):
                        m.d.sync += slot.eq(j)
                m.next = "DECIDE"
            with m.State("DECIDE"):
                held_other = found & ~sess_same.bit_select(slot, 1)
                with m.If(is_rm):
                    # (session 0 removes whatever session the job holds)
                    with m.If(held_other & (e_session != 0)):
                        m.d.comb += ev.control_refused.eq(1)
                        reply("not_removed")
                    with m.Else():
                        m.d.sync += cnt.eq(0)
                        m.next = "REMOVE"
                with m.Elif(e_flags[0]):
                    with m.If(~found):
                        m.d.comb += ev.control_refused.eq(1)
                        reply("not_installed")
                    with m.Elif(held_other):
                        m.d.comb += ev.control_refused.eq(1)
                        reply("other_session")
                    with m.Else():
                        def js(name):
                            return jobs_at(jt, name, slot)
                        same = ((js("nworkers") == e_n) & (js("bounded") == e_mode[0])
                                & (js("log2_window") == l2w)
                                & (js("elements") == e_elements)
                                & (js("mcast_en") == (e_mip != 0))
                                & ((e_mip == 0) | ((js("mcast_ip") == e_mip)
                                                   & (js("mcast_port") == e_mport))))
                        with m.If(same):
                            m.d.sync += [*set_ma(0), cnt.eq(0), dly.eq(0)]
                            m.next = "UPD_CMP"
                        with m.Else():
                            m.d.comb += ev.control_refused.eq(1)
                            reply("only_deadline")
                with m.Else():
                    fits = ((e_window <= P.window) & (e_elements <= P.elements)
                            & (e_n <= P.workers) & (cyc < (1 << 31)))
                    with m.If(held_other & young.bit_select(slot, 1)):
                        m.d.comb += ev.control_refused.eq(1)
                        reply("taken")
                    with m.Elif(~fits):
                        m.d.comb += ev.control_refused.eq(1)
                        reply("no_fit")
                    with m.Elif(~(found | free_ok)):
                        m.d.comb += ev.control_refused.eq(1)
                        reply("table_full")
                    with m.Else():
                        with m.If(~found):
                            m.d.sync += slot.eq(free)
                        m.d.sync += cnt.eq(0)
                        m.next = "WRITE"
            with m.State("UPD_CMP"):
                # member ma of the entry (buffer) against the member table (read port)
                with m.If(ma == kmem):
                    m.next = "UPD_WRITE"
                with m.Else():
                    m.d.comb += [self.member.en.eq(1),
                                 self.member.addr.eq(slot * WS + ma[:max(1, _log2(P.workers))]
                                                     if WS > 1 else slot)]
                    m.d.sync += [widx.eq(ma_w[0]), dly.eq(0), cnt.eq(0)]
                    m.next = "UPD_RD"
            with m.State("UPD_RD"):
                # (the member's entry, latched the cycle after its read)
                with m.If((cnt == 0) & (dly == 0)):
                    m.d.sync += mm.eq(self.member.data)
                with m.If(dly != RD):
                    m.d.sync += dly.eq(dly + 1)
                with m.Else():
                    m.d.sync += [dly.eq(0), cnt.eq(cnt + 1)]
                    with m.Switch(cnt):
                        with m.Case(0):
                            m.d.sync += [a_ip.eq(word), widx.eq(ma_w[1])]
                        with m.Case(1):
                            m.d.sync += [a_pm.eq(word), widx.eq(ma_w[2])]
                        with m.Case(2):
                            same = ((mm.ip == a_ip) & (mm.port == a_pm[16:])
                                    & (mm.mac == Cat(word, a_pm[:16])))
                            with m.If(same):
                                m.d.sync += set_ma()
                                m.next = "UPD_CMP"
                            with m.Else():
                                m.d.comb += ev.control_refused.eq(1)
                                reply("only_deadline")
            with m.State("UPD_WRITE"):
                with m.If(cyc >= (1 << 31)):
                    m.d.comb += ev.control_refused.eq(1)
                    reply("no_fit")
                with m.Else():
                    m.d.comb += job_w("deadline", cyc[:32])
                    m.d.comb += ev.control.eq(1)
                    reply("update")
            with m.State("REMOVE"):
                # every enabled entry with this job id
                for j in range(NJ):
                    with m.If(cnt == j):
                        with m.If(jt[j].enable & (jt[j].job_id == e_job)):
                            m.d.comb += job_w("enable", 0, j)
                m.d.sync += cnt.eq(cnt + 1)
                with m.If(cnt == NJ - 1):
                    m.d.comb += ev.control.eq(1)
                    reply("remove")
            with m.State("WRITE"):
                # enable 0, the job's registers, then its members, then enable 1
                fields = [("enable", 0), ("job_id", e_job), ("nworkers", e_n),
                          ("bounded", e_mode[0]), ("log2_window", l2w),
                          ("elements", e_elements), ("deadline", cyc[:32]),
                          ("mcast_en", e_mip != 0), ("mcast_ip", e_mip),
                          ("mcast_port", Mux(e_mip != 0, e_mport, 0)),
                          ("session_hi", e_session[32:]), ("session_lo", e_session[:32])]
                with m.Switch(cnt):
                    for k, (name, v) in enumerate(fields):
                        with m.Case(k):
                            m.d.comb += job_w(name, v)
                m.d.sync += cnt.eq(cnt + 1)
                with m.If(cnt == len(fields) - 1):
                    m.d.sync += [*set_ma(0), cnt.eq(0), dly.eq(0)]
                    m.next = "MEMBERS"
            with m.State("MEMBERS"):
                # member ma: ip, then port and the MAC's top 16 bits, then its low 32
                with m.If(ma == kmem):
                    m.d.comb += job_w("enable", 1)
                    m.next = "WAIT_INIT"
                with m.Else():
                    with m.If(read(ma_w[0])):
                        m.d.comb += mem_w("ip", ma, word)
                        m.next = "MEMBER_PORT"
            with m.State("MEMBER_PORT"):
                with m.If(read(ma_w[1])):
                    m.d.comb += mem_w("port", ma, word[16:])
                    m.d.sync += a_pm.eq(word)
                    m.next = "MEMBER_MAC"
            with m.State("MEMBER_MAC"):
                with m.If(read(ma_w[2])):
                    m.d.comb += mem_w("mac_hi", ma, a_pm[:16])
                    m.d.sync += a_ip.eq(word)
                    m.next = "MEMBER_LO"
            with m.State("MEMBER_LO"):
                m.d.comb += mem_w("mac_lo", ma, a_ip)
                m.d.sync += set_ma()
                m.next = "MEMBERS"
            with m.State("WAIT_INIT"):
                # the enable write lands, the job's slots are reset, enable reads 1
                m.d.sync += cnt.eq(cnt + 1)
                with m.If((cnt > 4) & jobs_at(jt, "enable", slot)):
                    m.d.comb += ev.control.eq(1)
                    reply("install")
            # ---------------------------------------------------------- the reply
            with m.State("R_HDR"):
                # the INA header of a STATUS datagram: version, type, then zeros
                put(Mux(cnt == 0, VERSION, Mux(cnt == 1, MsgType.STATUS, 0)))
                m.d.sync += cnt.eq(cnt + 1)
                with m.If(cnt == HEADER_BYTES - 1):
                    m.d.sync += [tp.eq(tstart), cnt.eq(0)]
                    m.next = "R_TPL"
            with m.State("R_TPL"):
                # the template, read two cycles ahead: 0 ends it, 1..8 are fields (above)
                m.d.sync += pw.eq(10 ** 9)      # (the seconds' opcode sets its own)
                with m.If(tpl_ok != 2):
                    m.d.sync += tpl_ok.eq(tpl_ok + 1)
                with m.Else():
                    m.d.sync += [tpl_ok.eq(0), tp.eq(tp + 1)]
                    with m.Switch(tb):
                        with m.Case(0):
                            with m.If(in_job):
                                m.d.sync += [in_job.eq(0), tp.eq(tret), jent.eq(jent + 1)]
                                m.next = "R_JOBS"
                            with m.Else():
                                m.d.sync += cnt.eq(0)
                                m.next = "R_NONCE"
                        with m.Case(1):
                            m.d.sync += dv.eq(Mux(in_job, jobs_at(jt, "job_id", jent), e_job))
                            m.next = "R_DIG"
                        with m.Case(2):
                            m.next = "R_CNT"
                        with m.Case(3):
                            m.d.sync += [tret.eq(tp + 1), jent.eq(0), jfirst.eq(1)]
                            m.next = "R_JOBS"
                        with m.Case(4):
                            m.d.sync += dv.eq(jobs_at(jt, "elements", jent))
                            m.next = "R_DIG"
                        with m.Case(6):
                            m.d.sync += dv.eq(C(1, 33) << jobs_at(jt, "log2_window", jent))
                            m.next = "R_DIG"
                        with m.Case(7):
                            m.d.sync += dv.eq(jobs_at(jt, "nworkers", jent))
                            m.next = "R_DIG"
                        with m.Case(5):
                            m.d.sync += [dv.eq(age + self.clock_hz // 2), dsec.eq(1),
                                         pw.eq(SEC_PW[0])]
                            m.next = "R_DIG"
                        with m.Case(8):
                            m.d.sync += [hv.eq(Cat(jobs_at(jt, "session_lo", jent),
                                                   jobs_at(jt, "session_hi", jent))),
                                         hx.eq(0)]
                            m.next = "R_HEX"
                        with m.Default():
                            put(tb)
                m.d.sync += [di.eq(0), dd.eq(0), dstarted.eq(0)]
            with m.State("R_CNT"):
                # the counter index follows the opcode
                with m.If(tpl_ok != 2):
                    m.d.sync += tpl_ok.eq(tpl_ok + 1)
                with m.Else():
                    m.d.sync += [tpl_ok.eq(0), tp.eq(tp + 1),
                                 dv.eq(Array(self.counters[k] for k in range(NC))[
                                     tb[:max(1, _log2(NC))]])]
                    m.next = "R_DIG"
            with m.State("R_JOBS"):
                # the next enabled entry, with ", " between entries
                with m.If(jent == NJ):
                    m.d.sync += tp.eq(tret)
                    m.next = "R_TPL"
                with m.Elif(~jobs_at(jt, "enable", jent[:max(1, _log2(NJ))])):
                    m.d.sync += jent.eq(jent + 1)
                with m.Elif(~jfirst):
                    put(ord(","))
                    m.next = "R_SEP"
                with m.Else():
                    m.d.sync += [tp.eq(Mux(jobs_at(jt, "bounded", jent[:max(1, _log2(NJ))]),
                                           starts["job_bounded"], starts["job_reliable"])),
                                 in_job.eq(1), jfirst.eq(0)]
                    m.next = "R_TPL"
            with m.State("R_SEP"):
                put(ord(" "))
                m.d.sync += [tp.eq(Mux(jobs_at(jt, "bounded", jent[:max(1, _log2(NJ))]),
                                       starts["job_bounded"], starts["job_reliable"])),
                             in_job.eq(1)]
                m.next = "R_TPL"
            with m.State("R_DIG"):
                # a number in decimal: subtract each power of ten, then write its digit
                # (``pw`` is a register, set for the next digit as this one ends)
                with m.If(dv >= pw):
                    m.d.sync += [dv.eq(dv - pw), dd.eq(dd + 1)]
                with m.Else():
                    m.d.sync += pw.eq(Mux(dsec, Array(C(x, 34) for x in SEC_PW[1:] + [1])[di],
                                          Array(C(10 ** max(0, 8 - k), 34)
                                                for k in range(10))[di]))
                    with m.If((dd != 0) | dstarted | (di == 9)):
                        put(ord("0") + dd)
                        m.d.sync += dstarted.eq(1)
                    m.d.sync += [dd.eq(0), di.eq(di + 1)]
                    with m.If(di == 9):
                        m.d.sync += dsec.eq(0)
                        m.next = "R_TPL"
            with m.State("R_HEX"):
                # the session in 16 lowercase hex digits, as the model's f"{s:016x}"
                nib = hv[60:]
                put(Mux(nib < 10, ord("0") + nib, ord("a") - 10 + nib))
                m.d.sync += [hv.eq(hv << 4), hx.eq(hx + 1)]
                with m.If(hx == 15):
                    m.next = "R_TPL"
            with m.State("R_NONCE"):
                put(nonce.word_select((7 - cnt[:3])[:3], 8))
                m.d.sync += cnt.eq(cnt + 1)
                with m.If(cnt == 7):
                    m.next = "R_LAST"
            with m.State("R_LAST"):
                # (the last nonce byte is written this cycle: ``pos`` is final after it)
                m.next = "R_HASH"
            with m.State("R_HASH"):
                # the tag over everything so far, as for a request
                m.d.comb += [flush.eq(1), sha.restart.eq(1)]
                m.d.sync += [mlen.eq(pos), cnt.eq(0), src_reply.eq(1)]
                m.next = "IPAD"
            with m.State("R_TAG"):
                with m.If(~sha.busy):
                    put(Cat(sha.digest[k] for k in reversed(range(4))).word_select((15 - cnt[:4])[:4], 8))
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(cnt == 15):
                        m.d.sync += [cnt.eq(0), dly.eq(0), ob_n.eq(0), ob_first.eq(1)]
                        m.next = "R_FLUSH"
            with m.State("R_FLUSH"):
                m.d.comb += flush.eq(1)
                m.next = "R_OUT"
            with m.State("R_OUT"):
                # one word at a time into the output beat, laid out as the core's output
                # (header words in the first beats, the rest from a fresh beat)
                nw = (pos + 3) >> 2
                is_hdr = cnt < HEADER_WORDS
                lane_o = Mux(is_hdr, cnt[:max(1, LL)] if L > 1 else 0,
                             (cnt - HEADER_WORDS)[:max(1, LL)] if L > 1 else 0)
                full = (lane_o == L - 1) | (cnt == HEADER_WORDS - 1) | (cnt == nw - 1)
                with m.If(read(cnt)):
                    for k in range(L):
                        with m.If(lane_o == k):
                            m.d.sync += ob_data[k].eq(word)
                    m.d.sync += ob_n.eq(lane_o + 1)
                    with m.If(full):
                        m.d.sync += [ob_last.eq(cnt == nw - 1), ob_valid.eq(1)]
                        m.next = "R_SEND"
                    with m.Else():
                        m.d.sync += cnt.eq(cnt + 1)
            with m.State("R_SEND"):
                with m.If(self.o.ready):
                    m.d.sync += [ob_valid.eq(0), ob_first.eq(0), cnt.eq(cnt + 1)]
                    with m.If(ob_last):
                        m.next = "DONE"
                    with m.Else():
                        m.next = "R_OUT"
            with m.State("DONE"):
                m.d.sync += [busy.eq(0), src_reply.eq(0)]
                m.next = "IDLE"

        # the reply's IPv4 header checksum (ip_checksum_hw's sum, in three registered
        # steps: its inputs are still while a reply is read out, which takes longer)
        from .replicator import IP_FLAGS_DF, IP_TTL_PROTO
        ck_a, ck_b, ck_s = Signal(18), Signal(17), Signal(20)
        cks = Signal(16)
        m.d.sync += [ck_a.eq(Const(0x4500 + IP_FLAGS_DF + IP_TTL_PROTO, 17)
                             + self.src_ip[16:] + self.src_ip[:16]),
                     ck_b.eq(r_ip[16:] + r_ip[:16]),
                     ck_s.eq(ck_a + ck_b + (pos + 28))]
        ck1 = ck_s[:16] + ck_s[16:]
        ck2 = ck1[:16] + ck1[16:]
        m.d.sync += cks.eq(~ck2[:16])
        o = self.o.payload
        m.d.comb += [self.o.valid.eq(ob_valid), o.first.eq(ob_first), o.last.eq(ob_last),
                     o.n.eq(ob_n), o.length.eq(pos), o.dst_mac.eq(r_mac), o.dst_ip.eq(r_ip),
                     o.dst_port.eq(r_port), o.mcast.eq(0),
                     o.ip_checksum.eq(cks)]
        for k in range(L):
            m.d.comb += o.data[k].eq(ob_data[k])

        m.d.comb += self.bus_active.eq(bus.w_stb)
        return m
