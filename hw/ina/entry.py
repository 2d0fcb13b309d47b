"""A CONTROL's job-table entry: :class:`EntryParser` reads and checks it as
``jobtable.parse_control`` does, :class:`EntryWriter` applies it through the register bus.

Both read the datagram buffer through a word reader (:mod:`.reader`); where the entry and
its members sit comes from the generated header and the job-table dtypes.
"""

from amaranth.hdl import *
from amaranth.lib import wiring, data, memory
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.fields import HEADER_BYTES, MAX_WORKERS
from ina_fabric.protocol.jobtable import ENTRY_UPDATE, MAX_ELEMENTS, ENTRY_DTYPE, MEMBER_DTYPE
from ina_fabric.protocol.jobtable import IDLE_RECLAIM_S
from ina_fabric.protocol.regs import JOB_BASE, JOB_STRIDE, JOB_REGS, MEMBER_BASE, MEMBER_REGS

from .params import CoreParams, HEADER_WORDS
from .reader import READ_LATENCY, reader_signature, word_reads
from .regfile import job_layout, member_layout, jobs_at
from .status import Reply

__all__ = ["EntryParser", "EntryWriter", "entry_layout", "ENTRY_AT", "MEMBERS_AT",
           "MEMBER_WORDS", "ENTRY_WORDS", "WRITER_EVENTS"]

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

#: the counter events the writer raises (one per cycle each)
WRITER_EVENTS = {"control": 1, "control_refused": 1}

RD = READ_LATENCY


def _log2(n):
    return (n - 1).bit_length()


def entry_layout() -> data.StructLayout:
    """The entry's fields (``ENTRY_DTYPE``'s names), each at its width in bits."""
    return data.StructLayout({name: 8 * ENTRY_DTYPE.fields[name][0].itemsize
                              for name in ENTRY_DTYPE.names})


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


class _Members:
    """Member loop counters (``ma``, and ``mb`` for pairs) with their buffer word
    addresses (``MEMBERS_AT + k + 3 ma``) kept in step, so no multiply-and-add sits in
    front of the reader's address (it was the core clock's longest path)."""

    def __init__(self, max_words, pairs):
        self.ma = Signal(range(MAX_WORKERS + 1))
        self.ma_w = [Signal(range(max_words + 4), name=f"ma_w{k}") for k in range(MEMBER_WORDS)]
        if pairs:
            self.mb = Signal(range(MAX_WORKERS + 1))
            self.mb_w = [Signal(range(max_words + 4), name=f"mb_w{k}") for k in range(2)]

    def set_ma(self, first=None):
        """ma := 0 (``first`` given) or ma + 1, with its addresses."""
        ma, ma_w = self.ma, self.ma_w
        if first is not None:
            return [ma.eq(0)] + [ma_w[k].eq(MEMBERS_AT + k) for k in range(MEMBER_WORDS)]
        return [ma.eq(ma + 1)] + [ma_w[k].eq(ma_w[k] + MEMBER_WORDS)
                                  for k in range(MEMBER_WORDS)]

    def set_mb(self, src):
        """mb := 1, mb + 1 or ma + 1 (``src`` "one", "next", "ma"), with its addresses."""
        mb, mb_w, ma, ma_w = self.mb, self.mb_w, self.ma, self.ma_w
        if src == "one":
            return [mb.eq(1)] + [mb_w[k].eq(MEMBERS_AT + MEMBER_WORDS + k) for k in range(2)]
        if src == "next":
            return [mb.eq(mb + 1)] + [mb_w[k].eq(mb_w[k] + MEMBER_WORDS) for k in range(2)]
        return [mb.eq(ma + 1)] + [mb_w[k].eq(ma_w[k] + MEMBER_WORDS) for k in range(2)]


