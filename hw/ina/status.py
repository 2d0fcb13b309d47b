"""The STATUS writer: the control plane's reply, a sealed STATUS datagram as the reference
model's (``SwitchModel._control``), written a byte at a time into a reply buffer from a
template ROM, then sealed with the tag the HMAC engine computes over it and sent.

Ports::

    start, kind   In: write reply ``kind`` (:class:`Reply`; a pulse)
    job, age, nonce
                  In: the entry's job id, the found job's idle cycles (``taken``), the
                  request's nonce (every reply carries it)
    jobs, counters
                  In: the job table and the counters (the STATUS page)
    rendered      Out: a pulse when the reply's bytes (header, JSON, nonce) are written;
                  ``length``: how many
    buf_addr, buf_data
                  the reply buffer's read port (synchronous), for the HMAC engine
    seal, digest  In: append the first 16 bytes of ``digest`` (a pulse) and send
    rd            the word reader (the reply, as the control plane's ``word``)
    src_ip, dst   In: the IPv4 source register; the reply's destination (ip, port, mac)
    o             Out: the reply, laid out as the core's output; ``sent`` a pulse after
                  its last beat
"""

import json

from amaranth.hdl import *
from amaranth.lib import wiring, data, enum, stream
from amaranth.lib import memory
from amaranth.lib.wiring import In, Out

from ina_fabric.protocol.auth import TRAILER_BYTES
from ina_fabric.protocol.fields import HEADER_BYTES, MsgType, VERSION
from ina_fabric.protocol.regs import COUNTER_NAMES

from .layout import out_layout
from .params import CoreParams, HEADER_WORDS
from .reader import reader_signature, word_reads
from .regfile import job_layout, jobs_at
from .replicator import IP_FLAGS_DF, IP_TTL_PROTO

__all__ = ["StatusWriter", "Reply", "reply_templates", "status_reply_bound", "REPLY_WORDS"]

#: the reply buffer, in 32-bit words
REPLY_WORDS = 512


class Reply(enum.Enum, shape=4):
    """The replies (each a template of :func:`reply_templates`, by its name in lower case)."""
    INSTALL = 0
    UPDATE = 1
    REMOVE = 2
    NOT_INSTALLED = 3
    ONLY_DEADLINE = 4
    TAKEN = 5
    OTHER_SESSION = 6
    NOT_REMOVED = 7
    TABLE_FULL = 8
    NO_FIT = 9
    STATUS = 10


def _log2(n):
    return (n - 1).bit_length()


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


