"""Bench of :class:`~ina_fabric.hw.ina.slot_rules.SlotRules` (P1b): random operations and
compares (idle cycles: no valid operation), every registered output against
:func:`~.stage_model.rules_py` a cycle later: the rules, the re-run (``reinject``,
``n_flush``), the flush of a scan that a packet follows; with one-beat headers, the
compares re-run on P3's write when P2 held the record."""

import cocotb
from amaranth.lib import data

from ina_fabric.hw.ina.layout import OpKind, Reason
from ina_fabric.hw.ina.params import CoreParams
from ina_fabric.hw.ina.regfile import job_layout
from ina_fabric.hw.ina.slot import CMP_FIELDS, RULE_FIELDS, meta_layout, op_layout, stage_layout
from ina_fabric.sim.bench import Bench, bench_params, pack, unpack
from ina_fabric.sim.ina.stage_model import md_compares_py, rules_py


def rand_meta(rng, P, tag_near=None):
    tag = (tag_near + rng.randint(-2, 2)) if tag_near is not None else rng.getrandbits(34)
    return {"tag": tag & ((1 << 34) - 1), "complete": rng.getrandbits(1),
            "bitmap": rng.getrandbits(P.workers), "count": rng.randint(0, P.workers),
            "exponent": rng.getrandbits(8), "due": rng.getrandbits(32),
            "nelem": rng.randint(0, P.elements)}


def rand_op(rng, P):
    seq = rng.getrandbits(32)
    return {"kind": rng.choice([k.value for k in OpKind]), "checks": 0,
            "reason": rng.choice([Reason.OK.value] * 4 + [r.value for r in Reason]),
            "rec": rng.randrange(P.records), "seq": seq,
            "seqm": (seq - 2 * P.window) & ((1 << 34) - 1), "ts": rng.getrandbits(32),
            "worker": rng.randrange(P.workers), "exp": rng.getrandbits(8),
            "nelem": rng.randint(0, P.elements), "base": 0, "nbeats": 1,
            "rewind": rng.getrandbits(5), "src_ok": rng.getrandbits(1)}


@cocotb.test()
async def test_slot_rules(dut):
    p = bench_params()
    P = CoreParams(**p["core"])
    byp2 = P.header_beats == 1
    NJ = P.jobs
    b = Bench(dut, seed=p["seed"])
    ST, ML, OL = stage_layout(P), meta_layout(P), op_layout(P)
    CL = data.StructLayout({k: 1 for k in CMP_FIELDS})
    RL = data.StructLayout({k: 1 for k in RULE_FIELDS})
    JL = data.ArrayLayout(job_layout(), NJ)
    jobs = [{"nworkers": b.rng.randint(1, P.workers), "enable": 1} for _ in range(NJ)]
    nwm1 = [(j["nworkers"] - 1) & 63 for j in jobs]
    jsize = data.Layout.cast(job_layout()).size
    await b.reset(jobs=sum(pack(job_layout(), j) << (k * jsize) for k, j in enumerate(jobs)),
                  nwm1=sum(v << (6 * k) for k, v in enumerate(nwm1)),
                  **dict.fromkeys(("q1", "q1c", "q1_md", "q1_bit", "q1_due", "q1_init_tag",
                                   "q1_job", "w3_data", "p3_push", "p3_a_rec", "p1_rec",
                                   "p0_valid", "near2"), 0))
    reinject = 0
    hist = []           # per cycle: (p2 valid, adj, rec, p1_rec) of the model
    prev = None
    for cyc in range(p["n"]):
        op = rand_op(b.rng, P)
        md = rand_meta(b.rng, P, op["seq"] if b.rng.random() < 0.5 else None)
        w3 = rand_meta(b.rng, P, op["seq"] if b.rng.random() < 0.5 else None)
        q = {k: b.rng.getrandbits(1) for k in CMP_FIELDS}
        ins = {"valid": int(b.rng.random() >= p["idle"]), "reinj": b.rng.getrandbits(1),
               "adj": int(b.rng.random() < 0.2)}
        stim = {"p0_valid": b.rng.getrandbits(1), "near2": b.rng.getrandbits(1),
                "p3_push": b.rng.getrandbits(2),
                "p3_a_rec": op["rec"] if b.rng.random() < 0.5 else b.rng.randrange(P.records),
                "q1_bit": 1 << op["worker"], "q1_due": b.rng.getrandbits(32),
                "q1_init_tag": b.rng.getrandbits(34), "q1_job": b.rng.randrange(NJ),
                "p1_rec": op["rec"] if b.rng.random() < 0.5 else b.rng.randrange(P.records)}
        b.wr("q1", {**ins, "op": pack(OL, op)}, ST)
        b.wr("q1c", q, CL), b.wr("q1_md", md, ML), b.wr("w3_data", w3, ML)
        for k, v in stim.items():
            b.wr(k, v)
        await b.step()
        # the registered outputs show the previous cycle's inputs
        if prev is not None:
            e_c, e_valid, e_re, e_op = prev
            got = b.rd("c", RL)
            assert got == e_c, f"cycle {cyc}: rules {got} != {e_c}"
            p2 = b.rd("p2", ST)
            assert p2["valid"] == e_valid, f"cycle {cyc}: p2 valid"
            if e_valid:
                assert unpack(OL, p2["op"]) == e_op, f"cycle {cyc}: p2 op"
            assert b.rd("reinject") == e_re and b.rd("n_flush") == 1 - e_re, f"cycle {cyc}"
        # the model, for this cycle's inputs
        qm, mdx = dict(q), md
        if byp2:
            if len(hist) >= 2:
                v2, adj2, rec2, _ = hist[-2]
                if v2 and not adj2 and rec2 == hist[-1][3]:
                    qm.update(md_compares_py(w3, op, jobs[stim["q1_job"]]["nworkers"],
                                             nwm1[stim["q1_job"]]))
                    mdx = w3
            if stim["p3_push"] and stim["p3_a_rec"] == op["rec"]:
                qm["pend"] = 1
        c = rules_py(qm, op, mdx, p.get("duplicate_check", True))
        scan_cancel = stim["p0_valid"] and op["kind"] == OpKind.SCAN.value and stim["near2"]
        valid = int(ins["valid"] and not reinject and not scan_cancel)
        re = int(ins["valid"] and not reinject and (ins["adj"] or c["defer"]))
        prev = (c, valid, re, op)
        hist.append((valid, ins["adj"], op["rec"], stim["p1_rec"]))
        reinject = re
