"""Bench of :class:`~ina_fabric.hw.ina.slot_issue.SlotIssue`: random decoded packets,
re-runs, scanner room (``q_stop``, ``retry``), P3 writes to the metadata, and ``enable``
writes of 1 and 0 (queued, cancelled, stopped initializations); the operation loaded
into P1a (its source by priority, the scanner's record and time, the initialization's
records one at a time through the empty pipeline, ``enable_set`` at the end), each
job's metadata read (against a model of the memories with their writes) and the bypass
selects, against a model of the stage, a cycle later."""

import cocotb
from amaranth.lib import data

from ina_fabric.hw.ina.layout import OpKind
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.slot import meta_layout, op_layout, stage_layout, write_layout, log2
from ina_fabric.sim.bench import Bench, bench_params, fields, pack, unpack
from ina_fabric.sim.ina.tb_slot_rules import rand_meta, rand_op

PKT, SCAN, INIT = OpKind.PKT.value, OpKind.SCAN.value, OpKind.INIT.value


@cocotb.test()
async def test_slot_issue(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    NJ, WM, R = P.jobs, P.window, P.records
    LWM = log2(WM)
    byp2 = P.header_beats == 1
    b = Bench(dut, seed=p["seed"])
    ST, ML, OL, WL = stage_layout(P), meta_layout(P), op_layout(P), write_layout(P)
    MS = data.Layout.cast(ML).size
    width = {n: w for n, _, w in fields(ML)}
    empty = {"tag": 0, "complete": 1, "bitmap": 0, "count": 0, "exponent": 0x80, "due": 0,
             "nelem": 0}
    mem = [[dict(empty) for _ in range(2 * WM)] for _ in range(NJ)]
    await b.reset(**dict.fromkeys(("p0_valid", "p0_op", "hrec", "near", "w3_near", "reinject",
                                   "p2", "q1", "v2", "horizon", "q_stop", "retry", "w3",
                                   "enable_stb", "enable_value"), 0))
    # the model's registers, after the reset's last edge (inputs 0: the scanner's first
    # visit loaded)
    p1 = {"valid": 1, "reinj": 0, "adj": 0, "op": {**unpack(OL, 0), "kind": SCAN}}
    scan_ptr = 1
    init_busy = init_go = init_job = init_ptr = init_req = 0
    byp1 = byp0 = 0
    w4 = unpack(ML, 0)
    p1_md = [dict(empty) for _ in range(NJ)]
    for cyc in range(p["n"]):
        rnd = b.rng.random
        p0_valid = int(rnd() < p["packets"])
        op0 = rand_op(b.rng, P)
        op0["kind"] = PKT
        p2 = {"valid": int(rnd() < 0.5), "reinj": 0, "adj": b.rng.getrandbits(1),
              "op": rand_op(b.rng, P)}
        q1 = {"valid": int(rnd() < 0.5), "reinj": 0, "adj": 0, "op": rand_op(b.rng, P)}
        for st in (p2, q1):
            if rnd() < 0.3:
                st["op"]["rec"] = scan_ptr
        hrec = [b.rng.randrange(2 * WM) for _ in range(NJ)]
        w3 = {"en": int(rnd() < 0.5), "addr": b.rng.randrange(R),
              "data": rand_meta(b.rng, P)}
        x = {"p0_valid": p0_valid, "near": b.rng.getrandbits(3), "w3_near": b.rng.getrandbits(1),
             "reinject": int(rnd() < 0.1), "v2": b.rng.getrandbits(1),
             "horizon": b.rng.getrandbits(32), "q_stop": int(rnd() < 0.2),
             "retry": int(rnd() < 0.1), "enable_stb": 0, "enable_value": b.rng.getrandbits(1)}
        if rnd() < p["enables"]:
            x["enable_stb"] = 1 << b.rng.randrange(NJ)
        b.wr("p0_op", op0, OL)
        b.wr("hrec", sum(h << ((LWM + 1) * j) for j, h in enumerate(hrec)))
        b.wr("p2", {**p2, "op": pack(OL, p2["op"])}, ST)
        b.wr("q1", {**q1, "op": pack(OL, q1["op"])}, ST)
        b.wr("w3", {**w3, "data": pack(ML, w3["data"])}, WL)
        for k, v in x.items():
            b.wr(k, v)
        # enable_set: combinational, in the cycle the last initialization write enters
        await b.settle()
        last_init = (not x["reinject"] and not p0_valid and init_go
                     and init_ptr == 2 * WM - 1)
        assert b.rd("enable_set") == ((1 << init_job) if last_init else 0), f"cycle {cyc}"
        assert b.rd("hold") == int(init_busy or init_req != 0), f"cycle {cyc}: hold"
        await b.step()
        # the registers, as the model has them for this cycle (loaded at the last edge)
        got = b.rd("p1", ST)
        got["op"] = unpack(OL, got["op"])
        assert got["valid"] == p1["valid"] and got["reinj"] == p1["reinj"] \
            and got["adj"] == p1["adj"], f"cycle {cyc}: p1 {got} != {p1}"
        if p1["valid"]:
            assert got["op"] == p1["op"], f"cycle {cyc}: p1 op {got['op']} != {p1['op']}"
        v = b.rd("p1_md")
        for j in range(NJ):
            assert unpack(ML, (v >> (MS * j)) & ((1 << MS) - 1)) == p1_md[j], \
                f"cycle {cyc}: job {j}'s read"
        assert (b.rd("byp1"), b.rd("byp0")) == (byp1, byp0), f"cycle {cyc}: bypass"
        assert b.rd("w4_data", ML) == w4, f"cycle {cyc}: w4"
        assert b.rd("init_busy") == init_busy, f"cycle {cyc}: init_busy"
        # the model: this cycle's inputs into the registers
        src = "p2" if x["reinject"] else "p0" if p0_valid else "scan"
        for j in range(NJ):
            a = {"p2": p2["op"]["rec"] & (2 * WM - 1), "p0": hrec[j],
                 "scan": scan_ptr & (2 * WM - 1)}[src]
            p1_md[j] = dict(mem[j][a])
        near1, near2, near3 = (x["near"] >> k & 1 for k in range(3))
        by_src = lambda f2, f0, fs: f2 if x["reinject"] else f0 if p0_valid else fs
        n_byp1 = int(x["v2"] and by_src(1, near3, p2["op"]["rec"] == scan_ptr))
        n_byp0 = int(w3["en"] and by_src(w3["addr"] == p2["op"]["rec"], x["w3_near"],
                                         w3["addr"] == scan_ptr))
        pipe_empty = not p0_valid and not p1["valid"] and not q1["valid"] and not p2["valid"]
        n_init_go = int(init_busy and pipe_empty and not init_go)
        scan_ok = int(not p0_valid and not init_busy and not x["retry"] and not x["q_stop"]
                      and not (p1["valid"] and p1["op"]["rec"] == scan_ptr)
                      and not (q1["valid"] and q1["op"]["rec"] == scan_ptr))
        n_p1 = {"valid": 0, "reinj": 0, "adj": 0, "op": dict(p1["op"])}
        n_busy, n_ptr, n_scan = init_busy, init_ptr, scan_ptr
        if x["reinject"]:
            n_p1.update(valid=1, reinj=1, op=dict(p2["op"]))
        elif p0_valid:
            adj = ((p1["valid"] and p1["op"]["kind"] == PKT and near1)
                   or (q1["valid"] and q1["op"]["kind"] == PKT and near2 and not byp2))
            n_p1.update(valid=1, adj=int(bool(adj)))
            n_p1["op"].update({k: op0[k] for k in ("checks", "rec", "seq", "seqm", "ts",
                                                   "worker", "exp", "nelem", "base",
                                                   "nbeats", "rewind")}, kind=PKT)
        elif init_go:
            n_p1["valid"] = 1
            n_p1["op"].update(kind=INIT, rec=(init_job << (LWM + 1)) | init_ptr)
            n_ptr = init_ptr + 1
            if init_ptr == 2 * WM - 1:
                n_busy = 0
        else:
            n_p1["valid"] = scan_ok
            n_p1["op"].update(kind=SCAN, rec=scan_ptr, ts=x["horizon"])
            if scan_ok:
                n_scan = 0 if scan_ptr == R - 1 else scan_ptr + 1
        n_req, n_job = init_req, init_job
        if not init_busy and init_req:
            n_busy, n_ptr = 1, 0
            n_job = min(j for j in range(NJ) if init_req >> j & 1)
            n_req = init_req & ~(1 << n_job)
        for j in range(NJ):
            if x["enable_stb"] >> j & 1:
                if x["enable_value"]:
                    n_req |= 1 << j
                else:
                    n_req &= ~(1 << j)
                    if init_busy and init_job == j:
                        n_busy = 0
        if w3["en"]:
            job, a = w3["addr"] >> (LWM + 1), w3["addr"] & (2 * WM - 1)
            if job < NJ:
                mem[job][a] = {k: v & ((1 << width[k]) - 1) for k, v in w3["data"].items()}
        w4 = {k: v & ((1 << width[k]) - 1) for k, v in w3["data"].items()}
        p1, byp1, byp0, init_go = n_p1, n_byp1, n_byp0, n_init_go
        init_busy, init_ptr, scan_ptr, init_req, init_job = n_busy, n_ptr, n_scan, n_req, n_job