class StatusWriter(wiring.Component):
    """See the module docstring. ``clock_hz``: the core clock (the seconds of ``taken``);
    ``reclaim_cycles``: the widest ``age``; ``max_words``: the word reader's range."""

    def __init__(self, params: CoreParams, *, clock_hz: int, reclaim_cycles: int,
                 max_words: int):
        self.params = P = params
        self.clock_hz = clock_hz
        self.reclaim_cycles = reclaim_cycles
        super().__init__({
            "start": In(1), "kind": In(Reply),
            "job": In(16), "age": In(range(reclaim_cycles + 1)), "nonce": In(64),
            "jobs": In(data.ArrayLayout(job_layout(), P.jobs)),
            "counters": In(data.ArrayLayout(32, len(COUNTER_NAMES))),
            "rendered": Out(1), "length": Out(range(4 * REPLY_WORDS + 1)),
            "buf_addr": In(range(REPLY_WORDS)), "buf_data": Out(32),
            "seal": In(1), "digest": In(data.ArrayLayout(32, 8)),
            "rd": Out(reader_signature(range(max_words + 1))),
            "src_ip": In(32),
            "dst": In(data.StructLayout({"ip": 32, "port": 16, "mac": 48})),
            "o": Out(stream.Signature(out_layout(P.lanes))),
            "sent": Out(1),
        })

    def _buffer(self, m):
        """The reply buffer and its byte writer: ``put(byte)`` (from an FSM state) writes
        the next byte a cycle later, from registers (the FSM's decisions do not reach the
        word assembly in one cycle); ``flush`` writes the word being filled."""
        RW = REPLY_WORDS
        m.submodules.rmem = rmem = memory.Memory(shape=32, depth=RW, init=[])
        rw, rr = rmem.write_port(), rmem.read_port()
        m.d.comb += [rr.addr.eq(self.buf_addr), self.buf_data.eq(rr.data)]
        pos = Signal(range(4 * RW + 1))     # reply bytes written
        acc = Signal(32)                    # the word being filled
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
        m.d.comb += self.length.eq(pos)

        def put(byte):
            m.d.comb += [pstb_c.eq(1), pbyte_c.eq(byte)]
        return put, flush, pos, acc

    def _checksum(self, m, pos):
        """The reply's IPv4 header checksum (``ip_checksum_hw``'s sum, in three
        registered steps: its inputs are still while a reply is read out, which takes
        longer)."""
        ck_a, ck_b, ck_s = Signal(18), Signal(17), Signal(20)
        cks = Signal(16)
        r_ip = self.dst.ip
        m.d.sync += [ck_a.eq(Const(0x4500 + IP_FLAGS_DF + IP_TTL_PROTO, 17)
                             + self.src_ip[16:] + self.src_ip[:16]),
                     ck_b.eq(r_ip[16:] + r_ip[:16]),
                     ck_s.eq(ck_a + ck_b + (pos + 28))]
        ck1 = ck_s[:16] + ck_s[16:]
        ck2 = ck1[:16] + ck1[16:]
        m.d.sync += cks.eq(~ck2[:16])
        return cks

    def elaborate(self, platform):
        P = self.params
        L = P.lanes
        LL = _log2(L)
        NJ = P.jobs
        NC = len(COUNTER_NAMES)
        m = Module()
        jt = self.jobs
        put, flush, pos, acc = self._buffer(m)
        replies = reply_templates(P)
        # reply templates: one ROM, each ends in 0; 1 marks the job id
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
        cnt = Signal(range(2048))
        dly = Signal(2)
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
        word = self.rd.word
        read = word_reads(m, self.rd, dly)
        nonce = self.nonce
        job_tpl = Mux(jobs_at(jt, "bounded", jent[:max(1, _log2(NJ))]),
                      starts["job_bounded"], starts["job_reliable"])

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    with m.Switch(self.kind):
                        for r in Reply:
                            with m.Case(r):
                                m.d.sync += tstart.eq(starts[r.name.lower()])
                    m.d.sync += [cnt.eq(0), pos.eq(0), acc.eq(0), tpl_ok.eq(0)]
                    m.next = "R_HDR"
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
                            m.d.sync += dv.eq(Mux(in_job, jobs_at(jt, "job_id", jent),
                                                  self.job))
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
                            m.d.sync += [dv.eq(self.age + self.clock_hz // 2), dsec.eq(1),
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
                    m.d.sync += [tp.eq(job_tpl), in_job.eq(1), jfirst.eq(0)]
                    m.next = "R_TPL"
            with m.State("R_SEP"):
                put(ord(" "))
                m.d.sync += [tp.eq(job_tpl), in_job.eq(1)]
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
                m.next = "R_END"
            with m.State("R_END"):
                # written: the HMAC engine hashes the buffer, then ``seal``
                m.d.comb += [flush.eq(1), self.rendered.eq(1)]
                m.d.sync += cnt.eq(0)
                m.next = "R_SEAL"
            with m.State("R_SEAL"):
                with m.If(self.seal):
                    m.next = "R_TAG"
            with m.State("R_TAG"):
                put(Cat(self.digest[k] for k in reversed(range(4))).word_select(
                    (15 - cnt[:4])[:4], 8))
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
                        m.d.comb += self.sent.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "R_OUT"

        cks = self._checksum(m, pos)
        o = self.o.payload
        m.d.comb += [self.o.valid.eq(ob_valid), o.first.eq(ob_first), o.last.eq(ob_last),
                     o.n.eq(ob_n), o.length.eq(pos), o.dst_mac.eq(self.dst.mac),
                     o.dst_ip.eq(self.dst.ip), o.dst_port.eq(self.dst.port), o.mcast.eq(0),
                     o.ip_checksum.eq(cks)]
        for k in range(L):
            m.d.comb += o.data[k].eq(ob_data[k])
        return m
