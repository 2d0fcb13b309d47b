"""Bench of :class:`~ina_fabric.hw.ina.header_pop.HeaderPop`: datagrams (whole, and cut
short inside the header) from a model of the input FIFO that runs empty at random, pops
held back (``wait``, the queue nearly full); every decoded header against the words
sent (the job and session matches, every job's record for the seq, the datagram's time,
length and source), the element path's beats ``DEC_LAT`` cycles after their pops, and
the scanner's time (that of the packet being received, else the head's, else now)."""

import cocotb
from amaranth.lib import data

from ina_fabric.hw.ina.element import beat_layout
from ina_fabric.hw.ina.input_fifo import entry_layout
from ina_fabric.hw.ina.layout import HeaderLayout
from ina_fabric.hw.ina.params import CoreParams, HEADER_WORDS, QUEUE_SLACK
from ina_fabric.hw.ina.regfile import job_layout
from ina_fabric.hw.ina.slot import DEC_LAT, record_of_py, log2
from ina_fabric.protocol.fields import HEADER_BYTES
from ina_fabric.sim.bench import Bench, bench_params, pack


@cocotb.test()
async def test_header_pop(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    L, H, NJ, WM = P.lanes, P.header_beats, P.jobs, P.window
    LWM = log2(WM)
    b = Bench(dut, seed=p["seed"])
    EL, BL = entry_layout(L), beat_layout(L)
    JS = data.Layout.cast(job_layout()).size
    jobs = [{"job_id": b.rng.getrandbits(16), "log2_window": b.rng.randint(0, LWM),
             "nworkers": b.rng.randint(1, P.workers), "session_hi": b.rng.getrandbits(32),
             "session_lo": b.rng.getrandbits(32)} for _ in range(NJ)]
    await b.reset(jobs=sum(pack(job_layout(), j) << (JS * k) for k, j in enumerate(jobs)),
                  **dict.fromkeys(("head", "avail", "pop_ptr", "wait", "flush", "queue_level",
                                   "now"), 0))
    beats, hdrs = [], []
    for d in range(p["n"]):
        j = b.rng.choice(jobs)
        f = {name: b.rng.getrandbits(fl.width) for name, fl in HeaderLayout}
        if b.rng.random() < 0.7:
            f["job"] = j["job_id"]
        if b.rng.random() < 0.7:
            f["session"] = (j["session_hi"] << 32) | j["session_lo"]
        v = pack(HeaderLayout, f)
        words = [(v >> (32 * (HEADER_WORDS - 1 - k))) & 0xFFFFFFFF for k in range(HEADER_WORDS)]
        nb = b.rng.randint(1, H - 1) if H > 1 and b.rng.random() < 0.15 else \
            H + b.rng.randint(0, 2)
        meta = {"length": b.rng.getrandbits(16), "src_ip": b.rng.getrandbits(32),
                "src_port": b.rng.getrandbits(16), "src_mac": b.rng.getrandbits(48),
                "ts": b.rng.getrandbits(32)}
        ws = words + [b.rng.getrandbits(32) for _ in range(L * nb)]
        for k in range(nb):
            lanes = (ws[k * L:(k + 1) * L] if k < H else
                     [b.rng.getrandbits(32) for _ in range(L)])
            if k == H - 1:      # lanes after the header's last word are padding
                lanes = ws[k * L:(k + 1) * L]
            beats.append({"data": sum(w << (32 * n) for n, w in enumerate(lanes)),
                          "first": int(k == 0), "last": int(k == nb - 1), **meta})
        hdrs.append((f, words, nb >= H, meta))
    rp, now = 0, 1000
    head = beats[0]
    # the model
    pos, collecting, in_hdr_r, posmh = 0, 0, 1, 0
    ts_reg = 0
    q_stop = 0
    dl = [None] * DEC_LAT
    expect_dec, hi = None, 0
    for cyc in range(60 * len(beats) + 200):
        avail = int(rp < len(beats) and b.rng.random() >= p["empty"])
        if rp < len(beats):
            head = beats[rp]
        wait = int(b.rng.random() < p["wait"])
        ql = b.rng.choice((0, P.queue)) if b.rng.random() < 0.1 else 0
        b.wr("head", head, EL), b.wr("avail", avail), b.wr("wait", wait)
        b.wr("queue_level", ql), b.wr("now", now), b.wr("pop_ptr", rp % 32)
        await b.settle()
        pop = b.rd("pop")
        assert pop == int(avail and not wait and not q_stop), f"cycle {cyc}: pop"
        want_h = ts_reg if collecting else head["ts"] if avail else now
        assert b.rd("horizon") == want_h, f"cycle {cyc}: horizon"
        # a header decoded at the last edge: P0's registers
        assert b.rd("dec") == int(expect_dec is not None), f"cycle {cyc}: dec"
        if expect_dec is not None:
            f, words, whole, meta, rewind = expect_dec
            assert b.rd("short") == int(not whole), f"cycle {cyc}: short"
            assert b.rd("rewind") == rewind
            assert b.rd("ts") == meta["ts"] and b.rd("sip") == meta["src_ip"] \
                and b.rd("sport") == meta["src_port"] and b.rd("smac") == meta["src_mac"], \
                f"cycle {cyc}: source, time"
            assert b.rd("len_short") == int(meta["length"] < HEADER_BYTES)
            assert b.rd("body") == (meta["length"] - HEADER_BYTES) & ((1 << 18) - 1)
            if whole:
                hv = b.rd("hdr")
                assert hv == pack(HeaderLayout, f), f"cycle {cyc}: header"
                jh, jhh, sh, hr = (b.rd(n) for n in ("job_hit", "job_hit_hi", "sess_hit", "hrec"))
                for k, jb in enumerate(jobs):
                    assert (jh >> k & 1) == int(f["job"] & 0xFF == jb["job_id"] & 0xFF)
                    assert (jhh >> k & 1) == int(f["job"] >> 8 == jb["job_id"] >> 8)
                    s = (jb["session_hi"] << 32) | jb["session_lo"]
                    want_s = sum(int((f["session"] >> (16 * q)) & 0xFFFF == (s >> (16 * q)) & 0xFFFF) << q
                                 for q in range(4))
                    assert (sh >> (4 * k)) & 15 == want_s, f"cycle {cyc}: job {k} session"
                    want_r = record_of_py(f["seq"] & ((2 << LWM) - 1), 1 << jb["log2_window"], WM)
                    assert (hr >> ((LWM + 1) * k)) & ((2 << LWM) - 1) == want_r, \
                        f"cycle {cyc}: job {k} record"
        el = b.rd("elem", BL)
        want_el = dl[-1]
        assert el["valid"] == int(want_el is not None), f"cycle {cyc}: element beat"
        if want_el is not None:
            assert (el["elem"], el["first"], el["data"]) == want_el[:3], f"cycle {cyc}: beat"
            if el["elem"]:
                assert el["e"] == want_el[3], f"cycle {cyc}: element index"
        await b.step()
        now += 1
        # the model, at this edge
        q_stop = int(ql > P.queue - QUEUE_SLACK)
        expect_dec = None
        if head["first"] and not collecting:
            ts_reg = head["ts"]
        dl = [None] + dl[:-1]
        if pop:
            x = beats[rp]
            if x["first"]:
                pos = 0
            in_hdr = x["first"] or in_hdr_r
            hdr_last = pos == H - 1
            dec = in_hdr and (hdr_last or x["last"])
            dl[0] = (int(not in_hdr), x["first"], x["data"], posmh & 0xFFFF)
            if dec:
                f, words, whole, meta = hdrs[hi]
                expect_dec = (f, words, whole, meta, (rp + 1) % 32)
                hi += 1
            if x["first"]:
                in_hdr_r, posmh = int(H > 1), 1 - H
            else:
                in_hdr_r = int(in_hdr_r and not hdr_last)
                posmh = posmh if posmh == 0xFFFF else posmh + 1
            collecting = int(not dec and not x["last"])
            pos += 1
            rp += 1
        if rp == len(beats) and all(e is None for e in dl) and expect_dec is None:
            break
    assert hi == len(hdrs), f"{hi} of {len(hdrs)} headers decoded"
