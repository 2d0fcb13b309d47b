"""Bench of :class:`~ina_fabric.hw.ina.slot_compare.SlotCompare` (P1a): random operations
(idle cycles: none valid; re-runs with their own source check), each job's metadata
read, the two bypass candidates and their selects; every registered compare, the reason,
the source check, the pending bit, the due time and an initialization's tag against
:func:`~.stage_model.md_compares_py` and the stage's rules, a cycle later."""

import cocotb
from amaranth.lib import data

from ina_fabric.hw.ina.layout import OpKind, Reason
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regfile import job_layout
from ina_fabric.hw.ina.slot import (CHECK_REASONS, CMP_FIELDS, meta_layout, op_layout,
                                    stage_layout, log2)
from ina_fabric.sim.bench import Bench, bench_params, fields, pack, unpack
from ina_fabric.sim.ina.stage_model import md_compares_py
from ina_fabric.sim.ina.tb_slot_rules import rand_meta, rand_op


@cocotb.test()
async def test_slot_compare(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    NJ, LWM = P.jobs, log2(P.window)
    b = Bench(dut, seed=p["seed"])
    ST, ML, OL = stage_layout(P), meta_layout(P), op_layout(P)
    CL = data.StructLayout({k: 1 for k in CMP_FIELDS})
    MS = data.Layout.cast(ML).size
    JS = data.Layout.cast(job_layout()).size
    jobs = [{"nworkers": b.rng.randint(1, P.workers), "enable": b.rng.getrandbits(1),
             "bounded": b.rng.getrandbits(1), "deadline": b.rng.getrandbits(32),
             "log2_window": b.rng.randint(0, LWM)} for _ in range(NJ)]
    wbit = [1 << j["log2_window"] for j in jobs]
    nwm1 = [(j["nworkers"] - 1) & 63 for j in jobs]
    await b.reset(jobs=sum(pack(job_layout(), j) << (k * JS) for k, j in enumerate(jobs)),
                  wbit=sum(v << (33 * k) for k, v in enumerate(wbit)),
                  nwm1=sum(v << (6 * k) for k, v in enumerate(nwm1)),
                  **dict.fromkeys(("p1", "p1_md", "w4_data", "byp1", "byp0", "w3_data",
                                   "src_eq", "pending", "p3_push", "reinject", "p0_valid",
                                   "near1"), 0))
    prev = None
    width = {n: w for n, _, w in fields(ML)}
    for cyc in range(p["n"]):
        op = rand_op(b.rng, P)
        op["checks"] = b.rng.getrandbits(len(CHECK_REASONS)) if b.rng.random() < 0.4 else 0
        job = op["rec"] >> (LWM + 1)
        mds = [rand_meta(b.rng, P, op["seq"] if b.rng.random() < 0.5 else None)
               for _ in range(NJ)]
        w3, w4 = (rand_meta(b.rng, P, op["seq"]) for _ in "34")
        ins = {"valid": int(b.rng.random() >= p["idle"]), "reinj": b.rng.getrandbits(1),
               "adj": b.rng.getrandbits(1)}
        x = {"byp1": int(b.rng.random() < 0.2), "byp0": int(b.rng.random() < 0.2),
             "src_eq": sum((7 if b.rng.random() < 0.7 else b.rng.getrandbits(3)) << (3 * j)
                           for j in range(NJ)),
             "pending": b.rng.getrandbits(P.records), "p3_push": b.rng.getrandbits(2),
             "reinject": int(b.rng.random() < 0.1), "p0_valid": b.rng.getrandbits(1),
             "near1": b.rng.getrandbits(1)}
        b.wr("p1", {**ins, "op": pack(OL, op)}, ST)
        b.wr("p1_md", sum(pack(ML, md) << (MS * j) for j, md in enumerate(mds)))
        b.wr("w3_data", w3, ML), b.wr("w4_data", w4, ML)
        for k, v in x.items():
            b.wr(k, v)
        await b.step()
        if prev is not None:
            e = prev
            q1 = b.rd("q1", ST)
            assert q1["valid"] == e["valid"], f"cycle {cyc}: valid"
            assert unpack(OL, q1["op"]) == e["op"], f"cycle {cyc}: op {unpack(OL, q1['op'])} != {e['op']}"
            got = b.rd("q1c", CL)
            assert got == e["c"], f"cycle {cyc}: compares {got} != {e['c']}"
            assert b.rd("q1_md", ML) == e["md"], f"cycle {cyc}: metadata"
            for k in ("q1_bit", "q1_due", "q1_init_tag", "q1_job"):
                assert b.rd(k) == e[k], f"cycle {cyc}: {k} {b.rd(k)} != {e[k]}"
        # the model
        md1 = w3 if x["byp1"] else w4 if x["byp0"] else mds[job]
        jb = jobs[job]
        reason = next((CHECK_REASONS[k].value for k in range(len(CHECK_REASONS))
                       if op["checks"] >> k & 1), Reason.OK.value)
        src_ok = op["src_ok"] if ins["reinj"] else int((x["src_eq"] >> (3 * job)) & 7 == 7)
        c = md_compares_py(md1, op, jb["nworkers"], nwm1[job])
        ok = reason == Reason.OK.value
        kind = op["kind"]
        c.update(one_n=int(jb["nworkers"] == 1), nelem_nz=int(op["nelem"] != 0), src_ok=src_ok,
                 pend=int((x["pending"] >> op["rec"]) & 1 or (x["byp1"] and x["p3_push"] != 0)),
                 enable=jb["enable"], bounded=jb["bounded"], ok=int(ok),
                 pkt=int(kind == OpKind.PKT.value and ok),
                 may_expire=int(kind in (OpKind.PKT.value, OpKind.SCAN.value)
                                and jb["enable"] and jb["bounded"]))
        idx, st = op["rec"] & ((1 << LWM) - 1), (op["rec"] >> LWM) & 1
        scan_cancel = x["p0_valid"] and kind == OpKind.SCAN.value and x["near1"]
        prev = {"valid": int(ins["valid"] and not x["reinject"] and not scan_cancel),
                "op": {**op, "reason": reason, "src_ok": src_ok}, "c": c,
                "md": {k: v & ((1 << width[k]) - 1) for k, v in md1.items()},
                "q1_bit": (1 << (op["worker"] & 31)) & ((1 << P.workers) - 1),
                "q1_due": (op["ts"] + jb["deadline"]) & 0xFFFFFFFF,
                "q1_init_tag": (idx + (wbit[job] if st else 0) - 2 * wbit[job]) & ((1 << 34) - 1),
                "q1_job": job}