class EntryParser(wiring.Component):
    """Reads a CONTROL's entry from the buffer and checks it (``jobtable.parse_control``'s
    checks, in its order, then every pair of members for a repeated address) and turns
    the deadline into cycles (by repeated addition: no multiplier on the path).

    start       In: parse the buffer's entry (a pulse)
    kmem        In: the members the datagram's length says
    rd          the word reader
    done        Out: a pulse when it is decided: ``malformed`` (the counter event, in
                the same cycle), else the entry is good and ``remove`` says whether it
                removes its job
    entry, cyc, l2w
                Out: the entry's fields, its deadline in cycles (48 bits: checked below
                2^31 by the writer), log2 of its window
    """

    def __init__(self, *, cycles_per_us: int, max_words: int):
        self.cycles_per_us = cycles_per_us
        self.max_words = max_words
        super().__init__({
            "start": In(1), "kmem": In(range(MAX_WORKERS + 1)),
            "rd": Out(reader_signature(range(max_words + 1))),
            "done": Out(1), "malformed": Out(1), "remove": Out(1),
            "entry": Out(entry_layout()), "cyc": Out(48), "l2w": Out(5),
        })

    def elaborate(self, platform):
        m = Module()
        e = self.entry
        efield = {name: getattr(e, name) for name in ENTRY_DTYPE.names}
        kmem, word = self.kmem, self.rd.word
        cnt = Signal(range(max(ENTRY_WORDS, self.cycles_per_us) + 1))
        dly = Signal(2)
        cyc = self.cyc
        mem = _Members(self.max_words, pairs=True)
        ma, mb = mem.ma, mem.mb
        a_ip = Signal(32)
        a_pm = Signal(32)       # port << 16 | mac[47:32]
        read = word_reads(m, self.rd, dly)
        for b in range(16):
            with m.If(e.window[b]):
                m.d.comb += self.l2w.eq(b)

        def verdict(malformed):
            m.d.comb += [self.done.eq(1), self.malformed.eq(malformed)]
            m.next = "IDLE"

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.comb += [self.rd.en.eq(1), self.rd.addr.eq(ENTRY_AT)]
                    m.d.sync += [dly.eq(0), cnt.eq(0)]
                    m.next = "ENTRY"
            with m.State("ENTRY"):
                # the entry's words (ENTRY_DTYPE, after the header), field by field
                m.d.comb += [self.rd.en.eq(1), self.rd.addr.eq(ENTRY_AT + cnt)]
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
                        m.d.sync += [cnt.eq(0), *mem.set_ma(0), *mem.set_mb("one")]
                        m.next = "PARSE"
            with m.State("PARSE"):
                # jobtable.parse_control's checks, in its order
                pow2 = (e.window != 0) & ((e.window & (e.window - 1)) == 0)
                bad = ((e.flags & ~ENTRY_UPDATE) != 0)
                remove = (e.nworkers == 0) & (kmem == 0)
                bad |= (e.nworkers != kmem)
                bad |= (e.mode >= 2)
                bad |= ~pow2 | (e.elements == 0) | (e.elements > MAX_ELEMENTS)
                bad |= (e.deadline_us == 0) | (e.deadline_us >= 4294000000)
                bad |= (e.session == 0)
                with m.If((e.flags & ~ENTRY_UPDATE) != 0):
                    verdict(1)
                with m.Elif(remove):
                    m.d.sync += self.remove.eq(1)
                    m.next = "GOOD"
                with m.Elif(bad):
                    verdict(1)
                with m.Else():
                    m.d.sync += [*mem.set_ma(0), dly.eq(0), cnt.eq(0), cyc.eq(0),
                                 self.remove.eq(0)]
                    m.next = "MUL"
            with m.State("MUL"):
                # the deadline in cycles, by repeated addition (no multiplier on the path)
                m.d.sync += [cyc.eq(cyc + e.deadline_us), cnt.eq(cnt + 1)]
                with m.If(cnt == self.cycles_per_us - 1):
                    m.d.sync += cnt.eq(0)
                    m.next = "DUP_A"

            # duplicate member addresses (ip, port): every pair, read from the buffer
            def next_b():
                with m.If(mb + 1 >= kmem):
                    m.d.sync += mem.set_ma()
                    m.next = "DUP_A"
                with m.Else():
                    m.d.sync += mem.set_mb("next")
                    m.next = "DUP_B"
            with m.State("DUP_A"):
                with m.If(ma + 1 >= kmem):
                    m.next = "GOOD"
                with m.Else():
                    with m.If(read(mem.ma_w[0])):
                        m.d.sync += a_ip.eq(word)
                        m.next = "DUP_A2"
            with m.State("DUP_A2"):
                with m.If(read(mem.ma_w[1])):
                    m.d.sync += [a_pm.eq(word), *mem.set_mb("ma")]
                    m.next = "DUP_B"
            with m.State("DUP_B"):
                with m.If(read(mem.mb_w[0])):
                    with m.If(word != a_ip):
                        next_b()
                    with m.Else():
                        m.next = "DUP_B2"
            with m.State("DUP_B2"):
                with m.If(read(mem.mb_w[1])):
                    with m.If(word[16:] == a_pm[16:]):
                        verdict(1)
                    with m.Else():
                        next_b()
            with m.State("GOOD"):
                verdict(0)
        return m


