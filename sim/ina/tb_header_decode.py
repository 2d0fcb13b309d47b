"""Bench of :class:`~ina_fabric.hw.ina.header_decode.HeaderDecode` (P0): random headers
(every type and version, width bytes the core takes or not, element counts and lengths
that agree or not, known and
unknown jobs, sessions, workers) and job tables; the checks in the model's priority
order, the job select (lowest matching job), the packet's record and ``seq - 2W``, the
records near it, and the member-table source compare (the bench answers the
asynchronous read port from its own table) against a model of the stage."""

import cocotb
from amaranth.lib import data

from ina_fabric.hw.ina.lanes import Width, width_checks_py
from ina_fabric.hw.ina.layout import HeaderLayout
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regfile import job_layout
from ina_fabric.hw.ina.slot import log2
from ina_fabric.protocol.fields import HEADER_BYTES, MsgType, VERSION
from ina_fabric.sim.bench import Bench, bench_params, pack


@cocotb.test()
async def test_header_decode(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    NJ, WM, R = P.jobs, P.window, P.records
    LWM, WS = log2(WM), 1 << log2(P.workers)
    b = Bench(dut, seed=p["seed"])
    JS = data.Layout.cast(job_layout()).size
    rr = lambda n: b.rng.getrandbits(n)
    members = {a: {"ip": rr(32), "port": rr(16)} for a in range(NJ * WS)}
    await b.reset(**dict.fromkeys(("hdr", "job_hit", "job_hit_hi", "sess_hit", "hrec", "wbit",
                                   "body", "len_short", "short", "sip", "sport", "jobs",
                                   "near_rec"), 0),
                  **{f"member__{j}__data": 0 for j in range(NJ)})
    prev_src = None
    for cyc in range(p["n"]):
        jobs = [{"enable": int(b.rng.random() < 0.8), "nworkers": b.rng.randint(1, P.workers),
                 "elements": b.rng.randint(1, P.elements)} for _ in range(NJ)]
        hit = [int(b.rng.random() < 0.5) for _ in range(NJ)]
        hit_hi = [int(b.rng.random() < 0.8) for _ in range(NJ)]
        sess = [15 if b.rng.random() < 0.8 else rr(4) for _ in range(NJ)]
        hrec = [rr(LWM + 1) for _ in range(NJ)]
        wbit = [1 << b.rng.randint(0, LWM) for _ in range(NJ)]
        nelem = b.rng.randint(0, P.elements + 2)
        f = {"version": VERSION if b.rng.random() < 0.9 else rr(8),
             "type": MsgType.DATA if b.rng.random() < 0.7 else b.rng.randint(0, 6),
             "worker": b.rng.randrange(P.workers + 2), "nelem": nelem, "seq": rr(32)}
        code = Width.of_bits(b.rng.choice(P.widths)).value
        wb = code * 17 if b.rng.random() < 0.85 else b.rng.choice((rr(8), rr(2) | rr(2) << 4))
        f["width" if "width" in {n for n, _ in HeaderLayout} else "reserved"] = wb
        bad_width, nbytes, width_ne, _ = width_checks_py(P.widths, wb, nelem)
        body = nbytes + (0 if b.rng.random() < 0.8 else b.rng.randint(-8, 8))
        x = {"short": int(b.rng.random() < 0.05), "len_short": int(b.rng.random() < 0.05),
             "sip": rr(32), "sport": rr(16)}
        near_rec = [b.rng.randrange(R) for _ in range(4)]
        b.wr("hdr", f, HeaderLayout)
        b.wr("jobs", sum(pack(job_layout(), j) << (JS * k) for k, j in enumerate(jobs)))
        b.wr("job_hit", sum(v << k for k, v in enumerate(hit)))
        b.wr("job_hit_hi", sum(v << k for k, v in enumerate(hit_hi)))
        b.wr("sess_hit", sum(v << (4 * k) for k, v in enumerate(sess)))
        b.wr("hrec", sum(v << ((LWM + 1) * k) for k, v in enumerate(hrec)))
        b.wr("wbit", sum(v << (33 * k) for k, v in enumerate(wbit)))
        b.wr("body", body & ((1 << 18) - 1))
        b.wr("near_rec", sum(v << (log2(R) * k) for k, v in enumerate(near_rec)))
        for k, v in x.items():
            b.wr(k, v)
        await b.settle()
        # the member table: the bench's answer to each job's asynchronous read
        for j in range(NJ):
            a = b.rd(f"member__{j}__addr")
            assert a == (j * WS + (f["worker"] & (WS - 1)) if WS > 1 else j), f"cycle {cyc}"
            mem = members[a] if b.rng.random() < 0.5 else {"ip": x["sip"], "port": x["sport"]}
            b.wr(f"member__{j}__data", mem["ip"] | mem["port"] << 32)
            members[a] = mem
        # the model
        hits = [jobs[j]["enable"] and hit[j] and hit_hi[j] for j in range(NJ)]
        sel = next((j for j in range(NJ) if hits[j]), 0)
        jb = jobs[sel]
        checks = [x["short"] or x["len_short"], f["version"] != VERSION,
                  f["type"] in (MsgType.STATUS_REQ, MsgType.CONTROL),
                  f["type"] != MsgType.DATA or bad_width,
                  body < nbytes, body != nbytes, not any(hits), sess[sel] != 15,
                  f["worker"] >= jb["nworkers"], nelem > jb["elements"],
                  0,    # a spine's bad count (CoreParams.tree; the benches build none)
                  width_ne]
        rec = (sel << (LWM + 1)) | hrec[sel]
        got = b.rd("checks")
        want = sum(int(bool(c)) << k for k, c in enumerate(checks))
        assert got == want, f"cycle {cyc}: checks {got:#x} != {want:#x}"
        assert b.rd("rec") == rec, f"cycle {cyc}: record"
        assert b.rd("seqm") == (f["seq"] - 2 * wbit[sel]) & ((1 << 34) - 1), f"cycle {cyc}"
        assert b.rd("near") == sum(int(near_rec[k] == rec) << k for k in range(4))
        await b.step()
        if prev_src is not None:
            assert b.rd("src_eq") == prev_src, f"cycle {cyc}: source compare"
        prev_src = 0
        for j in range(NJ):
            m = members[b.rd(f"member__{j}__addr")]
            eq = ((m["ip"] & 0xFFFF) == (x["sip"] & 0xFFFF)) | \
                (((m["ip"] >> 16) == (x["sip"] >> 16)) << 1) | ((m["port"] == x["sport"]) << 2)
            prev_src |= eq << (3 * j)