def _reg(name):
    return next(r for r in JOB_REGS if r.name == name).offset


def _mreg(name):
    return next(r for r in MEMBER_REGS if r.name == name).offset


class EntryWriter(wiring.Component):
    """Applies a parsed entry: a removal disables the job's entries; an install writes
    the entry and its members through the register bus and enables the job (which
    resets its slots); a live update of an installed job that changes only the deadline
    writes the deadline. Refused: an update of a job that is not installed, of another
    session's, or that changes more than the deadline (its members are compared with the
    member table); an install that does not fit the core or finds no free entry, or of a
    job another session holds and used within the reclaim time.

    start       In: apply ``entry`` (a pulse; the inputs are still until ``done``)
    entry, cyc, l2w, remove, kmem
                In: from :class:`EntryParser`, and the member count
    jobs        In: the job table; ``accepted``: per job, DATA accepted (its idle time)
    member      a synchronous read port on the member table (an update's compare)
    rd          the word reader (the members in the buffer)
    bus         Out: register-bus writes (``w_stb`` while it writes)
    done        Out: a pulse when it is over; ``reply`` says the answer
    age         Out: the found job's idle cycles (the "taken" reply's seconds)
    events      Out: ``control`` (applied), ``control_refused``
    """

    def __init__(self, params: CoreParams, *, max_words: int, reclaim_cycles: int):
        self.params = P = params
        self.max_words = max_words
        self.reclaim_cycles = reclaim_cycles
        ws = 1 << _log2(P.workers)
        super().__init__({
            "start": In(1), "entry": In(entry_layout()), "cyc": In(48), "l2w": In(5),
            "remove": In(1), "kmem": In(range(MAX_WORKERS + 1)),
            "jobs": In(data.ArrayLayout(job_layout(), P.jobs)),
            "accepted": In(P.jobs),
            "member": In(memory.ReadPort.Signature(
                addr_width=_log2(P.jobs * ws), shape=member_layout(mac=True))),
            "rd": Out(reader_signature(range(max_words + 1))),
            "bus": Out(data.StructLayout({"addr": 16, "w_stb": 1, "w_data": 32})),
            "done": Out(1), "reply": Out(Reply),
            "age": Out(range(reclaim_cycles + 1)),
            "events": Out(data.StructLayout(WRITER_EVENTS)),
        })

    def _idle(self, m):
        """Per job: cycles since it was last active (enabled, or DATA accepted),
        saturating at the reclaim time; a job is held by its session while below it."""
        NJ, REC = self.params.jobs, self.reclaim_cycles
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
        return idle, young

    def elaborate(self, platform):
        P = self.params
        NJ = P.jobs
        WS = 1 << _log2(P.workers)
        m = Module()
        ev, e, jt, bus = self.events, self.entry, self.jobs, self.bus
        kmem, word, cyc, l2w = self.kmem, self.rd.word, self.cyc, self.l2w
        idle, young = self._idle(m)
        slot = Signal(range(max(2, NJ)))     # the job-table entry used
        found, free_ok = Signal(), Signal()
        free = Signal(range(max(2, NJ)))
        sess_same = Signal(max(2, NJ))   # per entry: holds the entry's session
        age = self.age
        cnt = Signal(range(64))
        dly = Signal(2)
        mem = _Members(self.max_words, pairs=False)
        ma, ma_w, set_ma = mem.ma, mem.ma_w, mem.set_ma
        a_ip = Signal(32)
        a_pm = Signal(32)       # port << 16 | mac[47:32]
        mm = Signal(member_layout(mac=True))    # a member-table entry (update compare)
        read = word_reads(m, self.rd, dly)

        def job_w(name, value, j=None):
            jj = slot if j is None else j
            return [bus.addr.eq(JOB_BASE + jj * JOB_STRIDE + _reg(name)), bus.w_data.eq(value),
                    bus.w_stb.eq(1)]

        def mem_w(name, w, value):
            return [bus.addr.eq(MEMBER_BASE + (slot << 7) + (w << 2) + _mreg(name)),
                    bus.w_data.eq(value), bus.w_stb.eq(1)]

        def reply(kind, event):
            m.d.comb += getattr(ev, event).eq(1)
            m.d.sync += self.reply.eq(kind)
            m.next = "DONE"

        def refuse(kind):
            reply(kind, "control_refused")

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.next = "LOOKUP"
            with m.State("LOOKUP"):
                # the installed entry of this job, else the lowest free entry
                hit = [jt[j].enable & (jt[j].job_id == e.job) for j in range(NJ)]
                freej = [~jt[j].enable for j in range(NJ)]
                m.d.sync += [found.eq(Cat(hit).any()), free_ok.eq(Cat(freej).any())]
                m.d.sync += [sess_same[j].eq(Cat(jt[j].session_lo, jt[j].session_hi)
                                             == e.session) for j in range(NJ)]
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
                with m.If(self.remove):
                    # (session 0 removes whatever session the job holds)
                    with m.If(held_other & (e.session != 0)):
                        refuse(Reply.NOT_REMOVED)
                    with m.Else():
                        m.d.sync += cnt.eq(0)
                        m.next = "REMOVE"
                with m.Elif(e.flags[0]):
                    with m.If(~found):
                        refuse(Reply.NOT_INSTALLED)
                    with m.Elif(held_other):
                        refuse(Reply.OTHER_SESSION)
                    with m.Else():
                        def js(name):
                            return jobs_at(jt, name, slot)
                        same = ((js("nworkers") == e.nworkers) & (js("bounded") == e.mode[0])
                                & (js("log2_window") == l2w)
                                & (js("elements") == e.elements)
                                & (js("mcast_en") == (e.mcast_ip != 0))
                                & ((e.mcast_ip == 0) | ((js("mcast_ip") == e.mcast_ip)
                                                        & (js("mcast_port") == e.mcast_port))))
                        with m.If(same):
                            m.d.sync += [*set_ma(0), cnt.eq(0), dly.eq(0)]
                            m.next = "UPD_CMP"
                        with m.Else():
                            refuse(Reply.ONLY_DEADLINE)
                with m.Else():
                    fits = ((e.window <= P.window) & (e.elements <= P.elements)
                            & (e.nworkers <= P.workers) & (cyc < (1 << 31)))
                    with m.If(held_other & young.bit_select(slot, 1)):
                        refuse(Reply.TAKEN)
                    with m.Elif(~fits):
                        refuse(Reply.NO_FIT)
                    with m.Elif(~(found | free_ok)):
                        refuse(Reply.TABLE_FULL)
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
                    m.d.comb += [self.rd.en.eq(1), self.rd.addr.eq(ma_w[0])]
                    m.d.sync += [dly.eq(0), cnt.eq(0)]
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
                            m.d.sync += a_ip.eq(word)
                            m.d.comb += [self.rd.en.eq(1), self.rd.addr.eq(ma_w[1])]
                        with m.Case(1):
                            m.d.sync += a_pm.eq(word)
                            m.d.comb += [self.rd.en.eq(1), self.rd.addr.eq(ma_w[2])]
                        with m.Case(2):
                            same = ((mm.ip == a_ip) & (mm.port == a_pm[16:])
                                    & (mm.mac == Cat(word, a_pm[:16])))
                            with m.If(same):
                                m.d.sync += set_ma()
                                m.next = "UPD_CMP"
                            with m.Else():
                                refuse(Reply.ONLY_DEADLINE)
            with m.State("UPD_WRITE"):
                with m.If(cyc >= (1 << 31)):
                    refuse(Reply.NO_FIT)
                with m.Else():
                    m.d.comb += job_w("deadline", cyc[:32])
                    reply(Reply.UPDATE, "control")
            with m.State("REMOVE"):
                # every enabled entry with this job id
                for j in range(NJ):
                    with m.If(cnt == j):
                        with m.If(jt[j].enable & (jt[j].job_id == e.job)):
                            m.d.comb += job_w("enable", 0, j)
                m.d.sync += cnt.eq(cnt + 1)
                with m.If(cnt == NJ - 1):
                    reply(Reply.REMOVE, "control")
            with m.State("WRITE"):
                # enable 0, the job's registers, then its members, then enable 1
                fields = [("enable", 0), ("job_id", e.job), ("nworkers", e.nworkers),
                          ("bounded", e.mode[0]), ("log2_window", l2w),
                          ("elements", e.elements), ("deadline", cyc[:32]),
                          ("mcast_en", e.mcast_ip != 0), ("mcast_ip", e.mcast_ip),
                          ("mcast_port", Mux(e.mcast_ip != 0, e.mcast_port, 0)),
                          ("session_hi", e.session[32:]), ("session_lo", e.session[:32])]
                if P.tree:      # (a CONTROL entry's members are workers: docs/gateware.md)
                    fields.append(("children", 0))
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
                    reply(Reply.INSTALL, "control")
            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"
        return m
